"""td.custom_jvp, td.custom_vjp and td.stop_gradient are honoured by every transform, host and device."""
import numpy as np
import pytest
import taichi as ti
from custom_functions import clip_gradient, ten_clipped

import tidiff as td


@td.custom_jvp
@ti.func
def soft(x):
    return ti.sin(x)


@soft.defjvp
@ti.func
def soft_jvp(x, dx):
    return ti.sin(x), 10.0 * x * dx  # deliberately not cos(x): only the rule gives these numbers


@ti.func
def uses_soft(x: ti.f64, y: ti.f64) -> ti.f64:
    return y * soft(x)


@ti.func
def blocked(x: ti.f64) -> ti.f64:
    return x * td.stop_gradient(x * x)


d_uses_soft = td.grad(uses_soft, argnums=(0, 1))


@ti.kernel
def rule_in_kernel(x: ti.f64, y: ti.f64) -> ti.types.vector(2, ti.f64):
    g = d_uses_soft(x, y)
    return ti.Vector([g[0], g[1]])


def test_rule_used_by_every_transform():
    x, y = 0.7, 3.0
    expected_dx = y * 10.0 * x
    assert td.grad(soft)(x) == pytest.approx(10.0 * x, rel=1e-14)
    gx, gy = td.grad(uses_soft, argnums=(0, 1))(x, y)
    assert gx == pytest.approx(expected_dx, rel=1e-14) and gy == pytest.approx(np.sin(x), rel=1e-14)
    assert td.jacfwd(uses_soft)(x, y) == pytest.approx(expected_dx, rel=1e-14)
    assert td.jacrev(uses_soft)(x, y) == pytest.approx(expected_dx, rel=1e-14)
    _, vjp_fn = td.vjp(uses_soft, np.full(4, x), y)
    np.testing.assert_allclose(vjp_fn(np.ones(4))[0], np.full(4, expected_dx), rtol=1e-14)
    assert td.hessian(uses_soft)(x, y) == pytest.approx(10.0 * y, rel=1e-14)
    np.testing.assert_allclose(rule_in_kernel(x, y).to_numpy(), [expected_dx, np.sin(x)], rtol=1e-14)


def test_custom_function_evaluates_the_function_itself():
    np.testing.assert_allclose(td.function(soft)(np.array([0.1, 0.2])), np.sin([0.1, 0.2]), rtol=1e-15)


def test_rule_must_be_a_taichi_func_and_must_exist():
    @td.custom_jvp
    @ti.func
    def bare(x):
        return x

    with pytest.raises(TypeError, match="defjvp"):
        td.grad(bare)(1.0)
    with pytest.raises(TypeError, match="@ti.func"):
        bare.defjvp(lambda x, dx: (x, dx))
    with pytest.raises(TypeError, match=r"bare.defvjp: bare is a td.custom_jvp function.*td.custom_vjp"):
        bare.defvjp(soft_jvp)  # JAX's custom_jvp has no defvjp either
    assert bare.bwd is None


def test_stop_gradient_blocks_forward_and_reverse():
    # d/dx [x * sg(x^2)] = x^2 (the stopped factor is a constant)
    assert td.grad(blocked)(3.0) == 9.0
    assert td.jacfwd(blocked)(3.0) == 9.0
    assert td.hessian(blocked)(3.0) == 0.0


@td.custom_vjp
@ti.func
def scaled_square(x: ti.math.vec2, k: ti.f64) -> ti.f64:
    return k * x.norm_sqr()


@scaled_square.defvjp
@ti.func
def scaled_square_bwd(x, k, ct):
    return (ct * 3.0 * x, ct * x.norm_sqr())  # deliberately 3x, not 2kx: only the rule gives it


@ti.func
def calls_scaled_square(x: ti.math.vec2) -> ti.f64:
    return ti.sin(scaled_square(x, 2.0))


