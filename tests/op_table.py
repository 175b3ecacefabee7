"""The op table: one row per Taichi op or construct, with its torch twin.

Every rule test iterates these rows; adding an op is adding a row. Each row
gives a ``@ti.func`` with annotated core shapes, the same function in torch
(acting on one element, float64), the input domain, and whether it is
smooth enough there for second-order checks.
"""
from dataclasses import dataclass

import taichi as ti
import torch

import tidiff as td

vec3 = ti.types.vector(3, ti.f64)
vec2 = ti.types.vector(2, ti.f64)
mat2 = ti.types.matrix(2, 2, ti.f64)
mat3 = ti.types.matrix(3, 3, ti.f64)


@dataclass
class Row:
    name: str
    func: object
    torch_fn: object
    shapes: tuple  # core shape per argument
    low: float = -2.0
    high: float = 2.0
    smooth: bool = True  # twice differentiable on the domain (almost everywhere is not enough)
    fd: bool = True  # central differences see the function's derivative (not with td.stop_gradient)


ROWS = []


def row(name, shapes, torch_fn, low=-2.0, high=2.0, smooth=True, fd=True):
    def register(func):
        ROWS.append(Row(name, func, torch_fn, shapes, low, high, smooth, fd))
        return func

    return register


# -- arithmetic and powers ------------------------------------------------------

@row("arith", ((), ()), lambda x, y: x * y + x / (y * y + 1.0) - 3.0 * x + y - (-x))
@ti.func
def arith(x: ti.f64, y: ti.f64) -> ti.f64:
    return x * y + x / (y * y + 1.0) - 3.0 * x + y - (-x)


@row("int_pow", ((),), lambda x: x**3 + 2 * x**2 - 3 * x + 1)
@ti.func
def int_pow(x: ti.f64) -> ti.f64:
    return x**3 + 2 * x**2 - 3 * x + 1


@row("real_pow", ((), ()), lambda x, y: x**y + ti_pow_ref(x, 0.5), low=0.5, high=2.0)
@ti.func
def real_pow(x: ti.f64, y: ti.f64) -> ti.f64:
    return x**y + ti.pow(x, 0.5)


def ti_pow_ref(x, p):
    return torch.pow(x, p)


# -- elementary functions -------------------------------------------------------

@row("trig", ((),), lambda x: torch.sin(x) * torch.cos(2 * x) + torch.tan(x / 3))
@ti.func
def trig(x: ti.f64) -> ti.f64:
    return ti.sin(x) * ti.cos(2 * x) + ti.tan(x / 3)


@row(
    "inverse_trig",
    ((), ()),
    lambda x, y: torch.asin(x) + torch.acos(x * y) + torch.atan2(y, x + 2.0),
    low=-0.9,
    high=0.9,
)
@ti.func
def inverse_trig(x: ti.f64, y: ti.f64) -> ti.f64:
    return ti.asin(x) + ti.acos(x * y) + ti.atan2(y, x + 2.0)


@row(
    "exp_log_sqrt", ((),), lambda x: torch.exp(-x) * torch.log(x) + torch.sqrt(x) + 1 / torch.sqrt(x), low=0.3, high=3.0
)
@ti.func
def exp_log_sqrt(x: ti.f64) -> ti.f64:
    return ti.exp(-x) * ti.log(x) + ti.sqrt(x) + ti.rsqrt(x)


@row("tanh", ((),), lambda x: torch.tanh(3 * x))
@ti.func
def tanh(x: ti.f64) -> ti.f64:
    return ti.tanh(3 * x)


@row("abs", ((),), lambda x: torch.abs(x) * x + torch.abs(x - 1.0), smooth=False)
@ti.func
def absolute(x: ti.f64) -> ti.f64:
    return ti.abs(x) * x + abs(x - 1.0)


@row("min_max", ((), ()), lambda x, y: torch.minimum(x, y) * 2 + torch.maximum(x * x, y), smooth=False)
@ti.func
def min_max(x: ti.f64, y: ti.f64) -> ti.f64:
    return ti.min(x, y) * 2 + ti.max(x * x, y)


