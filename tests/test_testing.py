"""td.testing: each checker passes on correct derivatives and catches wrong ones, with the evidence."""
import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from op_table import ROW_BY_NAME

import tidiff as td
import tidiff.testing as tt

vec3 = ti.types.vector(3, ti.f64)


# -- deliberately wrong derivatives ---------------------------------------------------------

@ti.func
def field_of(x: vec3, s: ti.f64) -> vec3:
    return ti.sin(x) * s + x.cross(ti.Vector([1.0, 2.0, 3.0])) * x[0]


FIELD_OF = td.function(field_of)


def Skewed(inner, jvp_factor=1.0, vjp_factor=1.0):
    """``field_of`` with its forward and/or reverse rule scaled by a factor: a wrong derivative.

    Custom rules computed by tidiff's own transforms, scaled: the jvp rule
    serves forward mode, the vjp rule reverse mode.
    """
    assert inner is FIELD_OF

    @td.custom_vjp
    @ti.func
    def skewed_field_of(x: vec3, s: ti.f64) -> vec3:
        return field_of(x, s)

    @skewed_field_of.defjvp
    @ti.func
    def skewed_jvp(x, s, dx, ds):
        y, dy = td.jvp(field_of, (x, s), (dx, ds))
        return y, jvp_factor * dy

    @skewed_field_of.defvjp
    @ti.func
    def skewed_bwd(x, s, ct):
        jx, js = td.jacfwd(field_of, argnums=(0, 1))(x, s)
        return vjp_factor * (jx.transpose() @ ct), vjp_factor * js.dot(ct)

    return skewed_field_of


def torch_field_of(x, s):
    return torch.sin(x) * s + torch.linalg.cross(x, torch.tensor([1.0, 2.0, 3.0], dtype=x.dtype)) * x[0]


# A custom rule 1.5 times too large: reverse mode transposes the rule, so forward
# and reverse agree with each other; only central differences (or torch) can tell.
@td.custom_jvp
@ti.func
def bad_sin(x: ti.f64) -> ti.f64:
    return ti.sin(x)


@bad_sin.defjvp
@ti.func
def bad_sin_jvp(x, dx):
    return ti.sin(x), 1.5 * ti.cos(x) * dx


# A rule right to first order whose own derivative is wrong: cos(stop_gradient(x)) has
# derivative 0, so the second derivative comes out 0 instead of -sin(x).
@td.custom_jvp
@ti.func
def flat_sin(x: ti.f64) -> ti.f64:
    return ti.sin(x)


@flat_sin.defjvp
@ti.func
def flat_sin_jvp(x, dx):
    return ti.sin(x), ti.cos(td.stop_gradient(x)) * dx


@ti.func
def uses_flat_sin(x: ti.f64, y: ti.f64) -> ti.f64:
    return flat_sin(x) * y


X = np.array([[0.3, -0.7, 1.1], [0.9, 0.2, -0.4]])
S = np.array([1.5, -0.5])


def fails(check, *args, **kwargs):
    with pytest.raises(AssertionError) as info:
        check(*args, **kwargs)
    return str(info.value)


# -- check_grads -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["arith", "trig", "while_loop", "nested_call", "vector"])
def test_check_grads_second_order_on_op_table_rows(name):
    row = ROW_BY_NAME[name]
    rng = np.random.default_rng(0)
    args = tuple(rng.uniform(row.low, row.high, size=(2,) + shape) for shape in row.shapes)
    tt.check_grads(row.func, args, order=2)
    tt.check_grads(row.func, args, order=2, fast=True)


@pytest.mark.parametrize("name, fast_order", [("matmul", 1), ("cross", 2), ("norms", 2)])
def test_check_grads_first_order_on_op_table_rows(name, fast_order):
    # second order of matrix functions compiles for seconds (full: tens of seconds); a few rows suffice
    row = ROW_BY_NAME[name]
    rng = np.random.default_rng(0)
    args = tuple(rng.uniform(row.low, row.high, size=(2,) + shape) for shape in row.shapes)
    tt.check_grads(row.func, args, order=1)
    tt.check_grads(row.func, args, order=fast_order, fast=True)


def test_check_grads_batched_broadcast_and_tuple_outputs():
    @ti.func
    def pair(x: vec3, s: ti.f64):
        return x * ti.exp(s), x.dot(x) * s

    x = np.random.default_rng(1).uniform(-1, 1, (4, 1, 3))
    s = np.array([0.5, -0.2])  # broadcasts against x's batch (4, 1) -> (4, 2)
    tt.check_grads(pair, (x, s), order=1)
    tt.check_grads(pair, (x, s), order=2, fast=True)


