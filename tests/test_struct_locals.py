"""Local struct values in @ti.func code (NOTE: [Struct locals] in tidiff/_lang/structs.py), against torch."""
import numpy as np
import pytest
import taichi as ti
import torch

import tidiff as td

vec2 = ti.types.vector(2, ti.f64)
Particle = ti.types.struct(pos=vec2, mass=ti.f64, tag=ti.i32)


@ti.dataclass
class Spring:
    rest: ti.f64
    stiffness: ti.f64


@ti.func
def particle_energy(x: vec2, m: ti.f64) -> ti.f64:
    p = Particle(pos=x * 2.0, mass=m)  # tag left out: zero
    q = Particle(x, m, 3)
    p.mass = p.mass * 3.0
    p.pos[1] += q.mass
    r = q
    r.pos *= r.mass
    return p.mass * p.pos.norm_sqr() + r.pos[0] * q.mass + q.tag


def torch_particle_energy(x, m):
    pos = torch.stack([x[0] * 2.0, x[1] * 2.0 + m])
    return 3.0 * m * (pos**2).sum() + x[0] * m * m + 3.0


@ti.func
def spring_chain(x: ti.types.vector(3, ti.f64), k: ti.f64) -> ti.f64:
    total = 0.0
    s = Spring(rest=0.5, stiffness=k)
    for i in range(2):  # a runtime loop over a struct local
        s.rest = s.rest * 1.5
        d = x[i + 1] - x[i] - s.rest
        total += 0.5 * s.stiffness * d * d
    if x[0] > 0:  # a branch writing a member
        s = Spring(s.stiffness, s.rest)  # reads the struct it replaces
    return total + s.rest * s.stiffness


def torch_spring_chain(x, k):
    total, rest = 0.0, 0.5
    for i in range(2):
        rest = rest * 1.5
        d = x[i + 1] - x[i] - rest
        total = total + 0.5 * k * d * d
    return total + rest * k  # the swap keeps the product


CASES = [(particle_energy, torch_particle_energy, (np.array([0.3, -0.4]), 2.0)),
         (spring_chain, torch_spring_chain, (np.array([0.2, 0.9, 2.1]), 3.0)),
         (spring_chain, torch_spring_chain, (np.array([-0.2, 0.9, 2.1]), 3.0))]


@pytest.mark.parametrize("f, twin, args", CASES, ids=["particle", "chain", "chain_other_branch"])
def test_struct_locals_differentiate_in_every_mode(f, twin, args):
    """Issue 35, item 10: the transforms had no rule for a struct constructor (Warp's struct tests)."""
    targs = tuple(torch.tensor(a, dtype=torch.float64) for a in args)
    np.testing.assert_allclose(td.function(f)(*args), twin(*targs).item(), rtol=1e-15)
    want = torch.autograd.functional.jacobian(twin, targs)
    for got in (td.grad(f, argnums=(0, 1))(*args), td.jacfwd(f, argnums=(0, 1))(*args)):
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-13, atol=1e-14)
    hessian = torch.autograd.functional.hessian(lambda x: twin(x, targs[1]), targs[0]).numpy()
    np.testing.assert_allclose(td.hessian(f)(*args), hessian, rtol=1e-13, atol=1e-14)


@ti.kernel
def struct_in_a_kernel(x: vec2) -> ti.f64:
    return td.grad(particle_energy)(x, 2.0)[0]


def test_a_transform_of_a_struct_local_inside_a_kernel():
    x = np.array([0.3, -0.4])
    assert struct_in_a_kernel(x) == pytest.approx(td.grad(particle_energy)(x, 2.0)[0], rel=1e-15)


@ti.dataclass
class Body:
    v: vec2

    @ti.func
    def kinetic(self):
        return 0.5 * self.v.norm_sqr()


@ti.func
def calls_a_struct_method(x: vec2) -> ti.f64:
    b = Body(v=x)
    return b.kinetic()


def test_a_struct_whose_method_is_called_is_refused_by_name():
    with pytest.raises(td.TransformError, match="Body"):
        td.grad(calls_a_struct_method)(np.array([0.3, -0.4]))
