"""td.source shows readable generated code; pinned by a golden test."""
import pytest
import taichi as ti

import tidiff as td


@ti.func
def cubic(x):
    return x**3 + 2 * x**2 - 3 * x + 1


GOLDEN_GRAD_CUBIC = '''\
@ti.func
def grad_cubic(x):
    t_0 = cubic_jvp(x, ti.cast(1.0, ti.f64))
    J_0_0 = t_0[1]
    return J_0_0

@ti.func
def cubic_jvp(x, dx):
    pow = x ** 3
    dpow = 3 * x ** 2 * dx
    pow_1 = x ** 2
    dpow_1 = 2 * x * dx
    mul = 2 * pow_1
    dmul = 2 * dpow_1
    add = pow + mul
    dadd = dpow + dmul
    mul_1 = 3 * x
    dmul_1 = 3 * dx
    sub = add - mul_1
    dsub = dadd - dmul_1
    return (sub + 1, dsub)
'''


def test_golden_grad_source():
    assert td.source(td.grad(cubic), 1.0) == GOLDEN_GRAD_CUBIC


@ti.func
def energy(x: ti.math.vec3, s: ti.f64) -> ti.f64:
    return s * x.dot(x) + ti.sin(x[0])


def test_hessian_source_names_every_generated_function():
    text = td.source(td.hessian(energy))  # forward over reverse, widened to 3 lanes
    for name in ("def jacfwd_jacrev_energy(", "def jacrev_energy(", "def energy_vjp(", "def jacrev_energy_jvp3(",
                 "def energy_vjp_jvp3("):
        assert name in text
    assert "dx" in text and "ct_x" in text


def test_source_refuses_user_code_and_missing_examples():
    with pytest.raises(TypeError, match="example arguments"):
        td.source(td.grad(cubic))
    with pytest.raises(TypeError, match="not generated"):
        td.source(energy)
