"""The op table: one row per Taichi op, checked against torch at first and second order.

Add an op: write a row (a ``@ti.func`` using it, decorated with its torch
equivalent, argument shapes and input domain); every order is then tested.
"""
from dataclasses import dataclass

import numpy as np
import pytest
import taichi as ti
import torch
from tangent_harness import assert_close, evaluate, flatten, structure, torch_jvp, torch_second

from tidiff._tangent import jvp_func


@dataclass
class Op:
    name: str
    func: object
    torch_fn: object
    shapes: tuple
    lo: float
    hi: float
    second: bool


OPS = []


def op(torch_fn, *shapes, lo=-2.0, hi=2.0, second=True):
    """Register the decorated function as a row: torch equivalent, arg shapes, domain."""
    def register(fn):
        OPS.append(Op(fn.__name__, ti.func(fn), torch_fn, shapes, lo, hi, second))
        return fn
    return register


V3, M2, M3 = (3,), (2, 2), (3, 3)

# --- arithmetic ------------------------------------------------------------
@op(lambda x, y: x + y, (), ())
def add(x, y):
    return x + y


@op(lambda x, y: x - y, (), ())
def sub(x, y):
    return x - y


@op(lambda x, y: x * y, (), ())
def mul(x, y):
    return x * y


@op(lambda x, y: x / y, (), (), lo=0.5, hi=2.0)
def div(x, y):
    return x / y


@op(lambda x, y: x ** y, (), (), lo=0.5, hi=2.0)
def power(x, y):
    return x ** y


@op(lambda x: x ** 3 - 2 * x ** 2, ())
def int_power(x):
    return x ** 3 - 2 * x ** 2


