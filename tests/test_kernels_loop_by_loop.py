"""A kernel whose loop reads what an earlier loop of it wrote, then overwrites it, runs loop by loop in a
program (NOTE: [Kernels run loop by loop] in tidiff/_fields/split.py): exact, unchecked, in every mode; the
oracle is torch in float64."""
import warnings

import numpy as np
import pytest
import taichi as ti
import torch

import tidiff as td

N = 6
lx, ly, lz, lw = (ti.field(ti.f64, shape=N) for _ in range(4))
l_loss = ti.field(ti.f64, shape=())


@ti.kernel
def three_loops():
    for i in lx:
        ly[i] = ti.sin(lx[i])
    for i in lx:
        ly[i] *= lx[i] + lw[i]  # reads what the first loop wrote, then overwrites it
    ti.loop_config(serialize=True)
    for i in range(N):
        lz[i] = ly[i] * ly[(i + 1) % N]


@ti.kernel
def loss_of_z():
    for i in lz:
        l_loss[None] += lz[i] ** 2


def torch_three_loops(x, w):
    y = torch.sin(x) * (x + w)
    return y * torch.roll(y, -1)


def program():
    three_loops()
    loss_of_z()


X = np.linspace(-0.9, 1.1, N)
W = np.cos(np.arange(N))


def test_every_mode_as_torch_without_a_check():
    G = td.function(three_loops, inputs=[lx, lw], outputs=[lz])
    F = td.function(program, inputs=[lx, lw], outputs=[l_loss])
    tx, tw = torch.tensor(X), torch.tensor(W)
    jac = torch.autograd.functional.jacobian(torch_three_loops, (tx, tw))
    loss = lambda x, w: (torch_three_loops(x, w) ** 2).sum()  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no TaichiReverseWarning: nothing to check
        for got, want in zip(td.jacrev(G, argnums=(0, 1))(X, W), jac, strict=True):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-14)
        for got, want in zip(td.jacfwd(G, argnums=(0, 1))(X, W), jac, strict=True):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-14)
        value, grads = td.value_and_grad(F, argnums=(0, 1))(X, W)
        want_grads = torch.autograd.functional.jacobian(loss, (tx, tw))
        np.testing.assert_allclose(value, loss(tx, tw).item(), rtol=1e-13)
        for got, want in zip(grads, want_grads, strict=True):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-12)
        _, hv = td.hvp(F, (X, W), (np.sin(X), W))
        want_hv = torch.autograd.functional.hvp(loss, (tx, tw), (torch.sin(tx), tw))[1]
        for got, want in zip(hv, want_hv, strict=True):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-11)
    assert G.memo.peek("reverse verdict") is None
    assert F.memo.peek("reverse verdict") is None


@ti.kernel
def loops_apart():
    for i in lx:
        ly[i] = ti.sin(lx[i])
    for i in lx:
        lz[i] = ly[i] * lw[i]  # reads the first loop's writes, overwrites nothing it read


def test_a_kernel_whose_loops_overwrite_nothing_read_runs_whole():
    G = td.function(loops_apart, inputs=[lx, lw], outputs=[lz])
    want = torch.autograd.functional.jacobian(lambda x: torch.sin(x) * torch.tensor(W), torch.tensor(X)).numpy()
    np.testing.assert_allclose(td.jacrev(G)(X, W), want, rtol=1e-13, atol=1e-15)
    assert all(k._tidiff_loops is None for k in G.program._kernels)


@ti.kernel
def scaled_by_a_top_level_local():
    c = 2.0  # a statement beside the loops: the kernel runs whole and its adjoint is checked
    for i in lx:
        ly[i] = ti.sin(lx[i])
    for i in lx:
        ly[i] = ly[i] * lx[i] * c


def test_a_top_level_statement_keeps_the_kernel_whole_and_checked():
    G = td.function(scaled_by_a_top_level_local, inputs=[lx], outputs=[ly])
    want = np.diag(2.0 * (np.cos(X) * X + np.sin(X)))
    with pytest.warns(td.TaichiReverseWarning, match="scaled_by_a_top_level_local"):
        np.testing.assert_allclose(td.jacrev(G)(X), want, rtol=1e-12, atol=1e-14)
