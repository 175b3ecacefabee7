"""One entry per Taichi op: its derivative in both modes (the machinery is in ``table.py``).

Each rule follows Taichi's own definition of the op (``taichi/lang/ops.py``,
``matrix_ops.py``, ``math/mathimpl.py`` in Taichi 1.7.4), not a textbook one:
``v.normalized(eps)`` is ``v / (|v| + eps)``, ``v.norm(eps)`` is
``sqrt(|v|^2 + eps)``, ``clamp(x, lo, hi)`` is ``min(hi, max(lo, x))``. At a tie
of ``min``/``max`` the derivative splits evenly between the equal operands, as
JAX and torch (see NOTE: [Ties]).

Shapes are not known in the source: where an op broadcasts (``x * y`` with a
scalar ``x``), a reverse contribution is summed back with ``sum_to(v, x)``,
which Taichi resolves when it compiles.
"""
import ast
from collections.abc import Callable

import taichi as ti

from .._lang.sym import Sym, helpers
from .._lang.sym import ti as T
from . import helpers as rule_helpers
from .helpers import is_integral, stop_gradient
from .table import (
    FLOAT_CAST,
    REFUSED,
    Call,
    Contributions,
    Jvp,
    Rule,
    Vjp,
    broadcast,
    defjvp,
    defjvp2,
    deflinear_in,
    defrule,
    defzero,
    linear_in,
    method,
    register,
    scalar,
    without_minus,
)


def _sum_to(value: Sym, like: Sym) -> Sym:
    return helpers.sum_to(value, like)


def _zero(like: Sym) -> Sym:
    return T.zero(like)


# --- operators -------------------------------------------------------------


def _sum_rule(sign: int) -> Jvp:
    """The forward rule of ``x + y`` (sign 1) or ``x - y`` (sign -1). A lone tangent is broadcast to the
    sum's shape: ``v + s`` with only the scalar ``s`` active has a vector tangent."""
    def rule(call: Call) -> Sym | None:
        (x, y), (dx, dy) = call.args, call.tangents
        dy = None if dy is None else (dy if sign > 0 else -dy)
        if dx is not None and dy is not None:
            positive = without_minus(dy.node) if sign < 0 else None
            return dx + dy if positive is None else dx - Sym(positive)
        if dx is None and dy is None:
            return None
        term, other = (dx, y) if dy is None else (dy, x)
        return term if isinstance(other.node, ast.Constant) else helpers.broadcast_like(term, other)
    return rule


defjvp(ast.Add, lambda g, x, y: g, lambda g, x, y: g, jvp=_sum_rule(1))
defjvp(ast.Sub, lambda g, x, y: g, lambda g, x, y: -g, jvp=_sum_rule(-1))
defjvp(ast.Mult, lambda g, x, y: g * y, lambda g, x, y: x * g)
# ti.raw_div is true division on floats; not x / (y * y): y * y overflows past 1e154
defjvp2([ast.Div, ti.raw_div], lambda g, ans, x, y: g / y, lambda g, ans, x, y: -g * ans / y)
# the rules' own products are rule_helpers.matmul (NOTE: [Products entry by entry] in _lang/products.py)
defjvp([ast.MatMult, rule_helpers.matmul], lambda g, x, y: g @ y, lambda g, x, y: x @ g,
       vjp=lambda g, out, x, y: [helpers.matmul_adjoint_left(g, x, y), helpers.matmul_adjoint_right(g, x, y)],
       result_shape=None)


def exponent_less_one(y: Sym, x: Sym) -> Sym:
    """``y - 1``, or 1 where ``y == 0`` and ``x == 0``: ``0 * 0 ** -1`` would be NaN (``d x**0 = 0``); at any
    other base ``y * x ** (y - 1)`` is kept, so that its derivative by ``y`` at ``y = 0`` is ``1 / x``."""
    if _is_number(y.node):
        return y - 1
    return T.select(y.eq(0), T.select(x.eq(0), 1, y - 1), y - 1)


