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
from tidiff._elements.colouring import colour_columns, star_colours, symmetric_gather

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


@ti.kernel
def anchored_energy(u: ti.types.ndarray(ndim=1), out: ti.types.ndarray(ndim=0)):
    for i in range(1, u.shape[0]):
        out[None] += (u[i] - u[0]) ** 4 + ti.cos(u[i]) * u[0]


anchored = td.function(anchored_energy, inputs=["u"], outputs={"out": lambda u: ()})


def test_an_arrow_hessian_from_two_products_against_torch():
    n = 40
    u = np.random.default_rng(2).standard_normal(n)
    arrow = np.eye(n, dtype=bool)
    arrow[0, :] = arrow[:, 0] = True
    S = td.sparse_hessian(anchored, sparsity=np.triu(arrow))  # either half: a Hessian's pattern is symmetric
    H = S(u)

    def anchored_torch(v):
        return ((v[1:] - v[0]) ** 4 + torch.cos(v[1:]) * v[0]).sum()

    dense = torch.autograd.functional.hessian(anchored_torch, torch.tensor(u)).numpy()
    np.testing.assert_allclose(H.toarray(), dense, rtol=RTOL, atol=1e-12)
    assert H.nnz == arrow.sum()
    assert S.products == 2  # a star colouring (NOTE: [Star colouring]); columns sharing no row take 40


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


def _symmetric_pattern(seed, n, density):
    rng = np.random.default_rng(seed)
    upper = np.triu(rng.random((n, n)) < density, 1)
    return rng, sparse.csc_matrix((upper | upper.T | np.eye(n, dtype=bool)).astype(np.int8))


@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 40), density=st.floats(0.0, 0.6))
def test_star_colourings_leave_no_path_of_four_in_two_colours(seed, n, density):
    _, pattern = _symmetric_pattern(seed, n, density)
    colours = star_colours(pattern)
    adjacent = pattern.toarray().astype(bool) & ~np.eye(n, dtype=bool)
    assert not (adjacent & (colours[:, None] == colours[None, :])).any()
    edges = np.argwhere(adjacent)
    for a, b in edges:
        for c in np.flatnonzero(adjacent[b]):
            for d in np.flatnonzero(adjacent[c]):
                if len({a, b, c, d}) == 4:
                    assert colours[a] != colours[c] or colours[b] != colours[d], (a, b, c, d)


@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 40), density=st.floats(0.0, 0.6))
def test_a_symmetric_matrix_is_recovered_from_its_star_colours(seed, n, density):
    rng, pattern = _symmetric_pattern(seed, n, density)
    values = rng.standard_normal((n, n))
    H = pattern.toarray() * (values + values.T)
    colours = star_colours(pattern)
    products = np.stack([H @ (colours == c) for c in range(colours.max() + 1)])
    data = products.ravel()[symmetric_gather(pattern, colours)]
    got = sparse.csc_matrix((data, pattern.indices, pattern.indptr), shape=(n, n)).toarray()
    np.testing.assert_array_equal(got, H)


@ti.func
def cubed(x: ti.f64) -> ti.f64:
    return x**3


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
        td.sparse_hessian(td.function(cubed))  # a @ti.func over a batch: its pattern is given


# -- patterns read from the kernel's index expressions (NOTE: [Patterns from index expressions]) --------------------

def test_a_stencils_pattern_is_read_from_its_code():
    n = 9
    u = np.random.default_rng(3).standard_normal((n, n))
    S = td.sparse_jacobian(step)  # no sparsity=: the boundary tests guard reads outside, which are dropped
    J = S(u)
    assert (J != 0).nnz == five_point(n).nnz and ((J != 0) != five_point(n)).nnz == 0
    dense = torch.autograd.functional.jacobian(diffuse_torch, torch.tensor(u)).reshape(n * n, n * n).numpy()
    np.testing.assert_allclose(J.toarray(), dense, rtol=RTOL, atol=1e-14)
    assert S.products <= 7


