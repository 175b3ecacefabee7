"""One small derivative rule per Taichi op, in a plain dict registry.

A rule maps a :class:`Call` (primal operands and their tangents, as
:class:`~.sym.Sym`) to the tangent of the result, or ``None`` for a zero
tangent. Keys are the callee objects themselves (``ti.sin``, ``abs``,
``ti.math.vec3``), ``ast`` operator classes (``ast.Mult``) and
``("method", name)`` for methods (``v.dot(w)``), so every spelling that
resolves to the same object shares one rule; the unbound spelling of a method
(``ti.Vector.normalized(v, eps)``) finds the method's rule too.

Each rule follows Taichi's own definition of the op (``taichi/lang/ops.py``,
``matrix_ops.py``, ``math/mathimpl.py`` in Taichi 1.7.4), not a textbook one:
``v.normalized(eps)`` is ``v / (|v| + eps)``, ``v.norm(eps)`` is
``sqrt(|v|^2 + eps)``, ``clamp(x, lo, hi)`` is ``min(hi, max(lo, x))``. At a tie
of ``min``/``max`` the derivative is the one Taichi's own reverse mode gives:
that of the second operand (see NOTE: [Ties]).

``defjvp(op, *jvps)`` follows JAX: one function ``jvp(g, *args)`` per
operand, giving that operand's contribution for tangent ``g``; zero tangents
are skipped and the rest summed.
"""
import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import taichi as ti
from taichi.lang.matrix import MatrixType, VectorType

from .._lang.sym import Sym, helpers, zero_like
from .._lang.sym import ti as T
from . import helpers as rule_helpers
from .helpers import is_integral as is_integral
from .helpers import stop_gradient as stop_gradient

Rule = Callable[["Call"], Sym | None]
"""A derivative rule: the tangent of one application of an op, or None for a zero tangent."""

RULES: dict[Any, Rule] = {}
"""op key -> rule(call) -> tangent Sym or None."""

REFUSED: dict[Any, str] = {}
"""Taichi op -> why it has no derivative rule: the transform's error says so, naming the op."""

@dataclass
class Call:
    """One application of an op, as a rule sees it."""

    fn: Any  # a Sym naming the op; None for an operator (``a * b``)
    args: list[Sym]
    tangents: list[Sym | None]
    keywords: dict[str, Any] = field(default_factory=dict)
    static_args: list[Any] = field(default_factory=list)

    def zeros(self) -> list[Sym]:
        """Tangents with every zero spelled out, for rules that are not a sum of terms."""
        return [zero_like(a) if t is None else t for a, t in zip(self.args, self.tangents, strict=False)]


def defjvp(keys: Any, *jvps: Callable[..., Sym] | None) -> None:
    """Register a rule summing ``jvp(g, *args)`` over operands with a nonzero tangent."""
    def rule(call: Call) -> Sym | None:
        terms = [jvp(t, *call.args) for jvp, t in zip(jvps, call.tangents, strict=False)
                 if jvp is not None and t is not None]
        if not terms:
            return None
        total = terms[0]
        for term in terms[1:]:
            positive = _without_minus(term.node)
            total = total + term if positive is None else total - Sym(positive)
        return total
    _register(keys, rule)


