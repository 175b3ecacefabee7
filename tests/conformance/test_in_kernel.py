"""Transforms of generated programs called inside a generated kernel, per element, against the host call."""
import hypothesis.strategies as st
from hypothesis import given

import tidiff as td

from . import budget, cases, grammar, known
from .cases import draw_case
from .kernels import check_in_kernel
from .test_compositions import SMALL_PARAMS, chains

KINDS = ("grad", "value_and_grad", "jacfwd", "jacrev", "jacobian", "hessian", "hvp", "jvp", "chain")
FORWARD = ("jacfwd", "jvp")
"""Transforms that push tangents through f itself: refused (a td.TransformError, checked on the host by
test_funcs) for programs reaching a td.custom_vjp function without a jvp rule, so not drawn for them here.
hessian and hvp push tangents through the gradient's code, which has a forward mode, as in JAX."""


@budget.examples(ci=2, share=0.12)
@given(st.data())
def test_transforms_in_kernel(data):
    one_output = st.sampled_from(grammar.SHAPES).map(lambda s: (s,))
    case = draw_case(data, out_shapes=st.one_of(grammar.SCALAR_OUT, one_output), param_shapes=SMALL_PARAMS)
    scalar = case.out_shapes == ((),)
    kinds = [k for k in KINDS if known.enabled("in_kernel_" + k)
             and (scalar or k in ("jacfwd", "jacrev", "jacobian", "jvp"))
             and (case.program.forward_ok or k not in FORWARD)]
    kind = data.draw(st.sampled_from(kinds), label="transform")
    n = case.nargs
    if kind in ("jvp", "hvp"):
        tangents = [a * 0.5 + 0.25 for a in case.arrays]
        call = f"td.{kind}(f, ({{args}},), ({{extra}},))"
        check_in_kernel(case, call, lambda *flat: getattr(td, kind)(case.fn, tuple(flat[:n]), tuple(flat[n:])),
                        extra=tangents)
        return
    if kind == "chain":
        chain = data.draw(chains(case), label="chain")
    else:
        chain = [(kind, data.draw(cases.argnums(n), label="argnums"))]
    call = "f"
    for k, argnums in chain:
        call = f"td.{k}({call}, argnums={argnums!r})"

    def host(*flat):
        g = case.fn
        for k, argnums in chain:
            g = getattr(td, k)(g, argnums=argnums)
        return g(*flat)

    check_in_kernel(case, call + "({args})", host)
