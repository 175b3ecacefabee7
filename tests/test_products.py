"""Matrix products in the code tidiff compiles, written entry by entry (NOTE: [Products entry by entry] in
tidiff/_lang/products.py): Taichi's ``@`` to rounding for every pairing of shapes, derivatives through them as
torch's, and an operand's inf meeting only the entries that read it."""
import numpy as np
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td
from tidiff._lang.products import matmul

SHAPES = {"matrix @ matrix": ((2, 3), (3, 4)), "matrix @ vector": ((2, 3), (3,)), "vector @ matrix": ((3,), (3, 2)),
          "vector @ vector": ((3,), (3,))}
a23, b34 = ti.Matrix.field(2, 3, ti.f64, ()), ti.Matrix.field(3, 4, ti.f64, ())
v3, w3 = ti.Vector.field(3, ti.f64, ()), ti.Vector.field(3, ti.f64, ())
b32 = ti.Matrix.field(3, 2, ti.f64, ())
taichis, tidiffs = ti.field(ti.f64, 2 * 4 + 2 + 2 + 1), ti.field(ti.f64, 2 * 4 + 2 + 2 + 1)


@ti.func
def flat_into(out: ti.template(), p, q, r, s):  # type: ignore[valid-type]
    k = 0
    for part in ti.static([p, q, r]):
        for i in ti.static(range(part.n)):
            if ti.static(len(part.get_shape()) == 1):
                out[k] = part[i]
                k += 1
            else:
                for j in ti.static(range(part.m)):
                    out[k] = part[i, j]
                    k += 1
    out[k] = s


@ti.kernel
def products():
    a, b, v, w, c = a23[None], b34[None], v3[None], w3[None], b32[None]
    flat_into(taichis, a @ b, a @ v, v @ c, v @ w)
    flat_into(tidiffs, matmul(a, b), matmul(a, v), matmul(v, c), matmul(v, w))


def _fill(rng, scale=1.0):
    for f, shape in ((a23, (2, 3)), (b34, (3, 4)), (v3, (3,)), (w3, (3,)), (b32, (3, 2))):
        f.from_numpy(rng.uniform(-scale, scale, shape))


@given(st.integers(0, 2**32 - 1))
def test_every_pairing_of_shapes_is_taichis_product_to_rounding(seed):
    _fill(np.random.default_rng(seed))
    products()
    want = np.concatenate([(a23.to_numpy() @ b34.to_numpy()).ravel(), a23.to_numpy() @ v3.to_numpy(),
                           v3.to_numpy() @ b32.to_numpy(), [v3.to_numpy() @ w3.to_numpy()]])
    np.testing.assert_allclose(taichis.to_numpy(), want, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(tidiffs.to_numpy(), taichis.to_numpy(), rtol=2e-16 * 4, atol=1e-16)


def test_an_inf_meets_the_entries_that_read_it_as_numpys():
    _fill(np.random.default_rng(1))
    a, b = a23.to_numpy(), b34.to_numpy()
    a[0, 0], b[0, 1] = np.inf, 0.0  # inf * 0 is NaN in entry (0, 1) alone
    a23.from_numpy(a)
    b34.from_numpy(b)
    products()
    want = a @ b
    for got in (tidiffs.to_numpy()[:8].reshape(2, 4), taichis.to_numpy()[:8].reshape(2, 4)):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-14)


@ti.func
def rotated_energy(F: ti.types.matrix(3, 3, ti.f64), B: ti.types.matrix(3, 3, ti.f64)) -> ti.f64:
    R, S = ti.polar_decompose(F @ B)
    G = F.transpose() @ (F @ B) - R @ S
    return (G @ G.transpose()).trace() + (F @ ti.Vector([1.0, 2.0, 3.0])) @ ti.Vector([0.5, 0.25, 1.0])


def torch_energy(F, B):
    U, s, Vh = torch.linalg.svd(F @ B)
    R, S = U @ Vh, Vh.T @ torch.diag(s) @ Vh
    G = F.T @ (F @ B) - R @ S
    return torch.trace(G @ G.T) + (F @ torch.tensor([1.0, 2.0, 3.0], dtype=F.dtype)) @ torch.tensor(
        [0.5, 0.25, 1.0], dtype=F.dtype)


def test_derivatives_through_products_and_a_decomposition_are_torchs():
    rng = np.random.default_rng(3)
    F, B = np.eye(3) + 0.3 * rng.normal(size=(3, 3)), np.eye(3) + 0.2 * rng.normal(size=(3, 3))
    assert "_tidiff_matmul(" in td.source(td.grad(rotated_energy)) and " @ " not in td.source(td.grad(rotated_energy))
    tF, tB = torch.tensor(F), torch.tensor(B)
    np.testing.assert_allclose(td.grad(rotated_energy)(F, B), torch.func.grad(torch_energy)(tF, tB).numpy(),
                               rtol=1e-10)
    np.testing.assert_allclose(td.hessian(rotated_energy)(F, B), torch.func.hessian(torch_energy)(tF, tB).numpy(),
                               rtol=1e-8, atol=1e-10)
