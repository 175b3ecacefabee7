"""Derivatives of ``ti.svd``, ``ti.sym_eig`` and ``ti.polar_decompose``, as ``@ti.func`` helpers.

Rules in ``ops.py`` call them as ``_tidiff_rules.<name>``
(``helpers`` re-exports them). Each takes the op's primal results, so nothing is
decomposed twice, and is plain straight-line Taichi code: at second order the tangent
transform differentiates it through its source.

# NOTE: [Decompositions]
Taichi builds ``ti.svd``, ``ti.sym_eig`` and ``ti.polar_decompose`` from iterative or
branchy code (3x3: a Jacobi SVD in C++, Cardano's formula with a QL fallback; 2x2: closed
forms with thresholds such as ``abs(S[0, 1]) < 1e-5``), so differentiating its source is
neither possible (the C++ SVD has none) nor exact (a threshold branch differentiates to
the derivative of an approximation). The rules below are the textbook derivatives of the
*results*, exact wherever the decomposition is differentiable, and cheap: a few 2x2/3x3
products, no second decomposition. With ``A = U S V^T`` (Taichi's 3x3 SVD is *signed*:
``U``, ``V`` rotations, ``S[2, 2] < 0`` when ``det A < 0``; the formulas hold for any
signs) and ``X = U^T dA V``:

    dS_ii = X_ii,  dU = U W_U,  dV = V W_V,
    (W_U)_ij = (s_j X_ij + s_i X_ji) / (s_j^2 - s_i^2),  (W_V)_ij = (s_i X_ij + s_j X_ji) / (s_j^2 - s_i^2).

Symmetric eigenproblem ``A Q = Q diag(w)``, with ``X = Q^T sym(dA) Q``: ``dw_i = X_ii``,
``dQ = Q W``, ``W_ij = X_ij / (w_j - w_i)``. ``sym(dA) = (dA + dA^T) / 2``: Taichi reads
only some entries of ``A`` (it assumes symmetry), so a rule must pick a convention; the
symmetric part is the derivative of ``sym_eig((A + A^T) / 2)``, as ``torch.linalg.eigh``
on symmetric input.

Polar ``A = U P`` (``U`` orthogonal, ``P`` symmetric): ``M = U^T dA = W P + dP`` with
``W = U^T dU`` skew and ``dP`` symmetric, so the skew part of ``M`` is ``(W P + P W) / 2``.
For 3x3, ``W P + P W = [(tr(P) I - P) w]x`` with ``W = [w]x``, so ``w`` solves one 3x3
system; for 2x2, ``W P + P W = tr(P) W``. Then ``dU = U W`` and ``dP = M - W P``. This is
smooth where singular values repeat (``A`` near a rotation, the common case in simulation),
needs no second SVD, and is a few products: an eigenbasis solution of the Sylvester
equation ``P dP + dP P = d(A^T A)`` would divide by ``s_i - s_j`` in its own derivative, and
a closed-form one compiled ~3x slower at second order (Taichi's compile time grows fast
with the number of 3x3 products: 40 chained products compile for 11 s). Repeated singular
values (``s_i^2 = s_j^2``, SVD), repeated eigenvalues (sym_eig) and singular ``A`` (polar)
have no derivative: the rules divide by zero there (``docs/limits.md``). The reverse
helpers are the transposes of the same linear maps.
"""
import taichi as ti

from .._lang.products import matmul
from .cofactors import cofactors

_PAIRS = [(i, j) for i in range(3) for j in range(3)]
"""Index pairs of a 3x3 matrix; 2x2 code skips those past its size. (A loop over
``ti.ndrange(X.n, X.n)`` reads ``X``, which the tangent transform refuses at second order.)"""


@ti.func
def svd_jvp(U, S, V, dA):
    """Tangents ``(dU, dS, dV)`` of ``U, S, V = ti.svd(A)`` along ``dA``."""
    X = matmul(matmul(U.transpose(), dA), V)
    dS = ti.zero(S)
    WU = ti.zero(X)
    WV = ti.zero(X)
    for i, j in ti.static(_PAIRS):
        if ti.static(i >= X.n or j >= X.n):
            pass
        elif ti.static(i == j):
            dS[i, i] = X[i, i]
        else:
            gap = S[j, j] * S[j, j] - S[i, i] * S[i, i]
            WU[i, j] = (S[j, j] * X[i, j] + S[i, i] * X[j, i]) / gap
            WV[i, j] = (S[i, i] * X[i, j] + S[j, j] * X[j, i]) / gap
    return matmul(U, WU), dS, matmul(V, WV)


