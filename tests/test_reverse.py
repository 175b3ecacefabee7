"""Reverse bodies: gradients of straight-line @ti.func code by one reverse call (``_adjoint``).

The op table covers one op at a time (its multi-input rows now take the reverse path);
these tests cover what a transform of a whole function adds: reassignment, tuple
assignment, constructors, entries, broadcasting, a nested reversible call, several
outputs, forward over reverse against torch and against forward over forward, while
loops and branches on values (more in test_reverse_control.py).
"""
import numpy as np
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td
from tidiff._adjoint import why_not

vec3, mat3 = ti.types.vector(3, ti.f64), ti.types.matrix(3, 3, ti.f64)


@ti.func
def stretch(a, b):
    d = a - b
    return d.norm() - 1.0


@ti.func
def mixed(A: mat3, v: vec3, s: ti.f64) -> ti.f64:
    w = A @ v + s
    w *= ti.exp(-0.5 * s * s)
    u = vec3(w.x, w[1] * s, ti.max(w[2], s))
    B = A.inverse() @ A.transpose() + u.outer_product(v)
    x, y = u.cross(v), B.determinant()
    x = x.normalized() * y
    m = ti.Matrix([[x[0], s], [y, x[2] ** 2]])
    return stretch(u, v) * ti.log(1.0 + m.trace() ** 2) + ti.min(s, x.sum()) + (m @ m).sum() / 7.0


def torch_mixed(A, v, s):
    w = (A @ v + s) * torch.exp(-0.5 * s * s)
    u = torch.stack([w[0], w[1] * s, torch.maximum(w[2], s)])
    B = torch.linalg.inv(A) @ A.T + torch.outer(u, v)
    x, y = torch.linalg.cross(u, v), torch.linalg.det(B)
    x = x / x.norm() * y
    m = torch.stack([torch.stack([x[0], s]), torch.stack([y, x[2] ** 2])])
    return (
        ((u - v).norm() - 1.0) * torch.log(1.0 + torch.trace(m) ** 2) + torch.minimum(s, x.sum()) + (m @ m).sum() / 7.0
    )


def draw(seed):
    rng = np.random.default_rng(seed)
    return np.eye(3) + 0.3 * rng.standard_normal((3, 3)), np.array([1.0, -2.0, 0.5]) + 0.5 * rng.standard_normal(3), \
        0.3 + 0.4 * rng.random()


def test_straight_line_code_is_reversed():
    assert why_not(mixed, (True, True, True)) is None
    A, v, s = draw(0)
    assert "mixed_vjp(" in td.source(td.grad(mixed, argnums=(0, 1, 2)), A, v, s)


@given(st.integers(0, 2**31))
def test_gradient_by_reverse_matches_torch(seed):
    A, v, s = draw(seed)
    got = td.grad(mixed, argnums=(0, 1, 2))(A, v, s)
    want = torch.autograd.functional.jacobian(
        torch_mixed, tuple(torch.tensor(a, dtype=torch.float64) for a in (A, v, s))
    )
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-10, atol=1e-12)


@given(st.integers(0, 2**31))
def test_forward_over_reverse_hessian_matches_torch_and_forward_over_forward(seed):
    A, v, s = draw(seed)
    got = td.hessian(mixed, argnums=1)(A, v, s)
    want = torch.autograd.functional.hessian(
        lambda v_: torch_mixed(torch.tensor(A), v_, torch.tensor(s, dtype=torch.float64)), torch.tensor(v)
    ).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)
    forward = td.jacfwd(td.jacfwd(mixed, argnums=1), argnums=1)(A, v, s)
    np.testing.assert_allclose(got, forward, rtol=1e-10, atol=1e-12)


@ti.func
def pair(x: vec3, s: ti.f64):
    return x * s + 1.0, x.dot(x) * ti.sin(s)


def test_several_outputs_by_reverse_rows():
    x, s = np.array([0.3, -1.2, 2.0]), 0.7
    assert why_not(pair, (True, True), 2) is None
    got = td.jacrev(pair, argnums=(0, 1))(x, s)
    want = torch.autograd.functional.jacobian(
        lambda x_, s_: (x_ * s_ + 1.0, x_.dot(x_) * torch.sin(s_)),
        (torch.tensor(x), torch.tensor(s, dtype=torch.float64)),
    )
    for g_row, w_row in zip(got, want):
        for g, w in zip(g_row, w_row):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-12, atol=1e-14)


@ti.func
def looped(x: vec3) -> ti.f64:
    total = 0.0
    i = 0
    while i < 3:
        total += x[i] ** 3
        i += 1
    return total


@ti.func
def unrolled(x: vec3, A: mat3) -> ti.f64:
    total = 0.0
    for i in range(3):
        for j in ti.static(range(3)):
            if ti.static(i == j):
                total += A[i, j] * x[i] ** 2
            elif ti.static(i < j and j < N):
                total += ti.sin(A[i, j]) * x[j]
    return total


N = 3


