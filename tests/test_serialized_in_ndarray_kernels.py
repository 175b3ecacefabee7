"""Ndarray kernels with a serialized loop (NOTE: [Serialized kernels as one iteration]): beside a parallel loop (a
projection, then a scan reading what the step before wrote), or updating one entry step after step (a running
product). A survey of kernels as users write them found both checked, found wrong and pushed forward, one kernel run
per input entry; both are now taken as one iteration in order, the entry kept in a local."""
import warnings

import numpy as np
import taichi as ti
import torch
from exact_vjp import assert_exact_vjp
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td

nd = ti.types.ndarray(dtype=ti.f64)


@ti.kernel
def projected_scan(x: nd, w: nd, a: nd, u: nd, h: nd):
    for t in range(x.shape[0]):
        u[t] = w[0] * x[t] + w[1]
    ti.loop_config(serialize=True)
    for t in range(x.shape[0]):
        prev = 0.0
        if t > 0:
            prev = h[t - 1]
        h[t] = a[0] * prev + ti.tanh(u[t])


@ti.kernel
def running_product(x: nd, out: nd):
    out[None] = 1.0
    ti.loop_config(serialize=True)
    for i in range(x.shape[0]):
        out[None] = out[None] * (1.0 + 0.1 * x[i])


SCAN = td.function(projected_scan, inputs=["x", "w", "a"],
                   outputs={"u": lambda x, w, a: x.shape, "h": lambda x, w, a: x.shape})
PRODUCT = td.function(running_product, inputs=["x"], outputs={"out": ()})


def torch_scan(x, w, a):
    u = w[0] * x + w[1]
    h, prev = [], torch.zeros((), dtype=x.dtype)
    for t in range(x.shape[0]):
        prev = a[0] * prev + torch.tanh(u[t])
        h.append(prev)
    return u, torch.stack(h)


@given(st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_a_scan_beside_a_parallel_loop_as_torch(steps, seed):
    rng = np.random.default_rng(seed)
    args = [rng.normal(size=steps), rng.normal(size=2), rng.uniform(-0.95, 0.95, 1)]
    cts = [rng.normal(size=steps), rng.normal(size=steps)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        outs, pull = td.vjp(SCAN, *args)
        got = pull(tuple(cts))
    ts = [torch.tensor(a, requires_grad=True) for a in args]
    want = torch_scan(*ts)
    for o, w in zip(outs, want, strict=True):
        np.testing.assert_allclose(o, w.detach().numpy(), rtol=1e-12, atol=1e-14)
    for g, w in zip(got, torch.autograd.grad(want, ts, [torch.tensor(c) for c in cts]), strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-10, atol=1e-12)


@given(st.lists(st.floats(-2, 2), min_size=1, max_size=30))
def test_a_running_product_is_exact_and_unchecked(values):
    x = np.array(values)
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        value, grad = td.value_and_grad(PRODUCT)(x)
    t = torch.tensor(x, requires_grad=True)
    want = torch.prod(1.0 + 0.1 * t)
    np.testing.assert_allclose(value, want.item(), rtol=1e-12)
    np.testing.assert_allclose(grad, torch.autograd.grad(want, t)[0].numpy(), rtol=1e-10, atol=1e-14)
    assert PRODUCT.memo.peek("reverse verdict") is None


@ti.kernel
def cumulative_rows(x: nd, out: nd):
    for i, j in x:  # a loop over an array's indices beside the serialized one
        out[i, j] = x[i, j]
    ti.loop_config(serialize=True)
    for i in range(1, x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] += out[i - 1, j]


@ti.kernel
def cumulative_ndrange(x: nd, out: nd):
    for i, j in ti.ndrange(x.shape[0], x.shape[1]):
        out[i, j] = ti.sin(x[i, j])
    ti.loop_config(serialize=True)
    for i in range(1, x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = out[i, j] + 0.5 * out[i - 1, j] ** 2


def cumulative_ndrange_torch(x):
    rows = [torch.sin(x[0])]
    for i in range(1, x.shape[0]):
        rows.append(torch.sin(x[i]) + 0.5 * rows[-1] ** 2)
    return torch.stack(rows)


cumulative = td.function(cumulative_rows, inputs=["x"], outputs={"out": lambda x: x.shape})
squares_carried = td.function(cumulative_ndrange, inputs=["x"], outputs={"out": lambda x: x.shape})


@given(st.integers(1, 5), st.integers(1, 3), st.integers(0, 2**32 - 1))
def test_a_cumulative_sum_down_the_rows_in_place(rows, cols, seed):
    """``for i, j in x`` (and ``ti.ndrange``) cannot be a loop inside another in Taichi, so the one-iteration form
    did not take the kernel: Taichi's kernel.grad ran, wrong, and forward pushes replaced it (a survey). Written as
    nested ranges, the kernel is tidiff's: the sum exact and never checked; the squares of the row before, which
    its adjoint reads, checked on the first call and right."""
    rng = np.random.default_rng(seed)
    x, ct = rng.uniform(-1, 1, (rows, cols)), rng.normal(size=(rows, cols))
    assert cumulative.adjoint_for(cumulative.specs_for([x])) is not None
    assert_exact_vjp(cumulative, [x], lambda t: torch.cumsum(t, 0), [ct])
    assert squares_carried.adjoint_for(squares_carried.specs_for([x])) is not None
    xt = torch.tensor(x, requires_grad=True)
    want = cumulative_ndrange_torch(xt)
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        out, pull = td.vjp(squares_carried, x)
        (got,) = pull(ct)
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(got, torch.autograd.grad(want, xt, torch.tensor(ct))[0].numpy(), rtol=1e-12,
                               atol=1e-14)