def log_of_base(x: Sym) -> Sym:
    """``log(x)``, or 0 where ``x == 0``: ``x ** y * log(x)`` is then 0, not NaN, at ``x = 0``
    (the derivative of ``0 ** y`` in ``y > 0``; as torch)."""
    if _is_number(x.node):
        return T.log(x)
    return T.log(T.select(x.eq(0), 1.0, x))


def _is_number(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) or (isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant))


# NOTE: [Zero tangents of a power] A partial of ``x ** y`` may be inf or NaN where the other is finite: by
# ``y``, ``x ** y * log(x)`` at a negative base; by ``x``, ``y * x ** (y - 1)`` at ``x = 0``, ``y < 1``. A
# derivative by the one argument then met the other's non-finite partial times its zero tangent: NaN
# (``td.hessian(pow, argnums=(0, 1))`` at ``x = -2, y = 2``: d2/dx2 NaN, 2 by ``argnums=0`` alone; at
# ``x = 0, y = 1.5`` d/dy(d/dx) NaN where the limit is 0). A zero tangent (or cotangent) gives a zero term.
# An exponent that is a number of at least 1 has finite partials: nothing is added.
def _unless_zero(g: Sym, term: Sym) -> Sym:
    """``term``, or 0 where the tangent ``g`` is 0 (NOTE: [Zero tangents of a power])."""
    return T.select(g.eq(0), 0.0, term)


def _pow_by_base(g: Sym, ans: Sym, x: Sym, y: Sym) -> Sym:
    term = y * x ** exponent_less_one(y, x) * g
    value = y.node.value if isinstance(y.node, ast.Constant) else None
    finite = isinstance(value, (int, float)) and value >= 1
    return term if finite else _unless_zero(g, term)


defjvp2([ast.Pow, pow, ti.pow], _pow_by_base, lambda g, ans, x, y: _unless_zero(g, g * ans * log_of_base(x)))
defjvp(ast.Mod, lambda g, x, y: g, lambda g, x, y: -g * T.floor(x / y))
defzero([ast.FloorDiv, ti.raw_mod])  # raw_mod is C's integer %: Taichi 1.7.4 crashes compiling it on floats
defjvp(ast.USub, lambda g, x: -g)
defjvp(ast.UAdd, lambda g, x: g)

# --- elementary functions (ti.math.sin is ti.sin, and so on) ---------------
defjvp(ti.sin, lambda g, x: g * T.cos(x))
defjvp(ti.cos, lambda g, x: -g * T.sin(x))
defjvp(ti.tan, lambda g, x: g / T.cos(x) ** 2)
defjvp(ti.asin, lambda g, x: g / T.sqrt(1 - x * x))
defjvp(ti.acos, lambda g, x: -g / T.sqrt(1 - x * x))
defjvp(ti.atan2, lambda g, y, x: g * x * reciprocal_or_zero(x * x + y * y),  # 0 at (0, 0), as torch
       lambda g, y, x: -g * y * reciprocal_or_zero(x * x + y * y))
defjvp2(ti.tanh, lambda g, ans, x: g * (1 - ans ** 2))
defjvp2(ti.exp, lambda g, ans, x: g * ans)
defjvp(ti.log, lambda g, x: g / x)
defjvp2(ti.sqrt, lambda g, ans, x: g / (2 * ans))
defjvp2(ti.rsqrt, lambda g, ans, x: -0.5 * g * ans / x)
defjvp([abs, ti.abs], lambda g, x: g * T.math.sign(x))
defzero([ti.floor, ti.ceil, ti.round, ti.math.sign, ti.math.step, ti.math.isnan,
         ti.math.isinf, ti.zero, ti.one, int, stop_gradient, rule_helpers.zeros_like] + method("any", "all"))
register(float, FLOAT_CAST)


