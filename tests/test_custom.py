"""td.custom_jvp and td.stop_gradient are honoured by every transform, host and device."""
import numpy as np
import pytest
import taichi as ti

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


def test_vjp_rule_used_by_every_transform():
    x, k = np.array([0.3, -0.4]), 2.0
    rule = 3.0 * x
    np.testing.assert_allclose(td.grad(scaled_square)(x, k), rule, rtol=1e-15)
    np.testing.assert_allclose(td.jacfwd(scaled_square)(x, k), rule, rtol=1e-15)
    _, tangent = td.jvp(scaled_square, (x, k), (np.array([1.0, 2.0]), 0.5))
    assert tangent == pytest.approx(rule @ [1.0, 2.0] + 0.5 * x @ x, rel=1e-15)
    np.testing.assert_allclose(td.hessian(scaled_square)(x, k), 3.0 * np.eye(2), rtol=1e-15)
    inner = 2.0 * x @ x
    np.testing.assert_allclose(td.grad(calls_scaled_square)(x), np.cos(inner) * rule, rtol=1e-14)
    np.testing.assert_allclose(td.jacfwd(calls_scaled_square)(x), np.cos(inner) * rule, rtol=1e-14)


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

    with pytest.raises(TypeError, match="annotated"):
        td.custom_vjp(unannotated).defvjp(bad_bwd)