@row("select", ((), ()), lambda x, y: torch.where(x > y, x * y, x + y * y), smooth=False)
@ti.func
def select(x: ti.f64, y: ti.f64) -> ti.f64:
    return ti.select(x > y, x * y, x + y * y)


@row("floor", ((),), lambda x: torch.floor(x) * x + x, smooth=False)
@ti.func
def floor(x: ti.f64) -> ti.f64:
    return ti.floor(x) * x + x


# -- vectors and matrices -------------------------------------------------------

@row("vector", ((3,), ()), lambda x, s: s * x.dot(x) + torch.sin(x[0]))
@ti.func
def vector(x: vec3, s: ti.f64) -> ti.f64:
    return s * x.dot(x) + ti.sin(x[0])


@row(
    "norms",
    ((3,),),
    lambda x: torch.cat([x / torch.linalg.norm(x), torch.linalg.norm(x).reshape(1)]),
    low=0.5,
    high=2.0,
)
@ti.func
def norms(x: vec3) -> ti.types.vector(4, ti.f64):
    n = x.normalized()
    return ti.Vector([n[0], n[1], n[2], x.norm()])


@row("cross", ((3,), (3,)), lambda a, b: torch.linalg.cross(a, b) * a.sum())
@ti.func
def cross(a: vec3, b: vec3) -> vec3:
    return a.cross(b) * a.sum()


@row("outer", ((2,), (3,)), lambda a, b: torch.outer(a, b))
@ti.func
def outer(a: vec2, b: vec3) -> ti.types.matrix(2, 3, ti.f64):
    return a.outer_product(b)


@row("matmul", ((2, 2), (2,)), lambda A, x: torch.tanh(A @ x + A.T @ x))
@ti.func
def matmul(A: mat2, x: vec2) -> vec2:
    return ti.tanh(A @ x + A.transpose() @ x)


@row(
    "det_inv",
    ((2, 2),),
    lambda A: (
        torch.linalg.inv(A + 3 * torch.eye(2, dtype=A.dtype)) * torch.linalg.det(A + 3 * torch.eye(2, dtype=A.dtype))
    ),
    low=-0.5,
    high=0.5,
)
@ti.func
def det_inv(A: mat2) -> mat2:
    B = A + 3 * ti.Matrix.identity(ti.f64, 2)
    return B.inverse() * B.determinant()


@row("trace", ((3, 3),), lambda A: torch.trace(A @ A) + A.sum())
@ti.func
def trace(A: mat3) -> ti.f64:
    return (A @ A).trace() + A.sum()


# -- control flow ---------------------------------------------------------------

def _branch_ref(x, y):
    return x * x * y if x > 0 else torch.sin(x) - y


@row("branch", ((), ()), _branch_ref, smooth=False)
@ti.func
def branch(x: ti.f64, y: ti.f64) -> ti.f64:
    r = 0.0
    if x > 0:
        r = x * x * y
    else:
        r = ti.sin(x) - y
    return r


def _loop_ref(x):
    acc = x * 0
    for i in range(4):
        acc = acc * x + (i + 1)
    return acc


@row("for_loop", ((),), _loop_ref)
@ti.func
def for_loop(x: ti.f64) -> ti.f64:
    acc = 0.0
    for i in range(4):
        acc = acc * x + (i + 1)
    return acc


def _while_ref(x):
    y = x
    k = 0
    while k < 3:
        y = torch.sin(y) + x
        k += 1
    return y


@row("while_loop", ((),), _while_ref)
@ti.func
def while_loop(x: ti.f64) -> ti.f64:
    y = x
    k = 0
    while k < 3:
        y = ti.sin(y) + x
        k += 1
    return y


def _static_ref(x):
    out = x[0] * 0
    for i in range(3):
        out = out + x[i] ** (i + 1)
    return out


@row("static_loop", ((3,),), _static_ref)
@ti.func
def static_loop(x: vec3) -> ti.f64:
    out = 0.0
    for i in ti.static(range(3)):
        out += x[i] ** (i + 1)
    return out


@ti.func
def _helper(a, b):
    return a * ti.exp(b)