def _without_minus(node: ast.expr) -> ast.expr | None:
    """``a * b`` for ``-a * b`` (a leading minus), else None: sums then read ``x - a * b``."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return node.operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
        left = _without_minus(node.left)
        return None if left is None else ast.BinOp(left, node.op, node.right)
    return None


def defrule(keys: Any) -> Callable[[Rule], Rule]:
    """Register a decorated ``rule(call)`` as is."""
    def register(rule: Rule) -> Rule:
        _register(keys, rule)
        return rule
    return register


def defzero(keys: Any) -> None:
    """Register ops whose derivative is zero (floor, casts to int): called as written."""
    _register(keys, zero)


def zero(call: Call) -> None:
    """The rule of ops with zero derivative; the transform copies their calls verbatim."""
    return None


def deflinear(keys: Any) -> None:
    """Register ops linear in all their operands: the tangent is the op on the tangents."""
    _register(keys, _linear)


def _linear(call: Call) -> Sym | None:
    if all(t is None for t in call.tangents):
        return None
    return call.fn(*call.zeros(), **call.keywords)


def _register(keys: Any, rule: Rule) -> None:
    for key in keys if isinstance(keys, (list, tuple)) else (keys,):
        RULES[key] = rule


def method(*names: str) -> list[Any]:
    """Registry keys for methods called on Taichi values (``v.dot(w)``)."""
    return [("method", n) for n in names]


def unbound_method(callee: object) -> tuple[str, str] | None:
    """``("method", name)`` when ``callee`` is a method of ``ti.Matrix`` spelled unbound
    (``ti.Vector.normalized``, which is ``ti.Matrix.normalized``), else None."""
    name = getattr(callee, "__name__", None)
    if isinstance(name, str) and getattr(ti.Matrix, name, None) is callee:
        return ("method", name)
    return None


def lookup(callee: object) -> Rule | None:
    """The rule for ``callee``, including families (vector types, dtype casts) and unbound methods, or None."""
    try:
        if callee in RULES:
            return RULES[callee]
    except TypeError:  # unhashable callee
        return None
    if isinstance(callee, (VectorType, MatrixType)):
        return zero if is_integral(callee.dtype) else _linear
    if is_dtype(callee):
        return defined_cast(callee)
    return RULES.get(unbound_method(callee))


def is_dtype(value: object) -> bool:
    return isinstance(value, type(ti.f64)) or value in (int, float)


def defined_cast(dtype: Any) -> Rule:
    """Casting ``ti.f64(x)`` is linear; casting to an integer type has zero derivative."""
    return zero if is_integral(dtype) else _linear


# --- operators -------------------------------------------------------------


def _sum_rule(sign: int) -> Rule:
    """``x + y`` (sign 1) or ``x - y`` (sign -1). A lone tangent is broadcast to the sum's shape:
    ``v + s`` with only the scalar ``s`` active has a vector tangent."""
    def rule(call: Call) -> Sym | None:
        (x, y), (dx, dy) = call.args, call.tangents
        dy = None if dy is None else (dy if sign > 0 else -dy)
        if dx is not None and dy is not None:
            positive = _without_minus(dy.node) if sign < 0 else None
            return dx + dy if positive is None else dx - Sym(positive)
        if dx is None and dy is None:
            return None
        term, other = (dx, y) if dy is None else (dy, x)
        return term if isinstance(other.node, ast.Constant) else helpers.broadcast_like(term, other)
    return rule


_register(ast.Add, _sum_rule(1))
_register(ast.Sub, _sum_rule(-1))
defjvp(ast.Mult, lambda g, x, y: g * y, lambda g, x, y: x * g)
# ti.raw_div is true division on floats; not x / (y * y): y * y overflows past 1e154
defjvp([ast.Div, ti.raw_div], lambda g, x, y: g / y, lambda g, x, y: -g * (x / y) / y)
defjvp(ast.MatMult, lambda g, x, y: g @ y, lambda g, x, y: x @ g)


def exponent_less_one(y: Sym) -> Sym:
    """``y - 1``, or 1 where ``y == 0``: ``0 * x ** -1`` would be NaN at ``x = 0`` (``d x**0 = 0``)."""
    if _is_number(y.node):
        return y - 1
    return T.select(y.eq(0), 1, y - 1)


def log_of_base(x: Sym) -> Sym:
    """``log(x)``, or 0 where ``x == 0``: ``x ** y * log(x)`` is then 0, not NaN, at ``x = 0``
    (the derivative of ``0 ** y`` in ``y > 0``; as torch)."""
    if _is_number(x.node):
        return T.log(x)
    return T.log(T.select(x.eq(0), 1.0, x))


def _is_number(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) or (isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant))


defjvp([ast.Pow, pow, ti.pow],
       lambda g, x, y: y * x ** exponent_less_one(y) * g,
       lambda g, x, y: g * x ** y * log_of_base(x))
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
defjvp(ti.atan2, lambda g, y, x: g * x / (x * x + y * y), lambda g, y, x: -g * y / (x * x + y * y))
defjvp(ti.tanh, lambda g, x: g * (1 - T.tanh(x) ** 2))
defjvp(ti.exp, lambda g, x: g * T.exp(x))
defjvp(ti.log, lambda g, x: g / x)
defjvp(ti.sqrt, lambda g, x: g / (2 * T.sqrt(x)))
defjvp(ti.rsqrt, lambda g, x: -0.5 * g * T.rsqrt(x) / x)
defjvp([abs, ti.abs], lambda g, x: g * T.math.sign(x))
defzero([ti.floor, ti.ceil, ti.round, ti.math.sign, ti.math.step, ti.math.isnan,
         ti.math.isinf, ti.zero, ti.one, int, stop_gradient] + method("any", "all"))
deflinear(float)


# NOTE: [Ties]
# At a tie, min and max have no derivative; any choice is a convention. Taichi's own
# reverse mode (checked in tests/test_rule_semantics.py) gives the adjoint of max(a, b)
# to a only when a > b, of min(a, b) to a only when a < b: ties go to b. The rules do
# the same, so @ti.func transforms agree with kernel programs, which use Taichi's
# reverse mode. What is built on min/max inherits it: ti.max(a, b, c) is
# max(a, max(b, c)), the last of equal arguments wins (as in the left fold the
# transforms use); clamp(x, lo, hi) = min(hi, max(lo, x)) gives a tie to x, or to lo
# when lo == hi != x; v.max() (Taichi folds the entries left to right) to the last
# entry equal to the max.
@defrule([min, ti.min])
def _min(call: Call) -> Sym | None:
    if all(t is None for t in call.tangents):
        return None
    (x, y), (dx, dy) = call.args, call.zeros()
    return T.select(x < y, dx, dy)


@defrule([max, ti.max])
def _max(call: Call) -> Sym | None:
    if all(t is None for t in call.tangents):
        return None
    (x, y), (dx, dy) = call.args, call.zeros()
    return T.select(x > y, dx, dy)


@defrule(ti.select)
def _select(call: Call) -> Sym | None:
    if all(t is None for t in call.tangents[1:]):
        return None
    _, da, db = call.zeros()
    return T.select(call.args[0], da, db)


@defrule(ti.cast)
def _cast(call: Call) -> Sym | None:
    return _cast_tangent(call.tangents[0], call.args[1], call.static_args[1])


def _cast_tangent(t: Sym | None, dtype: Sym, static_dtype: Any) -> Sym | None:
    """The tangent of a cast of a value with tangent ``t`` to ``dtype`` (``static_dtype``: its
    value when the transform knows it, a parameter's ``dt`` is only known when Taichi compiles)."""
    if t is None or (static_dtype is not None and is_integral(static_dtype)):
        return None
    if static_dtype is None:
        return helpers.cast_tangent(t, dtype)
    return T.cast(t, dtype)


@defrule(method("cast"))
def _cast_method(call: Call) -> Sym | None:
    return None if call.tangents[0] is None else _cast_tangent(call.tangents[0], call.args[1], call.static_args[1])


@defrule([ti.Vector, ti.Matrix])
def _construct(call: Call) -> Sym | None:
    """``ti.Vector([a, b], dt)``: linear in the entries; a dtype given positionally is no operand."""
    if call.tangents[0] is None:
        return None
    return call.fn(call.tangents[0], *call.args[1:], **call.keywords)


@defrule(ti.math.clamp)
def _clamp(call: Call) -> Sym | None:
    if all(t is None for t in call.tangents):
        return None
    (x, lo, hi), (dx, dlo, dhi) = call.args, call.zeros()
    # Taichi computes min(hi, max(lo, x)); ties as its reverse mode (NOTE: [Ties])
    return T.select(hi < T.max(lo, x), dhi, T.select(lo > x, dlo, dx))


defjvp(ti.math.mix,
       lambda g, x, y, a: g * (1 - a),
       lambda g, x, y, a: g * a,
       lambda g, x, y, a: g * (y - x))


@defrule(ti.math.smoothstep)
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
defjvp(method("dot") + [ti.math.dot], lambda g, x, y: g.dot(y), lambda g, x, y: x.dot(g))
defjvp(method("cross") + [ti.math.cross], lambda g, x, y: g.cross(y), lambda g, x, y: x.cross(g))
defjvp(method("outer_product"), lambda g, x, y: g.outer_product(y), lambda g, x, y: x.outer_product(g))
# NOTE: [Norm at zero]
# The derivative of ``|x|`` is ``x / |x|``: 0 / 0 at a zero vector, where the norm has no derivative.
# A zero vector is common where nothing is differentiated through it: a spring at rest, two bodies in
# contact at the start (DiffTaichi's rigid_body: a joint closed at t = 0, a state the program does not
# differentiate by, inside a field it does). A tangent or cotangent of 0 then met 0 / 0 and gave NaN,
# which spread to every derivative of a field program by forward mode, where Taichi's reverse mode left
# it in the state's own gradient. The rules take the derivative of the norm at zero as 0, as torch does
# (``torch.linalg.vector_norm``'s subgradient), and ``1 / |x|`` from a radicand that is 1 there, so that
# derivatives of the rule itself (second order) are finite too.
def reciprocal_or_zero(norm: Sym) -> Sym:
    """``1 / norm``, or 0 where ``norm`` (a value of a norm, in reverse rules) is 0 (NOTE: [Norm at zero])."""
    zero = norm.eq(0)
    return T.select(zero, 0.0, 1.0 / T.select(zero, 1.0, norm))


def inverse_norm(x: Sym, *eps: Sym) -> Sym:
    """``1 / x.norm(eps)``, or 0 where the norm is 0 (NOTE: [Norm at zero])."""
    radicand = x.norm_sqr() + eps[0] if eps else x.norm_sqr()
    zero = radicand.eq(0)
    return T.select(zero, 0.0, 1.0 / T.sqrt(T.select(zero, 1.0, radicand)))


defjvp(method("norm") + [ti.math.length],
       lambda g, x, *eps: (x * g).sum() * inverse_norm(x, *eps))  # sqrt(|x|^2 + eps), of a matrix too
defjvp(method("norm_inv"), lambda g, x, *eps: -x.norm_inv(*eps) ** 3 * (x * g).sum())  # rsqrt(|x|^2 + eps)
defjvp(method("norm_sqr"), lambda g, x: 2 * (x * g).sum())


def _normalized_tangent(g: Sym, x: Sym, *eps: Sym) -> Sym:
    """Taichi's ``x.normalized(eps)`` is ``x / (|x| + eps)`` (eps outside the root, unlike ``norm``)."""
    if not eps:
        return (g - x.normalized() * x.normalized().dot(g)) / x.norm()
    return (g - x.normalized(*eps) * (x.dot(g) / x.norm())) / (x.norm() + eps[0])


defjvp(method("normalized") + [ti.math.normalize], _normalized_tangent)
defjvp(method("determinant") + [ti.math.determinant], lambda g, x: (helpers.cofactors(x) * g).sum())
defjvp(method("inverse") + [ti.math.inverse], lambda g, x: -(x.inverse() @ g @ x.inverse()))
@defrule(ti.math.distance)
def _distance(call: Call) -> Sym | None:
    """``|x - y|``: one term along ``dx - dy``, so the factor of NOTE: [Norm at zero] is written once."""
    (x, y), (dx, dy) = call.args, call.tangents
    if dx is None and dy is None:
        return None
    along = dx if dy is None else (-dy if dx is None else dx - dy)
    return (x - y).dot(along) * inverse_norm(x - y)


defjvp(method("transpose"), lambda g, x: g.transpose())
defjvp(method("trace"), lambda g, x: g.trace())
defjvp(method("sum"), lambda g, x: g.sum())
defjvp(method("max"), lambda g, x: helpers.pick_extreme(x, g, True))  # NOTE: [Ties]
defjvp(method("min"), lambda g, x: helpers.pick_extreme(x, g, False))


# --- the linear helpers reverse rules call (forward over reverse) -----------
def deflinear_in(keys: Any, position: int) -> None:
    """Register helpers linear in operand ``position``; the other operands (shapes, indices) pass as written."""
    def rule(call: Call) -> Sym | None:
        t = call.tangents[position]
        if t is None:
            return None
        args = list(call.args)
        args[position] = t
        return call.fn(*args)
    _register(keys, rule)


deflinear_in([rule_helpers.sum_to, rule_helpers.broadcast_like, rule_helpers.without, rule_helpers.without2], 0)
deflinear_in([rule_helpers.scatter, rule_helpers.scatter2, rule_helpers.trace_adjoint], 1)
deflinear_in([rule_helpers.cast_tangent, rule_helpers.cast_adjoint, rule_helpers.row_of, rule_helpers.col_of], 0)
# a new name for a new value (NOTE: [Rebinding in straight-line code]); linear in the value
_register(rule_helpers.rebound,
          lambda call: None if call.tangents[0] is None else helpers.rebound_tangent(call.tangents[0], call.args[1]))
deflinear_in([rule_helpers.rebound_tangent, rule_helpers.rebound_adjoint], 0)
# tapes of loop-carried values and the linearized custom rules of the reverse sweep (``_adjoint/control.py``)
deflinear_in([rule_helpers.entries, rule_helpers.unflat_any, rule_helpers.tape_of], 0)
defzero(rule_helpers.basis)
defjvp(rule_helpers.inner, lambda g, a, b: helpers.inner(g, b), lambda g, a, b: helpers.inner(a, g))
# piecewise constant in x (which entry wins), linear in the tangent or cotangent
deflinear_in([rule_helpers.pick_extreme, rule_helpers.extreme_adjoint], 1)

# --- constructors of matrices from values (the dims are static) -------------
deflinear_in(ti.Matrix.diag, 1)
deflinear_in([ti.Matrix.rows, ti.Matrix.cols], 0)


# --- linear solves and decompositions (see NOTE: [Decompositions]) ---------
@defrule(ti.solve)
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


def _decomposition(op: str, n_results: int, tangent_helper: str) -> None:
    """A rule for ``op(A, dt=None)`` returning ``n_results`` values: the helper takes them and ``dA``."""
    def rule(call: Call) -> Sym | None:
        dA = call.tangents[0]
        if dA is None:
            return None
        results = getattr(T, op)(*call.args, **call.keywords)  # the primal call: bound once, shared
        return getattr(helpers, tangent_helper)(*[results[k] for k in range(n_results)], dA)
    _register(getattr(ti, op), rule)


_decomposition("svd", 3, "svd_jvp")
_decomposition("sym_eig", 2, "sym_eig_jvp")
_decomposition("polar_decompose", 2, "polar_decompose_jvp")

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
