"""A branch's test (or a loop's bounds) reading an entry the kernel writes (NOTE: [Fields read by tests] in
tidiff/_adjoint/kernels.py, NOTE: [Sums into an owned entry, then read] in tidiff/_adjoint/entry_locals.py).

A survey of kernels as users write them found a ground contact, ``x[i] += d[i]``, then ``if x[i] < 0.0: x[i] =
0.0``, silently wrong: the adjoint computed the test again on the field as the kernel left it (clamped to 0, so the
other side), and the read was recorded nowhere, so no check ran. Now the test reads the sum, and is exact."""
import warnings

import numpy as np
import pytest
import taichi as ti
import torch
from exact_vjp import assert_exact_vjp
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td

N = 4
x = ti.field(ti.f64, shape=N)
d = ti.field(ti.f64, shape=N)
loss = ti.field(ti.f64, shape=())


@ti.kernel
def ground_contact():
    for i in x:
        x[i] += d[i]
        if x[i] < 0.0:
            x[i] = 0.0


@ti.kernel
def squared_distance():
    for i in x:
        loss[None] += (x[i] + 1.0) ** 2 * (1.0 + 0.5 * ti.sin(d[i]))


def contact():
    ground_contact()
    squared_distance()


def contact_torch(x0, d0):
    moved = torch.clamp(x0 + d0, min=0.0)
    return ((moved + 1.0) ** 2 * (1.0 + 0.5 * torch.sin(d0))).sum()


program = td.function(contact, inputs=[x, d], outputs=[loss])
entries = st.lists(st.floats(-1.0, 1.0).filter(lambda v: abs(v) > 1e-3), min_size=N, max_size=N)


@given(entries, entries)
def test_a_ground_contact_after_a_sum_is_exact(x0, d0):
    x0, d0 = np.array(x0), np.array(d0)
    if np.min(np.abs(x0 + d0)) < 1e-3:  # at the contact itself the derivative jumps
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        gx, gd = td.grad(program, argnums=(0, 1))(x0, d0)
        hessian = td.hessian(program, argnums=1)(x0, d0)
    assert program.memo.peek("reverse verdict") is None  # exact: never checked
    want = torch.autograd.functional.jacobian(contact_torch, (torch.tensor(x0), torch.tensor(d0)))
    np.testing.assert_allclose(gx, want[0].numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(gd, want[1].numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(hessian, torch.autograd.functional.hessian(
        lambda d_: contact_torch(torch.tensor(x0), d_), torch.tensor(d0)).numpy(), rtol=1e-12, atol=1e-14)


nd = ti.types.ndarray(dtype=ti.f64)


@ti.kernel
def clamped_sum(a: nd, b: nd, out: nd):
    for i in range(a.shape[0]):
        out[i] += a[i] * b[i]
        if out[i] < 0.0:
            out[i] = 0.1 * out[i]
        out[i] = out[i] * a[i]


def clamped_sum_torch(a, b):
    s = a * b
    return torch.where(s < 0.0, 0.1 * s, s) * a


def test_an_ndarray_kernel_testing_an_output_it_summed_into():
    f = td.function(clamped_sum, inputs=["a", "b"], outputs={"out": lambda a, b: a.shape})
    rng = np.random.default_rng(2)
    a, b, ct = rng.uniform(-1, 1, 6), rng.uniform(-1, 1, 6), rng.normal(size=6)
    assert_exact_vjp(f, [a, b], clamped_sum_torch, [ct])


pos = ti.Vector.field(2, ti.f64, shape=3)
vel = ti.Vector.field(2, ti.f64, shape=3)
energy = ti.field(ti.f64, shape=())


@ti.kernel
def bounce():
    for i in pos:
        vel[i][1] -= 0.5
        pos[i] += 0.1 * vel[i]
        if pos[i][1] < 0.0:
            vel[i] = -vel[i] * 0.7
            pos[i][1] = 0.0


@ti.kernel
def measured():
    for i in pos:
        energy[None] += (pos[i][0] + 2.0 * pos[i][1]) ** 2 + (vel[i][0] - 3.0 * vel[i][1]) ** 2


def bounce_torch(p, v):
    v = torch.stack([v[:, 0], v[:, 1] - 0.5], dim=1)
    p = p + 0.1 * v
    hit = (p[:, 1] < 0.0)[:, None]
    v = torch.where(hit, -v * 0.7, v)
    p = torch.stack([p[:, 0], torch.where(hit[:, 0], torch.zeros_like(p[:, 1]), p[:, 1])], dim=1)
    return ((p[:, 0] + 2.0 * p[:, 1]) ** 2 + (v[:, 0] - 3.0 * v[:, 1]) ** 2).sum()


@ti.kernel
def settle():
    for i in pos:
        pos[i] += 0.1 * vel[i]  # the whole entry summed into, then one component tested
        if pos[i][1] < 0.0:
            pos[i][1] = 0.0


@ti.kernel
def height_energy():
    for i in pos:
        energy[None] += (pos[i][0] + 2.0 * pos[i][1]) ** 2


def settle_torch(p, v):
    p = p + 0.1 * v
    p = torch.stack([p[:, 0], torch.clamp(p[:, 1], min=0.0)], dim=1)
    return ((p[:, 0] + 2.0 * p[:, 1]) ** 2).sum()


@pytest.mark.parametrize("step, measure, twin", [(bounce, measured, bounce_torch),
                                                 (settle, height_energy, settle_torch)])
def test_particles_written_by_components_are_exact(step, measure, twin):
    """A component updated (``vel[i][1] -= g``), then the whole entry read; a component tested of an entry summed
    into. The bounce was silently wrong; each is now exact, never checked (NOTE: [Sums into an owned entry, then
    read], NOTE: [Fields read by tests])."""
    f = td.function(lambda: (step(), measure()), inputs=[pos, vel], outputs=[energy])
    p0 = np.array([[0.2, 0.01], [0.3, 0.9], [0.5, 0.02]])
    v0 = np.array([[0.2, -0.3], [0.1, 0.4], [-0.5, -0.25]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        gp, gv = td.grad(f, argnums=(0, 1))(p0, v0)
    assert f.memo.peek("reverse verdict") is None
    want = torch.autograd.functional.jacobian(twin, (torch.tensor(p0), torch.tensor(v0)))
    np.testing.assert_allclose(gp, want[0].numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(gv, want[1].numpy(), rtol=1e-12, atol=1e-14)