@row("nested_call", ((), ()), lambda x, y: x * torch.exp(y) + (y * y) * torch.exp(x))
@ti.func
def nested_call(x: ti.f64, y: ti.f64) -> ti.f64:
    return _helper(x, y) + _helper(y * y, x)


# -- more operators, rounding and ops with zero derivative ------------------------

def _mod_ref(x, y):
    q = y * y + 0.3
    return torch.remainder(x, q) + torch.floor(x / q) * x + x / q + x**2 + y


@row("mod_floordiv", ((), ()), _mod_ref, smooth=False)
@ti.func
def mod_floordiv(x: ti.f64, y: ti.f64) -> ti.f64:
    q = y * y + 0.3  # Taichi's % and // on floats are Python's: floor division
    return x % q + (x // q) * x + ti.raw_div(x, q) + pow(x, 2) + (+y)


def _zero_derivative_ref(x, y):
    return (torch.ceil(x) * y + torch.round(x) * x + torch.sign(x) * y + (x >= 0.5).double() * x
            + torch.trunc(x) * y + torch.trunc(3 * x) * x + torch.floor(x) * y + y
            + torch.fmod(torch.trunc(4 * x), 3) * y)


@row("zero_derivative", ((), ()), _zero_derivative_ref, smooth=False)
@ti.func
def zero_derivative(x: ti.f64, y: ti.f64) -> ti.f64:
    nan_or_inf = ti.cast(ti.math.isnan(x * y) + ti.math.isinf(x * y), ti.f64)  # 0: no derivative anyway
    return (ti.ceil(x) * y + ti.round(x) * x + ti.math.sign(x) * y + ti.math.step(0.5, x) * x
            + int(x) * y + ti.cast(3 * x, ti.i32) * x + ti.floor(x, ti.f64) * y
            + ti.zero(x) * x + ti.one(x) * y + nan_or_inf
            + ti.raw_mod(int(4 * x), 3) * y)  # C's %, on integers only (Taichi cannot compile it on floats)


@row("stop_gradient", ((), ()), lambda x, y: (x * y).detach() * x + y * y, fd=False)
@ti.func
def stop_gradient(x: ti.f64, y: ti.f64) -> ti.f64:
    return td.stop_gradient(x * y) * x + y * y


def _clamp_ref(x, y, z):
    t = torch.clamp((x + 0.5) / 1.0, 0.0, 1.0)
    return (torch.maximum(torch.maximum(x, y), z) + 2 * torch.minimum(torch.minimum(x, y), z)
            + torch.minimum(z, torch.maximum(y, x)) + torch.clamp(x * y, -0.5, 0.5) + t * t * (3 - 2 * t))


@row("min_max_clamp", ((), (), ()), _clamp_ref, smooth=False)
@ti.func
def min_max_clamp(x: ti.f64, y: ti.f64, z: ti.f64) -> ti.f64:
    # clamp(x, lo, hi) is min(hi, max(lo, x)) for any order of lo and hi
    return (max(x, y, z) + 2 * min(x, y, z) + ti.math.clamp(x, y, z) + ti.math.clamp(x * y, -0.5, 0.5)
            + ti.math.smoothstep(-0.5, 0.5, x))


def _interpolation_ref(x, y, z):
    e0, e1 = x - 4.5, y + 4.5
    t = (z - e0) / (e1 - e0)
    return x * (1 - z) + y * z + t * t * (3 - 2 * t) * x


@row("mix_smoothstep", ((), (), ()), _interpolation_ref)
@ti.func
def mix_smoothstep(x: ti.f64, y: ti.f64, z: ti.f64) -> ti.f64:
    # edges that move with x and y, and z always between them: smooth
    return ti.math.mix(x, y, z) + ti.math.smoothstep(x - 4.5, y + 4.5, z) * x


def _vector_norms_ref(v, s):
    n = torch.linalg.norm(v)
    w = v * s
    return ((v / (n + 0.1)) @ torch.tensor([1.0, -2.0, 0.5], dtype=v.dtype) + torch.sqrt(n * n + 0.1) * s
            + 1 / torch.sqrt(n * n + 0.2) + (w / (torch.linalg.norm(w) + 0.3))[1] + n / torch.sqrt(n * n + 0.1))


@row("vector_norms", ((3,), ()), _vector_norms_ref, low=0.5, high=2.0)
@ti.func
def vector_norms(v: vec3, s: ti.f64) -> ti.f64:
    # Taichi: normalized(eps) = v / (|v| + eps), norm(eps) = sqrt(|v|^2 + eps), norm_inv = rsqrt(|v|^2 + eps)
    return (v.normalized(0.1).dot(ti.Vector([1.0, -2.0, 0.5])) + v.norm(0.1) * s + v.norm_inv(0.2)
            + ti.Vector.normalized(v * s, 0.3)[1] + ti.Matrix.norm(v) * ti.Matrix.norm_inv(v, 0.1))


def _matrix_norms_ref(A, s):
    n2 = torch.sum(A * A)
    return torch.sqrt(n2) * s + torch.sqrt(n2 + 0.1) + n2 * s + 1 / torch.sqrt(n2 + 0.2) + 1 / torch.sqrt(n2 * s * s)


@row("matrix_norms", ((2, 2), ()), _matrix_norms_ref, low=0.5, high=2.0)
@ti.func
def matrix_norms(A: mat2, s: ti.f64) -> ti.f64:
    # a matrix's norm is Frobenius's: sqrt of the sum of squares (outside code: forward mode wrote A.dot(dA))
    return A.norm() * s + A.norm(0.1) + A.norm_sqr() * s + A.norm_inv(0.2) + (A * s).norm_inv()


def _reductions_ref(v, A):
    return torch.max(v) * torch.min(A) + torch.max(A) + torch.min(v) * torch.sum(A) + torch.dot(v, v)


@row("reductions", ((3,), (2, 2)), _reductions_ref, smooth=False)
@ti.func
def reductions(v: vec3, A: mat2) -> ti.f64:
    return v.max() * A.min() + A.max() + v.min() * A.sum() + v.norm_sqr() + ti.cast(v.any() and A.all(), ti.f64) * 0


def _math_aliases_ref(v, w, A):
    B = A + 2 * torch.eye(2, dtype=A.dtype)
    c = torch.tensor([0.3, -1.0, 2.0], dtype=v.dtype)
    return (torch.dot(v, w) + torch.linalg.cross(v, w) @ c + torch.linalg.norm(v) + (v / torch.linalg.norm(v)) @ c
            + torch.linalg.norm(v - w) + torch.linalg.det(B) + torch.linalg.inv(B)[0, 1])


@row("math_aliases", ((3,), (3,), (2, 2)), _math_aliases_ref, low=0.3, high=1.0)
@ti.func
def math_aliases(v: vec3, w: vec3, A: mat2) -> ti.f64:
    B = A + 2 * ti.Matrix.identity(ti.f64, 2)
    c = ti.Vector([0.3, -1.0, 2.0])
    return (ti.math.dot(v, w) + ti.math.cross(v, w).dot(c) + ti.math.length(v) + ti.math.normalize(v).dot(c)
            + ti.math.distance(v, w) + ti.math.determinant(B) + ti.math.inverse(B)[0, 1])


def _constructors_ref(x, y):
    v = torch.stack([x * y, x])
    M = torch.stack([torch.stack([x, y]), torch.stack([y * y, x])])
    R = torch.stack([v, torch.stack([y, 2 * x])])
    W = torch.tensor([[1.0, -1.0], [0.5, 2.0]], dtype=x.dtype)
    return (v @ torch.tensor([1.0, 2.0], dtype=x.dtype) + (M * W).sum()
            + 2 * x + y + 3 * x + y * y + (R * torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=x.dtype)).sum()
            + (R.T * torch.tensor([[1.0, 0.5], [-2.0, 1.0]], dtype=x.dtype)).sum() + 2 * x * x)


