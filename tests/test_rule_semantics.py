"""Rules follow Taichi's own definitions of its ops (Taichi 1.7.4's source), not memory.

Each test pins a rule that was once written from memory and was wrong, or a convention
(ties, a zero base, a symmetric part) that the op table's random points never reach.
Where Taichi's reverse mode has an answer it is the reference; elsewhere torch or the
closed form the test states.
"""
import numpy as np
import pytest
import taichi as ti
import torch
from test_against_taichi_reverse import taichi_gradient

import tidiff as td
from tidiff._adjoint import why_not
from tidiff._signature import ArgSpec

vec2 = ti.types.vector(2, ti.f64)
vec3 = ti.types.vector(3, ti.f64)
mat2 = ti.types.matrix(2, 2, ti.f64)
mat3 = ti.types.matrix(3, 3, ti.f64)
mat4 = ti.types.matrix(4, 4, ti.f64)


def close(actual, expected, rtol=1e-12, atol=1e-14):
    np.testing.assert_allclose(np.asarray(actual, dtype=float), np.asarray(expected, dtype=float), rtol=rtol, atol=atol)


def both_modes(f, args):
    """The gradient of a scalar ``f`` by forward mode (jacfwd) and by reverse mode (grad)."""
    argnums = tuple(range(len(args)))
    return td.jacfwd(f, argnums=argnums)(*args), td.grad(f, argnums=argnums)(*args)


def taichi_reverse(f, args):
    specs = [ArgSpec(f"a{k}", np.shape(a), np.dtype(np.float64)) for k, a in enumerate(args)]
    return taichi_gradient(f, specs, [np.asarray(a, dtype=float) for a in args], ())


# -- normalized(eps) is v / (|v| + eps) -------------------------------------------------

@ti.func
def normalized_eps(v: vec2) -> vec2:
    return v.normalized(0.1)


def test_normalized_eps_is_v_over_norm_plus_eps():
    """Issue 10: both rules divided by sqrt(|v|^2 + eps); jvp at (.3, .4) along (1, -2) gave
    (2.39, -2.44). d[v / (|v| + eps)] = dv / s - v (v . dv) / (|v| s^2), s = |v| + eps."""
    v, dv = np.array([0.3, 0.4]), np.array([1.0, -2.0])
    s = np.linalg.norm(v) + 0.1
    expected = dv / s - v * v.dot(dv) / (np.linalg.norm(v) * s * s)  # (2.5, -2.2222...)
    _, tangent = td.jvp(normalized_eps, (v,), (dv,))
    close(tangent, expected)
    close(expected, [2.5, -2.0 - 2.0 / 9.0])
    _, vjp_fn = td.vjp(normalized_eps, v)
    close(vjp_fn(dv)[0], expected)  # the Jacobian is symmetric


@ti.func
def eps_norms(v: vec2) -> ti.f64:
    unbound = ti.Vector.normalized(v, 0.2)[0]
    return v.normalized(0.1).dot(ti.Vector([1.0, 2.0])) + v.norm(0.1) + v.norm_inv(0.1) + unbound


def test_eps_variants_match_taichis_reverse_mode():
    v = np.array([0.3, 0.4])
    expected = taichi_reverse(eps_norms, [v])[0]
    for (got,) in both_modes(eps_norms, (v,)):
        close(got, expected)


# -- ties: split evenly between equal arguments, as JAX and torch (NOTE: [Ties]) --------------------

@ti.func
def max2(x: ti.f64, y: ti.f64) -> ti.f64:
    return ti.max(x, y) + 2 * ti.min(x, y)


def torch_max2(x, y):
    return torch.maximum(x, y) + 2 * torch.minimum(x, y)


@ti.func
def max3(x: ti.f64, y: ti.f64, z: ti.f64) -> ti.f64:
    return ti.max(x, y, z) + 2 * min(x, y, z)


def torch_max3(x, y, z):  # Taichi's definition: max(a, max(b, c))
    return torch.maximum(x, torch.maximum(y, z)) + 2 * torch.minimum(x, torch.minimum(y, z))


@ti.func
def clamp(x: ti.f64, lo: ti.f64, hi: ti.f64) -> ti.f64:
    return ti.math.clamp(x, lo, hi)


def torch_clamp(x, lo, hi):  # Taichi's definition: min(hi, max(lo, x))
    return torch.minimum(hi, torch.maximum(lo, x))


@ti.func
def reductions(x: ti.f64, y: ti.f64, z: ti.f64) -> ti.f64:
    v = ti.Vector([x, y, z])
    return v.max() + 2 * v.min() + 4 * ti.Matrix([[x, y], [z, x]]).max()


