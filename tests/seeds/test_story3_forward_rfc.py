"""User story 3 (forward-mode RFC): ``dfdx = td.grad(p)`` on the host and in a kernel; the
three-input field version; forward and reverse mode agree."""
import numpy as np
import taichi as ti

import tidiff as td


@ti.func
def p(x):
    return x**3 + 2 * x**2 - 3 * x + 1


dfdx = td.grad(p)


@ti.kernel
def slope_in_kernel() -> ti.f64:
    return dfdx(1.0)


def test_grad_of_polynomial_host_and_kernel():
    assert dfdx(1.0) == 4.0
    assert slope_in_kernel() == 4.0
    _, tangent = td.jvp(p, (1.0,), (1.0,))
    assert tangent == 4.0


x1 = ti.field(ti.f64, shape=())
x2 = ti.field(ti.f64, shape=())
x3 = ti.field(ti.f64, shape=())
y = ti.field(ti.f64, shape=())


@ti.kernel
def three_inputs():
    y[None] += x1[None] ** 3 + 2 * x2[None] ** 2 - 3 * x3[None] + 1


def test_three_input_field_program_both_modes():
    f = td.function(three_inputs, inputs=[x1, x2, x3], outputs=[y])
    rev = td.grad(f, argnums=(0, 1, 2))(1.0, 2.0, 3.0)
    fwd = td.jacfwd(f, argnums=(0, 1, 2))(1.0, 2.0, 3.0)
    np.testing.assert_array_equal(rev, (3.0, 8.0, -3.0))
    np.testing.assert_array_equal(fwd, (3.0, 8.0, -3.0))
    assert f(1.0, 2.0, 3.0) == 1 + 8 - 9 + 1
    # twice in a row: no stale gradients, no accumulated outputs
    np.testing.assert_array_equal(td.grad(f, argnums=(0, 1, 2))(1.0, 2.0, 3.0), (3.0, 8.0, -3.0))
    assert f(1.0, 2.0, 3.0) == 1.0