# NOTE: [Ties]
# At a tie, min and max have no derivative; any choice is a convention. tidiff takes
# JAX's and torch's: a tie splits the derivative evenly between the equal arguments,
# so max(a, b) at a == b has derivative 1/2 by each, and the stable softplus
# max(x, 0) + log(1 + exp(-|x|)) has derivative 1/2 at 0, as its value's sigmoid(0).
# What Taichi builds from the binary op inherits it by Taichi's definition:
# ti.max(a, b, c) is max(a, max(b, c)) (a three-way tie gives 1/2, 1/4, 1/4, as JAX's
# nested maximum), clamp(x, lo, hi) is min(hi, max(lo, x)). The reductions v.max() and
# v.min() split evenly among all entries equal to the result, as jnp.max and
# torch.amax. Kernel programs differentiated by Taichi's own reverse mode keep its
# convention, a tie to b (docs/limits.md). The conditions are the only place the
# operands are read: every order of derivative is exact.
def _split(first: Sym, second: Sym, a: Sym, b: Sym) -> Sym:
    """``a`` where ``first``, else ``b`` where ``second``, else (a tie) their mean."""
    return T.select(first, a, T.select(second, b, (a + b) * 0.5))


def _binary_extreme(wins: Callable[[Sym, Sym], Sym]) -> tuple[Jvp, Vjp]:
    """Both rules of ``max`` or ``min``, where ``wins(x, y)`` says that ``x`` alone is the result."""
    def jvp(call: Call) -> Sym | None:
        if all(t is None for t in call.tangents):
            return None
        (x, y), (dx, dy) = call.args, call.zeros()
        return _split(wins(x, y), wins(y, x), dx, dy)

    def vjp(g: Sym, out: Sym, x: Sym, y: Sym) -> Contributions:
        return [_sum_to(_split(wins(x, y), wins(y, x), g, _zero(g)), x),
                _sum_to(_split(wins(y, x), wins(x, y), g, _zero(g)), y)]

    return jvp, vjp


register([min, ti.min], Rule(*_binary_extreme(lambda x, y: x < y), result_shape=broadcast))
register([max, ti.max], Rule(*_binary_extreme(lambda x, y: x > y), result_shape=broadcast))


@defrule(ti.select, lambda g, out, c, a, b: [None, _sum_to(T.select(c, g, _zero(g)), a),
                                             _sum_to(T.select(c, _zero(g), g), b)], broadcast)
def _select(call: Call) -> Sym | None:
    if all(t is None for t in call.tangents[1:]):
        return None
    _, da, db = call.zeros()
    return T.select(call.args[0], da, db)


def _cast_adjoint(g: Sym, out: Sym, x: Sym, dtype: Sym) -> Contributions:
    return [helpers.cast_adjoint(g, dtype)]


@defrule(ti.cast, _cast_adjoint)
def _cast(call: Call) -> Sym | None:
    return _cast_tangent(call.tangents[0], call.args[1], call.static_args[1])


def _cast_tangent(t: Sym | None, dtype: Sym, static_dtype: object) -> Sym | None:
    """The tangent of a cast of a value with tangent ``t`` to ``dtype`` (``static_dtype``: its
    value when the transform knows it, a parameter's ``dt`` is only known when Taichi compiles)."""
    if t is None or (static_dtype is not None and is_integral(static_dtype)):
        return None
    if static_dtype is None:
        return helpers.cast_tangent(t, dtype)
    return T.cast(t, dtype)


@defrule(method("cast"), _cast_adjoint)
def _cast_method(call: Call) -> Sym | None:
    return None if call.tangents[0] is None else _cast_tangent(call.tangents[0], call.args[1], call.static_args[1])


def _construct(call: Call) -> Sym | None:
    """``ti.Vector([a, b], dt)``: linear in the entries; a dtype given positionally is no operand."""
    if call.tangents[0] is None:
        return None
    return call.fn(call.tangents[0], *call.args[1:], **call.keywords)


register([ti.Vector, ti.Matrix], Rule(_construct, entrywise=True))


def _clamp_adjoint(g: Sym, out: Sym, x: Sym, lo: Sym, hi: Sym) -> Contributions:
    """Cotangents of ``min(hi, max(lo, x))`` (Taichi's clamp), each tie split (NOTE: [Ties])."""
    m = T.max(lo, x)
    to_m = _split(hi > m, hi < m, g, _zero(g))
    return [_sum_to(_split(lo < x, lo > x, to_m, _zero(g)), x), _sum_to(_split(lo > x, lo < x, to_m, _zero(g)), lo),
            _sum_to(_split(hi < m, hi > m, g, _zero(g)), hi)]


