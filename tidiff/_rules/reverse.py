"""One reverse (adjoint) rule per Taichi op, in a registry keyed like the forward rules.

A rule maps the cotangent ``g`` of an op's result, the result ``out`` and the
operands (all as :class:`~tidiff._lang.sym.Sym`) to one cotangent
contribution per operand (``None`` where the op has no derivative). Each rule
is the transpose of the forward rule in ``forward.py`` for the same
key, with ties broken the same way.

Shapes are not known in the source: where an op broadcasts (``x * y`` with a
scalar ``x``), the contribution is summed back with ``sum_to(v, x)``, which
Taichi resolves when it compiles.
"""
import ast
from collections.abc import Callable
from typing import Any

import taichi as ti
from taichi.lang.matrix import MatrixType, VectorType

from .._lang.sym import Sym, helpers
from .._lang.sym import ti as T
from . import helpers as rule_helpers
from .forward import exponent_less_one, is_dtype, is_integral, log_of_base, reciprocal_or_zero, unbound_method

Contributions = list[Sym | None]
"""One cotangent contribution per operand of an op, None where it has no derivative."""
AdjointRule = Callable[..., Contributions]
"""``(g, out, *operands) -> Contributions`` (a :class:`MultiOutput` takes lists ``gs``, ``outs``)."""

ADJOINTS: dict[Any, AdjointRule] = {}
"""op key -> (g, out, *operands) -> [contribution or None per operand]."""


def defvjp(keys: Any, *adjoints: Callable[..., Sym] | None) -> None:
    """Register one function ``adjoint(g, out, *operands)`` per operand (None: no derivative)."""
    def rule(g: Sym, out: Sym, *args: Sym) -> Contributions:
        return [None if adj is None else adj(g, out, *args) for adj in adjoints] + [None] * (len(args) - len(adjoints))
    for key in keys if isinstance(keys, (list, tuple)) else (keys,):
        ADJOINTS[key] = rule


class MultiOutput:
    """The adjoint rule of an op returning ``n_outputs`` values: ``rule(gs, outs, *operands)``, where
    ``gs`` and ``outs`` list the cotangents (zeros where none flows) and the results."""

    def __init__(self, n_outputs: int, adjoint: Callable[..., Contributions]) -> None:
        self.n_outputs = n_outputs
        self.adjoint = adjoint

    def __call__(self, gs: list[Sym], outs: list[Sym], *args: Sym) -> Contributions:
        contributions = self.adjoint(gs, outs, *args)
        return contributions + [None] * (len(args) - len(contributions))


def defvjp_multi(keys: Any, n_outputs: int, adjoint: Callable[..., Contributions]) -> None:
    """Register ``adjoint(gs, outs, *operands)`` (see :class:`MultiOutput`): one contribution per operand."""
    for key in keys if isinstance(keys, (list, tuple)) else (keys,):
        ADJOINTS[key] = MultiOutput(n_outputs, adjoint)


def method(*names: str) -> list[Any]:
    return [("method", n) for n in names]


def lookup(callee: object) -> AdjointRule | None:
    """The adjoint rule of ``callee`` (dtype casts and unbound methods included), or None."""
    try:
        if callee in ADJOINTS:
            return ADJOINTS[callee]
    except TypeError:  # unhashable
        return None
    if is_dtype(callee) and not is_integral(callee):
        return ADJOINTS["cast"]
    return ADJOINTS.get(unbound_method(callee))


def is_constructor(callee: object) -> bool:
    """``ti.math.vec3`` and its kin: a vector or matrix built from scalar entries."""
    return isinstance(callee, (VectorType, MatrixType))


def _sum_to(value: Sym, like: Sym) -> Sym:
    return helpers.sum_to(value, like)


def _zero(like: Sym) -> Sym:
    return T.zero(like)


def constructor_of_one(g: Sym, out: Sym, x: Sym) -> Contributions:
    """The adjoint of ``ti.math.vec3(x)``: Taichi puts a scalar ``x`` in every entry and copies a vector."""
    return [_sum_to(g, x)]


# --- operators -------------------------------------------------------------
defvjp(ast.Add, lambda g, out, x, y: _sum_to(g, x), lambda g, out, x, y: _sum_to(g, y))
defvjp(ast.Sub, lambda g, out, x, y: _sum_to(g, x), lambda g, out, x, y: _sum_to(-g, y))
defvjp(ast.Mult, lambda g, out, x, y: _sum_to(g * y, x), lambda g, out, x, y: _sum_to(x * g, y))
defvjp([ast.Div, ti.raw_div], lambda g, out, x, y: _sum_to(g / y, x), lambda g, out, x, y: _sum_to(-g * out / y, y))
defvjp([ast.Pow, pow, ti.pow],
       lambda g, out, x, y: _sum_to(g * y * x ** exponent_less_one(y), x),
       lambda g, out, x, y: _sum_to(g * out * log_of_base(x), y))
