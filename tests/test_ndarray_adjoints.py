"""Ndarray kernels reversed by tidiff's own adjoint transform (NOTE: [Reverse of an ndarray kernel]).

Each kernel's vjp, jacrev and torch backward are compared with torch's (float64, and float32 where the arrays
are), and with Taichi's own ``kernel.grad`` where Taichi's is right; none of them is checked against forward mode
at run time (``reverse verdict`` stays None) or warns.
"""
import warnings

import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import tidiff as td

N = 6
table = ti.field(ti.f64, shape=N)  # a global field an ndarray kernel reads: a constant of its function
table.from_numpy(np.linspace(0.5, 1.5, N))


@ti.kernel
def gather_scatter(x: ti.types.ndarray(dtype=ti.math.vec2, ndim=1), idx: ti.types.ndarray(dtype=ti.i32, ndim=1),
                   s: ti.f64, out: ti.types.ndarray(dtype=ti.f64, ndim=1)):
    for i in range(x.shape[0]):
        v = x[idx[i]] * table[i]  # a gather at an integer array's index, scaled by a global field
        out[idx[i]] += s * v.dot(v) + ti.tan(v[0] * 0.3)  # a scatter (tan: no rule in Taichi's reverse mode)


def torch_gather_scatter(x, idx, s):
    v = x[idx] * torch.linspace(0.5, 1.5, N, dtype=x.dtype)[:, None]
    out = torch.zeros(N, dtype=x.dtype)
    return out.index_add(0, idx, s * (v * v).sum(1) + torch.tan(v[:, 0] * 0.3))


IDX = np.array([2, 0, 2, 5, 1, 3], dtype=np.int32)
GATHER = td.function(gather_scatter, inputs=["x", "idx"], outputs={"out": lambda x, idx: (N,)},
                     constants={"s": 0.7})


@ti.kernel
def clipped_norms(x: ti.types.ndarray(), out: ti.types.ndarray()):
    for i in range(x.shape[0]):
        r = 0.0
        j = 0
        while j < x.shape[1]:  # a while loop with a break, neither in Taichi's reverse mode
            if r > 4.0:
                break
            r += x[i, j] * x[i, j]
            j += 1
        out[i] = ti.sqrt(r)


def torch_clipped_norms(x):
    rows = []
    for row in x:
        r = torch.zeros((), dtype=x.dtype)
        for value in row:
            if r > 4.0:
                break
            r = r + value * value
        rows.append(torch.sqrt(r))
    return torch.stack(rows)


CLIPPED = td.function(clipped_norms, inputs=["x"], outputs={"out": lambda x: x.shape[:1]})


@given(arrays(np.float64, (N, 2), elements=st.floats(-2.0, 2.0)),
       arrays(np.float64, (N,), elements=st.floats(-1.0, 1.0)))
def test_a_gather_and_scatter_with_a_rule_taichi_lacks(x, c):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, pull = td.vjp(GATHER, x, IDX)
        gx, gidx = pull(c)
        jac = td.jacrev(GATHER)(x, IDX)
    xt = torch.tensor(x)
    idx = torch.tensor(IDX, dtype=torch.long)
    np.testing.assert_allclose(out, torch_gather_scatter(xt, idx, 0.7).numpy(), rtol=1e-13, atol=1e-14)
    _, want = torch.autograd.functional.vjp(lambda a: torch_gather_scatter(a, idx, 0.7), xt, torch.tensor(c))
    np.testing.assert_allclose(gx, want.numpy(), rtol=1e-12, atol=1e-13)
    assert gidx is None  # an integer input has no cotangent
    want_jac = torch.autograd.functional.jacobian(lambda a: torch_gather_scatter(a, idx, 0.7), xt)
    np.testing.assert_allclose(jac, want_jac.numpy(), rtol=1e-12, atol=1e-13)
    assert GATHER.memo.peek("reverse verdict") is None  # exact: never checked against forward mode


def test_a_while_loop_with_a_break_and_its_torch_backward():
    x = np.array([[0.5, -1.0, 2.0, 0.3], [1.5, 1.5, 1.0, 0.2], [0.1, 0.2, -0.3, 0.4]])
    xt = torch.tensor(x, requires_grad=True)
    want = torch.autograd.functional.jacobian(torch_clipped_norms, torch.tensor(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(td.jacrev(CLIPPED)(x), want.numpy(), rtol=1e-13)
        td.torch.function(CLIPPED)(xt).sum().backward()
    np.testing.assert_allclose(xt.grad.numpy(), want.numpy().sum(0), rtol=1e-13)


def test_float32_arrays_get_float32_cotangents():
    x = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], dtype=torch.float32, requires_grad=True)
    out = td.torch.function(CLIPPED)(x)
    (g,) = torch.autograd.grad(out, x, torch.tensor([1.0, -2.0]))
    assert g.dtype == torch.float32
    x64 = x.detach().double().requires_grad_(True)
    (want,) = torch.autograd.grad(torch_clipped_norms(x64), x64, torch.tensor([1.0, -2.0], dtype=torch.float64))
    np.testing.assert_allclose(g.numpy(), want.numpy(), rtol=1e-6)