def test_check_grads_skips_integer_arguments():
    @ti.func
    def powered(x: ti.f64, n: ti.i32) -> ti.f64:
        return x ** n + ti.sin(x * n)

    tt.check_grads(powered, (np.array([0.3, 1.2]), np.array([2, 3], dtype=np.int32)), order=2)


def test_check_grads_catches_wrong_forward_mode():
    message = fails(tt.check_grads, Skewed(FIELD_OF, jvp_factor=1.5), (X, S), order=1)
    assert "forward mode (jacfwd) disagrees with reverse mode (jacrev)" in message
    assert "argument 'x' (argnums 0)" in message or "argument 's' (argnums 1)" in message
    assert "worst entry: batch element (" in message and "d out[" in message
    assert "jacfwd:" in message and "jacrev:" in message and "abs error" in message and "rel error" in message
    # the other checks pin the culprit: forward fails against central differences, reverse passes
    assert "forward mode (jacfwd) disagrees with central differences" in message
    assert "passing checks: " in message and "reverse mode (jacrev) vs central differences" in message


def test_check_grads_catches_wrong_reverse_mode():
    message = fails(tt.check_grads, Skewed(FIELD_OF, vjp_factor=0.5), (X, S), order=1)
    assert "reverse mode (jacrev)" in message
    assert "forward mode (jacfwd) vs central differences" in message.split("passing checks: ")[1]


def test_check_grads_values_in_the_message_are_the_worst_entry():
    wrong = Skewed(FIELD_OF, jvp_factor=1.5)
    message = fails(tt.check_grads, wrong, (X, S), order=1, modes=("fwd",))
    good = td.jacfwd(field_of, (0, 1))(X, S)
    shown = float(message.split("jacfwd:")[1].split()[0])
    assert any(np.isclose(shown, 1.5 * g).any() for g in good)


def test_check_grads_catches_consistent_but_wrong_derivatives():
    # forward and reverse both 1.5x: the dot-product test passes, central differences do not
    message = fails(tt.check_grads, Skewed(FIELD_OF, jvp_factor=1.5, vjp_factor=1.5), (X, S), order=1)
    assert "disagrees with central differences" in message
    assert "dot-product test <u, vjp(v)> == <jvp(u), v>" in message.split("passing checks: ")[1]
    assert "forward mode (jacfwd) vs reverse mode (jacrev)" in message.split("passing checks: ")[1]


def test_check_grads_catches_a_wrong_custom_rule():
    message = fails(tt.check_grads, bad_sin, (np.array([0.1, 0.5, 1.0]),), order=1)
    assert "disagrees with central differences" in message
    assert "forward mode (jacfwd) vs reverse mode (jacrev)" in message  # they agree: the rule is wrong


def test_check_grads_catches_a_wrong_second_derivative():
    args = (np.array([0.2, 0.9]), np.array([1.5, -2.0]))
    tt.check_grads(uses_flat_sin, args, order=1)
    message = fails(tt.check_grads, uses_flat_sin, args, order=2)
    assert message.startswith("check_grads(order 2, on grad(uses_flat_sin, argnums=(0, 1)))")
    assert "disagrees with central differences" in message
    assert "output 'dout_dx (output 0)'" in message  # d/dx of the gradient's x entry


@pytest.mark.parametrize(
    "wrong, expected",
    [
        (Skewed(FIELD_OF, jvp_factor=1.5), "forward mode (jvp) disagrees with central differences"),
        (Skewed(FIELD_OF, vjp_factor=1.5), "reverse mode (vjp) disagrees with central differences"),
        (Skewed(FIELD_OF, jvp_factor=1.5, vjp_factor=1.5), "disagrees with central differences"),
    ],
    ids=["fwd", "rev", "both"],
)
def test_fast_check_grads_catches_wrong_derivatives(wrong, expected):
    message = fails(tt.check_grads, wrong, (X, S), order=1, fast=True)
    assert expected in message
    assert "<u, vjp(v)>:" in message or "<jvp(u), v>:" in message
    assert "allowed |a - b| <= atol + rtol * s" in message


def test_fast_check_grads_dot_product_test_catches_a_mismatch_alone():
    # a tiny skew hides below the central-difference tolerance; the exact dot-product test sees it
    message = fails(tt.check_grads, Skewed(FIELD_OF, vjp_factor=1 + 1e-7), (X, S), order=1, fast=True)
    assert message.split("\n")[0].endswith("dot-product test <u, vjp(v)> == <jvp(u), v> fails")


def test_fast_check_grads_scales_to_a_big_batch():
    row = ROW_BY_NAME["vector"]
    rng = np.random.default_rng(3)
    tt.check_grads(row.func, (rng.uniform(-2, 2, (100_000, 3)), rng.uniform(-2, 2, (100_000,))), order=2, fast=True)


