"""The op table: one row per Taichi op or construct, with its torch twin.

Every rule test iterates these rows; adding an op is adding a row. Each row
gives a ``@ti.func`` with annotated core shapes, the same function in torch
(acting on one element, float64), the input domain, and whether it is
smooth enough there for second-order checks.
"""
from dataclasses import dataclass

import taichi as ti
import torch

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


ROWS = []


def row(name, shapes, torch_fn, low=-2.0, high=2.0, smooth=True):
    def register(func):
        ROWS.append(Row(name, func, torch_fn, shapes, low, high, smooth))
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


@row("inverse_trig", ((), ()), lambda x, y: torch.asin(x) + torch.acos(x * y) + torch.atan2(y, x + 2.0), low=-0.9, high=0.9)
@ti.func
def inverse_trig(x: ti.f64, y: ti.f64) -> ti.f64:
    return ti.asin(x) + ti.acos(x * y) + ti.atan2(y, x + 2.0)


@row("exp_log_sqrt", ((),), lambda x: torch.exp(-x) * torch.log(x) + torch.sqrt(x) + 1 / torch.sqrt(x), low=0.3, high=3.0)
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


@row("norms", ((3,),), lambda x: torch.cat([x / torch.linalg.norm(x), torch.linalg.norm(x).reshape(1)]), low=0.5, high=2.0)
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


@row("det_inv", ((2, 2),), lambda A: torch.linalg.inv(A + 3 * torch.eye(2, dtype=A.dtype)) * torch.linalg.det(A + 3 * torch.eye(2, dtype=A.dtype)), low=-0.5, high=0.5)
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


ROW_BY_NAME = {r.name: r for r in ROWS}