@row("fill", ((), ()), lambda x, y: torch.stack([x * y, x * y, y]) * torch.stack([x, y, x]))
@ti.func
def fill(x: ti.f64, y: ti.f64) -> vec3:
    v = ti.Vector([0.0, 0.0, 0.0])
    v.fill(x * y)  # writes every entry: Taichi's one mutating method
    v[2] = y
    return v * ti.Vector([x, y, x])


@row("constructors_casts", ((), ()), _constructors_ref)
@ti.func
def constructors_casts(x: ti.f64, y: ti.f64) -> ti.f64:
    v = ti.Vector([x * y, x], ti.f64)  # the dtype given positionally
    M = ti.Matrix([[x, y], [y * y, x]], ti.f64)
    R = ti.Matrix.rows([v, ti.Vector([y, 2 * x])])
    C = ti.Matrix.cols([v, ti.Vector([y, 2 * x])])
    return (v.cast(ti.f64).dot(ti.Vector([1.0, 2.0])) + (M * ti.Matrix([[1.0, -1.0], [0.5, 2.0]])).sum()
            + ti.cast(x, ti.f64) + float(x) + ti.f64(y) + ti.Matrix.diag(2, 1.5 * x).sum()
            + vec2(x, y).dot(vec2(0.0, y))
            + (R * ti.Matrix([[1.0, 2.0], [3.0, 4.0]])).sum() + (C * ti.Matrix([[1.0, 0.5], [-2.0, 1.0]])).sum()
            + 2 * x * x + ti.math.ivec2(x, y).sum() * 0)


