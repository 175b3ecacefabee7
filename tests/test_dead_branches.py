"""Branches a reverse function would compute again only for values nothing reads are left out (NOTE: [Branches
computed again for nothing] in tidiff/_lang/dead_branches.py): the adjoint of three nested branches holds each
branch's forward code once more, not once per level around it, and its derivatives are torch's."""
import inspect

import numpy as np
import taichi as ti
import torch

import tidiff as td
from tidiff._adjoint.kernels import vjp_kernel

N = 8
x = ti.field(ti.f64, shape=N)
v = ti.field(ti.f64, shape=N)
out = ti.field(ti.f64, shape=N)


@ti.kernel
def collide():
    for i in x:
        a = x[i] * 2.0
        b = ti.sin(a)
        if a > 0.1:
            c = b * a + v[i]
            if c > 0.2:
                d = ti.exp(c) * b
                if d > 0.3:
                    e = d * d + a
                    out[i] = e * c
                else:
                    out[i] = d + c
            else:
                out[i] = c * 3.0
        else:
            out[i] = b


def torch_collide(xs, vs):
    values = []
    for xi, vi in zip(xs, vs):
        a = xi * 2.0
        b = torch.sin(a)
        if a > 0.1:
            c = b * a + vi
            if c > 0.2:
                d = torch.exp(c) * b
                values.append((d * d + a) * c if d > 0.3 else d + c)
            else:
                values.append(c * 3.0)
        else:
            values.append(b)
    return torch.stack(values)


def test_each_branch_is_computed_again_once_in_the_adjoint():
    source = inspect.getsource(vjp_kernel(collide).kernel.__wrapped__)
    assert source.count("ti.exp(") == 1  # three levels deep: written 3 times before
    assert source.count("* 3.0") == 2  # the branch's value, then its cotangent's


def test_nested_branches_reverse_as_torch():
    F = td.function(collide, inputs=[x, v], outputs=[out])
    xs = np.linspace(-0.6, 0.9, N)  # every branch taken
    vs = np.linspace(0.5, -0.4, N)
    ct = np.cos(np.arange(N))
    _, pullback = td.vjp(F, xs, vs)
    want = torch.autograd.functional.vjp(torch_collide, (torch.tensor(xs), torch.tensor(vs)), torch.tensor(ct))[1]
    for got, expected in zip(pullback(ct), want, strict=True):
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-12)


@ti.func
def carried(p: ti.types.vector(3, ti.f64)) -> ti.f64:
    s = 0.0
    t = 1.0
    for k in range(4):
        if s < 2.0:  # assigns only variables of the function, read by the next iteration: kept
            t = t * p[k % 3] + 0.5
            s = s + t * t
    return s + t


def torch_carried(p):
    s, t = torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)
    for k in range(4):
        if s < 2.0:
            t = t * p[k % 3] + 0.5
            s = s + t * t
    return s + t


def test_a_branch_assigning_what_the_next_iteration_reads_is_kept():
    p = np.array([0.4, -0.3, 0.7])
    want = torch.autograd.functional.jacobian(torch_carried, torch.tensor(p)).numpy()
    np.testing.assert_allclose(td.jacrev(carried)(p), want, rtol=1e-12)
    np.testing.assert_allclose(td.grad(carried)(p), want, rtol=1e-12)
