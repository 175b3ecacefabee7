"""A torch operator's first-order backward reads back what its ndarray kernel stored instead of computing it again
(NOTE: [Outputs read back]): the same numbers as torch, in both forms of the adjoint, and only where the stored
value is what the output holds after the launch.
"""
import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_ndarray_chunks import launches

import tidiff as td
from tidiff._lang.compile import info


@ti.kernel
def tanh_layer(x: ti.types.ndarray(), W: ti.types.ndarray(), b: ti.types.ndarray(), y: ti.types.ndarray()):
    for i, j in y:
        acc = b[j]
        for k in range(x.shape[1]):
            acc += x[i, k] * W[j, k]
        y[i, j] = ti.tanh(acc)  # tanh's rule reads its result: read back, tanh not called again


def torch_tanh_layer(x, W, b):
    return torch.tanh(x @ W.T + b)


@ti.kernel
def two_outputs(x: ti.types.ndarray(), w: ti.types.ndarray(), e: ti.types.ndarray(), r: ti.types.ndarray()):
    for i in x:
        e[i] = ti.exp(x[i] * w[0])
        r[i] = ti.sqrt(x[i] * x[i] + w[1] * w[1])


def torch_two_outputs(x, w):
    return torch.exp(x * w[0]), torch.sqrt(x * x + w[1] * w[1])


# Kernels whose stores are not read back, each with its torch twin: the value stored may not be what the output
# holds after the launch (a branch, another index, written again), the iteration computes it in a runtime loop, or
# a later loop reads the output (left alone, though the output keeps the stored value there).
@ti.kernel
def in_a_branch(x: ti.types.ndarray(), y: ti.types.ndarray()):
    for i in x:
        if x[i] > 0:
            y[i] = ti.exp(x[i])


@ti.kernel
def at_another_index(x: ti.types.ndarray(), y: ti.types.ndarray()):
    for i in x:
        t = ti.exp(x[i])
        y[x.shape[0] - 1 - i] = t


@ti.kernel
def written_again(x: ti.types.ndarray(), y: ti.types.ndarray()):
    for i in x:
        t = ti.exp(x[i])
        y[i] = t
        y[i] += x[i]


@ti.kernel
def read_by_a_later_loop(x: ti.types.ndarray(), y: ti.types.ndarray(), z: ti.types.ndarray()):
    for i in x:
        t = ti.exp(x[i])
        y[i] = t
    for i in x:
        z[i] = y[i] * x[i]


@ti.kernel
def bound_in_a_loop(x: ti.types.ndarray(), y: ti.types.ndarray()):
    for i in x:
        t = x[i]
        for _ in range(x.shape[0] - 1):  # a runtime loop: 3 iterations for the 4 entries the test gives
            t = ti.sin(t)
        y[i] = t


def shape_of_x(x):
    return x.shape


NOT_READ_BACK = {
    "in a branch": (in_a_branch, ["y"], lambda x: torch.where(x > 0, torch.exp(x), torch.zeros_like(x))),
    "at another index": (at_another_index, ["y"], lambda x: torch.exp(x).flip(0)),
    "written again": (written_again, ["y"], lambda x: torch.exp(x) + x),
    "read by a later loop": (read_by_a_later_loop, ["y", "z"], lambda x: (torch.exp(x), torch.exp(x) * x)),
    "bound in a loop": (bound_in_a_loop, ["y"], lambda x: torch.sin(torch.sin(torch.sin(x)))),
}

LAYER = td.torch.function(tanh_layer, inputs=["x", "W", "b"],
                          outputs={"y": lambda x, W, b: (x.shape[0], W.shape[0])}, name="tanh_layer")
TWO = td.torch.function(two_outputs, inputs=["x", "w"], outputs={"e": lambda x, w: x.shape, "r": lambda x, w: x.shape})
OPS = {name: td.torch.function(k, inputs=["x"], outputs=dict.fromkeys(outs, shape_of_x))
       for name, (k, outs, _) in NOT_READ_BACK.items()}


def adjoint_of(op, *args):
    return op.fn.adjoint_for(op.fn.specs_for(args))


def assert_backward_equals_torch(op, twin, args, cotangents, rtol=1e-12):
    got = torch.autograd.grad(op(*args), args, cotangents)
    want = torch.autograd.grad(twin(*args), args, cotangents)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=rtol, atol=rtol)


