"""Kernels calling @ti.funcs that write fields, written out by tidiff's adjoint (NOTE: [Funcs that write fields,
inlined]): locals that clash, globals of another module, results, calls inside expressions and branches.

Oracles: torch twins (float64) and tidiff's forward mode, which transforms the funcs themselves.
"""
import numpy as np
import taichi as ti
import torch
from field_writers import SCALE, bucket, deposit

import tidiff as td
from tidiff._adjoint.kernels import KernelAdjoint, vjp_kernel

N = 6
x = ti.field(ti.f64, shape=N)
y = ti.field(ti.f64, shape=N)
total = ti.field(ti.f64, shape=())


@ti.func
def stored_square(out: ti.template(), i, v) -> ti.f64:
    s = v * v  # `s` is the kernel's name too
    out[i] = s
    return ti.sin(s)


@ti.func
def clipped(v) -> ti.f64:
    r = v
    if v > 1.0:
        r = 1.0 + ti.log(v)
    total[None] += r  # writes a field, and returns a value used inside an expression
    return r


@ti.kernel
def mixed():
    for i in x:
        s = x[i] * 0.5
        t = stored_square(y, i, s) + 2.0
        if clipped(x[i]) > 0.5:
            deposit(i, s * t)
        else:
            deposit(i + 1, t)


@ti.kernel
def gather():
    for i in y:
        total[None] += y[i] * bucket[i % 4]


@ti.func
def counted(v) -> ti.f64:
    total[None] += 0.1 * v  # once per evaluation of the loop's test
    return v


@ti.kernel
def loop_on_a_writer():
    for i in x:
        k = 0
        while counted(x[i]) * k < 1.0:
            k += 1


def program():
    mixed()
    gather()
    loop_on_a_writer()


F = td.function(program, inputs=[x], outputs=[total, y, bucket])


def twin(xt):
    y_t = torch.zeros(N, dtype=torch.float64)
    bucket_t = torch.zeros(4, dtype=torch.float64)
    tot = torch.zeros((), dtype=torch.float64)
    for i in range(N):
        s = xt[i] * 0.5
        y_t = y_t.index_put((torch.tensor(i),), s * s)
        t = torch.sin(s * s) + 2.0
        r = 1.0 + torch.log(xt[i]) if xt[i] > 1.0 else xt[i]
        tot = tot + r
        if r > 0.5:
            bucket_t = bucket_t.index_put((torch.tensor(i % 4),), (SCALE * s * t) ** 2, accumulate=True)
        else:
            bucket_t = bucket_t.index_put((torch.tensor((i + 1) % 4),), (SCALE * t) ** 2, accumulate=True)
    tot = tot + sum(y_t[i] * bucket_t[i % 4] for i in range(N))
    for i in range(N):
        k = 0
        tot = tot + 0.1 * xt[i]
        while xt[i] * k < 1.0:
            k += 1
            tot = tot + 0.1 * xt[i]
    return tot, y_t, bucket_t


def test_the_funcs_are_written_out_and_the_gradient_is_torchs():
    assert isinstance(vjp_kernel(mixed), KernelAdjoint)
    assert isinstance(vjp_kernel(loop_on_a_writer), KernelAdjoint)
    a = np.array([0.3, 1.7, 0.45, 0.9, 2.5, 0.6])  # each x > 0: the while loop ends
    values = F(a)
    want = twin(torch.tensor(a))
    for got, w in zip(values, want):
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-13)
    cts = (np.array(0.7), np.linspace(-1.0, 1.0, N), np.array([0.5, -0.25, 1.0, 2.0]))
    (grad,) = td.vjp(F, a)[1](cts)
    xt = torch.tensor(a, requires_grad=True)
    out = twin(xt)
    sum((o * torch.tensor(c)).sum() for o, c in zip(out, cts)).backward()
    np.testing.assert_allclose(grad, xt.grad.numpy(), rtol=1e-12)
    t = np.linspace(0.5, 1.5, N)
    _, tangents = td.jvp(F, (a,), (t,))  # forward mode: the funcs' own tangents, their writes in tests too
    _, want = torch.func.jvp(twin, (torch.tensor(a),), (torch.tensor(t),))
    for got, w in zip(tangents, want):
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-12)


@ti.func
def put_without_first(i, a):
    a[0] = 0.0  # its own copy of the caller's vector: Taichi passes values
    y[i] += a.sum()


@ti.kernel
def passes_a_vector():
    for i in x:
        v = ti.Vector([x[i], x[i] ** 2])
        put_without_first(i, v)
        y[i] += v[0] * 3.0  # the caller's v still holds x[i]


def test_a_parameter_the_func_writes_into_stays_its_own_copy():
    """A name given as an argument is taken as written only where the func never assigns the parameter, nor
    an entry of it (``a[0] = 0.0``): else the caller's vector lost its first entry, a gradient 2x + 0 where
    it is 2x + 3, without a word."""
    fn = td.function(passes_a_vector, inputs=[x], outputs=[y])
    x0 = np.linspace(-0.9, 1.3, N)
    np.testing.assert_allclose(fn(x0), x0 ** 2 + 3 * x0, rtol=1e-15)
    for transform in (td.jacrev, td.jacfwd):
        np.testing.assert_allclose(transform(fn)(x0), np.diag(2 * x0 + 3), rtol=1e-15, atol=1e-15)


@ti.func
def store_row(out: ti.template(), i, v):
    for j in ti.static(range(3)):
        out[i, j] = v[j]


@ti.func
def load_row(src: ti.template(), i):
    return ti.Vector([src[i, 0], src[i, 1], src[i, 2]])


@ti.kernel
def normalized_rows(x: ti.types.ndarray(dtype=ti.f64), out: ti.types.ndarray(dtype=ti.f64)):
    for i in range(x.shape[0]):
        v = load_row(x, i)
        store_row(out, i, v / v.norm())


def test_funcs_given_ndarrays_are_written_out_too():
    """A func given one of an ndarray kernel's arrays, reading or writing it, made the transform refuse the kernel
    (Taichi's ``kernel.grad`` ran, checked; a survey of kernels as users write them)."""
    from tidiff._adjoint.kernels import vjp_ndarray_kernel

    assert isinstance(vjp_ndarray_kernel(normalized_rows, {"x": ti.f64, "out": ti.f64}), KernelAdjoint)
    f = td.function(normalized_rows, inputs=["x"], outputs={"out": lambda x: x.shape})
    rng = np.random.default_rng(4)
    xs, c = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    (got,) = td.vjp(f, xs)[1](c)
    t = torch.tensor(xs, requires_grad=True)
    want = torch.autograd.grad(t / t.norm(dim=1, keepdim=True), t, torch.tensor(c))[0]
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-14)
    assert f.memo.peek("reverse verdict") is None
