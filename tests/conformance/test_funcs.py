"""Generated @ti.func programs: every first- and second-order transform against torch (and differences).

Each example draws a program, host arguments with broadcast batch shapes,
and one or two transforms with random argnums and has_aux; the value is
checked first, so a mismatch in a derivative is never a renderer's mistake.
"""
import hypothesis.strategies as st
import numpy as np
from hypothesis import given

from . import budget, cases, checks, grammar, known
from .cases import draw_case

FIRST_ORDER = ("jvp", "vjp", "jacfwd", "jacrev", "jacobian", "grad", "value_and_grad")
FORWARD = ("jvp", "jacfwd")


def first_order_kinds(case):
    kinds = [k for k in FIRST_ORDER if k not in ("grad", "value_and_grad") or case.out_shapes[0] == ()]
    if not case.program.forward_ok:
        kinds = [k for k in kinds if k not in FORWARD] + ["forward_refused"]
    return [k for k in kinds if known.enabled(k)]


def run_first_order(data, case, kind):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    has_aux = len(case.out_shapes) == 2 and data.draw(st.booleans(), label="has_aux")
    fd = case.program.smooth and case.program.forward_ok
    if kind == "forward_refused":
        checks.check_forward_refused(case)
    elif kind == "jvp":
        checks.check_jvp(case, rng, has_aux, fd)
    elif kind == "vjp":
        checks.check_vjp(case, rng, has_aux)
    else:
        argnums = data.draw(cases.argnums(case.nargs), label="argnums")
        if kind in ("grad", "value_and_grad") and len(case.out_shapes) == 2 and not has_aux:
            checks.check_grad_of_a_pair_refused(case, argnums, kind)
        elif kind in ("grad", "value_and_grad"):
            checks.check_grad(case, argnums, has_aux, kind)
        else:
            checks.check_jacobian(case, kind, argnums, has_aux)


@budget.examples(ci=4, share=0.4)
@given(st.data())
def test_first_order(data):
    case = draw_case(data)
    for kind in data.draw(st.lists(st.sampled_from(first_order_kinds(case)), min_size=1, max_size=2, unique=True),
                          label="transforms"):
        run_first_order(data, case, kind)


@budget.examples(ci=3, share=0.25)
@given(st.data())
def test_second_order(data):
    out_shapes = st.one_of(grammar.SCALAR_OUT, grammar.SCALAR_WITH_AUX)
    case = draw_case(data, out_shapes=out_shapes)
    # second order pushes tangents through the gradient, whose code (a custom_vjp's bwd rule included) has a
    # forward mode even where f's has none, as in JAX
    kinds = [k for k in ("hessian", "hvp") if known.enabled(k)]
    kind = data.draw(st.sampled_from(kinds), label="transform")
    if kind == "hvp":
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
        if len(case.out_shapes) == 1:
            checks.check_hvp(case, rng, fd=case.program.smooth)
    else:
        has_aux = len(case.out_shapes) == 2  # the Hessian of a scalar function: (scalar, aux) needs has_aux
        checks.check_jacobian(case, "hessian", data.draw(cases.argnums(case.nargs), label="argnums"), has_aux)
