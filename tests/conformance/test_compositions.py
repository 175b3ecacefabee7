"""Compositions of transforms up to third order on generated scalar programs, against nested torch autograd."""
import hypothesis.strategies as st
from hypothesis import given

from . import budget, cases, checks, grammar, known
from .cases import draw_case

MAX_SIZE = 27
"""Entries of the composed result: the torch oracle differentiates each one again (NOTE: [Oracle per element])."""


@st.composite
def chains(draw, case, max_size=MAX_SIZE):
    """Two or three transforms, each with its argnums, defined for this scalar function (checks.chain_sizes)."""
    kinds = [k for k in ("grad", "jacfwd", "jacrev", "jacobian", "hessian") if known.enabled(k)]
    chain: list = []
    for _ in range(draw(st.integers(2, 3))):
        # f itself has no forward mode when it reaches a custom_vjp without a jvp rule; its derivatives
        # (the rule's code) do, as in JAX: jacfwd(grad(f)) and hessian(f) = jacfwd(jacrev(f)) are defined
        allowed = kinds if chain or case.program.forward_ok else [k for k in kinds if k != "jacfwd"]
        options = [(kind, a) for kind in allowed for a in cases.all_argnums(case.nargs)
                   if (sizes := checks.chain_sizes(chain + [(kind, a)], case.cores)) is not None
                   and sum(sizes) <= max_size]
        if not options:
            break
        chain.append(draw(st.sampled_from(options)))
    return chain


SMALL_PARAMS = st.lists(st.sampled_from(grammar.SMALL_SHAPES), min_size=1, max_size=3).map(tuple)


@budget.examples(ci=2, share=0.13)
@given(st.data())
def test_compositions(data):
    case = draw_case(data, out_shapes=grammar.SCALAR_OUT, param_shapes=SMALL_PARAMS)
    chain = data.draw(chains(case), label="chain")
    if chain:
        checks.check_chain(case, chain)