def torch_reductions(x, y, z):
    v = torch.stack([x, y, z])
    return v.amax() + 2 * v.amin() + 4 * torch.stack([x, y, z, x]).amax()


@ti.func
def softplus(x: ti.f64) -> ti.f64:
    return ti.max(x, 0.0) + ti.log(1.0 + ti.exp(-ti.abs(x)))


def torch_softplus(x):
    return torch.maximum(x, torch.zeros_like(x)) + torch.log(1.0 + torch.exp(-torch.abs(x)))


TIES = [
    (max2, torch_max2, (1.0, 1.0)),
    (max3, torch_max3, (1.0, 1.0, 0.0)), (max3, torch_max3, (0.0, 1.0, 1.0)), (max3, torch_max3, (1.0, 0.0, 1.0)),
    (max3, torch_max3, (1.0, 1.0, 1.0)), (max3, torch_max3, (0.0, 0.0, 1.0)),
    (clamp, torch_clamp, (0.0, 0.0, 1.0)), (clamp, torch_clamp, (1.0, 0.0, 1.0)),
    (clamp, torch_clamp, (0.5, 0.5, 0.5)), (clamp, torch_clamp, (-1.0, 0.5, 0.5)),
    (clamp, torch_clamp, (2.0, 1.0, 1.0)),
    (reductions, torch_reductions, (1.0, 1.0, 0.0)), (reductions, torch_reductions, (0.0, 1.0, 1.0)),
    (reductions, torch_reductions, (1.0, 1.0, 1.0)), (reductions, torch_reductions, (1.0, 0.0, 1.0)),
    (softplus, torch_softplus, (0.0,)),
]


@pytest.mark.parametrize("f, twin, point", TIES, ids=[f"{f.__name__}{p}" for f, _, p in TIES])
def test_ties_split_evenly_as_torch(f, twin, point):
    """Issue 35, item 4: a tie of max(a, b) went to b (Taichi's reverse mode) where JAX and torch split it;
    the stable softplus had derivative 0 at 0. Both modes, and the Hessian (zero: the split is constant)."""
    args = tuple(np.float64(p) for p in point)
    targs = tuple(torch.tensor(p, dtype=torch.float64) for p in point)
    want = torch.autograd.functional.jacobian(twin, targs)
    for grads in both_modes(f, args):
        close(np.array(grads, dtype=float), np.array([w.item() for w in want]))
    argnums = tuple(range(len(args)))
    hessian = td.hessian(f, argnums=argnums)(*args)
    close(np.array(hessian, dtype=float), np.zeros((len(args), len(args))))


def test_softplus_at_zero_is_its_sigmoid():
    """The derivative of softplus is sigmoid: 1/2 at 0, by jvp, vjp and grad alike."""
    assert td.grad(softplus)(0.0) == 0.5
    assert td.jvp(softplus, (0.0,), (1.0,))[1] == 0.5
    assert td.vjp(softplus, 0.0)[1](1.0)[0] == 0.5


@ti.func
def vector_clamp(x: vec3) -> vec3:
    return ti.math.clamp(x, 0.0, 1.0) + ti.max(x, 0.5)


def test_a_vector_tie_splits_entry_by_entry():
    x = np.array([0.0, 0.5, 1.0])
    xt = torch.tensor(x, requires_grad=True)
    want = torch.autograd.functional.jacobian(lambda t: torch_clamp(t, torch.tensor(0.0, dtype=torch.float64),
                                                                    torch.tensor(1.0, dtype=torch.float64))
                                              + torch.maximum(t, torch.tensor(0.5, dtype=torch.float64)), xt)
    close(td.jacrev(vector_clamp)(x), want.numpy())
    close(td.jacfwd(vector_clamp)(x), want.numpy())


# -- pow at a zero base ---------------------------------------------------------------------

@ti.func
def power(x: ti.f64, y: ti.f64) -> ti.f64:
    return x ** y


@ti.func
def integer_power(x: ti.f64, n: ti.i32) -> ti.f64:
    return 3.0 * x ** n


def test_pow_of_a_zero_base():
    """d/dy 0**y = 0 for y > 0 (x**y * log x was 0 * -inf = NaN); d/dx x**0 = 0 at x = 0 (0 * x**-1
    was NaN). torch gives the same; a negative base has no y-derivative (NaN, as in torch)."""
    for got in both_modes(power, (0.0, 2.0)):
        close(got, [0.0, 0.0])
    x, y = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (0.0, 2.0))
    close([g.item() for g in torch.autograd.grad(x**y, (x, y))], [0.0, 0.0])  # torch: the same
    for n in (0, 1, 2):
        close(td.grad(integer_power)(0.0, np.int32(n)), 3.0 * (1.0 if n == 1 else 0.0))
        close(td.jacfwd(integer_power)(0.0, np.int32(n)), 3.0 * (1.0 if n == 1 else 0.0))
    fwd, rev = both_modes(power, (-2.0, 3.0))
    for got in (fwd, rev):
        close(got[0], 12.0)
        assert np.isnan(got[1])