def test_loops_over_constant_ranges_are_unrolled():
    assert why_not(unrolled, (True, True)) is None
    rng = np.random.default_rng(3)
    x, A = rng.standard_normal((5, 3)), rng.standard_normal((5, 3, 3))

    def torch_unrolled(x_, A_):
        upper = torch.triu(torch.ones(3, 3, dtype=torch.float64), diagonal=1)
        return (torch.diagonal(A_) * x_**2).sum() + (torch.sin(A_) * upper * x_[None, :]).sum()

    gx, gA = td.grad(unrolled, argnums=(0, 1))(x, A)
    for b in range(5):
        want = torch.autograd.functional.jacobian(torch_unrolled, (torch.tensor(x[b]), torch.tensor(A[b])))
        np.testing.assert_allclose(gx[b], want[0].numpy(), rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(gA[b], want[1].numpy(), rtol=1e-13, atol=1e-14)


@ti.func
def branched(x: vec3) -> ti.f64:
    out = x.norm()
    if x[0] > 0.0:
        out = x.dot(x)
    return out


@ti.func
def writes_entries(x: vec3) -> ti.f64:
    y = x * 2.0
    y[0] = ti.sin(x[1])
    return y.norm_sqr()


def test_while_loops_and_branches_on_values_are_reversed():
    for f in (looped, branched):  # tests/test_reverse_control.py takes them further
        assert why_not(f, (True,)) is None
    x = np.array([0.4, -0.8, 1.5])
    # a runtime loop's reverse sweep recomputes it: forward pushes where they are possible
    # (NOTE: [Loops in reverse cost their square] in tidiff/_modes.py); branches reverse
    assert "looped_vjp(" not in td.source(td.grad(looped), x)
    assert "branched_vjp(" in td.source(td.grad(branched), x)
    np.testing.assert_allclose(td.grad(looped)(x), 3 * x**2, rtol=1e-14)
    np.testing.assert_allclose(td.grad(branched)(x), 2 * x, rtol=1e-14)


@ti.func
def builds(x: vec3, s: ti.f64) -> ti.f64:
    M = ti.Matrix.zero(ti.f64, 3, 3)
    for i in ti.static(range(3)):
        M[i, (i + 1) % 3] = x[i] * s
        M[i, i] += ti.exp(x[i])
    v = M @ x
    v.z = v.x * s
    return v.norm_sqr()


def torch_builds(x, s):
    M = torch.diag(torch.exp(x)) + torch.roll(torch.diag(x * s), shifts=1, dims=1)  # (i, i) -> (i, i + 1 mod 3)
    v = M @ x
    v = torch.stack([v[0], v[1], v[0] * s])
    return (v * v).sum()


def test_writes_into_entries_are_reversed():
    assert why_not(writes_entries, (True,)) is None
    x = np.array([0.4, -0.8, 1.5])
    want = torch.autograd.functional.jacobian(
        lambda t: torch.cat([torch.sin(t[1:2]), 2 * t[1:]]).pow(2).sum(), torch.tensor(x)).numpy()
    np.testing.assert_allclose(td.grad(writes_entries)(x), want, rtol=1e-14)
    assert why_not(builds, (True, True)) is None
    s = 0.7
    xt, st_ = torch.tensor(x), torch.tensor(s, dtype=torch.float64)
    gx, gs = td.grad(builds, argnums=(0, 1))(x, s)
    want = torch.autograd.functional.jacobian(torch_builds, (xt, st_))
    np.testing.assert_allclose(gx, want[0].numpy(), rtol=1e-13)
    np.testing.assert_allclose(gs, want[1].numpy(), rtol=1e-13)
    hessian = torch.autograd.functional.hessian(lambda t: torch_builds(t, st_), xt).numpy()
    np.testing.assert_allclose(td.hessian(builds)(x, s), hessian, rtol=1e-12)


@ti.func
def larger(x: ti.f64, y: ti.f64) -> ti.f64:
    return ti.max(x, y) + ti.min(x, 2.0 * y)


def test_ties_go_where_forward_mode_sends_them():
    x, y = np.array([1.0, 2.0]), np.array([1.0, 1.0])  # x == y, and x == 2y
    rev = td.grad(larger, argnums=(0, 1))(x, y)
    fwd = td.jacfwd(larger, argnums=(0, 1))(x, y)
    for r, f in zip(rev, fwd):
        np.testing.assert_array_equal(r, f)


@ti.func
def shifted(s: ti.f64) -> ti.f64:
    v = ti.Vector([1.0, 2.0])
    w = v + s  # only the scalar is active: the tangent of w is a vector
    return w.dot(w)


def test_the_tangent_of_a_vector_plus_an_active_scalar_is_a_vector():
    np.testing.assert_allclose(td.jacfwd(shifted)(0.5), 2 * (1.5 + 2.5), rtol=1e-15)
    np.testing.assert_allclose(td.hessian(shifted)(0.5), 4.0, rtol=1e-15)


@ti.dataclass
class Holder:
    v: vec3


@ti.func
def dots_a_member(x: vec3) -> ti.f64:
    h = Holder(v=vec3(1.0, -2.0, 0.5))
    return h.v.dot(x * x)  # the receiver is an inactive attribute, not a name


def test_a_method_of_an_inactive_member_is_reversed():
    assert why_not(dots_a_member, (True,)) is None
    x = np.array([0.3, 0.7, -1.2])
    want = torch.autograd.functional.jacobian(
        lambda t: torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64).dot(t * t), torch.tensor(x)).numpy()
    np.testing.assert_allclose(td.grad(dots_a_member)(x), want, rtol=1e-15)
