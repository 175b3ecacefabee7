"""td.scan's per-step outputs (per_step=): stacked over the steps and differentiable, on the host and over fields,
against torch running the same steps (float64)."""
import numpy as np
import pytest
import taichi as ti
import torch
from mass_spring import MassSpring

import tidiff as td

RTOL = 1e-9
T = 11


@ti.func
def oscillator(x: ti.f64, v: ti.f64, k: ti.f64):
    return x + 0.05 * v, v - 0.05 * k * ti.sin(x), x * v


def oscillator_torch(x, v, k, steps):
    ys = []
    for _ in range(steps):
        x, v, y = x + 0.05 * v, v - 0.05 * k * torch.sin(x), x * v
        ys.append(y)
    return x, v, torch.stack(ys)


@pytest.mark.parametrize("checkpoints", [1, 3, T, None])
def test_a_func_step_on_the_host_against_torch(checkpoints):
    loop = td.scan(oscillator, T, checkpoints=checkpoints, per_step=1)
    args = (0.7, -0.2, 3.0)
    xT, vT, ys = loop(*args)
    x, v, k = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in args)
    tx, tv, tys = oscillator_torch(x, v, k, T)
    assert ys.shape == (T,)
    np.testing.assert_allclose(ys, tys.detach().numpy(), rtol=RTOL)
    np.testing.assert_allclose([xT, vT], [tx.item(), tv.item()], rtol=RTOL)
    w = np.linspace(-1.0, 2.0, T)
    (tx * 0.5 + (tys * torch.tensor(w)).sum()).backward()
    _, vjp_fn = td.vjp(loop, *args)
    grads = vjp_fn((0.5, 0.0, w))
    np.testing.assert_allclose(grads, [x.grad.item(), v.grad.item(), k.grad.item()], rtol=RTOL)
    # forward mode agrees: <c, J t> = <J^T c, t>
    t = np.array([0.3, -1.1, 0.4])
    _, (dxT, dvT, dys) = td.jvp(loop, args, tuple(t))
    np.testing.assert_allclose(0.5 * dxT + w @ dys, np.dot(grads, t), rtol=RTOL)


@pytest.fixture(scope="module")
def system():
    return MassSpring(5)


@pytest.fixture(scope="module")
def energy_step(system):
    return system.step_and_energy_function(td)  # one program: its kernels compile once for every loop below


@pytest.mark.parametrize("checkpoints", [1, 4, T])
def test_a_field_program_step_against_torch(system, energy_step, checkpoints):
    loop = td.scan(energy_step, T, checkpoints=checkpoints, per_step=1)
    x0, v0, k0 = system.arguments()
    xT, vT, energies = loop(x0, v0, k0)
    x, v, k = (torch.tensor(a, requires_grad=True) for a in (x0, v0, k0))
    tx, tv, te = system.torch_steps(torch, x, v, k, T)
    assert energies.shape == (T,)
    np.testing.assert_allclose(energies, te.detach().numpy(), rtol=RTOL)
    np.testing.assert_allclose(xT, tx.detach().numpy(), rtol=RTOL)
    w = np.linspace(0.5, 1.5, T)
    c_x = np.random.default_rng(0).standard_normal(x0.shape)
    ((tx * torch.tensor(c_x)).sum() + (te * torch.tensor(w)).sum()).backward()
    _, vjp_fn = td.vjp(loop, x0, v0, k0)
    dx, dv, dk = vjp_fn((c_x, np.zeros_like(v0), w))
    np.testing.assert_allclose(dx, x.grad.numpy(), rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(dv, v.grad.numpy(), rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(dk, k.grad.numpy(), rtol=RTOL, atol=1e-12)
    # forward mode agrees: <c, J t> = <J^T c, t>
    rng = np.random.default_rng(1)
    t = (rng.standard_normal(x0.shape), rng.standard_normal(v0.shape), rng.standard_normal(k0.shape))
    _, (dxT, _, denergies) = td.jvp(loop, (x0, v0, k0), t)
    np.testing.assert_allclose(np.sum(c_x * dxT) + w @ denergies,
                               sum(np.sum(g * d) for g, d in zip((dx, dv, dk), t, strict=True)), rtol=RTOL)
    # only the energies: the loss over the whole trajectory, by the stiffnesses
    energy_only = vjp_fn((np.zeros_like(x0), np.zeros_like(v0), w))[2]
    x, v, k = (torch.tensor(a, requires_grad=True) for a in (x0, v0, k0))
    (system.torch_steps(torch, x, v, k, T)[2] * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(energy_only, k.grad.numpy(), rtol=RTOL, atol=1e-12)


def test_per_step_must_count_outputs():
    with pytest.raises(ValueError, match="per_step must be an integer from 0 to the step's 3 outputs"):
        td.scan(oscillator, T, per_step=4)
    with pytest.raises(ValueError, match="per_step must be an integer"):
        td.scan(oscillator, T, per_step=-1)
    with pytest.raises(TypeError, match="per_step must be an integer"):
        td.scan(oscillator, T, per_step=1.0)