def test_pow_second_derivatives_at_the_edges():
    """Issue 35, items 1 and 2 (NOTE: [Zero tangents of a power]): at y = 0 the mixed second derivative is
    1 / x both ways (it was x one way: the Hessian was not symmetric); at a negative base d2/dx2 is finite
    as by argnums=0 alone, the rest NaN (no y-derivative); at x = 0, y = 1.5 the limit of d/dy(d/dx) is 0.
    Forward over reverse and reverse over reverse agree; away from the edges torch's Hessian."""
    hessians = (td.hessian(power, argnums=(0, 1)), td.jacrev(td.grad(power, argnums=(0, 1)), argnums=(0, 1)))
    cases = {(np.pi, 0.0): [[0.0, 1 / np.pi], [1 / np.pi, np.log(np.pi) ** 2]],
             (-2.0, 2.0): [[2.0, np.nan], [np.nan, np.nan]],
             (0.0, 1.5): [[np.inf, 0.0], [0.0, 0.0]],
             (0.0, 2.0): [[2.0, 0.0], [0.0, 0.0]],
             (2.0, 0.0): [[0.0, 0.5], [0.5, np.log(2.0) ** 2]]}  # torch: d/dy(d/dx) 0, d/dx(d/dy) 0.5
    for point, want in cases.items():
        for H in hessians:
            close(np.array(H(*point), dtype=float), np.array(want))
    assert float(td.hessian(power)(-2.0, 2.0)) == 2.0  # by x alone, as before
    for point in ((0.7, 2.5), (1.3, -0.4), (0.2, 0.9)):
        want = torch.autograd.functional.hessian(lambda v: v[0] ** v[1], torch.tensor(point, dtype=torch.float64))
        for H in hessians:
            close(np.array(H(*point), dtype=float), want.numpy())


# -- a quotient by a large denominator ---------------------------------------------------

@ti.func
def quotients(x: ti.f64, y: ti.f64) -> ti.f64:
    return x / y + ti.raw_div(x, y)


def test_a_quotients_tangent_by_its_denominator_does_not_overflow():
    """d(x / y) = -dy * (x / y) / y, as torch computes it: -dy * x / (y * y) overflows y * y past 1e154
    and gave -0 here (long run, seed 12107: NaN in a Hessian, an inf / inf in atan2's second order)."""
    x, y = 1e200, 1e160
    _, tangent = td.jvp(quotients, (x, y), (0.0, 1.0))
    close(tangent, -2e-120)
    for got in both_modes(quotients, (x, y)):
        close(got, [2e-160, -2e-120])
    close(td.hessian(quotients, argnums=1)(x, y), 4e-280)  # 2 * 2x / y**3
    close(td.jacfwd(td.jacfwd(quotients, argnums=1), argnums=1)(x, y), 4e-280)


# -- casts to a dtype known only when Taichi compiles --------------------------------------

@ti.func
def cast_to(x, dt: ti.template()):
    return ti.cast(x * x, dt) * x


@ti.func
def casts_by_parameter(x: ti.f64) -> ti.f64:
    return cast_to(x, ti.f64) + cast_to(x, ti.i32)


def test_a_cast_to_a_dtype_parameter():
    """ti.cast(x, dt) with dt a template parameter: a float cast is linear, an integer one has
    zero derivative (the forward rule dropped the tangent of both; the reverse one kept both)."""
    x = 1.7
    expected = 3 * x * x + np.trunc(x * x)
    for (got,) in both_modes(casts_by_parameter, (x,)):
        close(got, expected)


# -- the dtype given positionally to ti.Vector / ti.Matrix (issue 10, item 8) --------------

@ti.func
def positional_dtype(x: ti.f64, y: ti.f64) -> ti.f64:
    v = ti.Vector([x * y, x], ti.f64)
    M = ti.Matrix([[x, y], [y, x * x]], ti.f64)
    return v.dot(M @ v)


def test_a_positional_dtype_is_no_operand():
    assert why_not(positional_dtype, (True, True)) is None  # the reverse transform takes it
    x, y = 0.7, -1.3

    def reference(x, y):
        v = torch.stack([x * y, x])
        M = torch.stack([torch.stack([x, y]), torch.stack([y, x * x])])
        return v @ (M @ v)

    expected = [g.item() for g in torch.autograd.functional.jacobian(
        reference, (torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)))]
    for got in both_modes(positional_dtype, (x, y)):
        close(got, expected)


# -- determinants of singular 4x4 matrices -------------------------------------------------