@defrule(ti.math.clamp, _clamp_adjoint, broadcast)
def _clamp(call: Call) -> Sym | None:
    if all(t is None for t in call.tangents):
        return None
    (x, lo, hi), (dx, dlo, dhi) = call.args, call.zeros()
    m = T.max(lo, x)
    return _split(hi < m, hi > m, dhi, _split(lo > x, lo < x, dlo, dx))


defjvp(ti.math.mix,
       lambda g, x, y, a: g * (1 - a),
       lambda g, x, y, a: g * a,
       lambda g, x, y, a: g * (y - x))


def _smoothstep_adjoint(g: Sym, out: Sym, e0: Sym, e1: Sym, x: Sym) -> Contributions:
    """Cotangents of ``t * t * (3 - 2 t)``, ``t = clamp((x - e0) / (e1 - e0), 0, 1)`` (Taichi's smoothstep)."""
    t = T.math.clamp((x - e0) / (e1 - e0), 0.0, 1.0)
    k = g * 6 * t * (1 - t) / (e1 - e0)
    return [_sum_to(k * (t - 1), e0), _sum_to(-k * t, e1), _sum_to(k, x)]


@defrule(ti.math.smoothstep, _smoothstep_adjoint, broadcast)
def _smoothstep(call: Call) -> Sym | None:
    e0, e1, x = call.args
    de0, de1, dx = call.tangents
    t = T.math.clamp((x - e0) / (e1 - e0), 0.0, 1.0)
    # dt = (dx - de0 - t * (de1 - de0)) / (e1 - e0), term by term
    terms = [term for term in (dx, None if de0 is None else de0 * (t - 1),
                               None if de1 is None else -de1 * t) if term is not None]
    if not terms:
        return None
    return 6 * t * (1 - t) / (e1 - e0) * sum(terms[1:], terms[0])


# --- vectors and matrices: methods and their ti.math spellings -------------
defjvp(method("dot") + [ti.math.dot], lambda g, x, y: g.dot(y), lambda g, x, y: x.dot(g),
       vjp=lambda g, out, x, y: [g * y, g * x], result_shape=scalar)
defjvp(method("cross") + [ti.math.cross], lambda g, x, y: g.cross(y), lambda g, x, y: x.cross(g),
       vjp=lambda g, out, x, y: [helpers.cross_adjoint_left(g, x, y), helpers.cross_adjoint_right(g, x, y)],
       result_shape=None)
defjvp(method("outer_product"), lambda g, x, y: g.outer_product(y), lambda g, x, y: x.outer_product(g),
       vjp=lambda g, out, x, y: [g @ y, g.transpose() @ x], result_shape=None)


# NOTE: [Norm at zero]
# The derivative of ``|x|`` is ``x / |x|``: 0 / 0 at a zero vector, where the norm has no derivative.
# A zero vector is common where nothing is differentiated through it: a spring at rest, two bodies in
# contact at the start (DiffTaichi's rigid_body: a joint closed at t = 0, a state the program does not
# differentiate by, inside a field it does). A tangent or cotangent of 0 then met 0 / 0 and gave NaN,
# which spread to every derivative of a field program by forward mode, where Taichi's reverse mode left
# it in the state's own gradient. The rules take the derivative of the norm at zero as 0, as torch does
# (``torch.linalg.vector_norm``'s subgradient), and ``1 / |x|`` from a radicand that is 1 there, so that
# derivatives of the rule itself (second order) are finite too. ``atan2(y, x)`` at ``(0, 0)`` likewise:
# its partials ``x / (x^2 + y^2)`` and ``-y / (x^2 + y^2)`` are 0 there, as torch's are.
def reciprocal_or_zero(norm: Sym) -> Sym:
    """``1 / norm``, or 0 where ``norm`` (a norm, or a squared one) is 0 (NOTE: [Norm at zero])."""
    zero = norm.eq(0)
    return T.select(zero, 0.0, 1.0 / T.select(zero, 1.0, norm))


