"""Sums into an entry the iteration set before, then read: ``y[i] = b; y[i] += e; y[i] = ti.tanh(y[i])``.

The adjoint read the entry after the sum as the kernel left it (the ``tanh``), so the first vjp was checked, found
wrong and replaced by forward pushes, one run per input entry (found by a survey of kernels as users write them:
a linear layer summing into its output then applying ``tanh`` in place). Now the sum is a stored value the read
sees (NOTE: [Reads of what the iteration wrote]), and a runtime loop summing into such an entry keeps the sum in a
local (NOTE: [Entries updated in a loop, as locals]): exact, unchecked, no warning.
"""
import ast
import warnings

import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td
from tidiff._adjoint.entry_locals import entries_as_locals
from tidiff._adjoint.kernels import _touches_fields
from tidiff._lang.objects import bind
from tidiff._lang.parse import parse

N = 6
x = ti.field(ti.f64, shape=N)
y = ti.field(ti.f64, shape=N)
v = ti.Vector.field(2, ti.f64, shape=N)
loss = ti.field(ti.f64, shape=())


@ti.kernel
def set_add_sub_tanh():
    for i in x:
        y[i] = 0.5
        y[i] += x[i] ** 2
        y[i] -= 0.25 * x[i]
        y[i] = ti.tanh(y[i])


@ti.func
def add_into(out: ti.template(), i, e):
    out[i] += e


@ti.kernel
def added_by_a_func():
    for i in x:
        y[i] = 0.5
        add_into(y, i, x[i] ** 2)
        y[i] = ti.tanh(y[i]) * y[i]


@ti.kernel
def component_sum():
    for i in x:
        v[i] = ti.Vector([x[i], 1.0])
        v[i][0] += x[i] ** 2
        y[i] = ti.sin(v[i][0]) * v[i][1]


@ti.kernel
def summed_in_a_loop(n: ti.i32):
    for i in x:
        y[i] = x[i]
        for k in range(n):
            y[i] += ti.sin(x[(i + k) % N]) * 0.5
        y[i] = ti.tanh(y[i])


@ti.kernel
def weighted_loss():
    for i in y:
        loss[None] += y[i] * (i + 1)


def torch_value(name, t):
    if name == "set_add_sub_tanh":
        out = torch.tanh(0.5 + t ** 2 - 0.25 * t)
    elif name == "added_by_a_func":
        out = torch.tanh(0.5 + t ** 2) * (0.5 + t ** 2)
    elif name == "component_sum":
        out = torch.sin(t + t ** 2)
    else:
        n = int(name.rsplit(" ", 1)[1])
        out = torch.tanh(t + sum(torch.sin(torch.roll(t, -k)) * 0.5 for k in range(n)))
    return (out * torch.arange(1, N + 1, dtype=t.dtype)).sum()


def program(kernel, *args):
    def run():
        kernel(*args)
        weighted_loss()
    return td.function(run, inputs=[x], outputs=[loss])


PROGRAMS = {"set_add_sub_tanh": program(set_add_sub_tanh), "added_by_a_func": program(added_by_a_func),
            "component_sum": program(component_sum), **{f"summed_in_a_loop {n}": program(summed_in_a_loop, n)
                                                        for n in (0, 1, 3)}}


@given(st.sampled_from(sorted(PROGRAMS)), st.integers(0, 2**32 - 1))
def test_a_sum_into_a_set_entry_is_read_back_exactly(name, seed):
    x0 = np.random.default_rng(seed).uniform(-1.2, 1.2, N)
    fn = PROGRAMS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        value, grad = td.value_and_grad(fn)(x0)
    t = torch.tensor(x0, requires_grad=True)
    want = torch_value(name, t)
    np.testing.assert_allclose(value, want.item(), rtol=1e-12)
    np.testing.assert_allclose(grad, torch.autograd.grad(want, t)[0].numpy(), rtol=1e-10, atol=1e-13)
    assert fn.memo.peek("reverse verdict") is None  # exact: never checked against forward mode


@ti.kernel
def linear_tanh(x: ti.types.ndarray(), W: ti.types.ndarray(), b: ti.types.ndarray(), out: ti.types.ndarray()):
    for i, j in ti.ndrange(x.shape[0], W.shape[0]):
        out[i, j] = b[j]
        for k in range(x.shape[1]):
            out[i, j] += x[i, k] * W[j, k]
        out[i, j] = ti.tanh(out[i, j])


LAYER = td.function(linear_tanh, inputs=["x", "W", "b"], outputs={"out": lambda x, W, b: (x.shape[0], W.shape[0])})


@given(st.integers(1, 4), st.integers(0, 3), st.integers(0, 2**32 - 1))
def test_a_linear_layer_summing_into_its_output_then_tanh_in_place(rows, inner, seed):
    rng = np.random.default_rng(seed)
    xs, W, b, c = rng.normal(size=(rows, inner)), rng.normal(size=(3, inner)), rng.normal(size=3), \
        rng.normal(size=(rows, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        out, vjp_fn = td.vjp(LAYER, xs, W, b)
        got = vjp_fn(c)
    ts = [torch.tensor(a, requires_grad=True) for a in (xs, W, b)]
    want = torch.tanh(ts[0] @ ts[1].T + ts[2])
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=1e-12, atol=1e-15)
    for g, w in zip(got, torch.autograd.grad(want, ts, torch.tensor(c)), strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-10, atol=1e-13)
    assert LAYER.memo.peek("reverse verdict") is None


def test_the_layer_as_written_for_its_adjoint():
    parsed = entries_as_locals(bind(parse(linear_tanh), None), _touches_fields)
    assert ast.unparse(parsed.tree).splitlines()[2:8] == [
        "        out[i, j] = b[j]",
        "        out_entry = out[i, j]",
        "        for k in range(x.shape[1]):",
        "            out_entry += x[i, k] * W[j, k]",
        "        out[i, j] = out_entry",
        "        out[i, j] = ti.tanh(out[i, j])",
    ]


@ti.kernel
def summed_not_read_after(x: ti.types.ndarray(), W: ti.types.ndarray(), out: ti.types.ndarray()):
    for i, j in ti.ndrange(x.shape[0], W.shape[0]):
        out[i, j] = 0.0
        for k in range(x.shape[1]):
            out[i, j] += x[i, k] * W[j, k]


@ti.kernel
def not_set_before(x: ti.types.ndarray(), W: ti.types.ndarray(), out: ti.types.ndarray()):
    for i, j in ti.ndrange(x.shape[0], W.shape[0]):
        for k in range(x.shape[1]):
            out[i, j] += x[i, k] * W[j, k]
        out[i, j] = ti.tanh(out[i, j])


@pytest.mark.parametrize("kernel", [summed_not_read_after, not_set_before])
def test_sums_without_a_set_before_and_a_read_after_stay_as_written(kernel):
    """Summed only (its adjoint needs no value), or summed into what the entry held before the kernel (a local
    would start from the entry as the kernel left it)."""
    parsed = bind(parse(kernel), None)
    assert entries_as_locals(parsed, _touches_fields) is parsed