@ti.kernel
def smooth(x: ti.types.ndarray(dtype=ti.f64, ndim=1), out: ti.types.ndarray(dtype=ti.f64, ndim=1)):
    for i in range(x.shape[0]):
        out[i] = ti.sin(x[i]) * x[(i + 1) % x.shape[0]] + x[i] ** 3


def test_where_taichi_is_right_its_kernel_grad_gives_the_same_numbers():
    """Taichi's reverse mode as a cross-check (item 5 of issue 34): both adjoints over the same tensors."""
    op = td.function(smooth, inputs=["x"], outputs={"out": lambda x: x.shape})
    x, c = np.linspace(-1.0, 1.2, 7), np.cos(np.arange(7.0))
    (ours,) = td.vjp(op, x)[1](c)
    xt = torch.tensor(x).requires_grad_(True)
    xt.grad = torch.zeros_like(xt)
    out = torch.zeros(7, dtype=torch.float64, requires_grad=True)
    out.grad = torch.tensor(c)
    smooth.grad(xt, out)  # Taichi's kernel.grad: accumulates into the tensors' .grad
    np.testing.assert_allclose(ours, xt.grad.numpy(), rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("transform", ["jacfwd", "jacrev", "torch hvp"])
def test_second_order_goes_through_the_adjoint_of_the_tangent_kernel(transform):
    op = td.function(smooth, inputs=["x"], outputs={"out": lambda x: x.shape})
    x, v = np.linspace(-1.0, 1.2, 5), np.sin(np.arange(5.0))
    xt = torch.tensor(x)
    tangent = op.tangent_at(op.specs_for([x]))
    assert tangent.adjoint_for(tangent.specs_for([x, v])) is not None  # the tangent kernel is tidiff's to reverse

    def torch_smooth(a):
        return torch.sin(a) * torch.roll(a, -1) + a**3

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if transform == "jacfwd":
            got = td.jacrev(td.jacfwd(op))(x)
            want = torch.autograd.functional.jacobian(
                lambda a: torch.autograd.functional.jacobian(torch_smooth, a, create_graph=True), xt)
        elif transform == "jacrev":
            got = td.jacrev(td.jacrev(op))(x)
            want = torch.autograd.functional.jacobian(
                lambda a: torch.autograd.functional.jacobian(torch_smooth, a, create_graph=True), xt)
        else:
            t_op = td.torch.function(op)  # torch's double backward through the operator
            got = torch.autograd.functional.hvp(lambda a: t_op(a).sum(), xt, torch.tensor(v))[1].numpy()
            want = torch.autograd.functional.hvp(lambda a: torch_smooth(a).sum(), xt, torch.tensor(v))[1]
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-13)


@ti.kernel
def row_sums(x: ti.types.ndarray(dtype=ti.f64, ndim=2), out: ti.types.ndarray(dtype=ti.f64, ndim=1)):
    for i, j in x:
        out[i] += ti.tan(x[i, j]) * (j + 1.0)


def test_jacobians_choose_reverse_mode_whatever_the_shape_rule_reads():
    """Choosing a Jacobian's mode asks whether tidiff reverses the kernel before any shapes are known: a shape rule
    indexing its input's shape (``x.shape[0]``) must not be called then."""
    op = td.function(row_sums, inputs=["x"], outputs={"out": lambda x: (x.shape[0],)})
    assert op.reverse_refused() is None
    x = np.array([[0.1, -0.4, 0.3], [0.7, 0.2, -0.9]])
    want = torch.autograd.functional.jacobian(lambda t: (torch.tan(t) * torch.tensor([1.0, 2.0, 3.0])).sum(1),
                                              torch.tensor(x))
    np.testing.assert_allclose(td.jacrev(op)(x), want.numpy(), rtol=1e-13)


@ti.func
def weight(i):
    return table[i] * 2.0 + ti.cos(table[(i + 1) % N])  # a func reading a global float field


@ti.kernel
def weighted(x: ti.types.ndarray(dtype=ti.f64, ndim=1), out: ti.types.ndarray(dtype=ti.f64, ndim=1)):
    for i in range(x.shape[0]):
        out[i] = ti.tan(x[i] * 0.4) * weight(i)