def test_check_grads_leaves_inputs_unchanged():
    x, s = X.copy(), S.copy()
    tt.check_grads(field_of, (x, s), order=1)
    np.testing.assert_array_equal(x, X)
    np.testing.assert_array_equal(s, S)


def test_check_grads_one_mode():
    tt.check_grads(field_of, (X, S), order=2, modes=("rev",), fast=True)
    tt.check_grads(field_of, (X, S), order=2, modes="fwd", fast=True)
    assert "forward mode" in fails(tt.check_grads, Skewed(FIELD_OF, jvp_factor=2.0), (X, S), order=1, modes="fwd")


def test_check_grads_refuses_bad_requests():
    with pytest.raises(ValueError, match="modes"):
        tt.check_grads(field_of, (X, S), modes=("sideways",))
    with pytest.raises(ValueError, match="order"):
        tt.check_grads(field_of, (X, S), order=0)

    @ti.func
    def single(x: ti.f32) -> ti.f32:
        return x * x

    with pytest.raises(TypeError, match=r"single annotates 'x' with a float32 \(or float16\) scalar type, so it "
                                        r"computes in that precision whatever the values"):
        tt.check_grads(single, (np.float32(1.0),))

    @ti.func
    def double(x: ti.f64) -> ti.f64:
        return x * x * x

    # float32 data is checked on a float64 copy, and the warning says so (issue 35, item 17: it raised)
    with pytest.warns(UserWarning, match=r"arguments \[0\] \(argnums\) checked on float64 copies"):
        tt.check_grads(double, (np.float32(1.5),))
    with pytest.warns(UserWarning, match="float64 copies"):
        tt.check_against_torch(double, lambda x: x ** 3, (torch.tensor([0.5, 2.0], dtype=torch.float32),))

    @ti.func
    def counting(n: ti.i32) -> ti.f64:
        return n * 1.0

    with pytest.raises(TypeError, match="no float arguments"):
        tt.check_grads(counting, (np.int32(3),))


# -- field programs ---------------------------------------------------------------------------

fx = ti.field(ti.f64, shape=4)
fw = ti.field(ti.f64, shape=())
floss = ti.field(ti.f64, shape=())


@ti.kernel
def field_energy():
    for i in fx:
        floss[None] += fw[None] * ti.sin(fx[i]) ** 2


ENERGY = td.function(field_energy, inputs=[fx, fw], outputs=[floss])
ENERGY_ARGS = (np.linspace(-1.0, 1.0, 4), 2.0)


def torch_energy(x, w):
    return (w * torch.sin(x) ** 2).sum()


def test_field_program_first_order():
    tt.check_grads(ENERGY, ENERGY_ARGS, order=1)
    tt.check_grads(ENERGY, ENERGY_ARGS, order=1, fast=True)
    tt.check_against_torch(ENERGY, torch_energy, ENERGY_ARGS, order=1)


def test_field_program_second_order():
    tt.check_grads(ENERGY, ENERGY_ARGS, order=2)
    tt.check_grads(ENERGY, ENERGY_ARGS, order=2, fast=True)
    tt.check_against_torch(ENERGY, torch_energy, ENERGY_ARGS, order=2)


# -- check_against_torch ------------------------------------------------------------------------

@pytest.mark.parametrize("name, order", [("arith", 2), ("while_loop", 2), ("vector", 2),
                                         ("matmul", 1), ("norms", 1)])
def test_check_against_torch_passes_on_op_table_rows(name, order):
    row = ROW_BY_NAME[name]
    rng = np.random.default_rng(0)
    args = tuple(rng.uniform(row.low, row.high, size=(2,) + shape) for shape in row.shapes)
    tt.check_against_torch(row.func, row.torch_fn, args, order=order)


def test_check_against_torch_broadcast_and_tuple_outputs():
    @ti.func
    def pair(x: vec3, s: ti.f64):
        return x * ti.exp(s), x.dot(x) * s

    x = np.random.default_rng(1).uniform(-1, 1, (3, 1, 3))
    s = np.array([0.5, -0.2])
    tt.check_against_torch(pair, lambda x, s: (x * torch.exp(s), x.dot(x) * s), (x, s), order=1)


def test_check_against_torch_catches_a_wrong_rule():
    message = fails(tt.check_against_torch, bad_sin, torch.sin, (np.array([0.1, 0.5, 1.0]),), order=1)
    assert "disagrees with torch.autograd.functional" in message
    assert "torch:" in message and "worst entry: batch element (" in message


