"""Launch plans set tensors, gradients and numbers into a kernel's launch context themselves (NOTE: [Tensor
launches] in tidiff/_lang/launch.py): the same results as Taichi's call, and Taichi's call wherever its setter does
more than that.
"""
from unittest import mock

import numpy as np
import pytest
import taichi as ti
import torch

from tidiff._lang.launch import DirectLaunch


@ti.kernel
def mixed(x: ti.types.ndarray(), v: ti.types.ndarray(dtype=ti.math.vec2, ndim=1), s: ti.f64, n: ti.i32,
          out: ti.types.ndarray()):
    for i in out:
        out[i] = ti.sin(x[i, 1]) * v[i].dot(v[i]) * s + n


def arguments(rows=5):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 3, dtype=torch.float64, generator=g)
    v = torch.randn(rows, 2, dtype=torch.float64, generator=g)
    return x, v, 1.5, 3, torch.zeros(rows, dtype=torch.float64)


def by_taichi(kernel, *args):
    kernel(*args)
    return args


def launched(direct, args):
    """Launch ``direct`` with ``args``; whether it went through Taichi's call."""
    taichi_call = direct.kernel.launch_kernel
    with mock.patch.object(direct.kernel, "launch_kernel", wraps=taichi_call) as call:
        direct(*args)
    return call.called


def test_a_launch_sets_tensors_vectors_and_numbers_itself():
    direct = DirectLaunch(mixed)
    for rows in (5, 9, 5):  # the first looks the compiled kernel up
        args = arguments(rows)
        assert not launched(direct, args)
        want = by_taichi(mixed, *arguments(rows))[-1]
        torch.testing.assert_close(args[-1], want, rtol=0, atol=0)


@ti.kernel
def squares(x: ti.types.ndarray(), y: ti.types.ndarray()):
    for i in x:
        y[i] = x[i] * x[i] * ti.exp(x[i])


def test_gradients_are_set_beside_their_tensors():
    direct = DirectLaunch(squares.grad)
    results = []
    for _ in range(3):
        x = torch.linspace(-1, 1, 6, dtype=torch.float64).requires_grad_()
        y = torch.zeros(6, dtype=torch.float64).requires_grad_()
        x.grad, y.grad = torch.zeros_like(x), torch.linspace(0.5, 2, 6, dtype=torch.float64)
        assert not launched(direct, (x, y))
        results.append(x.grad)
    want = (2 * x + x * x) * torch.exp(x) * torch.linspace(0.5, 2, 6, dtype=torch.float64)
    for got in results:
        torch.testing.assert_close(got, want.detach(), rtol=1e-14, atol=1e-14)


def test_taichi_sets_what_a_launch_does_not():
    direct = DirectLaunch(mixed)
    direct(*arguments())
    x, v, s, n, out = arguments()
    host = out.numpy().copy()
    assert not launched(direct, (x.numpy(), v.numpy(), s, n, host))  # contiguous NumPy arrays: set too
    np.testing.assert_array_equal(host, by_taichi(mixed, *arguments())[-1].numpy())
    assert launched(direct, (np.asfortranarray(x.numpy()), v.numpy(), s, n, host))  # Fortran order: Taichi copies
    assert launched(direct, (x, v, np.float64(s), n, out)) is False  # NumPy numbers are numbers
    assert launched(direct, (x, v, s, n, out.requires_grad_()))  # a gradient Taichi allocates
    assert out.grad is not None
    with pytest.raises(ValueError, match="Non contiguous"):  # Taichi's own error
        direct(torch.randn(3, 5, dtype=torch.float64).T, v, s, n, torch.zeros(5, dtype=torch.float64))