def test_a_func_reading_fields_in_an_ndarray_kernel_reads_constants():
    """Fields are constants of an ndarray kernel's function, in the funcs it calls too: tidiff's adjoint, exact."""
    op = td.function(weighted, inputs=["x"], outputs={"out": lambda x: x.shape})
    x = np.linspace(-1.0, 1.5, N)
    t = torch.linspace(0.5, 1.5, N, dtype=torch.float64)
    w = t * 2.0 + torch.cos(torch.roll(t, -1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jac = td.jacrev(op)(x)
    want = torch.autograd.functional.jacobian(lambda a: torch.tan(a * 0.4) * w, torch.tensor(x))
    np.testing.assert_allclose(jac, want.numpy(), rtol=1e-13, atol=1e-15)
    assert op.memo.peek("reverse verdict") is None


# -- kernels whose loops run in order (NOTE: [Serialized kernels as one iteration]) ---------------------------------

@ti.kernel
def leaky_scan(x: ti.types.ndarray(dtype=ti.f64, ndim=1), a: ti.f64, y: ti.types.ndarray(dtype=ti.f64, ndim=1)):
    h = 0.0
    ti.loop_config(serialize=True)
    for i in range(x.shape[0]):
        h = a * h + ti.sin(x[i]) * x[i]
        y[i] = h * h


@ti.kernel
def recursive_filter(x: ti.types.ndarray(dtype=ti.f64, ndim=1), a: ti.f64,
                     y: ti.types.ndarray(dtype=ti.f64, ndim=1)):
    y[0] = ti.tanh(x[0])
    ti.loop_config(serialize=True)
    for i in range(1, x.shape[0]):
        y[i] = a * y[i - 1] * ti.cos(y[i - 1]) + ti.tanh(x[i])


def torch_leaky_scan(x, a):
    h, ys = torch.zeros((), dtype=x.dtype), []
    for v in x:
        h = a * h + torch.sin(v) * v
        ys.append(h * h)
    return torch.stack(ys)


def torch_recursive_filter(x, a):
    ys = [torch.tanh(x[0])]
    for v in x[1:]:
        ys.append(a * ys[-1] * torch.cos(ys[-1]) + torch.tanh(v))
    return torch.stack(ys)


SERIAL = {"a value carried between iterations": (leaky_scan, torch_leaky_scan),
          "a field reading what the iteration before wrote": (recursive_filter, torch_recursive_filter)}


@pytest.mark.parametrize("name", sorted(SERIAL))
@given(x=arrays(np.float64, st.integers(1, 12), elements=st.floats(-2.0, 2.0)), a=st.floats(-1.0, 1.0))
def test_serialized_kernels_carrying_values_are_reversed_by_tidiff(name, x, a):
    kernel, twin = SERIAL[name]
    op = td.function(kernel, inputs=["x"], outputs={"y": lambda x: x.shape}, constants={"a": a})
    assert not isinstance(td._adjoint.kernels.vjp_ndarray_kernel(kernel, {"x": ti.f64, "y": ti.f64}),
                          td._adjoint.kernels.NotReversible)  # Taichi's reverse mode refuses both
    want = torch.autograd.functional.jacobian(lambda v: twin(v, a), torch.tensor(x)).numpy()
    np.testing.assert_allclose(td.jacrev(op)(x), want, rtol=1e-10, atol=1e-12)
    # the carried value is exact; the filter reads its output, so its vjp is checked against forward mode once
    assert (op.memo.peek("reverse verdict") is None) == (kernel is leaky_scan)
    np.testing.assert_allclose(td.jacfwd(op)(x), want, rtol=1e-10, atol=1e-12)
    second = torch.autograd.functional.jacobian(
        lambda v: torch.autograd.functional.jacobian(lambda w: twin(w, a), v, create_graph=True), torch.tensor(x))
    np.testing.assert_allclose(td.jacfwd(td.jacrev(op))(x), second.numpy(), rtol=1e-9, atol=1e-11)


def test_a_long_serialized_scan_is_exact():
    """5,000 iterations, each recomputed from the loop's start in reverse (NOTE: [Reverse control flow])."""
    a = 0.9
    op = td.function(leaky_scan, inputs=["x"], outputs={"y": lambda x: x.shape}, constants={"a": a})
    x = np.sin(np.arange(5000.0))
    c = np.cos(np.arange(5000.0) * 0.3)
    (got,) = td.vjp(op, x)[1](c)
    h = np.zeros(x.size)
    for i in range(x.size):
        h[i] = a * (h[i - 1] if i else 0.0) + np.sin(x[i]) * x[i]
    carried, want = 0.0, np.zeros(x.size)
    for i in range(x.size - 1, -1, -1):
        carried = carried * a + c[i] * 2 * h[i]
        want[i] = carried * (np.cos(x[i]) * x[i] + np.sin(x[i]))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