def inverse_norm(x: Sym, *eps: Sym) -> Sym:
    """``1 / x.norm(eps)``, or 0 where the norm is 0 (NOTE: [Norm at zero])."""
    radicand = x.norm_sqr() + eps[0] if eps else x.norm_sqr()
    zero = radicand.eq(0)
    return T.select(zero, 0.0, 1.0 / T.sqrt(T.select(zero, 1.0, radicand)))


defjvp(method("norm") + [ti.math.length],  # sqrt(|x|^2 + eps), of a matrix too
       lambda g, x, *eps: (x * g).sum() * inverse_norm(x, *eps),
       vjp=lambda g, out, x, *eps: [g * x * reciprocal_or_zero(out)], result_shape=scalar)
defjvp2(method("norm_inv"), lambda g, ans, x, *eps: -ans ** 3 * (x * g).sum(),  # rsqrt(|x|^2 + eps)
        vjp=lambda g, out, x, *eps: [-g * out ** 3 * x], result_shape=scalar)
defjvp(method("norm_sqr"), lambda g, x: 2 * (x * g).sum(), vjp=lambda g, out, x: [2 * g * x], result_shape=scalar)


def _normalized(g: Sym, ans: Sym, x: Sym, *eps: Sym) -> Sym:
    """Taichi's ``x.normalized(eps)`` is ``x / (|x| + eps)`` (eps outside the root, unlike ``norm``); its
    Jacobian is symmetric, so the same formula with the cotangent is the reverse rule."""
    if not eps:
        return (g - ans * ans.dot(g)) / x.norm()
    return (g - ans * (x.dot(g) / x.norm())) / (x.norm() + eps[0])


defjvp2(method("normalized") + [ti.math.normalize], _normalized)
defjvp(method("determinant") + [ti.math.determinant], lambda g, x: (helpers.cofactors(x) * g).sum(),
       vjp=lambda g, out, x: [g * helpers.cofactors(x)], result_shape=scalar)
defjvp2(method("inverse") + [ti.math.inverse], lambda g, ans, x: -(ans @ g @ ans),
        vjp=lambda g, out, x: [-(out.transpose() @ g @ out.transpose())], result_shape=None)


@defrule(ti.math.distance, lambda g, out, x, y: [g * (x - y) * reciprocal_or_zero(out),  # NOTE: [Norm at zero]
                                                 -g * (x - y) * reciprocal_or_zero(out)])
def _distance(call: Call) -> Sym | None:
    """``|x - y|``: one term along ``dx - dy``, so the factor of NOTE: [Norm at zero] is written once."""
    (x, y), (dx, dy) = call.args, call.tangents
    if dx is None and dy is None:
        return None
    along = dx if dy is None else (-dy if dx is None else dx - dy)
    return (x - y).dot(along) * inverse_norm(x - y)


defjvp(method("transpose"), lambda g, x: g.transpose(), result_shape=None)
defjvp(method("trace"), lambda g, x: g.trace(), vjp=lambda g, out, x: [helpers.trace_adjoint(x, g)],
       result_shape=scalar)
defjvp(method("sum"), lambda g, x: g.sum(), vjp=lambda g, out, x: [_zero(x) + g], result_shape=scalar)
defjvp(method("max"), lambda g, x: helpers.pick_extreme(x, g, True),  # NOTE: [Ties]
       vjp=lambda g, out, x: [helpers.extreme_adjoint(x, g, True)], result_shape=scalar)
defjvp(method("min"), lambda g, x: helpers.pick_extreme(x, g, False),
       vjp=lambda g, out, x: [helpers.extreme_adjoint(x, g, False)], result_shape=scalar)

# --- constructors of matrices from values (the dims are static) -------------
deflinear_in(ti.Matrix.diag, 1, lambda g, out, dim, val: [None, g.trace()])
register([ti.Matrix.rows, ti.Matrix.cols], Rule(linear_in(0), entrywise=True))


