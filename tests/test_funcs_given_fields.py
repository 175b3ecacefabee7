"""Forward mode through @ti.funcs given fields as ti.template() arguments (issue 34, item 4).

Before: a @ti.func writing into a field passed to it (``write(y, i, v)`` with
``out[i] = v * v`` inside) lost its tangent writes: td.jvp, td.jacfwd and the
field program's td.hvp gave 0 where reverse mode was right, without an
error. Its tangent func now takes the tangent field of each such argument
beside it. And tidiff's adjoint of a kernel passing a field to a func that
only reads it (``loss[None] += read_cube(x, i)``) took the call for a
constant and gave 0: such kernels are left to Taichi's kernel.grad, as those
whose funcs write. Now tidiff's adjoint takes them all, the funcs written
out in the kernel (NOTE: [Funcs that write fields, inlined]), and so a func
writing a field with ``ti.tan`` (Taichi has no reverse rule for it) has its
gradient. Oracles: closed forms, reverse mode and central differences.
"""
import numpy as np
import pytest
import taichi as ti

import tidiff as td
from tidiff._adjoint.kernels import KernelAdjoint, vjp_kernel

N = 5
x = ti.field(ti.f64, shape=N)
y = ti.field(ti.f64, shape=N)
z = ti.field(ti.f64, shape=N)
loss = ti.field(ti.f64, shape=())


@ti.func
def write_square(out: ti.template(), i, v):
    out[i] = v * v


@ti.func
def scale_into(dst: ti.template(), src: ti.template(), i, s):
    dst[i] = s * ti.sin(src[i]) + src[i] ** 2


@ti.func
def passes_on(out: ti.template(), i, v):
    write_square(out, i, ti.exp(v))  # the field given on to another func


@ti.func
def read_cube(src: ti.template(), i) -> ti.f64:
    return src[i] ** 3


@ti.kernel
def square_then_scale():
    for i in x:
        write_square(y, i, x[i])
    for i in x:
        scale_into(z, y, i, 0.5)


@ti.kernel
def exp_squared():
    for i in x:
        passes_on(y, i, x[i])


@ti.kernel
def cubes():
    for i in x:
        loss[None] += read_cube(x, i)


@ti.kernel
def total_of_z():
    for i in z:
        loss[None] += z[i]


@ti.kernel
def total_of_y():
    for i in y:
        loss[None] += y[i]


@ti.kernel
def sines_squared(a: ti.template(), b: ti.template()):
    for i in a:
        write_square(b, i, ti.sin(a[i]))  # a kernel's own ti.template() parameter given on to a func


@ti.func
def add_tangent(v):
    loss[None] += ti.tan(v)  # a global field written by name, with an op Taichi's reverse mode has no rule for


@ti.kernel
def tangents():
    for i in x:
        add_tangent(x[i] * 0.5)


def through_parameters():
    sines_squared(x, y)
    total_of_y()


def chained():
    square_then_scale()
    total_of_z()


def nested():
    exp_squared()
    total_of_y()


A = np.array([0.3, -1.2, 0.8, 2.0, -0.4])
PROGRAMS = {
    # d/dx sum(0.5 sin(x^2) + x^4) = x cos(x^2) + 4 x^3
    "chained": (chained, lambda a: a * np.cos(a * a) + 4 * a ** 3,
                lambda a: np.cos(a * a) - 2 * a * a * np.sin(a * a) + 12 * a * a),
    # d/dx sum(exp(x)^2) = 2 exp(2x)
    "nested": (nested, lambda a: 2 * np.exp(2 * a), lambda a: 4 * np.exp(2 * a)),
    # d/dx sum(x^3) = 3 x^2
    "cubes": (cubes, lambda a: 3 * a * a, lambda a: 6 * a),
    # d/dx sum(sin(x)^2) = sin(2x)
    "through_parameters": (through_parameters, lambda a: np.sin(2 * a), lambda a: 2 * np.cos(2 * a)),
    # d/dx sum(tan(x / 2)) = 1 / (2 cos(x / 2)^2)
    "tangents": (tangents, lambda a: 0.5 / np.cos(a / 2) ** 2, lambda a: 0.5 * np.tan(a / 2) / np.cos(a / 2) ** 2),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_forward_mode_keeps_writes_through_template_arguments(name):
    program, gradient, curvature = PROGRAMS[name]
    F = td.function(program, inputs=[x], outputs=[loss])
    t = np.array([1.0, -0.5, 0.25, 2.0, 1.5])
    _, dy = td.jvp(F, (A,), (t,))
    assert float(dy) == pytest.approx(float(gradient(A) @ t), rel=1e-12)
    np.testing.assert_allclose(td.jacfwd(F)(A), gradient(A), rtol=1e-12)
    np.testing.assert_allclose(td.grad(F)(A), gradient(A), rtol=1e-12)  # tidiff's adjoint gave 0 for `cubes`
    _, (hv,) = td.hvp(F, (A,), (t,))
    np.testing.assert_allclose(hv, curvature(A) * t, rtol=1e-10)
    eps = 1e-6
    difference = (float(F(A + eps * t)) - float(F(A - eps * t))) / (2 * eps)
    assert float(dy) == pytest.approx(difference, rel=1e-7)


@pytest.mark.parametrize("kernel", [square_then_scale, exp_squared, cubes, sines_squared, tangents],
                         ids=lambda k: k.__name__)
def test_tidiffs_adjoint_takes_kernels_calling_funcs_that_write_or_are_given_fields(kernel):
    assert isinstance(vjp_kernel(kernel), KernelAdjoint)