def test_a_sums_hessian_pattern_is_read_from_its_code():
    n = 12
    u = np.random.default_rng(4).standard_normal(n)
    S = td.sparse_hessian(chain)
    H = S(u)
    band = sparse.diags([np.ones(n - 1), np.ones(n), np.ones(n - 1)], [-1, 0, 1]) != 0
    assert ((H != 0) != band).nnz == 0 and S.products == 3
    dense = td.hessian(chain)(u)
    np.testing.assert_allclose(H.toarray(), dense, rtol=RTOL, atol=1e-12)
    A = td.sparse_hessian(anchored)(u)  # u[0] in every term: an arrow, two products
    np.testing.assert_allclose(A.toarray(), td.hessian(anchored)(u), rtol=RTOL, atol=1e-12)


@ti.kernel
def shifted(u: ti.types.ndarray(ndim=1), out: ti.types.ndarray(ndim=1), a: ti.i32, b: ti.i32):
    n = u.shape[0]
    for i in out:
        s = 0.0
        for k in ti.static(range(2)):
            s += ti.sin(u[(i + a * k + n) % n])
        j = ti.min(i + b, n - 1)
        out[n - 1 - i] = s * u[j] + ti.cos(u[i // 2])


def shifted_torch(u, a, b):
    n = u.shape[0]
    i = torch.arange(n)
    s = torch.sin(u[(i + n) % n]) + torch.sin(u[(i + a + n) % n])
    value = s * u[torch.clamp(i + b, max=n - 1)] + torch.cos(u[i // 2])
    return torch.flip(value, [0])


@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 20), a=st.integers(-4, 4), b=st.integers(0, 3))
def test_patterns_of_wrapped_clamped_and_reversed_indices_hold_the_jacobian(seed, n, a, b):
    f = td.function(shifted, inputs=["u"], outputs={"out": lambda u: u.shape}, constants={"a": a, "b": b})
    u = np.random.default_rng(seed).standard_normal(n)
    S = td.sparse_jacobian(f)
    J = S(u)
    dense = torch.autograd.functional.jacobian(lambda v: shifted_torch(v, a, b), torch.tensor(u)).numpy()
    np.testing.assert_allclose(J.toarray(), dense, rtol=RTOL, atol=1e-14)
    assert J.nnz <= 4 * n  # the four reads of each iteration, no more


@ti.kernel
def gathered(u: ti.types.ndarray(ndim=1), idx: ti.types.ndarray(dtype=ti.i32, ndim=1),
             out: ti.types.ndarray(ndim=1)):
    for i in out:
        out[i] = u[idx[i]] ** 2


@ti.func
def first_of(v: ti.template()):
    return v[0]


@ti.kernel
def passed_on(u: ti.types.ndarray(ndim=1), out: ti.types.ndarray(ndim=1)):
    for i in out:
        out[i] = first_of(u) * u[i]


@ti.kernel
def two_loops(u: ti.types.ndarray(ndim=1), out: ti.types.ndarray(ndim=1)):
    for i in out:
        out[i] = u[i]
    for i in out:
        out[i] += u[i] ** 2


@ti.kernel
def halved(u: ti.types.ndarray(ndim=1), out: ti.types.ndarray(ndim=1)):
    for i in u:
        ti.atomic_add(out[i // 2], u[i] ** 2)


@ti.kernel
def carried(u: ti.types.ndarray(ndim=1), out: ti.types.ndarray(ndim=1)):
    s = 0.0
    for i in u:
        s += u[i]
        out[i] = s


def test_atomic_writes_are_writes_and_values_carried_between_iterations_are_named():
    f = td.function(halved, inputs=["u"], outputs={"out": lambda u: (u.shape[0] // 2 + 1,)})
    u = np.random.default_rng(5).standard_normal(7)
    J = td.sparse_jacobian(f)(u)
    np.testing.assert_allclose(J.toarray(), td.jacobian(f)(u), rtol=RTOL, atol=0)
    assert J.nnz == 7
    with pytest.raises(TypeError, match="its loop updates `s`, a variable of the kernel's top level"):
        td.sparse_jacobian(td.function(carried, inputs=["u"], outputs={"out": lambda u: u.shape}))


@ti.kernel
def spring_forces(x: ti.types.ndarray(dtype=ti.math.vec2, ndim=1), springs: ti.types.ndarray(dtype=ti.i32, ndim=2),
                  force: ti.types.ndarray(dtype=ti.math.vec2, ndim=1)):
    for s in range(springs.shape[0]):
        a, b = springs[s, 0], springs[s, 1]
        d = x[b] - x[a]
        f = (d.norm() - 1.0) * d.normalized()
        force[a] += f
        force[b] -= f


def test_a_mass_spring_jacobian_reads_its_pattern_through_the_spring_array():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((12, 2))
    springs = np.array([[k, (k + 1) % 12] for k in range(12)] + [[0, 6], [3, 9]], np.int32)
    forces = td.function(spring_forces, inputs=["x", "springs"], outputs={"force": lambda x, s: x.shape})
    S = td.sparse_jacobian(forces)
    J = S(x, springs)
    dense = td.jacobian(forces)(x, springs).reshape(24, 24)
    np.testing.assert_allclose(J.toarray(), dense, rtol=RTOL, atol=1e-14)
    assert J.nnz == 4 * (12 + 2 * 14)  # 2 x 2 blocks: each node's own and one per spring each way
    fewer = springs[:12]
    J2 = S(x, fewer)  # another mesh, another pattern (kept by the integer arrays' values)
    assert J2.nnz == 4 * (12 + 2 * 12)
    np.testing.assert_allclose(J2.toarray(), td.jacobian(forces)(x, fewer).reshape(24, 24), rtol=RTOL, atol=1e-14)
    gather = td.function(gathered, inputs=["u", "idx"], outputs={"out": lambda u, idx: u.shape})
    idx = np.array([3, 0, 3, 1], np.int32)
    np.testing.assert_allclose(td.sparse_jacobian(gather)(x[:4, 0], idx).toarray(),
                               td.jacobian(gather)(x[:4, 0], idx), rtol=RTOL, atol=0)
    with pytest.raises(TypeError, match="sparsity of gathered is not read from its code: `idx\\[i\\]` reads "
                                        "outside `idx`; give it as sparsity="):
        td.sparse_jacobian(gather)(x[:5, 0], np.array([0, 1, 2, 3], np.int32))  # i = 4 reads idx[4]


@ti.kernel
def by_value(u: ti.types.ndarray(ndim=1), out: ti.types.ndarray(ndim=1)):
    for i in out:
        out[i] = u[int(ti.abs(u[i]) * 2) % u.shape[0]]


def test_kernels_whose_pattern_is_not_in_their_indices_are_named():
    with pytest.raises(TypeError, match="sparsity of by_value is not read from its code: the index expression "
                                        "`int\\(.*\\)`; give it as sparsity="):
        td.sparse_jacobian(td.function(by_value, inputs=["u"], outputs={"out": lambda u: u.shape}))(np.ones(4))
    with pytest.raises(TypeError, match="passes `u` on"):
        td.sparse_jacobian(td.function(passed_on, inputs=["u"], outputs={"out": lambda u: u.shape}))
    with pytest.raises(TypeError, match="it has 2 top-level loops"):
        td.sparse_jacobian(td.function(two_loops, inputs=["u"], outputs={"out": lambda u: u.shape}))
    gather = td.function(gathered, inputs=["u", "idx"], outputs={"out": lambda u, idx: u.shape})
    J = td.sparse_jacobian(gather, sparsity=np.eye(4))(np.ones(4), np.arange(4, dtype=np.int32))  # given: taken
    np.testing.assert_array_equal(J.toarray(), 2 * np.eye(4))