def _matmul_shapes_ref(v, A):
    c = torch.tensor([1.0, -0.5], dtype=v.dtype)
    return (v @ A) @ c + (A @ v) @ (2 * c) + v @ v + torch.trace(A @ A.T) + v[0] * (A @ v)[1] - v[1] * (A @ v)[0]


@row("matmul_shapes", ((2,), (2, 2)), _matmul_shapes_ref)
@ti.func
def matmul_shapes(v: vec2, A: mat2) -> ti.f64:
    c = ti.Vector([1.0, -0.5])
    # Taichi reads v @ A as A^T v and v @ w as v.dot(w); 2-vectors cross to a scalar
    return (v @ A).dot(c) + (A @ v).dot(2 * c) + v @ v + (A @ A.transpose()).trace() + v.cross(A @ v)


def _solve_ref(M, b):
    x = torch.linalg.solve(M + 2 * torch.eye(3, dtype=M.dtype), b)
    return x @ torch.tensor([1.0, -2.0, 0.5], dtype=M.dtype) + x[0] * x[1]


@row("solve", ((3, 3), (3,)), _solve_ref, low=-0.5, high=0.5)
@ti.func
def solve(M: mat3, b: vec3) -> ti.f64:
    x = ti.solve(M + 2 * ti.Matrix.identity(ti.f64, 3), b)
    return x.dot(ti.Vector([1.0, -2.0, 0.5])) + x[0] * x[1]


def _det_inv_sizes_ref(A):
    B = A + 3 * torch.eye(4, dtype=A.dtype)
    C = B[:3, :3]
    return torch.linalg.det(B) + torch.linalg.det(C) * B[3, 3] + 1 / B[0, 0] + B[0, 0]


@row("det_inv_sizes", ((4, 4),), _det_inv_sizes_ref, low=-0.5, high=0.5)
@ti.func
def det_inv_sizes(A: ti.types.matrix(4, 4, ti.f64)) -> ti.f64:
    # 2x2 is row det_inv; 3x3 and 4x4 inverses are in test_tangent_ops (Taichi's own inverse()
    # of those sizes makes Hessians compile for 5 to 25 s; the rule is the same for every size)
    B = A + 3 * ti.Matrix.identity(ti.f64, 4)
    C = ti.Matrix([[B[0, 0], B[0, 1], B[0, 2]], [B[1, 0], B[1, 1], B[1, 2]], [B[2, 0], B[2, 1], B[2, 2]]])
    D = ti.Matrix([[B[0, 0]]])  # 1x1
    return B.determinant() + C.determinant() * B[3, 3] + D.inverse()[0, 0] + D.determinant()


# -- decompositions (see NOTE: [Decompositions]); near-identity inputs keep singular values and
# eigenvalues apart, and row outputs are invariant to the signs of singular and eigenvectors,
# which torch picks its own way. Taichi's 2x2 sym_eig lists the larger eigenvalue first.

