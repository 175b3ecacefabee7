"""Sparse Jacobians and Hessians of any function from a given pattern, by column colouring (td.sparse_jacobian and
td.sparse_hessian with sparsity=), against torch (float64)."""
import numpy as np
import pytest
import scipy.sparse as sparse
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td
from tidiff._elements.colouring import colour_columns

RTOL = 1e-7


@ti.kernel
def diffuse(u: ti.types.ndarray(ndim=2), out: ti.types.ndarray(ndim=2)):
    n, m = u.shape[0], u.shape[1]
    for i, j in u:
        lap = -4.0 * u[i, j]
        if i > 0:
            lap += u[i - 1, j]
        if i < n - 1:
            lap += u[i + 1, j]
        if j > 0:
            lap += u[i, j - 1]
        if j < m - 1:
            lap += u[i, j + 1]
        out[i, j] = u[i, j] + 0.1 * lap - 0.05 * u[i, j] ** 3


step = td.function(diffuse, inputs=["u"], outputs={"out": lambda u: u.shape})


def diffuse_torch(u):
    p = torch.nn.functional.pad(u, (1, 1, 1, 1))
    lap = p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * u
    return u + 0.1 * lap - 0.05 * u**3


def five_point(n):
    line = sparse.diags([np.ones(n - 1), np.ones(n), np.ones(n - 1)], [-1, 0, 1])
    eye = sparse.identity(n)
    return (sparse.kron(line, eye) + sparse.kron(eye, line)) != 0


def test_a_stencil_jacobian_from_seven_products_against_torch():
    n = 9
    u = np.random.default_rng(0).standard_normal((n, n))
    S = td.sparse_jacobian(step, sparsity=five_point(n))
    J = S(u)
    assert isinstance(J, sparse.csr_matrix) and J.shape == (n * n, n * n)
    dense = torch.autograd.functional.jacobian(diffuse_torch, torch.tensor(u)).reshape(n * n, n * n).numpy()
    np.testing.assert_allclose(J.toarray(), dense, rtol=RTOL, atol=1e-14)
    assert S.products <= 7  # whatever the size: 99,856 unknowns take as many
    assert isinstance(td.sparse_jacobian(step, sparsity=five_point(n), format="csc")(u), sparse.csc_matrix)


@ti.kernel
def chain_energy(u: ti.types.ndarray(ndim=1), out: ti.types.ndarray(ndim=0)):
    for i in range(u.shape[0] - 1):
        out[None] += (u[i + 1] - u[i]) ** 4 + ti.sin(u[i]) * u[i + 1]


chain = td.function(chain_energy, inputs=["u"], outputs={"out": lambda u: ()})


def test_a_banded_hessian_from_hvps_against_torch():
    n = 12
    u = np.random.default_rng(1).standard_normal(n)
    band = sparse.diags([np.ones(n - 1), np.ones(n), np.ones(n - 1)], [-1, 0, 1])
    S = td.sparse_hessian(chain, sparsity=band)
    H = S(u)

    def chain_torch(v):
        return ((v[1:] - v[:-1]) ** 4 + torch.sin(v[:-1]) * v[1:]).sum()

    dense = torch.autograd.functional.hessian(chain_torch, torch.tensor(u)).numpy()
    np.testing.assert_allclose(H.toarray(), dense, rtol=RTOL, atol=1e-12)
    assert S.products == 3


@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 30), cols=st.integers(1, 30),
       density=st.floats(0.0, 0.5))
def test_no_two_columns_of_one_colour_share_a_row(seed, rows, cols, density):
    rng = np.random.default_rng(seed)
    pattern = sparse.csc_matrix(rng.random((rows, cols)) < density)
    colours = colour_columns(pattern.astype(np.int8))
    dense = pattern.toarray()
    for c in np.unique(colours):
        assert dense[:, colours == c].sum(axis=1).max(initial=0) <= 1
    assert colours.max(initial=0) < max(1, dense.sum(axis=1).max(initial=0)) * max(1, dense.sum(axis=0).max(
        initial=0)) + 1  # greedy: at most (conflicts per column) + 1


def test_bad_patterns_are_named():
    u = np.zeros((4, 4))
    with pytest.raises(ValueError, match="sparsity must have the derivative's shape \\(16, 16\\)"):
        td.sparse_jacobian(step, sparsity=five_point(3))(u)
    with pytest.raises(ValueError, match="with sparsity= it must be None"):
        td.sparse_hessian(chain, sparsity=np.eye(4), project="psd")
    with pytest.raises(ValueError, match="the format is 'csr' or 'csc'"):
        td.sparse_jacobian(step, sparsity=five_point(4), format="bsr")
    with pytest.raises(TypeError, match="needs a scalar output"):
        td.sparse_hessian(step, sparsity=five_point(4))(u)
    with pytest.raises(TypeError, match="or sparsity= \\(the pattern\\) for any other function"):
        td.sparse_hessian(chain)
