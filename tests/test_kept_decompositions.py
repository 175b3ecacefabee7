"""A Hessian operator keeps its point's decompositions across products (NOTE: [Decompositions kept across
products] in tidiff/_rules/kept.py): products against torch's dense Hessian (float64) while the operator records
and after it replays, bit for bit the same numbers, with decompositions in a runtime loop and in a branch."""
import numpy as np
import pytest
import taichi as ti
import torch
from tet_meshes import tet_mesh

import tidiff as td
from tidiff._elements.kernels import KeptValues

RTOL = 1e-7

tet4 = ti.types.matrix(4, 3, ti.f64)


@ti.func
def edges(xe: tet4, B: ti.math.mat3) -> ti.math.mat3:
    return ti.Matrix.cols([xe[1, :] - xe[0, :], xe[2, :] - xe[0, :], xe[3, :] - xe[0, :]]) @ B


@ti.func
def corotated(xe: tet4, B: ti.math.mat3, vol: ti.f64) -> ti.f64:
    F = edges(xe, B)
    R, S = ti.polar_decompose(F)
    return vol * ((F - R).norm_sqr() + 0.1 * xe[2, 1])


@ti.func
def looped(xe: tet4, B: ti.math.mat3, vol: ti.f64) -> ti.f64:
    """An SVD in a runtime loop: a slot per iteration, in the order they run."""
    F = edges(xe, B)
    total = 0.0
    for t in range(2):
        U, S, V = ti.svd(F * (1.0 + 0.5 * t))
        total += S[0, 0] * S[1, 1] + S[2, 2] ** 3
    return vol * total


@ti.func
def branched(xe: tet4, B: ti.math.mat3, vol: ti.f64) -> ti.f64:
    """A symmetric eigenproblem in a branch only some elements take: their counts differ."""
    F = edges(xe, B)
    total = F.norm_sqr()
    if vol > 0.75:
        w, Q = ti.sym_eig(F.transpose() @ F)
        total += (w * w).sum() + (Q @ w).norm_sqr()
    return vol * total


def _edges_torch(x, tets, B):
    xe = x[tets]
    return torch.stack([xe[:, 1] - xe[:, 0], xe[:, 2] - xe[:, 0], xe[:, 3] - xe[:, 0]], dim=2) @ B


def _rotation_torch(F):
    U, _, Vh = torch.linalg.svd(F)
    return U @ Vh


def corotated_torch(x, tets, B, vol):
    F = _edges_torch(x, tets, B)
    return (vol * (((F - _rotation_torch(F)) ** 2).sum((1, 2)) + 0.1 * x[tets][:, 2, 1])).sum()


def looped_torch(x, tets, B, vol):
    F = _edges_torch(x, tets, B)
    total = torch.zeros(len(tets), dtype=torch.float64)
    for t in range(2):
        s = torch.linalg.svdvals(F * (1.0 + 0.5 * t))
        total = total + s[:, 0] * s[:, 1] + s[:, 2] ** 3
    return (vol * total).sum()


def branched_torch(x, tets, B, vol):
    F = _edges_torch(x, tets, B)
    w = torch.linalg.eigvalsh(F.transpose(1, 2) @ F)
    taken = (w * w).sum(1) + (w * w).sum(1)  # |Q w|^2 = |w|^2: Q is orthogonal
    return (vol * ((F * F).sum((1, 2)) + torch.where(vol > 0.75, taken, 0.0))).sum()


def mesh():
    """Tets whose deformation gradients are near the identity, stretched: distinct, positive singular values."""
    return tet_mesh(3, nodes=12, count=10, stretch=(1.1, 0.95, 1.02), noise=0.02)


def dense_hessian(energy, tets, x, B, vol):
    Bt, vt = torch.tensor(B), torch.tensor(vol)
    H = torch.autograd.functional.hessian(lambda y: energy(y, torch.tensor(tets), Bt, vt), torch.tensor(x))
    return H.reshape(x.size, x.size).numpy()


@pytest.mark.parametrize("energy, oracle, least", [(corotated, corotated_torch, 18), (looped, looped_torch, 2 * 27),
                                                   (branched, branched_torch, 12)])
def test_products_recorded_then_replayed_equal_torch_and_each_other(energy, oracle, least):
    tets, x, B, vol = mesh()
    H = dense_hessian(oracle, tets, x, B, vol)
    op = td.hessian_operator(td.element_sum(energy, tets))(x, B, vol)
    vs = np.random.default_rng(5).standard_normal((3,) + x.shape)
    recorded = [op @ v for v in vs]  # the first launch finds the width, the second fills the values
    assert op._kept.ready and op._kept.width >= least  # room for the element that decomposes most
    for v, first in zip(vs, recorded, strict=True):
        replayed = op @ v
        np.testing.assert_allclose(replayed.ravel(), H @ v.ravel(), rtol=RTOL, atol=1e-9)
        np.testing.assert_array_equal(replayed, first)
    op._kept.store[:] = 0.0  # what a product reads now is what was kept
    assert not np.allclose(op @ vs[0], recorded[0])


