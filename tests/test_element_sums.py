"""Element sums and maps (td.element_sum, td.element_map) and their sparse derivatives, against torch (float64)."""
import numpy as np
import pytest
import scipy.sparse as sparse
import scipy.sparse.linalg as spla
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st
from tet_meshes import tet_mesh

import tidiff as td

RTOL = 1e-7

tet4 = ti.types.matrix(4, 3, ti.f64)


@ti.func
def neo_hookean(xe: tet4, B: ti.math.mat3, vol: ti.f64) -> ti.f64:
    Ds = ti.Matrix.cols([xe[1, :] - xe[0, :], xe[2, :] - xe[0, :], xe[3, :] - xe[0, :]])
    F = Ds @ B
    log_j = ti.log(F.determinant())
    return vol * (0.5 * ((F.transpose() @ F).trace() - 3.0) - log_j + 2.0 * log_j**2)


def neo_hookean_torch(x, tets, B, vol):
    xe = x[tets]  # (M, 4, 3)
    Ds = torch.stack([xe[:, 1] - xe[:, 0], xe[:, 2] - xe[:, 0], xe[:, 3] - xe[:, 0]], dim=2)
    F = Ds @ B
    log_j = torch.log(torch.linalg.det(F))
    return (vol * (0.5 * ((F * F).sum((1, 2)) - 3.0) - log_j + 2.0 * log_j**2)).sum()


@ti.func
def smooth_tet(xe: tet4, B: ti.math.mat3, vol: ti.f64) -> ti.f64:
    F = ti.Matrix.cols([xe[1, :] - xe[0, :], xe[2, :] - xe[0, :], xe[3, :] - xe[0, :]]) @ B
    return vol * ((F.transpose() @ F).trace() + F.determinant() ** 2 + ti.sin(F[0, 1] * F[1, 2]))


def smooth_tet_torch(x, tets, B, vol):
    xe = x[tets]
    F = torch.stack([xe[:, 1] - xe[:, 0], xe[:, 2] - xe[:, 0], xe[:, 3] - xe[:, 0]], dim=2) @ B
    return (vol * ((F * F).sum((1, 2)) + torch.linalg.det(F) ** 2 + torch.sin(F[:, 0, 1] * F[:, 1, 2]))).sum()


def torch_of(*arrays):
    return [torch.tensor(a, dtype=torch.float64) for a in arrays]


def dense_torch_hessian(tets, x, B, vol):
    xt, Bt, vt = torch_of(x, B, vol)
    H = torch.autograd.functional.hessian(lambda y: neo_hookean_torch(y, torch.tensor(tets), Bt, vt), xt)
    return H.reshape(x.size, x.size).numpy()


@pytest.fixture(scope="module")
def tets():
    return tet_mesh(0)


