"""Functions with many inputs per element: a runtime loop over an 80-vector, gradients exact.

Taichi's own reverse mode crashes the process on this function (SIGBUS, Taichi 1.7.4);
tidiff's reverse mode for @ti.func code is forward mode transposed.
"""
import numpy as np
import taichi as ti
import torch

import tidiff as td

N = 80


@ti.func
def long_energy(x: ti.types.vector(N, ti.f64), w: ti.f64) -> ti.f64:
    total = 0.0
    for i in range(N):
        total += ti.sin(w * x[i]) * x[(i + 1) % N]
    return total


def torch_long_energy(x, w):
    return (torch.sin(w * x) * torch.roll(x, -1, dims=-1)).sum(-1)


def test_gradient_matches_torch_and_forward():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((6, N)), 0.7
    gx, gw = td.grad(long_energy, argnums=(0, 1))(x, w)
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    torch_long_energy(xt, wt).sum().backward()
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gw.sum(), wt.grad.item(), rtol=1e-10)
    # the same gradient by forward mode (one tangent per component)
    np.testing.assert_allclose(td.jacfwd(long_energy)(x, w), gx, rtol=1e-10, atol=1e-12)


def test_vjp_sums_broadcast_argument():
    rng = np.random.default_rng(1)
    x, w, c = rng.standard_normal((5, N)), 0.3, rng.standard_normal(5)
    _, vjp_fn = td.vjp(long_energy, x, w)
    gx, gw = vjp_fn(c)
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    (torch_long_energy(xt, wt) * torch.tensor(c)).sum().backward()
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert gw.shape == () and np.isclose(gw, wt.grad.item(), rtol=1e-10)