def test_vjp_rule_used_by_every_reverse_transform():
    x, k = np.array([0.3, -0.4]), 2.0
    rule = 3.0 * x
    np.testing.assert_allclose(td.grad(scaled_square)(x, k), rule, rtol=1e-15)
    np.testing.assert_allclose(td.jacrev(scaled_square)(x, k), rule, rtol=1e-15)
    _, vjp_fn = td.vjp(scaled_square, x, k)
    gx, gk = vjp_fn(np.array(0.5))
    np.testing.assert_allclose(gx, 0.5 * rule, rtol=1e-15)
    assert gk == pytest.approx(0.5 * x @ x, rel=1e-15)
    inner = 2.0 * x @ x
    np.testing.assert_allclose(td.grad(calls_scaled_square)(x), np.cos(inner) * rule, rtol=1e-14)
    # reverse over reverse differentiates bwd's own code: d/dx (3 x) = 3 I
    np.testing.assert_allclose(td.jacrev(td.grad(scaled_square))(x, k), 3.0 * np.eye(2), rtol=1e-15)


def test_forward_mode_of_a_vjp_rule_is_an_error_as_in_jax():
    x, k = np.array([0.3, -0.4]), 2.0
    for call in (lambda: td.jacfwd(scaled_square)(x, k),
                 lambda: td.jvp(scaled_square, (x, k), (x, 0.0)),
                 lambda: td.jacfwd(calls_scaled_square)(x)):
        with pytest.raises(td.TransformError, match=r"scaled_square.*custom_vjp function without a jvp rule"):
            call()


@ti.func
def through_a_helper(x: ti.math.vec2) -> ti.f64:
    return calls_scaled_square(x) * 1.0


def test_second_order_differentiates_the_primal_code_and_the_rule_as_jax():
    """hessian = jacfwd(jacrev(f)): the gradient's code (the bwd rule, and the value from the function's own
    code, as JAX's comes from its fwd rule) is pushed forward. JAX 0.4 gives the same matrix for this rule
    (checked when written): [[2.1149681, 0.69037278], [0.69037278, 1.71225065]] at x = (0.3, -0.4)."""
    x = np.array([0.3, -0.4])
    inner = 2.0 * x @ x
    # grad = cos(s(x)) * 3x with s = 2|x|^2 (the rule's 3x, not 4x); its Jacobian uses ds/dx = 4x from s's code
    want = 3.0 * np.cos(inner) * np.eye(2) - 3.0 * np.sin(inner) * 4.0 * np.outer(x, x)
    np.testing.assert_allclose(td.hessian(calls_scaled_square)(x), want, rtol=1e-14)
    np.testing.assert_allclose(td.jacfwd(td.grad(calls_scaled_square))(x), want, rtol=1e-14)
    np.testing.assert_allclose(td.jacrev(td.grad(calls_scaled_square))(x), want, rtol=1e-14)
    np.testing.assert_allclose(td.hvp(calls_scaled_square, (x,), (np.array([1.0, 2.0]),))[1][0],
                               want @ np.array([1.0, 2.0]), rtol=1e-14)
    np.testing.assert_allclose(td.hessian(through_a_helper)(x), want, rtol=1e-14)  # reached through a helper
    with pytest.raises(td.TransformError, match="custom_vjp function without a jvp rule"):
        td.jvp(through_a_helper, (x,), (x,))  # forward mode of the function itself still refuses


@ti.func
def scaled_by_a_rule_of_y(x: ti.f64, y: ti.f64) -> ti.f64:
    """x times a custom_vjp function of y alone: forward mode by x does not reach the rule, by y it does."""
    return x * scaled_square(ti.math.vec2(y, 1.0), 2.0)


def test_forward_mode_over_a_jacobian_by_an_argument_the_rule_does_not_see():
    """``td.jacfwd(td.jacrev(f, argnums=0), argnums=1)`` with f's custom_vjp function (no jvp rule) taking y alone
    (long run, seed 20133). td.jacrev by x, one input component and one output, was built on f's tangent
    function, which forward mode by y cannot take (a TransformError), while with x of three components it was
    built on the reverse function and gave a number. Now always on the reverse function, whose code forward mode
    takes (NOTE: [Forward mode of a gradient's code]): d/dy of the value's code 2 (y^2 + 1) is 4y, not the rule's
    3y. (JAX refuses this composition: its jvp meets the custom_vjp function outside the inner vjp.) Reverse over
    reverse uses the rule, as JAX: 3y."""
    x, y = 0.7, -0.4
    for inner in (td.grad, td.jacrev, td.jacobian):
        got = td.jacfwd(inner(scaled_by_a_rule_of_y, argnums=0), argnums=1)(x, y)
        assert got == pytest.approx(4.0 * y, rel=1e-14), inner
        assert td.jacrev(inner(scaled_by_a_rule_of_y, argnums=0), argnums=1)(x, y) == pytest.approx(3.0 * y, rel=1e-14)
    with pytest.raises(td.TransformError, match="custom_vjp function without a jvp rule"):
        td.jacfwd(td.jacfwd(scaled_by_a_rule_of_y, argnums=0), argnums=1)(x, y)  # jacfwd is forward mode, as asked