def test_check_against_torch_catches_a_wrong_hessian():
    args = (np.array([0.2, 0.9]), np.array([1.5, -2.0]))
    tt.check_against_torch(uses_flat_sin, lambda x, y: torch.sin(x) * y, args, order=1)
    message = fails(tt.check_against_torch, uses_flat_sin, lambda x, y: torch.sin(x) * y, args, order=2)
    assert "td.hessian disagrees with torch.autograd.functional.hessian" in message
    assert "td.hvp disagrees with torch's Hessian times the tangents" in message
    assert "worst entry: batch element (" in message


def test_check_against_torch_catches_wrong_vector_derivatives():
    message = fails(tt.check_against_torch, Skewed(FIELD_OF, vjp_factor=2.0), torch_field_of, (X, S), order=1)
    assert "td.jacrev disagrees with torch.autograd.functional.jacobian" in message
    assert "td.jacfwd vs torch.autograd.functional.jacobian" in message.split("passing checks: ")[1]


def test_check_against_torch_reports_a_wrong_reference_value_first():
    message = fails(tt.check_against_torch, field_of, lambda x, s: torch.sin(x) * s, (X, S), order=1)
    assert message.split("\n")[0].endswith("value disagrees with torch_f")


# -- strategies ---------------------------------------------------------------------------------

@given(args=tt.arguments(field_of, elements=st.floats(-1.5, 1.5)))
@settings(max_examples=15)
def test_arguments_draw_valid_broadcastable_arrays(args):
    x, s = args
    assert x.shape[-1:] == (3,) and x.dtype == np.float64 and s.dtype == np.float64
    batch = np.broadcast_shapes(x.shape[:-1], s.shape)  # raises if they did not broadcast
    assert len(batch) <= 2
    assert np.all(np.abs(x) <= 1.5)
    out = td.function(field_of)(x, s)
    assert out.shape == batch + (3,)


@given(args=tt.arguments(ROW_BY_NAME["matmul"].func, batch_shapes=tt.batch_shapes(max_dims=2, max_side=3)))
@settings(max_examples=10)
def test_check_grads_on_drawn_arguments(args):
    tt.check_grads(ROW_BY_NAME["matmul"].func, args, order=1)
    tt.check_grads(ROW_BY_NAME["matmul"].func, args, order=1, fast=True)


@given(args=tt.arguments(ROW_BY_NAME["arith"].func))
@settings(max_examples=10)
def test_check_grads_second_order_on_drawn_arguments(args):
    tt.check_grads(ROW_BY_NAME["arith"].func, args, order=2)


@given(args=tt.arguments(ROW_BY_NAME["real_pow"].func, elements=st.floats(0.5, 2.0),
                         batch_shapes=tt.batch_shapes(max_side=2)))
@settings(max_examples=5)
def test_check_against_torch_on_drawn_arguments(args):
    row = ROW_BY_NAME["real_pow"]
    tt.check_against_torch(row.func, row.torch_fn, args, order=2)


SLIGHTLY_WRONG = Skewed(FIELD_OF, jvp_factor=1.001)


@given(args=tt.arguments(SLIGHTLY_WRONG))
@settings(max_examples=10)
def test_fast_check_catches_a_small_skew_on_every_drawn_argument(args):
    if not np.any(args[0]) and not np.any(args[1]):
        return  # f'(0) = 0 can hide a factor
    with pytest.raises(AssertionError, match="disagrees"):
        tt.check_grads(SLIGHTLY_WRONG, args, order=1, fast=True)


@given(args=tt.arguments(ROW_BY_NAME["branch"].func, integers={}, elements={"x": st.floats(0.1, 2.0)}))
@settings(max_examples=10)
def test_arguments_take_elements_per_argument(args):
    x, y = args
    assert np.all(x >= 0.1) and np.all(np.abs(y) <= 2.0)


@given(args=tt.arguments(ROW_BY_NAME["for_loop"].func, batch_shapes=st.just(())))
@settings(max_examples=5)
def test_arguments_without_batch(args):
    assert args[0].shape == ()


@ti.func
def unannotated(x, n):
    return x * n


def test_arguments_need_a_signature_without_annotations():
    with pytest.raises(TypeError, match="signature"):
        tt.arguments(unannotated)

    @given(tt.arguments(unannotated, signature=[(2,), ti.i32]))
    @settings(max_examples=5)
    def drawn(args):
        assert args[0].shape[-1:] == (2,) and args[0].dtype == np.float64
        assert args[1].dtype == np.int32

    drawn()


@given(args=tt.arguments(ENERGY))
@settings(max_examples=5)
def test_arguments_for_field_programs_have_the_fields_shapes(args):
    assert args[0].shape == (4,) and args[1].shape == ()


@given(tt.batch_shapes(min_dims=1, max_dims=3, max_side=2))
def test_batch_shapes(shape):
    assert 1 <= len(shape) <= 3 and all(1 <= n <= 2 for n in shape)
