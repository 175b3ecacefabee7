"""Slices of vectors and matrices (``m[i, :]``, ``m[:, j]``, ``m[1:3, :2]``, ``v[1:]``, ``m[2, ::2]``) in
differentiated code, against torch: reverse mode takes them (NOTE: [Slices] in _rules/helpers.py), where it
crashed and then pushed tangents forward, 200x slower for a tet's edge vectors written ``xe[1, :] - xe[0, :]``."""
import numpy as np
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td

RTOL = 1e-7


@ti.func
def sliced(m: ti.types.matrix(4, 3, ti.f64), v: ti.math.vec4) -> ti.f64:
    a = m[1, :] - m[0, :]
    b = m[:, 2]
    c = m[1:3, :2]
    d = v[1:]
    e = m[2, ::2]
    return a.norm_sqr() * b.dot(v) + (c @ c.transpose()).trace() * d.sum() + ti.sin(e.sum())


def sliced_torch(m, v):
    a, b, c, d, e = m[1, :] - m[0, :], m[:, 2], m[1:3, :2], v[1:], m[2, ::2]
    return (a * a).sum() * (b * v).sum() + (c @ c.T).trace() * d.sum() + torch.sin(e.sum())


@given(seed=st.integers(0, 2**31 - 1))
def test_gradients_and_hessians_of_slices_against_torch(seed):
    rng = np.random.default_rng(seed)
    m, v = rng.standard_normal((4, 3)), rng.standard_normal(4)
    mt, vt = torch.tensor(m, requires_grad=True), torch.tensor(v, requires_grad=True)
    sliced_torch(mt, vt).backward()
    gm, gv = td.grad(sliced, argnums=(0, 1))(m, v)
    np.testing.assert_allclose(gm, mt.grad.numpy(), rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(gv, vt.grad.numpy(), rtol=RTOL, atol=1e-12)
    H = torch.autograd.functional.hessian(lambda y: sliced_torch(y, torch.tensor(v)), torch.tensor(m)).numpy()
    np.testing.assert_allclose(td.hessian(sliced)(m, v), H, rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(td.jacrev(sliced)(m, v), td.jacfwd(sliced)(m, v), rtol=RTOL, atol=1e-12)


def test_reverse_mode_takes_slices():
    assert "sliced_vjp(" in td.source(td.grad(sliced))  # one reverse call, not a tangent push per input
