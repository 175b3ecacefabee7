"""Ndarray kernels that overwrite, inside each row's iteration, what a runtime loop before wrote: a softmax, attention
or normalization written in place (NOTE: [Versions by inner loop]), and top-level loops updating with ``/=``
(NOTE: [Arrays kept by version]). A survey of kernels as users write them found each checked against forward mode,
found wrong and pushed forward, one kernel run per input entry; now exact, never checked, equal to torch."""
import warnings

import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td
from tidiff._lang.compile import info

nd = ti.types.ndarray(dtype=ti.f64)


@ti.kernel
def softmax_divided(x: nd, y: nd):
    total = 0.0
    for i in x:
        y[i] = ti.exp(x[i])
        total += y[i]
    for i in x:
        y[i] /= total


@ti.kernel
def row_softmax_in_place(x: nd, out: nd):
    for i in range(x.shape[0]):
        s = 0.0
        for j in range(x.shape[1]):
            out[i, j] = ti.exp(x[i, j])
            s += out[i, j]
        for j in range(x.shape[1]):
            out[i, j] /= s


@ti.kernel
def attention(q: nd, k: nd, v: nd, att: nd, out: nd):
    for i in range(q.shape[0]):
        m = -1e30
        for j in range(k.shape[0]):
            sc = 0.0
            for d in range(q.shape[1]):
                sc += q[i, d] * k[j, d]
            att[i, j] = sc / ti.sqrt(q.shape[1] * 1.0)
            m = ti.max(m, att[i, j])
        s = 0.0
        for j in range(k.shape[0]):
            att[i, j] = ti.exp(att[i, j] - m)
            s += att[i, j]
        for j in range(k.shape[0]):
            att[i, j] /= s
        for d in range(v.shape[1]):  # reads the weights only, in a loop of its own
            acc = 0.0
            for j in range(k.shape[0]):
                acc += att[i, j] * v[j, d]
            out[i, d] = acc


@ti.kernel
def normalized_product(a: nd, b: nd, out: nd):
    for i in range(a.shape[0]):
        norm = 0.0
        for j in range(b.shape[1]):
            out[i, j] = 0.0
            for k in range(a.shape[1]):  # summed into the entry (NOTE: [Entries updated in a loop, as locals])
                out[i, j] += a[i, k] * b[k, j]
            norm += out[i, j] ** 2
        norm = ti.sqrt(norm)
        for j in range(b.shape[1]):
            out[i, j] = out[i, j] / norm


@ti.kernel
def product_then_activation(a: nd, b: nd, bias: nd, out: nd):
    for i, j in out:
        for k in range(a.shape[1]):  # summed into the iteration's own entry (NOTE: [Arrays kept by version])
            out[i, j] += a[i, k] * b[k, j]
    for i, j in out:
        out[i, j] = ti.tanh(out[i, j] + bias[j])


def torch_attention(q, k, v):
    weights = torch.softmax(q @ k.T / np.sqrt(q.shape[1]), 1)
    return weights, weights @ v


def torch_normalized_product(a, b):
    c = a @ b
    return c / c.norm(dim=1, keepdim=True)


CASES = {
    "softmax divided": (td.function(softmax_divided, inputs=["x"], outputs={"y": lambda x: x.shape}),
                        lambda x: torch.softmax(x, 0), lambda rows, cols: [(rows * cols,)]),
    "row softmax in place": (td.function(row_softmax_in_place, inputs=["x"], outputs={"out": lambda x: x.shape}),
                             lambda x: torch.softmax(x, 1), lambda rows, cols: [(rows, cols)]),
    "attention": (td.function(attention, inputs=["q", "k", "v"],
                              outputs={"att": lambda q, k, v: (q.shape[0], k.shape[0]),
                                       "out": lambda q, k, v: (q.shape[0], v.shape[1])}),
                  torch_attention, lambda rows, cols: [(rows, cols), (rows + 1, cols), (rows + 1, 2)]),
    "product then activation": (td.function(product_then_activation, inputs=["a", "b", "bias"],
                                            outputs={"out": lambda a, b, bias: (a.shape[0], b.shape[1])}),
                                lambda a, b, bias: torch.tanh(a @ b + bias),
                                lambda rows, cols: [(rows, cols), (cols, rows + 1), (rows + 1,)]),
    "normalized product": (td.function(normalized_product, inputs=["a", "b"],
                                       outputs={"out": lambda a, b: (a.shape[0], b.shape[1])}),
                           torch_normalized_product, lambda rows, cols: [(rows, cols), (cols, rows + 1)]),
}