defvjp(ast.Mod, lambda g, out, x, y: _sum_to(g, x), lambda g, out, x, y: _sum_to(-g * T.floor(x / y), y))
defvjp(ast.MatMult, lambda g, out, x, y: helpers.matmul_adjoint_left(g, x, y),
       lambda g, out, x, y: helpers.matmul_adjoint_right(g, x, y))
defvjp(ast.USub, lambda g, out, x: -g)
defvjp([ast.UAdd, "cast", float], lambda g, out, x: g)
defvjp([ti.cast] + method("cast"), lambda g, out, x, dtype: helpers.cast_adjoint(g, dtype))

# --- elementary functions ----------------------------------------------------
defvjp(ti.sin, lambda g, out, x: g * T.cos(x))
defvjp(ti.cos, lambda g, out, x: -g * T.sin(x))
defvjp(ti.tan, lambda g, out, x: g / T.cos(x) ** 2)
defvjp(ti.asin, lambda g, out, x: g / T.sqrt(1 - x * x))
defvjp(ti.acos, lambda g, out, x: -g / T.sqrt(1 - x * x))
defvjp(ti.atan2, lambda g, out, y, x: _sum_to(g * x / (x * x + y * y), y),
       lambda g, out, y, x: _sum_to(-g * y / (x * x + y * y), x))
defvjp(ti.tanh, lambda g, out, x: g * (1 - out * out))
defvjp(ti.exp, lambda g, out, x: g * out)
defvjp(ti.log, lambda g, out, x: g / x)
defvjp(ti.sqrt, lambda g, out, x: g / (2 * out))
defvjp(ti.rsqrt, lambda g, out, x: -0.5 * g * out / x)
defvjp([abs, ti.abs], lambda g, out, x: g * T.math.sign(x))
# ties go where the forward rules send them (NOTE: [Ties]): min to x when x < y, max to x when x > y
defvjp([min, ti.min], lambda g, out, x, y: _sum_to(T.select(x < y, g, _zero(g)), x),
       lambda g, out, x, y: _sum_to(T.select(x < y, _zero(g), g), y))
defvjp([max, ti.max], lambda g, out, x, y: _sum_to(T.select(x > y, g, _zero(g)), x),
       lambda g, out, x, y: _sum_to(T.select(x > y, _zero(g), g), y))
defvjp(ti.select, None, lambda g, out, c, a, b: _sum_to(T.select(c, g, _zero(g)), a),
       lambda g, out, c, a, b: _sum_to(T.select(c, _zero(g), g), b))
def _clamp_adjoint(g: Sym, x: Sym, lo: Sym, hi: Sym) -> Contributions:
    """Cotangents of ``min(hi, max(lo, x))`` (Taichi's clamp), ties as in NOTE: [Ties]."""
    upper = hi < T.max(lo, x)
    lower = lo > x
    return [_sum_to(T.select(upper, _zero(g), T.select(lower, _zero(g), g)), x),
            _sum_to(T.select(upper, _zero(g), T.select(lower, g, _zero(g))), lo),
            _sum_to(T.select(upper, g, _zero(g)), hi)]


def _smoothstep_adjoint(g: Sym, e0: Sym, e1: Sym, x: Sym) -> Contributions:
    """Cotangents of ``t * t * (3 - 2 t)``, ``t = clamp((x - e0) / (e1 - e0), 0, 1)`` (Taichi's smoothstep)."""
    t = T.math.clamp((x - e0) / (e1 - e0), 0.0, 1.0)
    k = g * 6 * t * (1 - t) / (e1 - e0)
    return [_sum_to(k * (t - 1), e0), _sum_to(-k * t, e1), _sum_to(k, x)]


ADJOINTS[ti.math.clamp] = lambda g, out, x, lo, hi: _clamp_adjoint(g, x, lo, hi)
ADJOINTS[ti.math.smoothstep] = lambda g, out, e0, e1, x: _smoothstep_adjoint(g, e0, e1, x)
defvjp(ti.math.mix, lambda g, out, x, y, a: _sum_to(g * (1 - a), x), lambda g, out, x, y, a: _sum_to(g * a, y),
       lambda g, out, x, y, a: _sum_to(g * (y - x), a))

# --- vectors and matrices ----------------------------------------------------
defvjp(method("dot") + [ti.math.dot], lambda g, out, x, y: g * y, lambda g, out, x, y: g * x)
defvjp(method("cross") + [ti.math.cross], lambda g, out, x, y: helpers.cross_adjoint_left(g, x, y),
       lambda g, out, x, y: helpers.cross_adjoint_right(g, x, y))