def test_value_gradient_and_data_gradients_against_torch(tets):
    elements, x, B, vol = tets
    E = td.element_sum(neo_hookean, elements)
    xt, Bt, vt = torch_of(x, B, vol)
    for t in (xt, Bt, vt):
        t.requires_grad_(True)
    value = neo_hookean_torch(xt, torch.tensor(elements), Bt, vt)
    value.backward()
    np.testing.assert_allclose(E(x, B, vol), value.item(), rtol=RTOL)
    gx, gB, gv = td.grad(E, argnums=(0, 1, 2))(x, B, vol)
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(gB, Bt.grad.numpy(), rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(gv, vt.grad.numpy(), rtol=RTOL, atol=1e-12)


def test_shared_data_gradient_sums_over_elements(tets):
    elements, x, B, vol = tets
    E = td.element_sum(neo_hookean, elements)
    g = td.grad(E, argnums=2)(x, B, 0.7)  # one volume for every element
    np.testing.assert_allclose(g, E(x, B, 1.0), rtol=RTOL)
    assert np.shape(g) == ()


def test_gradient_against_central_differences(tets):
    elements, x, B, vol = tets
    E = td.element_sum(neo_hookean, elements)
    g = td.grad(E)(x, B, vol)
    h = 1e-6
    for i, j in [(0, 0), (3, 2), (7, 1)]:
        step = np.zeros_like(x)
        step[i, j] = h
        fd = (E(x + step, B, vol) - E(x - step, B, vol)) / (2 * h)
        np.testing.assert_allclose(g[i, j], fd, rtol=1e-6, atol=1e-8)


def test_forward_mode_against_reverse_mode(tets):
    elements, x, B, vol = tets
    E = td.element_sum(neo_hookean, elements)
    v = np.random.default_rng(1).standard_normal(x.shape)
    _, dy = td.jvp(E, (x, B, vol), (v, np.zeros_like(B), np.zeros_like(vol)))
    np.testing.assert_allclose(dy, np.sum(td.grad(E)(x, B, vol) * v), rtol=RTOL)


def test_hvp_and_every_sparse_format_against_torch(tets):
    elements, x, B, vol = tets
    E = td.element_sum(neo_hookean, elements)
    H = dense_torch_hessian(elements, x, B, vol)
    v = np.random.default_rng(2).standard_normal(x.shape)
    _, (hv, _, _) = td.hvp(E, (x, B, vol), (v, np.zeros_like(B), np.zeros_like(vol)))
    np.testing.assert_allclose(hv.ravel(), H @ v.ravel(), rtol=RTOL, atol=1e-10)
    csr = td.sparse_hessian(E)(x, B, vol)
    bsr = td.sparse_hessian(E, format="bsr")(x, B, vol)
    assert isinstance(csr, sparse.csr_matrix) and isinstance(bsr, sparse.bsr_matrix)
    assert bsr.blocksize == (3, 3)
    np.testing.assert_allclose(csr.toarray(), H, rtol=RTOL, atol=1e-10)
    np.testing.assert_allclose(bsr.toarray(), H, rtol=RTOL, atol=1e-10)
    # the pattern is the nodes sharing an element, each pair a full 3 x 3 block
    shares = np.zeros((len(x), len(x)), bool)
    for t in elements:
        shares[np.ix_(t, t)] = True
    assert csr.nnz == 9 * shares.sum()
    taichi_matrix = td.sparse_hessian(E, format="taichi")(x, B, vol)
    assert isinstance(taichi_matrix, ti.linalg.SparseMatrix) and taichi_matrix.shape == H.shape
    for i, j in [(0, 0), (5, 7), (13, 20), (40, 41)]:
        assert taichi_matrix[i, j] == pytest.approx(H[i, j], rel=RTOL, abs=1e-10)


def test_a_second_call_refills_the_values_on_the_same_pattern(tets):
    elements, x, B, vol = tets
    E = td.element_sum(neo_hookean, elements)
    S = td.sparse_hessian(E)
    first, second = S(x, B, vol), S(1.01 * x, B, vol)
    np.testing.assert_array_equal(first.indices, second.indices)
    assert not np.shares_memory(first.data, second.data)
    np.testing.assert_allclose(second.toarray(), dense_torch_hessian(elements, 1.01 * x, B, vol), rtol=RTOL,
                               atol=1e-10)


def test_projected_hessian_is_the_sum_of_projected_element_hessians(tets):
    elements, x, B, vol = tets
    E = td.element_sum(smooth_tet, elements)  # indefinite element Hessians (the sine)
    exact = td.sparse_hessian(E)(x, B, vol).toarray()
    assert np.linalg.eigvalsh(exact).min() < -1e-3
    projected = td.sparse_hessian(E, project="psd")(x, B, vol).toarray()
    expected = np.zeros_like(exact)
    for e, t in enumerate(elements):  # each element's Hessian by torch, projected by LAPACK
        xt, Bt = torch_of(x[t], B[e])
        h = torch.autograd.functional.hessian(
            lambda y, B=Bt, v=vol[e]: smooth_tet_torch(y, torch.arange(4)[None], B[None], torch.tensor([v])), xt)
        w, U = np.linalg.eigh(h.reshape(12, 12).numpy())
        idx = (3 * t[:, None] + np.arange(3)).ravel()
        expected[np.ix_(idx, idx)] += (U * np.maximum(w, 0)) @ U.T
    np.testing.assert_allclose(projected, expected, rtol=1e-9, atol=1e-9)
    assert np.linalg.eigvalsh(projected).min() > -1e-9


def test_hessian_operator_with_scipy_and_taichi_conjugate_gradients(tets):
    elements, x, B, vol = tets
    E = td.element_sum(neo_hookean, elements)
    H = td.sparse_hessian(E)(x, B, vol)
    op = td.hessian_operator(E)(x, B, vol)
    v = np.random.default_rng(4).standard_normal(x.shape)
    assert op.shape == H.shape
    np.testing.assert_allclose(op @ v, (H @ v.ravel()).reshape(x.shape), rtol=RTOL, atol=1e-10)
    np.testing.assert_allclose(op.matvec(v.ravel()), H @ v.ravel(), rtol=RTOL, atol=1e-10)
    # a regularized system (the energy is invariant to translations): cg through the operator and the matrix
    shift = spla.LinearOperator(H.shape, matvec=lambda u: op.matvec(u) + u, dtype=np.float64)
    b = v.ravel()
    u, info = spla.cg(shift, b, rtol=1e-12, maxiter=500)
    assert info == 0
    np.testing.assert_allclose(H @ u + u, b, atol=1e-9)
    raw, info = spla.cg(op, H @ v.ravel(), rtol=1e-12, maxiter=500)
    assert info == 0
    np.testing.assert_allclose(H @ raw, H @ v.ravel(), atol=1e-8)
    # Taichi's matrix-free CG over fields of the node argument's shape
    b_field, u_field = ti.field(ti.f64, shape=x.shape), ti.field(ti.f64, shape=x.shape)
    b_field.from_numpy((H @ v.ravel()).reshape(x.shape))
    ti.linalg.MatrixFreeCG(op.taichi(), b_field, u_field, tol=1e-12, maxiter=500)
    np.testing.assert_allclose(H @ u_field.to_numpy().ravel(), H @ v.ravel(), atol=1e-8)


# -- scalar nodes, element maps and their sparse Jacobians ---------------------------------------------------------
@ti.func
def bar(ue: ti.math.vec2, stiffness: ti.f64) -> ti.f64:
    return 0.5 * stiffness * (ue[1] - ue[0]) ** 2 + ti.exp(ue[0] * ue[1]) * 0.1


@ti.func
def stretch(xe: ti.types.matrix(3, 2, ti.f64)) -> ti.math.vec3:
    a, b = xe[1, :] - xe[0, :], xe[2, :] - xe[1, :]
    return ti.Vector([a.norm() - 1.0, b.norm_sqr() - 1.0, a.dot(b)])


@ti.func
def length(xe: ti.types.matrix(2, 2, ti.f64)) -> ti.f64:
    return (xe[1, :] - xe[0, :]).norm()


def test_scalar_nodes(tets):
    chain = np.array([[0, 1], [1, 2], [2, 3], [3, 0], [1, 3]])
    u = np.array([0.1, -0.3, 0.2, 0.5])
    k = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    E = td.element_sum(bar, chain)

    def torch_energy(ut):
        a, b = ut[chain[:, 0]], ut[chain[:, 1]]
        return (0.5 * torch.tensor(k) * (b - a) ** 2 + torch.exp(a * b) * 0.1).sum()

    H = torch.autograd.functional.hessian(torch_energy, torch.tensor(u)).numpy()
    np.testing.assert_allclose(td.sparse_hessian(E)(u, k).toarray(), H, rtol=RTOL)
    np.testing.assert_allclose(td.sparse_hessian(E, format="bsr")(u, k).toarray(), H, rtol=RTOL)
    np.testing.assert_allclose(td.grad(E)(u, k), torch.func.grad(torch_energy)(torch.tensor(u)).numpy(), rtol=RTOL)


def test_element_map_and_its_sparse_jacobian_against_torch():
    rng = np.random.default_rng(5)
    triples = np.array([[0, 1, 2], [2, 3, 4], [4, 1, 5], [5, 5, 0]])  # the last lists a node twice
    x = rng.standard_normal((7, 2))
    R = td.element_map(stretch, triples)

    def torch_residuals(xt):
        xe = xt[triples]
        a, b = xe[:, 1] - xe[:, 0], xe[:, 2] - xe[:, 1]
        return torch.stack([a.norm(dim=1) - 1.0, (b * b).sum(1) - 1.0, (a * b).sum(1)], dim=1)

    xt = torch.tensor(x)
    np.testing.assert_allclose(R(x), torch_residuals(xt).numpy(), rtol=RTOL)
    J = torch.autograd.functional.jacobian(torch_residuals, xt).reshape(12, 14).numpy()
    sparse_j = td.sparse_jacobian(R)(x)
    assert isinstance(sparse_j, sparse.csr_matrix) and sparse_j.shape == (12, 14)
    np.testing.assert_allclose(sparse_j.toarray(), J, rtol=RTOL, atol=1e-12)
    assert sparse_j.nnz == 3 * (6 + 6 + 6 + 4)  # the last element's two distinct nodes
    c = rng.standard_normal((4, 3))
    np.testing.assert_allclose(td.vjp(R, x)[1](c)[0].ravel(), J.T @ c.ravel(), rtol=RTOL, atol=1e-12)
    lengths = td.element_map(length, triples[:, :2])
    Jl = td.sparse_jacobian(lengths, format="taichi")(x)
    dense = td.jacobian(lengths)(x).reshape(4, 14)
    assert Jl.shape == (4, 14) and Jl[0, 0] == pytest.approx(dense[0, 0], rel=RTOL)
    np.testing.assert_allclose(td.sparse_jacobian(lengths)(x).toarray(), dense, rtol=RTOL)


@given(seed=st.integers(0, 2**31 - 1), count=st.integers(1, 9), distinct=st.booleans())
def test_sparse_hessian_equals_torch_on_drawn_meshes(seed, count, distinct):
    """Drawn connectivity (nodes repeated within an element, nodes in no element), points and data."""
    rng = np.random.default_rng(seed)
    nodes = int(rng.integers(4, 12))
    elements = (np.array([rng.choice(nodes, 4, replace=False) for _ in range(count)]) if distinct
                else rng.integers(0, nodes, (count, 4)))
    x, B, vol = rng.standard_normal((nodes, 3)), rng.standard_normal((count, 3, 3)), rng.uniform(0.5, 1.0, count)
    E = td.element_sum(smooth_tet, elements)
    xt, Bt, vt = torch_of(x, B, vol)
    H = torch.autograd.functional.hessian(lambda y: smooth_tet_torch(y, torch.tensor(elements), Bt, vt), xt)
    H = H.reshape(x.size, x.size).numpy()
    np.testing.assert_allclose(td.sparse_hessian(E)(x, B, vol).toarray(), H, rtol=RTOL, atol=1e-9)
    np.testing.assert_allclose(td.sparse_hessian(E, format="bsr")(x, B, vol).toarray(), H, rtol=RTOL, atol=1e-9)
    v = rng.standard_normal(x.shape)
    np.testing.assert_allclose(td.hessian_operator(E)(x, B, vol) @ v.ravel(), H @ v.ravel(), rtol=RTOL, atol=1e-9)
    projected = td.sparse_hessian(E, project="psd")(x, B, vol).toarray()
    assert np.linalg.eigvalsh(projected).min() > -1e-9 * max(1.0, np.abs(H).max())


# -- bad input -----------------------------------------------------------------------------------------------------
def test_bad_input_is_named_before_anything_runs(tets):
    elements, x, B, vol = tets
    with pytest.raises(ValueError, match="elements must be an \\(M, k\\) array"):
        td.element_sum(neo_hookean, elements.ravel())
    with pytest.raises(TypeError, match="integer node indices"):
        td.element_sum(neo_hookean, elements.astype(float))
    with pytest.raises(ValueError, match="negative node index \\(element 0"):
        td.element_sum(neo_hookean, -elements)
    E = td.element_sum(neo_hookean, elements)
    with pytest.raises(ValueError, match="elements refer to node 13, but argument 'xe' holds values for 10 nodes"):
        E(x[:10], B, vol)
    with pytest.raises(ValueError, match="elements refer to node 13"):
        td.grad(E)(x[:10], B, vol)
    with pytest.raises(ValueError, match="the elements have 3 nodes each, so neo_hookean's parameter 'xe' takes "
                                         "shape \\(3, 3\\); it is declared \\(4, 3\\)"):
        td.element_sum(neo_hookean, elements[:, :3])(x, B, vol)
    with pytest.raises(ValueError, match="argument 'vol' holds one value \\(\\) per element \\(12 elements"):
        E(x, B, vol[:5])
    with pytest.raises(ValueError, match="nodal names 'y', which is not a parameter"):
        td.element_sum(neo_hookean, elements, nodal="y")
    with pytest.raises(TypeError, match="expects a function made by td.element_sum"):
        td.sparse_hessian(td.element_map(stretch, elements[:, :3]))
    with pytest.raises(ValueError, match="argnums 2 \\('vol'\\) holds values per element"):
        td.sparse_hessian(E, argnums=2)
    with pytest.raises(ValueError, match="format must be one of"):
        td.sparse_hessian(E, format="coo")
    with pytest.raises(ValueError, match="project must be None or 'psd'"):
        td.sparse_hessian(E, project="abs")
    with pytest.raises(TypeError, match="must return one scalar per element"):
        td.sparse_hessian(td.element_sum(stretch, elements[:, :3]))(x[:, :2])
    with pytest.raises(TypeError, match="has no per-element body"):
        td.element_sum(E, elements)


def test_empty_mesh():
    E = td.element_sum(length, np.zeros((0, 2), np.int64))
    x = np.ones((3, 2))
    assert E(x) == 0.0
    np.testing.assert_array_equal(td.grad(E)(x), np.zeros((3, 2)))
    assert td.sparse_hessian(E)(x).nnz == 0



@ti.func
def damped(xe: ti.types.matrix(2, 2, ti.f64), ve: ti.types.matrix(2, 2, ti.f64), k: ti.f64) -> ti.f64:
    d, dv = xe[1, :] - xe[0, :], ve[1, :] - ve[0, :]
    return k * (d.norm() - 1.0) ** 2 + 0.1 * d.dot(dv) ** 2


def test_two_node_arguments():
    """Positions and velocities both per node (nodal=(0, 1)): gradients, both sparse Hessians, the operator."""
    edges = np.array([[0, 1], [1, 2], [2, 0], [3, 1]])
    rng = np.random.default_rng(6)
    x, v, k = rng.standard_normal((4, 2)), rng.standard_normal((4, 2)), rng.uniform(1, 2, 4)
    E = td.element_sum(damped, edges, nodal=("xe", 1))

    def energy(xt, vt):
        d, dv = xt[edges[:, 1]] - xt[edges[:, 0]], vt[edges[:, 1]] - vt[edges[:, 0]]
        return (torch.tensor(k) * (d.norm(dim=1) - 1) ** 2 + 0.1 * (d * dv).sum(1) ** 2).sum()

    xt, vt = torch.tensor(x, requires_grad=True), torch.tensor(v, requires_grad=True)
    energy(xt, vt).backward()
    gx, gv = td.grad(E, argnums=(0, 1))(x, v, k)
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=RTOL, atol=1e-14)
    np.testing.assert_allclose(gv, vt.grad.numpy(), rtol=RTOL, atol=1e-14)
    for p, (first, second) in enumerate([(None, torch.tensor(v)), (torch.tensor(x), None)]):
        H = torch.autograd.functional.hessian(
            lambda y, a=first, b=second: energy(y if a is None else a, y if b is None else b),
            torch.tensor([x, v][p])).reshape(8, 8).numpy()
        np.testing.assert_allclose(td.sparse_hessian(E, argnums=p)(x, v, k).toarray(), H, rtol=RTOL, atol=1e-14)
        u = rng.standard_normal((4, 2))
        np.testing.assert_allclose(td.hessian_operator(E, argnums=p)(x, v, k) @ u, (H @ u.ravel()).reshape(4, 2),
                                   rtol=RTOL, atol=1e-14)


