"""Every transform of a @ti.func is callable inside a kernel, with the same call as on the host."""
import numpy as np
import taichi as ti
import torch
from op_table import ROW_BY_NAME

import tidiff as td

vector = ROW_BY_NAME["vector"].func  # s * x.dot(x) + sin(x[0])
matmul = ROW_BY_NAME["matmul"].func  # tanh(A x + A^T x)


@ti.func
def p(x):
    return x**3 + 2 * x**2 - 3 * x + 1


@ti.kernel
def derivatives_of_p(x: ti.f64) -> ti.types.vector(4, ti.f64):
    d1 = td.grad(p)(x)
    d2 = td.grad(td.grad(p))(x)
    d3 = td.grad(td.grad(td.grad(p)))(x)
    y, dy = td.jvp(p, (x,), (2.0,))
    return ti.Vector([d1, d2, d3, dy])


def test_polynomial_derivatives_in_kernel():
    np.testing.assert_allclose(derivatives_of_p(1.0).to_numpy(), [4.0, 10.0, 6.0, 8.0])


@ti.kernel
def vector_transforms(x: ti.math.vec3, s: ti.f64, v: ti.math.vec3, out: ti.types.ndarray(ndim=1)):
    g = td.grad(vector)(x, s)
    H = td.hessian(vector)(x, s)
    J = td.jacobian(vector, argnums=(0, 1))(x, s)
    value, hv = td.hvp(vector, (x, s), (v, 0.0))
    for i in ti.static(range(3)):
        out[i] = g[i]
        out[3 + i] = (H @ v)[i]
        out[6 + i] = hv[0][i]
        out[9 + i] = J[0][i]
    out[12] = J[1]
    out[13] = value


def test_vector_transforms_in_kernel_match_host():
    rng = np.random.default_rng(0)
    x, v, s = rng.standard_normal(3), rng.standard_normal(3), 1.5
    out = np.zeros(14)
    vector_transforms(ti.math.vec3(x), s, ti.math.vec3(v), out)
    g = td.grad(vector)(x, s)
    H = td.hessian(vector)(x, s)
    np.testing.assert_allclose(out[:3], g, rtol=1e-13)
    np.testing.assert_allclose(out[3:6], H @ v, rtol=1e-13)
    np.testing.assert_allclose(out[6:9], H @ v, rtol=1e-13)
    np.testing.assert_allclose(out[9:12], g, rtol=1e-13)
    assert out[12] == np.dot(x, x)
    assert out[13] == s * np.dot(x, x) + np.sin(x[0])


@ti.kernel
def jacobians_in_loop(A: ti.types.ndarray(dtype=ti.math.mat2, ndim=1), x: ti.types.ndarray(dtype=ti.math.vec2, ndim=1),
                      J: ti.types.ndarray(dtype=ti.math.mat2, ndim=1)):
    for i in range(x.shape[0]):
        J[i] = td.jacfwd(matmul, argnums=1)(A[i], x[i])


def test_jacobian_in_parallel_loop_matches_torch():
    rng = np.random.default_rng(1)
    A, x = rng.standard_normal((6, 2, 2)), rng.standard_normal((6, 2))
    J = np.zeros((6, 2, 2))
    jacobians_in_loop(A, x, J)
    for i in range(6):
        expected = torch.autograd.functional.jacobian(
            lambda x_, i=i: ROW_BY_NAME["matmul"].torch_fn(torch.tensor(A[i]), x_), torch.tensor(x[i])
        )
        np.testing.assert_allclose(J[i], expected.numpy(), rtol=1e-12, atol=1e-14)


def test_third_order_on_host_against_torch():
    f = ROW_BY_NAME["trig"]
    x = np.linspace(-1.0, 1.0, 5)
    third = td.grad(td.grad(td.grad(f.func)))(x)
    for xi, got in zip(x, third):
        t = torch.tensor(xi, requires_grad=True)
        (d1,) = torch.autograd.grad(f.torch_fn(t), t, create_graph=True)
        (d2,) = torch.autograd.grad(d1, t, create_graph=True)
        (d3,) = torch.autograd.grad(d2, t)
        assert got == np.float64(d3.item()) or abs(got - d3.item()) <= 1e-9 * max(1.0, abs(d3.item()))
    h3 = td.hessian(td.grad(vector))(np.array([0.3, -0.2, 0.5]), 2.0)
    assert h3.shape == (3, 3, 3)
    expected = np.zeros((3, 3, 3))
    expected[0, 0, 0] = -np.cos(0.3)
    np.testing.assert_allclose(h3, expected, atol=1e-13)


@ti.func
def spring_energy(x: ti.f64, k: ti.f64) -> ti.f64:
    return 0.5 * k * x**2 + ti.sin(x)


@ti.kernel
def squared_forces(x: ti.types.ndarray(), k: ti.types.ndarray(), out: ti.types.ndarray()):
    for i in x:
        out[i] = td.grad(spring_energy)(x[i], k[0]) ** 2  # a transform called in the kernel body itself


positions = ti.field(ti.f64, shape=4)
stiffness = ti.field(ti.f64, shape=())
force_energy = ti.field(ti.f64, shape=())


@ti.kernel
def total_squared_force():
    for i in positions:
        force_energy[None] += td.grad(spring_energy)(positions[i], stiffness[None]) ** 2


def _squared_force_derivatives(x, k):
    """f = (k x + cos x)^2: df/dx, d2f/dx2, df/dk."""
    g, dg = k * x + np.cos(x), k - np.sin(x)
    return 2 * g * dg, 2 * dg**2 - 2 * g * np.cos(x), 2 * g * x


def test_a_transform_called_in_a_kernel_body_is_differentiated_in_every_mode():
    """Outside code: forward mode (and so second order) of a kernel calling td.grad(E)(...) directly, not
    through a @ti.func of its own, raised 'tidiff differentiates @ti.func code ..., got <td.Function
    grad(energy)>; decorate it with @ti.func' (reverse mode was right)."""
    x, k = np.array([0.1, 0.2, 0.3, 0.4]), np.array([2.0])
    dx, dxx, dk = _squared_force_derivatives(x, k[0])
    fn = td.function(squared_forces, inputs=["x", "k"], outputs={"out": lambda x, k: x.shape})
    for jacobian in (td.jacrev, td.jacfwd):
        jx, jk = jacobian(fn, argnums=(0, 1))(x, k)
        np.testing.assert_allclose(jx, np.diag(dx), rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(jk[:, 0], dk, rtol=1e-13)
    program = td.function(total_squared_force, inputs=[positions, stiffness], outputs=[force_energy])
    np.testing.assert_allclose(td.grad(program)(x, np.array(k[0])), dx, rtol=1e-13)
    _, tangent = td.jvp(program, (x, np.array(k[0])), (np.ones(4), np.array(0.0)))
    np.testing.assert_allclose(tangent, dx.sum(), rtol=1e-13)
    _, (hx, _) = td.hvp(program, (x, np.array(k[0])), (np.ones(4), np.array(0.0)))
    np.testing.assert_allclose(hx, dxx, rtol=1e-12)