def _svd_ref(M):
    U, S, Vh = torch.linalg.svd(M + torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=M.dtype)))
    V = Vh.T
    return (S[0] + 2.0 * S[1] - S[2] + U[0, 0] * V[1, 0] - 2.0 * U[2, 1] * V[0, 1] + U[1, 2] * V[2, 2]
            + U[0, 1] * U[2, 1] + V[1, 2] * V[0, 2])


@row("svd_3x3", ((3, 3),), _svd_ref, low=-0.3, high=0.3)
@ti.func
def svd_3x3(M: mat3) -> ti.f64:
    U, S, V = ti.svd(M + ti.Matrix([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 3.0]], ti.f64))
    return (S[0, 0] + 2.0 * S[1, 1] - S[2, 2] + U[0, 0] * V[1, 0] - 2.0 * U[2, 1] * V[0, 1] + U[1, 2] * V[2, 2]
            + U[0, 1] * U[2, 1] + V[1, 2] * V[0, 2])


def _polar_ref(M):
    U, S, Vh = torch.linalg.svd(M + torch.eye(3, dtype=M.dtype))
    R, P = U @ Vh, Vh.T @ torch.diag(S) @ Vh
    return R[0, 1] - 2.0 * R[2, 0] + R[1, 1] * P[0, 2] + P[1, 1] - 3.0 * P[2, 0]


@row("polar_3x3", ((3, 3),), _polar_ref, low=-0.3, high=0.3)
@ti.func
def polar_3x3(M: mat3) -> ti.f64:
    U, P = ti.polar_decompose(M + ti.Matrix.identity(ti.f64, 3))
    return U[0, 1] - 2.0 * U[2, 0] + U[1, 1] * P[0, 2] + P[1, 1] - 3.0 * P[2, 0]


def _sym_eig_ref(M):
    w, Q = torch.linalg.eigh(M + M.T + torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=M.dtype)))
    return w[0] - 2.0 * w[1] + 0.5 * w[2] + Q[0, 0] * Q[1, 0] - 2.0 * Q[2, 1] * Q[0, 1] + Q[1, 2] * Q[1, 2]


@row("sym_eig_3x3", ((3, 3),), _sym_eig_ref, low=-0.3, high=0.3)
@ti.func
def sym_eig_3x3(M: mat3) -> ti.f64:
    w, Q = ti.sym_eig(M + M.transpose() + ti.Matrix([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 3.0]], ti.f64))
    return w[0] - 2.0 * w[1] + 0.5 * w[2] + Q[0, 0] * Q[1, 0] - 2.0 * Q[2, 1] * Q[0, 1] + Q[1, 2] * Q[1, 2]


def _polar_2x2_ref(M):
    def polar(B):
        U, S, Vh = torch.linalg.svd(B)
        return U @ Vh, Vh.T @ torch.diag(S) @ Vh

    A = M + torch.eye(2, dtype=M.dtype)
    R, P = polar(A)
    R2, P2 = polar(torch.diag(torch.tensor([1.0, -1.0], dtype=M.dtype)) @ A)
    return R[0, 1] + P[1, 0] * P[1, 1] - 2.0 * P[0, 0] + R2[1, 0] - P2[0, 1] + R2[0, 0] * P2[1, 1]


@row("polar_2x2", ((2, 2),), _polar_2x2_ref, low=-0.3, high=0.3)
@ti.func
def polar_2x2(M: mat2) -> ti.f64:
    # (2x2 svd and sym_eig share the 3x3 rules' code: test_tangent_ops checks them, cheaper to compile)
    A = M + ti.Matrix.identity(ti.f64, 2)
    R, P = ti.polar_decompose(A)
    R2, P2 = ti.polar_decompose(ti.Matrix([[1.0, 0.0], [0.0, -1.0]], ti.f64) @ A)  # det < 0: U a reflection
    return R[0, 1] + P[1, 0] * P[1, 1] - 2.0 * P[0, 0] + R2[1, 0] - P2[0, 1] + R2[0, 0] * P2[1, 1]


ROW_BY_NAME = {r.name: r for r in ROWS}