def randn(*shape, generator):
    return torch.randn(*shape, dtype=torch.float64, generator=generator, requires_grad=True)


def test_the_layer_reads_tanh_back():
    g = torch.Generator().manual_seed(0)
    args = randn(5, 8, generator=g), randn(4, 8, generator=g), randn(4, generator=g)
    own = adjoint_of(LAYER, *args)
    assert own.reads_back == ["y"] and own.read_back.chunked is not None
    for form in (own.read_back, own.read_back.chunked):
        source = info(form.kernel).source
        assert "= y[i, j]" in source and "ti.tanh" not in source  # tanh's result read, not computed again
    assert "ti.tanh(acc_1)" in info(own.kernel).source  # every other vjp computes it again
    before = own.read_back.compiles()
    for rows in (5, 3000):  # the second call of each runs the launch plan
        args = randn(rows, 8, generator=g), randn(4, 8, generator=g), randn(4, generator=g)
        for _ in range(2):
            assert_backward_equals_torch(LAYER, torch_tanh_layer, args, torch.randn(rows, 4, dtype=torch.float64))
    assert own.read_back.compiles() > before  # the backward launched the form reading back


@given(st.integers(1, 7), st.integers(0, 2**32 - 1))
def test_the_layer_by_chunk_reads_back_as_torch(rows, seed):
    g = torch.Generator().manual_seed(seed)
    args = randn(rows, 8, generator=g), randn(4, 8, generator=g), randn(4, generator=g)
    with launches(every_launch_chunked=True) as taken:
        assert_backward_equals_torch(LAYER, torch_tanh_layer, args, torch.randn(rows, 4, dtype=torch.float64,
                                                                              generator=g))
    assert taken == [True]


@given(st.lists(st.floats(-3, 3), min_size=1, max_size=9), st.floats(-2, 2), st.floats(0.5, 2),
       st.integers(0, 2**32 - 1))
def test_two_outputs_read_back_as_torch(x, a, c, seed):
    g = torch.Generator().manual_seed(seed)
    args = torch.tensor(x, dtype=torch.float64, requires_grad=True), torch.tensor([a, c], dtype=torch.float64,
                                                                                   requires_grad=True)
    assert sorted(adjoint_of(TWO, *args).reads_back) == ["e", "r"]
    cts = tuple(torch.randn(len(x), dtype=torch.float64, generator=g) for _ in range(2))
    assert_backward_equals_torch(TWO, torch_two_outputs, args, cts)


@pytest.mark.parametrize("name", sorted(NOT_READ_BACK))
def test_stores_not_read_back(name):
    kernel, outs, twin = NOT_READ_BACK[name]
    op = OPS[name]
    x = torch.tensor([0.3, -1.2, 0.7, 1.1], dtype=torch.float64, requires_grad=True)
    assert op.fn.read_back_for(op.fn.specs_for([x])) is None
    cts = tuple(torch.linspace(-1, 1, 4, dtype=torch.float64) * (k + 1) for k in range(len(outs)))
    got = torch.autograd.grad(op(x), x, cts)
    want = torch.autograd.grad(twin(x), x, cts)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_float32_outputs_under_float64_are_not_read_back():
    x = np.linspace(-1, 1, 6, dtype=np.float32)
    fn = TWO.fn
    specs = fn.specs_for([x, np.array([0.5, 1.0], np.float32)])
    assert fn.adjoint_for(specs).read_back is None  # the store rounds what the kernel computed in float64


def test_an_output_changed_in_place_is_refused_as_torch_refuses():
    x = torch.tensor([0.5, -0.25], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([1.5, 0.5], dtype=torch.float64, requires_grad=True)
    e, _ = TWO(x, w)
    e.mul_(2.0)  # the backward would read back the changed values: torch's error, as for torch.exp
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        e.sum().backward()
    y = OPS["in a branch"](x)  # outputs not read back are not kept
    y.mul_(2.0)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.where(x > 0, 2 * torch.exp(x), torch.zeros_like(x)).detach())


def test_double_backward_and_forward_mode_take_the_vjp_without_outputs():
    g = torch.Generator().manual_seed(3)
    args = randn(3, 8, generator=g), randn(4, 8, generator=g), randn(4, generator=g)
    assert torch.autograd.gradcheck(LAYER, args, check_forward_ad=True)
    assert torch.autograd.gradgradcheck(LAYER, args)
