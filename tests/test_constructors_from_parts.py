"""Vector and matrix types called with parts of any shape, GLSL's ``ti.math.vec4(v.xyz, 1.0)`` (NOTE: [Constructors
from parts] in tidiff/_rules/helpers.py): tidiff's reverse transform takes them, in funcs, ndarray kernels and
field programs, where it refused them before (a func's derivatives then came from forward pushes, a kernel's from
Taichi's ``kernel.grad``, checked on its first call)."""
import warnings

import numpy as np
import taichi as ti
import torch
from exact_vjp import assert_exact_vjp
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td
from tidiff._adjoint import why_not
from tidiff._adjoint.kernels import KernelAdjoint, vjp_kernel

mat2x3 = ti.types.matrix(2, 3, ti.f64)
vec6 = ti.types.vector(6, ti.f64)


@ti.func
def from_parts(v: ti.math.vec2):
    w = ti.math.vec3(v.yx, 1.0) * v.x  # a swizzle, then a number
    u = ti.math.vec4(w.z, w.xy * 2.0, ti.sin(v.y))  # a scalar, a vector, a scalar
    m = ti.math.mat2(w.xy, u.zw)  # rows from vectors
    n = mat2x3(w, u.xyz)  # rows of three
    e = vec6(m, v.yy * 3.0)  # a matrix, row by row, then an entry twice
    return u.dot(u) + ti.sqrt(w.dot(w) + 1.0) + m.determinant() + (n @ n.transpose()).trace() * e[3] + e.dot(e) * e[5]


def from_parts_torch(v):
    w = torch.stack([v[1], v[0], torch.ones_like(v[0])]) * v[0]
    u = torch.stack([w[2], 2 * w[0], 2 * w[1], torch.sin(v[1])])
    m = torch.stack([w[:2], u[2:]])
    n = torch.stack([w, u[:3]])
    e = torch.cat([m.reshape(4), v[[1, 1]] * 3.0])
    determinant = m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0]  # torch.linalg.det's gradient is 0 where m is singular
    return u @ u + torch.sqrt(w @ w + 1.0) + determinant + torch.trace(n @ n.T) * e[3] + (e @ e) * e[5]


vectors = st.lists(st.tuples(st.floats(-2, 2), st.floats(0.1, 2)), min_size=1, max_size=3)


def _torch_rows(f, x, second=False):
    rows = []
    for r in torch.tensor(x):
        rows.append((torch.autograd.functional.hessian if second else torch.autograd.functional.jacobian)(f, r))
    return np.stack([r.numpy() for r in rows])


def test_the_reverse_transform_takes_them():
    assert why_not(from_parts, (True,)) is None


@given(vectors)
def test_a_func_built_from_parts(rows):
    x = np.array(rows)
    np.testing.assert_allclose(td.grad(from_parts)(x), _torch_rows(from_parts_torch, x), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(td.hessian(from_parts)(x), _torch_rows(from_parts_torch, x, second=True),
                               rtol=1e-10, atol=1e-12)
    t = np.ones_like(x)
    _, forward = td.jvp(from_parts, (x,), (t,))
    np.testing.assert_allclose(forward, (td.grad(from_parts)(x) * t).sum(axis=-1), rtol=1e-12)


@ti.kernel
def from_parts_rows(x: ti.types.ndarray(dtype=ti.f64, ndim=2), y: ti.types.ndarray(dtype=ti.f64, ndim=1)):
    for i in range(x.shape[0]):
        y[i] = from_parts(ti.math.vec2(x[i, 0], x[i, 1]))


@ti.kernel
def glsl_rows(x: ti.types.ndarray(dtype=ti.f64, ndim=2), y: ti.types.ndarray(dtype=ti.f64, ndim=2)):
    for i in range(x.shape[0]):
        v = ti.math.vec2(x[i, 0], x[i, 1])
        h = ti.math.vec4(v.yx * v.x, 1.0, v.y)  # written inline, as users write a homogeneous point
        for j in ti.static(range(4)):
            y[i, j] = ti.tanh(h[j])


def glsl_torch(x):
    h = torch.stack([x[:, 1] * x[:, 0], x[:, 0] * x[:, 0], torch.ones_like(x[:, 0]), x[:, 1]], dim=1)
    return torch.tanh(h)


rows_of = td.function(from_parts_rows, inputs=["x"], outputs={"y": lambda x: (x.shape[0],)})
glsl = td.function(glsl_rows, inputs=["x"], outputs={"y": lambda x: (x.shape[0], 4)})


@given(vectors, st.integers(0, 2**32 - 1))
def test_ndarray_kernels_built_from_parts_are_tidiffs_to_reverse(rows, seed):
    x = np.array(rows)
    rng = np.random.default_rng(seed)
    for f, twin in ((rows_of, lambda t: torch.stack([from_parts_torch(r) for r in t])), (glsl, glsl_torch)):
        assert f.adjoint_for(f.specs_for([x])) is not None
        ct = rng.normal(size=tuple(twin(torch.tensor(x)).shape))
        (got,) = assert_exact_vjp(f, [x], twin, [ct], rtol=1e-10, atol=1e-12)
        t = rng.normal(size=x.shape)
        _, pushed = td.jvp(f, (x,), (t,))
        np.testing.assert_allclose(np.vdot(ct, pushed), np.vdot(got, t), rtol=1e-9, atol=1e-12)


def test_second_order_through_the_torch_operator():
    op = td.torch.function(glsl_rows, inputs=["x"], outputs={"y": lambda x: (x.shape[0], 4)})
    x = torch.randn(3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        assert torch.autograd.gradcheck(op, (x,))
        assert torch.autograd.gradgradcheck(op, (x,))


points = ti.Vector.field(2, ti.f64, shape=3)
lifted = ti.field(ti.f64, shape=())


@ti.kernel
def lift():
    for i in points:
        p = points[i]
        h = ti.math.vec3(p.yx, 1.0) * p.x
        lifted[None] += h.dot(h) + ti.sin(h.z)


def lift_torch(p):
    h = torch.stack([p[:, 1], p[:, 0], torch.ones_like(p[:, 0])], dim=1) * p[:, :1]
    return ((h * h).sum(dim=1) + torch.sin(h[:, 2])).sum()


@given(st.lists(st.floats(-2, 2), min_size=6, max_size=6))
def test_a_field_program_built_from_parts(entries):
    assert isinstance(vjp_kernel(lift), KernelAdjoint)  # tidiff's, not Taichi's kernel.grad
    f = td.function(lift, inputs=[points], outputs=[lifted])
    x = np.array(entries).reshape(3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        got = td.grad(f)(x)
        hessian = td.hessian(f)(x)
    assert f.memo.peek("reverse verdict") is None  # exact: never checked
    xt = torch.tensor(x)
    np.testing.assert_allclose(got, torch.autograd.functional.jacobian(lift_torch, xt).numpy(), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(hessian, torch.autograd.functional.hessian(lift_torch, xt).numpy(), rtol=1e-10,
                               atol=1e-12)