@ti.func
def squared_by_a_rule_of_y(x: ti.f64, y: ti.f64) -> ti.f64:
    return x * x * scaled_square(ti.math.vec2(y, 1.0), 2.0)


def test_forward_mode_over_a_hessian_by_an_argument_the_rule_does_not_see():
    """The third order of the same: ``td.jacfwd(td.hessian(f, argnums=0), argnums=1)`` (long run, seed 34308).
    The hessian's pushes by x are a tangent function of the reverse function; the push by y over them reached
    the custom_vjp call the reverse function keeps as written (its arguments do not depend on x) and refused.
    Now that tangent function's own tangent goes through the code too: d/dy of 2 * 2 (y^2 + 1) is 8y. Reverse
    mode over it takes the rule, as above: 2 * 3y."""
    x, y = 0.7, -0.4
    for inner in (td.hessian(squared_by_a_rule_of_y, argnums=0),
                  td.jacfwd(td.grad(squared_by_a_rule_of_y, argnums=0), argnums=0),
                  td.jacfwd(td.jacrev(squared_by_a_rule_of_y, argnums=0), argnums=0)):
        assert td.jacfwd(inner, argnums=1)(x, y) == pytest.approx(8.0 * y, rel=1e-14)
        assert td.jacrev(inner, argnums=1)(x, y) == pytest.approx(6.0 * y, rel=1e-14)


@ti.func
def clipped_in_a_loop(x: ti.f64) -> ti.f64:
    out = 0.0
    i = 0
    while i < 2:  # reversed: the rule sees the real cotangent (3, clipped to 1) in each iteration
        out += 3.0 * clip_gradient(x)
        i += 1
    return out


@ti.func
def clipped_until_a_break(x: ti.f64) -> ti.f64:
    out = 0.0
    for _ in range(2):
        out += clip_gradient(x)
        if out > 10.0:
            break  # a flag to the reverse transform (NOTE: [Break as a flag])
    return out


def test_vjp_rule_sees_the_real_cotangent():
    """JAX's clip_gradient: the rule clips the incoming cotangent, so only the real one gives these."""
    assert td.grad(ten_clipped)(2.0) == 1.0
    assert td.grad(clip_gradient)(2.0) == 1.0
    _, vjp_fn = td.vjp(clip_gradient, 1.0)
    assert vjp_fn(5.0) == (1.0,)
    assert vjp_fn(-0.25) == (-0.25,)
    _, vjp_fn = td.vjp(clip_gradient, np.array([1.0, 2.0]))
    np.testing.assert_array_equal(vjp_fn(np.array([3.0, 0.5]))[0], [1.0, 0.5])
    _, vjp_fn = td.vjp(ten_clipped, np.array([1.0, 2.0]))
    np.testing.assert_array_equal(vjp_fn(np.array([0.01, -1.0]))[0], [0.1, -1.0])


def test_vjp_rule_in_the_torch_backward():
    import torch

    op = td.torch.function(clip_gradient)
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    op(x).backward(torch.tensor([5.0, -0.5], dtype=torch.float64))
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, -0.5])


def test_a_vjp_rule_in_a_loop_that_breaks_is_reversed():
    """Forward mode is impossible (the rule has no jvp rule): the loop with a break is reversed, and the
    rule sees the real cotangent (1) once per iteration that ran: twice, or once where the loop broke."""
    assert td.grad(clipped_in_a_loop)(1.0) == 2.0
    np.testing.assert_array_equal(td.grad(clipped_until_a_break)(np.array([1.0, 6.0, 11.0])), [2.0, 2.0, 1.0])


@td.custom_vjp
@ti.func
def polar(p: ti.math.vec2):
    return p.norm(), ti.atan2(p[1], p[0])