# --- the linear helpers rules call, each the transpose of another (derivatives of derivatives) ------
# Keyed by the helper functions themselves, as generated code calls them (``_tidiff_rules.sum_to``);
# each is linear in one operand, the others give shapes or indices.
deflinear_in(rule_helpers.sum_to, 0, lambda g, out, v, like: [helpers.broadcast_like(g, v)])
deflinear_in(rule_helpers.broadcast_like, 0, lambda g, out, v, other: [_sum_to(g, v)])
deflinear_in(rule_helpers.scatter, 1, lambda g, out, like, v, i: [None, g[i]])
deflinear_in(rule_helpers.scatter2, 1, lambda g, out, like, v, i, j: [None, g[i, j]])
deflinear_in(rule_helpers.without, 0, lambda g, out, v, i: [helpers.without(g, i)])
deflinear_in(rule_helpers.without2, 0, lambda g, out, v, i, j: [helpers.without2(g, i, j)])
deflinear_in(rule_helpers.trace_adjoint, 1, lambda g, out, like, v: [None, g.trace()])
deflinear_in([rule_helpers.cast_tangent, rule_helpers.cast_adjoint], 0,  # cast_adjoint is its own adjoint
             lambda g, out, v, dtype: [helpers.cast_adjoint(g, dtype)])
deflinear_in(rule_helpers.row_of, 0, lambda g, out, m, i: [helpers.row_into(m, g, i)])
deflinear_in(rule_helpers.col_of, 0, lambda g, out, m, j: [helpers.col_into(m, g, j)])
deflinear_in(rule_helpers.row_into, 1, lambda g, out, like, v, i: [None, helpers.row_of(g, i)])
deflinear_in(rule_helpers.col_into, 1, lambda g, out, like, v, j: [None, helpers.col_of(g, j)])
deflinear_in(rule_helpers.part_of, 0, lambda g, out, whole, k, *parts: [helpers.part_into(whole, g, k, *parts)])
deflinear_in(rule_helpers.part_into, 1, lambda g, out, like, v, k, *parts: [None, helpers.part_of(g, k, *parts)])
deflinear_in(rule_helpers.entries, 0, lambda g, out, x: [helpers.unflat_any(g, x)])
deflinear_in(rule_helpers.unflat_any, 0, lambda g, out, v, like: [helpers.entries(g)])
deflinear_in(rule_helpers.pick_extreme, 1, lambda g, out, x, t, largest: [None, helpers.extreme_adjoint(x, g, largest)])
deflinear_in(rule_helpers.extreme_adjoint, 1, lambda g, out, x, v, largest: [None, helpers.pick_extreme(x, g, largest)])
def _entries_at(rank: int) -> Rule:
    """The rules of ``scattered`` (``rank`` 1: ``like, i, v, ...``) and ``scattered2`` (2: ``like, i, j, v, ...``),
    linear in the values (NOTE: [Entries in one value] in ``helpers.py``)."""
    step = rank + 1

    def jvp(call: Call) -> Sym | None:
        groups = [(call.args[k:k + rank], call.tangents[k + rank]) for k in range(1, len(call.args), step)]
        kept = [part for index, t in groups if t is not None for part in (*index, t)]
        return None if not kept else call.fn(call.args[0], *kept)

    def vjp(g: Sym, out: Sym, like: Sym, *groups: Sym) -> Contributions:
        found: Contributions = [None]
        for k in range(0, len(groups), step):
            found += [None] * rank + [g[groups[k]] if rank == 1 else g[groups[k], groups[k + 1]]]
        return found

    return Rule(jvp, vjp)


register(rule_helpers.scattered, _entries_at(1))
register(rule_helpers.scattered2, _entries_at(2))
defjvp(rule_helpers.inner, lambda g, a, b: helpers.inner(g, b), lambda g, a, b: helpers.inner(a, g),
       vjp=lambda g, out, a, b: [g * b, g * a], result_shape=scalar)
defzero(rule_helpers.basis)


# a new name for a new value (NOTE: [Rebinding in straight-line code]); linear in the value
@defrule(rule_helpers.rebound, lambda g, out, value, old: [helpers.rebound_adjoint(g, value, old)])
def _rebound(call: Call) -> Sym | None:
    return None if call.tangents[0] is None else helpers.rebound_tangent(call.tangents[0], call.args[1])