@pytest.mark.parametrize("energy, oracle", [(corotated, corotated_torch), (looped, looped_torch),
                                            (branched, branched_torch)])
def test_sparse_hessians_keep_each_element_s_decompositions_across_its_pushes(energy, oracle):
    """The first push of an element records, the others replay (NOTE: [Kept across pushes]); each call records
    anew: three calls at three points, each against torch, the transform made once and made at each call."""
    tets, x, B, vol = mesh()
    E = td.element_sum(energy, tets)
    hessian_of = td.sparse_hessian(E)
    for step in range(3):
        moved = x + 0.01 * step * np.sin(np.arange(x.size)).reshape(x.shape)
        H = dense_hessian(oracle, tets, moved, B, vol)
        np.testing.assert_allclose(hessian_of(moved, B, vol).toarray(), H, rtol=RTOL, atol=1e-9)
        np.testing.assert_allclose(td.sparse_hessian(E)(moved, B, vol).toarray(), H, rtol=RTOL, atol=1e-9)


def test_the_operator_is_the_hessian_where_it_was_made():
    """Its point is copied: the caller's arrays changed in place afterwards change nothing."""
    tets, x, B, vol = mesh()
    E = td.element_sum(corotated, tets)
    v = np.random.default_rng(6).standard_normal(x.shape)
    expected = td.hessian_operator(E)(x, B, vol) @ v
    moved, data = x.copy(), B.copy()
    op = td.hessian_operator(E)(moved, data, vol)
    for _ in range(3):
        moved += 0.1
        data *= 1.5
        np.testing.assert_array_equal(op @ v, expected)


def test_values_too_large_to_keep_are_decomposed_at_every_product(monkeypatch):
    tets, x, B, vol = mesh()
    monkeypatch.setattr(KeptValues, "LIMIT", 8 * len(tets) * 10)  # room for 10 values per element, 18 needed
    H = dense_hessian(corotated_torch, tets, x, B, vol)
    op = td.hessian_operator(td.element_sum(corotated, tets))(x, B, vol)
    v = np.random.default_rng(7).standard_normal(x.shape)
    for _ in range(3):
        np.testing.assert_allclose((op @ v).ravel(), H @ v.ravel(), rtol=RTOL, atol=1e-9)
    assert not op._kept.ready and op._kept.width == 0


def test_decompositions_outside_an_operator_are_taichis_own():
    """The tangent code's kept call is the op itself where nothing keeps values: the same numbers as Taichi's."""
    tets, x, B, vol = mesh()
    E = td.element_sum(corotated, tets)
    v = np.random.default_rng(8).standard_normal(x.shape)
    H = td.sparse_hessian(E)(x, B, vol)
    assert "_tidiff_rules.kept_polar_decompose(F)" in td.source(td.hessian(corotated))
    np.testing.assert_allclose(td.hessian_operator(E)(x, B, vol) @ v, (H @ v.ravel()).reshape(x.shape),
                               rtol=1e-12, atol=1e-12)


@ti.func
def corotated32(xe: ti.types.matrix(4, 3, ti.f32), B: ti.types.matrix(3, 3, ti.f32), vol: ti.f32) -> ti.f32:
    F = ti.Matrix.cols([xe[1, :] - xe[0, :], xe[2, :] - xe[0, :], xe[3, :] - xe[0, :]]) @ B
    R, S = ti.polar_decompose(F, ti.f32)
    return vol * ((F - R).norm_sqr() + 0.1 * xe[2, 1])


def test_float32_values_are_kept_as_they_were():
    """Kept in the float64 array and read back as float32: replayed products equal recorded ones bit for bit."""
    tets, x, B, vol = mesh()
    H = dense_hessian(corotated_torch, tets, x, B, vol)
    x, B, vol = (a.astype(np.float32) for a in (x, B, vol))
    op = td.hessian_operator(td.element_sum(corotated32, tets))(x, B, vol)
    v = np.random.default_rng(9).standard_normal(x.shape).astype(np.float32)
    products = [op @ v for _ in range(4)]
    assert op._kept.ready and products[0].dtype == np.float32
    for p in products[1:]:
        np.testing.assert_array_equal(p, products[0])
    np.testing.assert_allclose(products[0].ravel(), H @ v.ravel(), rtol=1e-4, atol=1e-4 * np.abs(H).max())