@given(seed=st.integers(0, 2**31 - 1), count=st.integers(1, 8), scalar=st.booleans())
def test_sparse_jacobian_equals_torch_on_drawn_meshes(seed, count, scalar):
    """Drawn triples (nodes repeated within an element), vector or scalar residuals per element."""
    rng = np.random.default_rng(seed)
    nodes = int(rng.integers(3, 9))
    triples = rng.integers(0, nodes, (count, 3))
    x = rng.standard_normal((nodes, 2))
    R = td.element_map(length if scalar else stretch, triples[:, :2] if scalar else triples)

    def residuals(xt):
        if scalar:
            return (xt[triples[:, 1]] - xt[triples[:, 0]]).norm(dim=1)
        xe = xt[triples]
        a, b = xe[:, 1] - xe[:, 0], xe[:, 2] - xe[:, 1]
        return torch.stack([a.norm(dim=1) - 1.0, (b * b).sum(1) - 1.0, (a * b).sum(1)], dim=1)

    value = residuals(torch.tensor(x)).numpy()
    if not np.all(np.isfinite(value)) or (scalar and np.min(value) < 1e-6):  # |0|: no derivative
        return
    if not scalar:
        a = x[triples[:, 1]] - x[triples[:, 0]]
        if np.min(np.linalg.norm(a, axis=1)) < 1e-6:
            return
    J = torch.autograd.functional.jacobian(residuals, torch.tensor(x)).reshape(value.size, x.size).numpy()
    np.testing.assert_allclose(td.sparse_jacobian(R)(x).toarray(), J, rtol=RTOL, atol=1e-12)


def test_torch_operator_of_an_element_sum(tets):
    """td.torch.function of an element sum: a torch op whose backward is the scattered gradient."""
    elements, x, B, vol = tets
    op = td.torch.function(td.element_sum(neo_hookean, elements))
    xt, Bt, vt = (torch.tensor(a, requires_grad=True) for a in (x, B, vol))
    op(xt, Bt, vt).backward()
    xr, Br, vr = (torch.tensor(a, requires_grad=True) for a in (x, B, vol))
    neo_hookean_torch(xr, torch.tensor(elements), Br, vr).backward()
    for mine, theirs in ((xt, xr), (Bt, Br), (vt, vr)):
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=RTOL, atol=1e-12)