@polar.defvjp
@ti.func
def polar_bwd(p, ct_r, ct_theta):
    r2 = p.dot(p)
    return (ct_r * p / ti.sqrt(r2) + ct_theta * ti.Vector([-p[1], p[0]]) / r2,)


@ti.func
def uses_polar(p: ti.math.vec2) -> ti.f64:
    r, theta = polar(p)
    return r * r + 3.0 * theta


def test_vjp_rule_with_several_outputs_unpacked_by_the_caller():
    p = np.array([0.6, -0.8])
    r2 = p @ p
    expected = 2.0 * p + 3.0 * np.array([-p[1], p[0]]) / r2
    np.testing.assert_allclose(td.grad(uses_polar)(p), expected, rtol=1e-14)
    _, vjp_fn = td.vjp(polar, p)
    np.testing.assert_allclose(vjp_fn((2.0, 0.5))[0], 2.0 * p / np.sqrt(r2) + 0.5 * np.array([-p[1], p[0]]) / r2,
                               rtol=1e-14)


@td.custom_vjp
@ti.func
def both_rules(x: ti.f64) -> ti.f64:
    return ti.sin(x)


@both_rules.defvjp
@ti.func
def both_rules_bwd(x, ct):
    return (ct * 7.0,)


@both_rules.defjvp
@ti.func
def both_rules_jvp(x, dx):
    return ti.sin(x), 5.0 * dx


def test_a_function_with_both_rules_uses_each_in_its_mode():
    assert td.grad(both_rules)(0.3) == 7.0
    assert td.jacrev(both_rules)(0.3) == 7.0
    assert td.jacfwd(both_rules)(0.3) == 5.0
    assert td.jvp(both_rules, (0.3,), (2.0,))[1] == 10.0


@td.custom_vjp
@ti.func
def clip_between(lo: ti.f64, hi: ti.f64, x: ti.f64) -> ti.f64:
    return x


@clip_between.defvjp
@ti.func
def clip_between_bwd(lo, hi, x, g):
    return (None, None, ti.math.clamp(g, lo, hi))  # JAX's tutorial as written: None is a zero cotangent


@ti.func
def clipped_square(lo: ti.f64, hi: ti.f64, x: ti.f64) -> ti.f64:
    return clip_between(lo, hi, x * x)


def test_a_vjp_rule_may_return_none_for_a_zero_cotangent():
    assert td.grad(clip_between, argnums=(0, 1, 2))(-0.5, 0.5, 3.0) == (0.0, 0.0, 0.5)
    # inside a function: d/dx clip(x^2) with cotangent 1 is clamp(1, lo, hi) * 2x
    x = np.array([0.5, 1.5, -2.0])
    got = td.grad(clipped_square, argnums=(0, 1, 2))(-0.5, 0.25, x)
    np.testing.assert_array_equal(got[2], 0.25 * 2 * x)
    np.testing.assert_array_equal(got[0], 0.0)
    _, vjp_fn = td.vjp(clipped_square, -0.5, 0.25, x)
    np.testing.assert_array_equal(vjp_fn(np.array([-4.0, 0.1, 1.0]))[2], np.array([-0.5, 0.1, 0.25]) * 2 * x)


def test_vjp_rule_must_return_one_cotangent_per_primal():
    @td.custom_vjp
    @ti.func
    def two(x: ti.math.vec2, k: ti.f64) -> ti.f64:
        return k * x.sum()

    @ti.func
    def bad_bwd(x, k, ct):
        return ct * x  # not a tuple

    with pytest.raises(TypeError, match="tuple with one cotangent per primal"):
        two.defvjp(bad_bwd)

    @ti.func
    def unannotated(x):
        return x

    @ti.func
    def untupled_bwd(x, ct):
        return ct  # not a tuple

    f = td.custom_vjp(unannotated)
    f.defvjp(untupled_bwd)  # without annotations: checked as the call compiles
    with pytest.raises(TypeError, match="must return a tuple with one cotangent per primal"):
        td.grad(f)(1.0)


@td.custom_jvp
@ti.func
def doubled(x: ti.types.vector(2, ti.f64)) -> ti.types.vector(2, ti.f64):
    return 2.0 * x


@doubled.defjvp
@ti.func
def doubled_scalar_tangent(x, dx):
    return 2.0 * x, 2.0 * dx[0]  # a scalar tangent for a vec2 output