@op(lambda x, y: torch.floor(x / y) * x, (), (), lo=0.3, hi=2.0)
def floordiv(x, y):
    return (x // y) * x


@op(lambda x, y: torch.remainder(x, y) * x, (), (), lo=0.3, hi=2.0)
def mod(x, y):
    return (x % y) * x


@op(lambda x: -x * x, ())
def neg(x):
    return -x * x


@op(lambda x: torch.abs(x) * x, ())
def absolute(x):
    return abs(x) * x


@op(lambda x: torch.abs(x) * x, ())
def ti_abs(x):
    return ti.abs(x) * x


# --- elementary functions ---------------------------------------------------
@op(lambda x: torch.sin(x), ())
def sin(x):
    return ti.sin(x)


@op(lambda x: torch.cos(x), ())
def cos(x):
    return ti.cos(x)


@op(lambda x: torch.tan(x), (), lo=-1.2, hi=1.2)
def tan(x):
    return ti.tan(x)


@op(lambda x: torch.asin(x), (), lo=-0.9, hi=0.9)
def asin(x):
    return ti.asin(x)


@op(lambda x: torch.acos(x), (), lo=-0.9, hi=0.9)
def acos(x):
    return ti.acos(x)


@op(lambda y, x: torch.atan2(y, x), (), ())
def atan2(y, x):
    return ti.atan2(y, x)


@op(lambda x: torch.tanh(x), ())
def tanh(x):
    return ti.tanh(x)


@op(lambda x: torch.exp(x), ())
def exp(x):
    return ti.exp(x)


@op(lambda x: torch.log(x), (), lo=0.3, hi=3.0)
def log(x):
    return ti.log(x)


@op(lambda x: torch.sqrt(x), (), lo=0.3, hi=3.0)
def sqrt(x):
    return ti.sqrt(x)


@op(lambda x: torch.rsqrt(x), (), lo=0.3, hi=3.0)
def rsqrt(x):
    return ti.rsqrt(x)


@op(lambda x, y: x ** y, (), (), lo=0.5, hi=2.0)
def ti_pow(x, y):
    return ti.pow(x, y)


@op(lambda x: torch.exp(torch.sin(x)) + torch.log(x), (), lo=0.3, hi=3.0)
def math_prefixed(x):
    return ti.math.exp(ti.math.sin(x)) + ti.math.log(x)


@op(lambda x, y: torch.minimum(x, y) * torch.maximum(x, y), (), ())
def min_max(x, y):
    return ti.min(x, y) * ti.max(x, y)


@op(lambda x, y, z: torch.minimum(torch.minimum(x, y), z) + torch.maximum(x, y), (), (), ())
def builtin_min_max(x, y, z):
    return min(x, y, z) + max(x, y)


@op(lambda x, y: torch.where(x > y, x * x, y), (), ())
def select(x, y):
    return ti.select(x > y, x * x, y)


@op(lambda x: torch.floor(x) * x + torch.ceil(x) + torch.round(x), ())
def floor_ceil_round(x):
    return ti.floor(x) * x + ti.ceil(x) + ti.round(x)


@op(lambda x, y: torch.trunc(x * 3) * y, (), ())
def cast_to_int(x, y):
    return ti.cast(x * 3, ti.i32) * y + int(x * 3) * 0


@op(lambda x: x * 2, ())
def cast_to_float(x):
    return ti.cast(x, ti.f64) + ti.f64(x)


@op(lambda x, lo, hi: torch.clamp(x, lo - 1, hi + 1), (), (), ())
def clamp(x, lo, hi):
    return ti.math.clamp(x, lo - 1.0, hi + 1.0)


@op(lambda x, y, a: x * (1 - a) + y * a, (), (), ())
def mix(x, y, a):
    return ti.math.mix(x, y, a)


def _smoothstep(e0, e1, x):
    t = torch.clamp((x - e0) / (e1 - e0), 0.0, 1.0)
    return t * t * (3 - 2 * t)


@op(lambda x: _smoothstep(torch.tensor(-1.0, dtype=torch.float64), torch.tensor(1.5, dtype=torch.float64), x), ())
def smoothstep(x):
    return ti.math.smoothstep(-1.0, 1.5, x)


@op(lambda x: torch.sign(x) * x, ())
def sign(x):
    return ti.math.sign(x) * x


@op(lambda x: torch.frac(x - torch.floor(x)) * x + torch.log2(x) + x * torch.pi / 180, (), lo=0.3, hi=3.0)
def math_funcs_transformed_from_taichi_source(x):
    return ti.math.fract(x) * x + ti.math.log2(x) + ti.math.radians(x)


@op(lambda x, y: torch.remainder(x, y) + torch.linalg.norm(x - y), V3, V3, lo=0.3, hi=2.0)
def math_mod_distance(x, y):
    return ti.math.mod(x, y) + ti.math.distance(x, y)


@op(lambda x: torch.sin(x), V3)
def elementwise_vector(x):
    return ti.sin(x)


# --- vectors and matrices ---------------------------------------------------
@op(lambda x, y: torch.dot(x, y), V3, V3)
def dot(x, y):
    return x.dot(y)


@op(lambda x, y: torch.dot(x, y), V3, V3)
def math_dot(x, y):
    return ti.math.dot(x, y)


@op(lambda x, y: torch.linalg.cross(x, y), V3, V3)
def cross(x, y):
    return x.cross(y)


@op(lambda x, y: torch.linalg.cross(x, y), V3, V3)
def math_cross(x, y):
    return ti.math.cross(x, y)


@op(lambda x: torch.linalg.norm(x), V3)
def norm(x):
    return x.norm()


@op(lambda x: torch.linalg.norm(x), V3)
def math_length(x):
    return ti.math.length(x)


@op(lambda x: x / torch.linalg.norm(x), V3)
def normalized(x):
    return x.normalized()


@op(lambda x: x / torch.linalg.norm(x), V3)
def math_normalize(x):
    return ti.math.normalize(x)


@op(lambda x: torch.dot(x, x), V3)
def norm_sqr(x):
    return x.norm_sqr()


@op(lambda x, y: torch.outer(x, y), V3, V3)
def outer_product(x, y):
    return x.outer_product(y)


@op(lambda a, x: a @ x, M3, V3)
def matvec(a, x):
    return a @ x


@op(lambda a, b: a.T @ b, M2, M2)
def transpose_matmul(a, b):
    return a.transpose() @ b


@op(lambda x: torch.stack([x[0] * x[1], x[2]]) * x[2], V3)
def swizzle(x):
    return ti.Vector([x.x * x.y, x.z]) * x.zy[0]


@op(lambda x, s: s * x.dot(x) + torch.sin(x[0]), V3, ())
def annotated(x: ti.math.vec3, s: ti.f64) -> ti.f64:
    return s * x.dot(x) + ti.sin(x[0])


def _near_identity(shape, rng):
    return np.eye(shape[0]) + 0.3 * rng.uniform(-1, 1, shape)


@op(lambda a: torch.linalg.det(a), M3)
def determinant(a):
    return a.determinant()


@op(lambda a: torch.linalg.det(a), M2)
def math_determinant(a):
    return ti.math.determinant(a)


@op(lambda a: torch.linalg.det(a), (4, 4))
def determinant_4x4(a):  # past the written-out cofactors: the textbook rule
    return a.determinant()


@op(lambda a: torch.linalg.inv(a), M3)
def inverse(a):
    return a.inverse()


@op(lambda a: torch.linalg.inv(a), M2)
def math_inverse(a):
    return ti.math.inverse(a)


@op(lambda a: torch.trace(a) + a.sum(), M3)
def trace_sum(a):
    return a.trace() + a.sum()


@op(lambda x: torch.max(x) * torch.min(x), V3)
def vector_max_min(x):
    return x.max() * x.min()


@op(lambda x, s: torch.stack([x * s, x * x, s]), (), ())
def vector_literal(x, s):
    return ti.Vector([x * s, x * x, s])


@op(lambda x, y: torch.stack([x, 2 * y, x * y]), (), ())
def vec3_literal(x, y):
    return ti.math.vec3(x, 2 * y, x * y)


@op(lambda x, y: torch.stack([torch.stack([x, y]), torch.stack([x * y, torch.sin(x)])]), (), ())
def matrix_literal(x, y):
    return ti.Matrix([[x, y], [x * y, ti.sin(x)]])


@op(lambda x: torch.stack([torch.stack([x[0], x[1]]), torch.stack([x[2], x[0] * x[1]])]), V3)
def mat2_literal(x):
    return ti.math.mat2(x[0], x[1], x[2], x[0] * x[1])


@op(lambda a, x: a[0, 1] * x[2] + a[1, 1] ** 2, M2, V3)
def indexing(a, x):
    return a[0, 1] * x[2] + a[1, 1] ** 2


@op(lambda x, y: x.dot(y) * torch.exp(x[0]) + torch.linalg.norm(x - y), V3, V3)
def vector_expression(x, y):
    return x.dot(y) * ti.exp(x[0]) + (x - y).norm()


@op(lambda x: x / (torch.linalg.norm(x) + 0.1), V3, lo=0.3, hi=2.0)
def normalized_eps(x):  # Taichi: x / (|x| + eps), eps outside the root
    return x.normalized(0.1)


@op(lambda x: torch.rsqrt(torch.dot(x, x) + 0.1) + torch.sqrt(torch.dot(x, x) + 0.2), V3)
def norm_eps(x):  # Taichi: rsqrt(|x|^2 + eps) and sqrt(|x|^2 + eps), eps inside the root
    return x.norm_inv(0.1) + x.norm(0.2)


@op(lambda a: torch.linalg.inv(a), (4, 4))
def inverse_4x4(a):
    return a.inverse()


def _svd_2x2_ref(a):
    U, S, Vh = torch.linalg.svd(a)
    V = Vh.T
    return torch.stack([S[0], S[1], U[0, 0] * V[1, 0], U[0, 1] * V[0, 1], U[1, 1] * U[0, 1], V[0, 0] * V[1, 0]])


@op(_svd_2x2_ref, M2)
def svd_2x2(a):  # outputs that do not depend on the signs of singular vectors
    U, S, V = ti.svd(a)
    return ti.Vector([S[0, 0], S[1, 1], U[0, 0] * V[1, 0], U[0, 1] * V[0, 1], U[1, 1] * U[0, 1], V[0, 0] * V[1, 0]])


def _sym_eig_2x2_ref(a):
    w, Q = torch.linalg.eigh(a + a.T)
    return torch.stack([w[1], w[0], Q[0, 1] * Q[1, 1], Q[0, 0] * Q[0, 0]])  # Taichi: the larger first


@op(_sym_eig_2x2_ref, M2)
def sym_eig_2x2(a):
    w, Q = ti.sym_eig(a + a.transpose())
    return ti.Vector([w[0], w[1], Q[0, 0] * Q[1, 0], Q[0, 1] * Q[0, 1]])


def _sample(row, rng):
    matrix = row.name in ("determinant", "math_determinant", "determinant_4x4", "inverse", "math_inverse",
                          "inverse_4x4", "svd_2x2", "sym_eig_2x2")
    values = []
    for shape in row.shapes:
        if matrix and len(shape) == 2:
            values.append(_near_identity(shape, rng))
        else:
            values.append(rng.uniform(row.lo, row.hi, shape))
    return values


def _tangents(row, rng):
    return [rng.uniform(-1, 1, shape) for shape in row.shapes]


@pytest.mark.parametrize("row", OPS, ids=[row.name for row in OPS])
def test_first_order_matches_torch(row):
    rng = np.random.default_rng(0)
    x, t = _sample(row, rng), _tangents(row, rng)
    out, dout = torch_jvp(row.torch_fn, x, t)
    s = structure(out)
    got = evaluate(jvp_func(row.func), row.shapes * 2, [s, s], x + t)
    assert_close(got, flatten(out) + flatten(dout), f"jvp of {row.name}")


@pytest.mark.parametrize("row", [r for r in OPS if r.second], ids=[r.name for r in OPS if r.second])
def test_second_order_matches_torch(row):
    rng = np.random.default_rng(1)
    x, u, v = _sample(row, rng), _tangents(row, rng), _tangents(row, rng)
    out, du, dv, duv = torch_second(row.torch_fn, x, u, v)
    s = structure(out)
    zeros = [np.zeros(shape) for shape in row.shapes]
    got = evaluate(jvp_func(jvp_func(row.func)), row.shapes * 4, [[s, s], [s, s]], x + u + v + zeros)
    assert_close(got, flatten(out) + flatten(du) + flatten(dv) + flatten(duv), f"second order of {row.name}")