@ti.func
def det4(A: mat4) -> ti.f64:
    return A.determinant()


def test_det_of_a_singular_4x4_has_the_cofactors_as_gradient():
    """4x4 cofactors were det(a) * a^-T: NaN for a singular a, whose gradient is its cofactor matrix."""
    A = np.array([[1.0, 2.0, 0.0, -1.0], [3.0, -1.0, 2.0, 1.0], [0.0, 1.0, 1.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    A[3] = A[0] + 2 * A[1]  # rank 3, and small integers: det(A) is exactly 0
    cofactors = np.array([[(-1) ** (i + j) * np.linalg.det(np.delete(np.delete(A, i, 0), j, 1)) for j in range(4)]
                          for i in range(4)])
    assert np.abs(cofactors).max() > 0.1
    for (got,) in both_modes(det4, (A,)):
        close(got, cofactors, rtol=1e-12, atol=1e-13)


# -- sym_eig reads the symmetric part of a tangent -------------------------------------------

@ti.func
def eigenvalues(A: mat2) -> vec2:
    w, _ = ti.sym_eig(A)
    return w


def test_sym_eig_differentiates_the_symmetric_part():
    """Taichi assumes A symmetric and reads some entries only; the rule's convention is
    sym_eig((A + A^T) / 2), as torch.linalg.eigh of symmetric input."""
    A = np.array([[2.0, 0.3], [0.3, 1.0]])
    E = np.array([[0.1, 1.0], [-0.4, 0.2]])
    _, along_E = td.jvp(eigenvalues, (A,), (E,))
    _, along_sym = td.jvp(eigenvalues, (A,), (0.5 * (E + E.T),))
    close(along_E, along_sym)
    _, Q = np.linalg.eigh(A)
    close(along_E, [Q[:, 1] @ E @ Q[:, 1], Q[:, 0] @ E @ Q[:, 0]])  # Taichi's 2x2: larger first


# -- polar decomposition where singular values repeat ----------------------------------------

@ti.func
def polar_energy(A: mat3) -> ti.f64:
    U, P = ti.polar_decompose(A)
    return U[0, 1] - 2.0 * U[2, 0] + U[1, 1] * P[0, 2] + P[1, 1] * P[2, 2] - 3.0 * P[2, 0]


def _exact_polar_energy(A):
    U, S, Vh = np.linalg.svd(A)
    U, P = U @ Vh, Vh.T @ np.diag(S) @ Vh
    return U[0, 1] - 2.0 * U[2, 0] + U[1, 1] * P[0, 2] + P[1, 1] * P[2, 2] - 3.0 * P[2, 0]


def test_polar_at_a_rotation():
    """A rotation has three equal singular values: the rule (a 3x3 solve in tr(P) I - P, see
    NOTE: [Decompositions]) stays smooth there. Reference: central differences of the polar
    decomposition from numpy's SVD (Taichi's own 3x3 SVD is accurate to ~1e-12 only near
    repeated singular values, too little for differences; torch's SVD backward is NaN there)."""
    c, s = np.cos(0.7), np.sin(0.7)
    R = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    basis = np.eye(9).reshape(9, 3, 3)
    h = 1e-5
    fd_grad = np.array([(_exact_polar_energy(R + h * e) - _exact_polar_energy(R - h * e)) / (2 * h) for e in basis])
    close(td.grad(polar_energy)(R), fd_grad.reshape(3, 3), rtol=1e-8, atol=1e-9)
    h = 1e-4
    E = _exact_polar_energy
    fd_hessian = np.array([[(E(R + h * a + h * b) - E(R + h * a - h * b) - E(R - h * a + h * b) + E(R - h * a - h * b))
                            / (4 * h * h) for b in basis] for a in basis])
    close(td.hessian(polar_energy)(R), fd_hessian.reshape(3, 3, 3, 3), rtol=1e-6, atol=1e-6)


# -- ops refused by name ----------------------------------------------------------------------

@ti.func
def eig(A: mat2) -> ti.f64:
    values, _ = ti.eig(A)
    return values[0, 0]


@ti.func
def bit_cast(x: ti.f64) -> ti.f64:
    return ti.cast(ti.bit_cast(x, ti.i64), ti.f64)


@pytest.mark.parametrize("f, op, reason", [(eig, "ti.eig", "ti.sym_eig"), (bit_cast, "ti.bit_cast", "bits")])
def test_ops_without_a_rule_are_refused_by_name_with_the_reason(f, op, reason):
    x = np.eye(2) if f is eig else 1.0
    for transform in (td.jacfwd, td.grad):
        with pytest.raises(td.TransformError) as info:
            transform(f)(x)
        assert op in str(info.value) and reason in str(info.value)