defvjp(method("outer_product"), lambda g, out, x, y: g @ y, lambda g, out, x, y: g.transpose() @ x)
defvjp(method("norm") + [ti.math.length],  # sqrt(|x|^2 + eps); NOTE: [Norm at zero]
       lambda g, out, x, *eps: g * x * reciprocal_or_zero(out))
defvjp(method("norm_inv"), lambda g, out, x, *eps: -g * out ** 3 * x)  # rsqrt(|x|^2 + eps)
defvjp(method("norm_sqr"), lambda g, out, x: 2 * g * x)
def _normalized_adjoint(g: Sym, out: Sym, x: Sym, *eps: Sym) -> Sym:
    """``x / (|x| + eps)`` has a symmetric Jacobian: the adjoint is the forward rule's formula."""
    if not eps:
        return (g - out * out.dot(g)) / x.norm()
    return (g - out * (x.dot(g) / x.norm())) / (x.norm() + eps[0])


defvjp(method("normalized") + [ti.math.normalize], _normalized_adjoint)
defvjp(method("determinant") + [ti.math.determinant], lambda g, out, x: g * helpers.cofactors(x))
defvjp(method("inverse") + [ti.math.inverse], lambda g, out, x: -(out.transpose() @ g @ out.transpose()))
defvjp(ti.math.distance, lambda g, out, x, y: g * (x - y) * reciprocal_or_zero(out),  # NOTE: [Norm at zero]
       lambda g, out, x, y: -g * (x - y) * reciprocal_or_zero(out))
defvjp(method("transpose"), lambda g, out, x: g.transpose())
defvjp(method("trace"), lambda g, out, x: helpers.trace_adjoint(x, g))
defvjp(method("sum"), lambda g, out, x: _zero(x) + g)
defvjp(method("max"), lambda g, out, x: helpers.extreme_adjoint(x, g, True))  # NOTE: [Ties]
defvjp(method("min"), lambda g, out, x: helpers.extreme_adjoint(x, g, False))
defvjp(ti.Matrix.diag, None, lambda g, out, dim, val: g.trace())


# --- linear solves and decompositions (see NOTE: [Decompositions]) -----------
def _solve_adjoint(g: Sym, out: Sym, A: Sym) -> Contributions:
    """``x = solve(A, b)``: ``b`` gets ``A^-T g``, ``A`` minus its outer product with ``x``."""
    ct_b = helpers.inverse_by_cofactors(A).transpose() @ g
    return [-ct_b.outer_product(out), ct_b]


ADJOINTS[ti.solve] = lambda g, out, A, b, *dt: _solve_adjoint(g, out, A) + [None] * len(dt)
defvjp_multi(ti.svd, 3, lambda gs, outs, A, *dt: [helpers.svd_vjp(*outs, *gs)])
defvjp_multi(ti.sym_eig, 2, lambda gs, outs, A, *dt: [helpers.sym_eig_vjp(*outs, *gs)])
defvjp_multi(ti.polar_decompose, 2, lambda gs, outs, A, *dt: [helpers.polar_decompose_vjp(*outs, *gs)])

# --- the linear helpers forward and reverse rules call (reverse over reverse) ---
# Keyed by the helper functions themselves, as generated code calls them
# (``_tidiff_rules.sum_to``); each is linear in one operand, the others give shapes or indices.
defvjp(rule_helpers.sum_to, lambda g, out, v, like: helpers.broadcast_like(g, v))
defvjp(rule_helpers.broadcast_like, lambda g, out, v, other: _sum_to(g, v))
defvjp(rule_helpers.scatter, None, lambda g, out, like, v, i: g[i])
defvjp(rule_helpers.scatter2, None, lambda g, out, like, v, i, j: g[i, j])
defvjp(rule_helpers.without, lambda g, out, v, i: helpers.without(g, i))
defvjp(rule_helpers.without2, lambda g, out, v, i, j: helpers.without2(g, i, j))
defvjp(rule_helpers.trace_adjoint, None, lambda g, out, like, v: g.trace())
defvjp(rule_helpers.cast_adjoint, lambda g, out, v, dtype: helpers.cast_adjoint(g, dtype))  # its own adjoint
defvjp(rule_helpers.rebound, lambda g, out, value, old: helpers.rebound_adjoint(g, value, old))
defvjp(rule_helpers.rebound_tangent, lambda g, out, t, old: helpers.rebound_adjoint(g, t, old))
defvjp(rule_helpers.rebound_adjoint, lambda g, out, h, value, old: helpers.rebound_tangent(g, old))
defvjp(rule_helpers.extreme_adjoint, None, lambda g, out, x, v, largest: helpers.pick_extreme(x, g, largest))