deflinear_in(rule_helpers.rebound_tangent, 0, lambda g, out, t, old: [helpers.rebound_adjoint(g, t, old)])
deflinear_in(rule_helpers.rebound_adjoint, 0, lambda g, out, h, value, old: [helpers.rebound_tangent(g, old)])


deflinear_in(rule_helpers.tape_of, 0, None)  # a tape's tangent is a tape of the tangent; see FORWARD_ONLY
FORWARD_ONLY = {
    rule_helpers.tape_of: "a tape of a runtime loop is written only by reverse code, which is not reversed again "
                          "through its loops (forward pushes take those derivatives)",
}
"""Entries with no reverse rule, and why (tests/test_rule_coverage.py checks that every other has one)."""


# --- linear solves and decompositions (see NOTE: [Decompositions]) ---------
def _solve_adjoint(g: Sym, out: Sym, A: Sym, b: Sym, *dt: Sym) -> Contributions:
    """``x = solve(A, b)``: ``b`` gets ``A^-T g``, ``A`` minus its outer product with ``x``."""
    ct_b = helpers.inverse_by_cofactors(A).transpose() @ g
    return [-ct_b.outer_product(out), ct_b]


@defrule(ti.solve, _solve_adjoint)
def _solve(call: Call) -> Sym | None:
    """``x = solve(A, b)``: ``dx = A^-1 (db - dA x)``, ``A^-1`` by cofactors (hoisted out of the lanes):
    another ``ti.solve`` per direction would inline Taichi's Gauss elimination once per lane."""
    (A, b), rest = call.args[:2], call.args[2:]
    dA, db = call.tangents[:2]
    if dA is None and db is None:
        return None
    x = T.solve(A, b, *rest, **call.keywords)  # the primal call: bound once, shared
    rhs = db if dA is None else (-(dA @ x) if db is None else db - dA @ x)
    return helpers.inverse_by_cofactors(A) @ rhs


def _decomposition(op: str, n_results: int, tangent_helper: str, adjoint_helper: str) -> None:
    """The rules of ``op(A, dt=None)``, returning ``n_results`` values: the tangent helper takes them and
    ``dA``; the adjoint helper takes them and their cotangents (``gs``, zeros where none flows)."""
    def jvp(call: Call) -> Sym | None:
        dA = call.tangents[0]
        if dA is None:
            return None
        # the primal call, bound once and shared; kept across a Hessian operator's products (NOTE: [Decompositions
        # kept across products] in kept.py)
        results = getattr(helpers, f"kept_{op}")(*call.args, **call.keywords)
        return getattr(helpers, tangent_helper)(*[results[k] for k in range(n_results)], dA)

    def vjp(gs: list[Sym], outs: list[Sym], A: Sym, *dt: Sym) -> Contributions:
        return [getattr(helpers, adjoint_helper)(*outs, *gs)]

    # the op as the user's code calls it, and as the tangent code does
    register([getattr(ti, op), getattr(rule_helpers, f"kept_{op}")], Rule(jvp, vjp, n_outputs=n_results))


_decomposition("svd", 3, "svd_jvp", "svd_vjp")
_decomposition("sym_eig", 2, "sym_eig_jvp", "sym_eig_vjp")
_decomposition("polar_decompose", 2, "polar_decompose_jvp", "polar_decompose_vjp")

# --- ops refused by name, with the reason (docs/limits.md lists them) -------
REFUSED.update({
    ti.eig: "the eigenvectors of a general matrix come in Taichi's complex 4x2 layout with its own scaling; "
            "for a symmetric matrix use ti.sym_eig, which has a rule",
    ti.frexp: "it returns an integer exponent (and Taichi 1.7.4 fails to compile it on the CPU)",
    ti.bit_cast: "it reinterprets the bits of a value as another type",
    ti.atomic_max: "an atomic update of shared storage (only atomic_add/atomic_sub statements are transformed)",
    ti.atomic_min: "an atomic update of shared storage (only atomic_add/atomic_sub statements are transformed)",
    ti.atomic_mul: "an atomic update of shared storage (only atomic_add/atomic_sub statements are transformed)",
})
