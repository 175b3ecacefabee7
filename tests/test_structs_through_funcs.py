"""Struct locals given to a func or made by one, in kernels (NOTE: [Structs through funcs] in
tidiff/_lang/inline.py): tidiff's adjoint, exact, where Taichi's ``kernel.grad`` ran, checked on the first call."""
import warnings

import numpy as np
import taichi as ti
import torch
from exact_vjp import assert_exact_vjp
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td
from tidiff._adjoint.kernels import KernelAdjoint, vjp_kernel

Particle = ti.types.struct(pos=ti.math.vec2, m=ti.f64)
nd = ti.types.ndarray(dtype=ti.f64)


@ti.func
def energy(p):
    return p.m * p.pos.norm_sqr() + ti.sin(p.pos.x)


@ti.func
def energy_annotated(p: Particle) -> ti.f64:
    return p.m * p.pos.norm_sqr() + ti.sin(p.pos.x)


@ti.func
def particle(x, y, m):
    return Particle(pos=ti.math.vec2(x, y), m=m)


@ti.kernel
def given_to_a_func(x: nd, out: nd):
    for i in range(x.shape[0]):
        p = Particle(pos=ti.math.vec2(x[i, 0], x[i, 1]), m=x[i, 2])
        out[i] = energy(p)


@ti.kernel
def made_by_a_func(x: nd, out: nd):
    for i in range(x.shape[0]):
        p = particle(x[i, 0], x[i, 1], x[i, 2])
        out[i] = energy_annotated(p) * 2.0


def energy_torch(x):
    return x[:, 2] * (x[:, :2] ** 2).sum(dim=1) + torch.sin(x[:, 0])


def per_row(kernel):
    return td.function(kernel, inputs=["x"], outputs={"out": lambda x: (x.shape[0],)})


CASES = {
    "given to a func": (per_row(given_to_a_func), energy_torch),
    "made by a func": (per_row(made_by_a_func), lambda x: 2.0 * energy_torch(x)),
}


@given(st.sampled_from(sorted(CASES)), st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_ndarray_kernels_with_structs_through_funcs(case, rows, seed):
    f, twin = CASES[case]
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, (rows, 3))
    assert f.adjoint_for(f.specs_for([x])) is not None  # tidiff's adjoint, not Taichi's kernel.grad
    assert_exact_vjp(f, [x], twin, [rng.normal(size=rows)])
    t = rng.normal(size=x.shape)
    _, pushed = td.jvp(f, (x,), (t,))
    _, forward = torch.autograd.functional.jvp(twin, torch.tensor(x), torch.tensor(t))
    np.testing.assert_allclose(pushed, forward.numpy(), rtol=1e-12, atol=1e-14)


positions = ti.Vector.field(2, ti.f64, shape=4)
masses = ti.field(ti.f64, shape=4)
total = ti.field(ti.f64, shape=())


@ti.kernel
def field_energy():
    for i in positions:
        p = particle(positions[i][0], positions[i][1], masses[i])
        total[None] += energy(p)


def test_a_field_program_with_structs_through_funcs():
    assert isinstance(vjp_kernel(field_energy), KernelAdjoint)
    f = td.function(field_energy, inputs=[positions, masses], outputs=[total])
    rng = np.random.default_rng(0)
    x, m = rng.uniform(-2, 2, (4, 2)), rng.uniform(0.5, 2, 4)

    def twin(x, m):
        return energy_torch(torch.cat([x, m[:, None]], dim=1)).sum()

    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        gx, gm = td.grad(f, argnums=(0, 1))(x, m)
        hessian = td.hessian(f)(x, m)
    assert f.memo.peek("reverse verdict") is None
    want = torch.autograd.functional.jacobian(twin, (torch.tensor(x), torch.tensor(m)))
    np.testing.assert_allclose(gx, want[0].numpy(), rtol=1e-12)
    np.testing.assert_allclose(gm, want[1].numpy(), rtol=1e-12)
    np.testing.assert_allclose(hessian, torch.autograd.functional.hessian(
        lambda x: twin(x, torch.tensor(m)), torch.tensor(x)).numpy(), rtol=1e-12, atol=1e-14)