@ti.func
def svd_vjp(U, S, V, gU, gS, gV):
    """The cotangent of ``A`` in ``U, S, V = ti.svd(A)``: the transpose of :func:`svd_jvp`."""
    a = matmul(U.transpose(), gU)
    b = matmul(V.transpose(), gV)
    M = ti.zero(a)
    for i, j in ti.static(_PAIRS):
        if ti.static(i >= a.n or j >= a.n):
            pass
        elif ti.static(i == j):
            M[i, i] = gS[i, i]
        else:
            gap = S[j, j] * S[j, j] - S[i, i] * S[i, i]
            M[i, j] = (S[j, j] * (a[i, j] - a[j, i]) + S[i, i] * (b[i, j] - b[j, i])) / gap
    return matmul(matmul(U, M), V.transpose())


@ti.func
def sym_eig_jvp(w, Q, dA):
    """Tangents ``(dw, dQ)`` of ``w, Q = ti.sym_eig(A)`` along the symmetric part of ``dA``."""
    X = matmul(matmul(Q.transpose(), 0.5 * (dA + dA.transpose())), Q)
    dw = ti.zero(w)
    W = ti.zero(X)
    for i, j in ti.static(_PAIRS):
        if ti.static(i >= X.n or j >= X.n):
            pass
        elif ti.static(i == j):
            dw[i] = X[i, i]
        else:
            W[i, j] = X[i, j] / (w[j] - w[i])
    return dw, matmul(Q, W)


@ti.func
def sym_eig_vjp(w, Q, gw, gQ):
    """The cotangent of ``A`` in ``w, Q = ti.sym_eig(A)``: the transpose of :func:`sym_eig_jvp`."""
    a = matmul(Q.transpose(), gQ)
    M = ti.zero(a)
    for i, j in ti.static(_PAIRS):
        if ti.static(i >= a.n or j >= a.n):
            pass
        elif ti.static(i == j):
            M[i, i] = gw[i]
        else:
            M[i, j] = a[i, j] / (w[j] - w[i])
    G = matmul(matmul(Q, M), Q.transpose())
    return 0.5 * (G + G.transpose())


@ti.func
def _cross_matrix(w):
    """``[w]x``, the skew matrix with ``[w]x v = w x v``."""
    return ti.Matrix([[0.0, -w[2], w[1]], [w[2], 0.0, -w[0]], [-w[1], w[0], 0.0]])


@ti.func
def _axial(K):
    """The vector ``k`` of a skew matrix ``K = [k]x`` (read from the lower triangle)."""
    return ti.Vector([K[2, 1], K[0, 2], K[1, 0]])


@ti.func
def _spin_solve(P, K):
    """``W`` skew with ``W P + P W = K - K^T``, ``P`` symmetric (see NOTE: [Decompositions])."""
    W = ti.zero(P)
    if ti.static(P.n == 2):
        theta = (K[1, 0] - K[0, 1]) / P.trace()
        W = ti.Matrix([[0.0, -theta], [theta, 0.0]])
    else:
        G = P.trace() * ti.Matrix.identity(float, 3) - P  # symmetric: G^-1 = cofactors(G) / det G
        W = _cross_matrix(matmul(cofactors(G), _axial(K - K.transpose())) / G.determinant())
    return W


@ti.func
def polar_decompose_jvp(U, P, dA):
    """Tangents ``(dU, dP)`` of ``U, P = ti.polar_decompose(A)`` along ``dA``."""
    M = matmul(U.transpose(), dA)
    W = _spin_solve(P, M)
    return matmul(U, W), M - matmul(W, P)


@ti.func
def polar_decompose_vjp(U, P, gU, gP):
    """The cotangent of ``A`` in ``U, P = ti.polar_decompose(A)``: the transpose of :func:`polar_decompose_jvp`."""
    ct_W = matmul(U.transpose(), gU) - matmul(gP, P)
    # the transposes of M -> (skew part -> solve -> W) are (W -> skew part -> solve -> M): G is symmetric
    return matmul(U, gP + _spin_solve(P, ct_W))