@td.custom_jvp
@ti.func
def halved(x):
    return 0.5 * x


@halved.defjvp
@ti.func
def halved_no_tangent(x, dx):
    return 0.5 * x


@ti.func
def calls_doubled(x: ti.types.vector(2, ti.f64)) -> ti.f64:
    return doubled(x).sum()


def test_a_jvp_rule_of_the_wrong_shape_is_a_type_error_naming_it():
    """Issue 35, item 6: td.jvp broadcast the scalar tangent silently, jacfwd/jacrev failed with Taichi's bare
    AssertionError. Now every transform, and a function calling the rule's function, names the rule."""
    x = np.array([1.0, 2.0])
    calls = [lambda: td.jvp(doubled, (x,), (x,)), lambda: td.jacfwd(doubled)(x), lambda: td.jacrev(doubled)(x),
             lambda: td.grad(calls_doubled)(x)]
    for call in calls:
        with pytest.raises(TypeError, match=r"the jvp rule `doubled_scalar_tangent` of `doubled` returned a tangent "
                                            r"of a scalar for an output of shape \(2,\)"):
            call()
    with pytest.raises(TypeError, match=r"the jvp rule `halved_no_tangent` of `halved` must return a pair"):
        td.jvp(halved, (x,), (x,))


@td.custom_vjp
@ti.func
def clip_gradient_unannotated(lo, hi, x):
    return x


@clip_gradient_unannotated.defvjp
@ti.func
def clip_gradient_unannotated_bwd(lo, hi, x, g):
    return (None, None, ti.math.clamp(g, lo, hi))  # JAX's tutorial, without annotations


@ti.func
def ten_sines_clipped(x: ti.f64) -> ti.f64:
    return 10.0 * clip_gradient_unannotated(-1.0, 1.0, ti.sin(x)) + x * x


@td.custom_vjp
@ti.func
def square_norm(x):
    return x.dot(x)


@square_norm.defvjp
@ti.func
def square_norm_bwd(x, g):
    return (2.0 * g * x,)


@ti.func
def cubic(x: ti.types.vector(3, ti.f64)) -> ti.f64:
    return square_norm(x) * x[0]


def test_a_vjp_rule_of_a_function_without_annotations():
    """Issue 35, item 9: td.custom_vjp of a function without annotations was refused; its shapes come at the call,
    as for other functions, and the rule is checked as each call compiles."""
    assert td.grad(clip_gradient_unannotated, argnums=(0, 1, 2))(-0.5, 0.5, 3.0) == (0.0, 0.0, 0.5)
    x = np.array([0.3, 2.0])
    np.testing.assert_allclose(td.grad(ten_sines_clipped)(x), np.cos(x) + 2 * x, rtol=1e-15)  # 10 clipped to 1
    v = np.array([0.3, 0.4, 0.5])
    np.testing.assert_allclose(td.grad(cubic)(v), 2 * v * v[0] + np.eye(3)[0] * v.dot(v), rtol=1e-15)
    hessian = 2 * v[0] * np.eye(3) + 2 * (np.outer(v, np.eye(3)[0]) + np.outer(np.eye(3)[0], v))
    np.testing.assert_allclose(td.hessian(cubic)(v), hessian, rtol=1e-14)  # reverse of the rule's own code


def test_a_vjp_rule_without_annotations_is_checked_as_it_compiles():
    @td.custom_vjp
    @ti.func
    def norm_squared(x):
        return x.dot(x)

    @norm_squared.defvjp
    @ti.func
    def scalar_cotangent(x, g):
        return (2.0 * g,)

    with pytest.raises(TypeError, match=r"the bwd rule `scalar_cotangent` of `norm_squared` returned a cotangent of a "
                                        r"scalar for primal 0, of shape \(3,\)"):
        td.grad(norm_squared)(np.array([0.3, 0.4, 0.5]))

    @td.custom_vjp
    @ti.func
    def pick(c, x):
        return x

    @ti.func
    def nones_disagree(c, x, g):
        if c > 0:
            return (None, g)
        return (g, g)

    with pytest.raises(TypeError, match=r"returns None \(a zero cotangent\) at different positions"):
        pick.defvjp(nones_disagree)