@given(st.sampled_from(sorted(CASES)), st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_overwrites_inside_an_iteration_are_exact_without_a_check(case, rows, cols, seed):
    f, reference, shapes = CASES[case]
    rng = np.random.default_rng(seed)
    args = [rng.uniform(-1.5, 1.5, s) for s in shapes(rows, cols)]
    ts = [torch.tensor(a, requires_grad=True) for a in args]
    want = reference(*ts)
    want = want if isinstance(want, tuple) else (want,)
    cts = [rng.normal(size=w.shape) for w in want]
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        outs, pull = td.vjp(f, *args)
        got = pull(tuple(cts) if len(cts) > 1 else cts[0])
        tangents = [rng.normal(size=a.shape) for a in args]
        _, pushed = td.jvp(f, tuple(args), tuple(tangents))
    for o, w in zip(outs if len(want) > 1 else (outs,), want, strict=True):
        np.testing.assert_allclose(o, w.detach().numpy(), rtol=1e-12, atol=1e-14)
    expected = torch.autograd.grad(want, ts, [torch.tensor(c) for c in cts])
    for g, e in zip(got, expected, strict=True):  # one per primal, as JAX's
        np.testing.assert_allclose(g, e.numpy(), rtol=1e-10, atol=1e-13)
    assert f.by_version() is not None and f.memo.peek("reverse verdict") is None
    pushed = pushed if len(want) > 1 else (pushed,)  # <c, J t> = <J^T c, t>
    forward = sum(np.vdot(c, p) for c, p in zip(cts, pushed, strict=True))
    reverse = sum(np.vdot(g, t) for g, t in zip(got, tangents, strict=True))
    np.testing.assert_allclose(forward, reverse, rtol=1e-9, atol=1e-12)


def test_the_rows_so_written():
    f, _, _ = CASES["row softmax in place"]
    versions = f.by_version()
    assert versions is not None
    source = info(versions[0].kernel).source
    assert "out_v0[i, j] = ti.exp(x[i, j])" in source and "s += out_v0[i, j]" in source
    assert "out[i, j] = out_v0[i, j]" in source  # the second loop's copy of its entry
    assert "out[i, j] = out_v0[i, j] / s" in source  # its update reads the version before it


def test_second_order_through_the_torch_operator():
    op = td.torch.function(row_softmax_in_place, inputs=["x"], outputs={"out": lambda x: x.shape})
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(5), requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        assert torch.autograd.gradcheck(op, (x,))
        assert torch.autograd.gradgradcheck(op, (x,))


@ti.kernel
def rows_over_other_ranges(x: nd, out: nd):
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = ti.exp(x[i, j])
        for j in range(x.shape[1] - 1):  # leaves the last entry: a version of its own would miss it
            out[i, j] = out[i, j] * out[i, j + 1]


@ti.kernel
def recurrence_then_activation(x: nd, out: nd):
    for i in out:
        out[i] = x[i]
        for _ in range(3):  # reads what the pass before wrote, after the iteration's first write: one version
            out[i] = out[i] * 0.5 + ti.sin(out[i])
    for i in out:
        out[i] = ti.tanh(out[i])


@ti.kernel
def recurrence_on_what_a_loop_before_wrote(x: nd, out: nd):
    for i in out:
        out[i] = x[i]
    for i in out:
        for _ in range(3):  # reads before the iteration's first write: a version read before would hold the old
            out[i] = out[i] * 0.5 + ti.sin(out[i])  # value for every pass (versioned so, silently wrong)
    for i in out:
        out[i] = ti.tanh(out[i])


@ti.kernel
def rows_recurring_on_what_a_loop_before_wrote(x: nd, out: nd):
    for r in range(1):
        for i in range(x.shape[0]):
            out[r, i] = x[i]
        for i in range(x.shape[0]):
            for _ in range(3):  # a read in a loop inside, before the pass's first write: not versioned
                out[r, i] = out[r, i] * 0.5 + ti.sin(out[r, i])
        for i in range(x.shape[0]):
            out[r, i] = ti.tanh(out[r, i])


def torch_recurrence(x):
    v = x
    for _ in range(3):
        v = v * 0.5 + torch.sin(v)
    return torch.tanh(v)


@pytest.mark.parametrize("kernel, versioned", [(recurrence_then_activation, True),
                                               (recurrence_on_what_a_loop_before_wrote, False),
                                               (rows_recurring_on_what_a_loop_before_wrote, False)])
def test_a_recurrence_on_an_entry_in_a_runtime_loop(kernel, versioned):
    rows = kernel is rows_recurring_on_what_a_loop_before_wrote
    f = td.function(kernel, inputs=["x"], outputs={"out": (lambda x: (1,) + x.shape) if rows else lambda x: x.shape})
    assert (f.by_version() is not None) == versioned
    x, c = np.linspace(-1.0, 1.0, 5), np.arange(5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", td.TaichiReverseWarning)
        (got,) = td.vjp(f, x)[1](c[None] if rows else c)
    xt = torch.tensor(x, requires_grad=True)
    want = torch.autograd.grad(torch_recurrence(xt), xt, torch.tensor(c))[0]
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kernel", [rows_over_other_ranges])
def test_iterations_reaching_the_output_otherwise_stay_checked_and_right(kernel):
    f = td.function(kernel, inputs=["x"], outputs={"out": lambda x: x.shape})
    assert f.by_version() is None
    x, c = np.linspace(-1.0, 1.0, 6).reshape(2, 3), np.arange(6.0).reshape(2, 3) / 6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", td.TaichiReverseWarning)
        (got,) = td.vjp(f, x)[1](c)
    xt = torch.tensor(x, requires_grad=True)
    e = torch.exp(xt)
    want = torch.cat([e[:, :-1] * e[:, 1:], e[:, -1:]], 1)
    np.testing.assert_allclose(got, torch.autograd.grad(want, xt, torch.tensor(c))[0].numpy(), rtol=1e-12)
