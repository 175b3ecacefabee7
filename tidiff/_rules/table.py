"""The rule table: one entry per Taichi op, its derivative in both modes.

An entry (:class:`Rule`) holds the op's forward rule, ``jvp(call)``: the
tangent of one application from its operands, their tangents and its result
(a :class:`Call`, all as :class:`~tidiff._lang.sym.Sym`), None for a zero
tangent; and its reverse rule, ``vjp(g, out, *operands)``: one cotangent
contribution per operand from the result's cotangent ``g`` and the result
``out``, None where an operand has no derivative. Keys are the callee objects
themselves (``ti.sin``, ``abs``, ``ti.math.vec3``), ``ast`` operator classes
(``ast.Mult``) and ``("method", name)`` for methods (``v.dot(w)``), so every
spelling that resolves to the same object shares one entry; the unbound
spelling of a method (``ti.Vector.normalized(v, eps)``) finds it too.

As in JAX, the forward rule is written and the reverse one derived where it
can be (NOTE: [One rule, two modes]):

- :func:`defjvp` (:func:`defjvp2` where the rule reads the result, as JAX's
  ``defjvp2``): one *partial* per operand, ``partial(g, *operands)``, the
  term that operand's tangent ``g`` contributes. Both rules are derived: the
  forward sums the terms of the operands with a tangent; the reverse applies
  each partial to the cotangent, summed back to its operand's shape
  (``sum_to``) where the op has several operands and may broadcast.
- :func:`deflinear`, :func:`deflinear_in`: ops linear in (one of) their
  operands; the forward applies the op to the tangents, the reverse is the
  op's transpose, given.
- :func:`defrule`: a forward rule of its own (ties, shapes, decompositions),
  with its reverse rule given beside it.
- :func:`defzero`: no derivative; both transforms copy the call as written.

Adding an op is one entry; tests/test_rule_coverage.py checks that every
entry has both modes and an op-table row.
"""
from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import taichi as ti
from taichi.lang.matrix import MatrixType, VectorType

from .._lang.sym import Sym, helpers, zero_like
from .helpers import is_integral

Jvp = Callable[["Call"], Sym | None]
"""A forward rule: the tangent of one application of an op, or None for a zero tangent."""
Contributions = list[Sym | None]
"""One cotangent contribution per operand of an op, None where it has no derivative."""
Vjp = Callable[..., Contributions]
"""A reverse rule ``(g, out, *operands) -> Contributions``; an op with several results takes the lists of
their cotangents and of the results (``gs, outs, *operands``)."""


Shape = tuple[int, ...]
"""A value's shape: ``()`` for a scalar."""
ResultShape = Callable[[list["Shape | None"]], "Shape | None"]
"""The shape of an op's result from its operands' shapes (None where one is not known)."""


def broadcast(shapes: list[Shape | None]) -> Shape | None:
    """The result shape of an elementwise op: its operands' common shape, scalars broadcast; None if unknown."""
    if any(s is None for s in shapes):
        return None
    found = {s for s in shapes if s}
    return found.pop() if len(found) == 1 else () if not found else None


def scalar(shapes: list[Shape | None]) -> Shape | None:
    """The result shape of a reduction (``v.dot(w)``, ``v.sum()``, ``det(m)``)."""
    return ()


@dataclass(frozen=True)
class Rule:
    """How one op is differentiated, in both modes (see the module's docstring)."""

    jvp: Jvp
    vjp: Vjp | None = None  # None: no derivative (``zero``), or reversed entry by entry (``entrywise``)
    n_outputs: int = 1
    entrywise: bool = False  # a constructor (``ti.Vector([a, b])``): the reverse transform sends g[k] to entry k
    result_shape: ResultShape | None = None  # where the transforms can know it: they drop ``sum_to`` of one shape


TABLE: dict[Any, Rule] = {}
"""op key -> its :class:`Rule`."""

REFUSED: dict[Any, str] = {}
"""Taichi op -> why it has no derivative rule: the transforms' errors say so, naming the op."""


@dataclass
class Call:
    """One application of an op, as a forward rule sees it."""

    fn: Any  # a Sym naming the op; None for an operator (``a * b``)
    args: list[Sym]
    tangents: list[Sym | None]
    keywords: dict[str, Any] = field(default_factory=dict)
    static_args: list[Any] = field(default_factory=list)
    out: Sym | None = None  # the op's result (for defjvp2 partials)

    def zeros(self) -> list[Sym]:
        """Tangents with every zero spelled out, for rules that are not a sum of terms."""
        return [zero_like(a) if t is None else t for a, t in zip(self.args, self.tangents, strict=False)]


def register(keys: Any, rule: Rule) -> Rule:
    """Put ``rule`` in the table under every key of ``keys`` (one key, or a list of spellings)."""
    for key in keys if isinstance(keys, (list, tuple)) else (keys,):
        TABLE[key] = rule
    return rule


# NOTE: [One rule, two modes] A partial ``g * cos(x)`` is linear in ``g`` and acts entry by entry (or, for
# ``normalized`` and ``transpose``, is its own transpose), so the same expression with the cotangent in
# place of the tangent is the reverse rule: JAX writes ``ad.defjvp`` for such primitives and derives the
# transpose. The reverse of a broadcasting op (``x * y`` with a scalar ``x``) gives a contribution of the
# result's shape, summed back with ``sum_to(v, x)`` (shapes are known only when Taichi compiles); an op of
# one operand keeps its shape. Partials that read the result (``defjvp2``) get, in forward mode, the
# primal expression, which the transform binds once (``tanh_x``), and in reverse mode its name.
def defjvp(keys: Any, *partials: Callable[..., Sym] | None, jvp: Jvp | None = None,
           vjp: Vjp | None = None, result_shape: ResultShape | None = broadcast) -> Rule:
    """An op whose operand ``k``'s tangent ``g`` contributes ``partials[k](g, *operands)`` (None: no
    derivative by it); both rules derived from the partials (NOTE: [One rule, two modes]).

    ``jvp`` or ``vjp`` replaces the derived rule of that mode: a forward rule
    that gives a lone tangent the result's shape (``x + y``), a reverse rule
    for an op whose partials are not elementwise (``x @ y``, ``x.dot(y)``:
    their transposes, as JAX's ``defbilinear``). ``result_shape``: the
    elementwise broadcast, unless the op says otherwise (None: not known).
    """
    return register(keys, Rule(jvp or sum_of_terms(partials, with_out=False),
                               vjp or _transposed(partials, with_out=False), result_shape=result_shape))


def defjvp2(keys: Any, *partials: Callable[..., Sym] | None, vjp: Vjp | None = None,
            result_shape: ResultShape | None = broadcast) -> Rule:
    """As :func:`defjvp`, with partials ``(g, ans, *operands)`` that also read the op's result ``ans``."""
    return register(keys, Rule(sum_of_terms(partials, with_out=True), vjp or _transposed(partials, with_out=True),
                               result_shape=result_shape))


def sum_of_terms(partials: Sequence[Callable[..., Sym] | None], with_out: bool = False) -> Jvp:
    """The forward rule summing the partials of the operands with a tangent."""
    def jvp(call: Call) -> Sym | None:
        lead = (call.out,) if with_out else ()
        terms = [partial(t, *lead, *call.args) for partial, t in zip(partials, call.tangents, strict=False)
                 if partial is not None and t is not None]
        if not terms:
            return None
        total = terms[0]
        for term in terms[1:]:
            positive = without_minus(term.node)
            total = total + term if positive is None else total - Sym(positive)
        return total
    return jvp


def _transposed(partials: Sequence[Callable[..., Sym] | None], with_out: bool) -> Vjp:
    several = sum(p is not None for p in partials) > 1

    def vjp(g: Sym, out: Sym, *args: Sym) -> Contributions:
        lead = (out,) if with_out else ()
        found: Contributions = []
        for k, arg in enumerate(args):
            partial = partials[k] if k < len(partials) else None
            term = None if partial is None else partial(g, *lead, *args)
            found.append(helpers.sum_to(term, arg) if term is not None and several else term)
        return found
    return vjp


def pairwise(node: ast.Call) -> ast.Call:
    """``max(a, b, c)`` as Taichi computes it, ``max(a, max(b, c))``: the rules are binary, and a tie of three
    splits as Taichi's nesting does (NOTE: [Ties])."""
    if len(node.args) <= 2:
        return node
    return ast.Call(node.func, [node.args[0], pairwise(ast.Call(node.func, node.args[1:], []))], [])


def without_minus(node: ast.expr) -> ast.expr | None:
    """``a * b`` for ``-a * b`` (a leading minus), else None: sums then read ``x - a * b``."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return node.operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
        left = without_minus(node.left)
        return None if left is None else ast.BinOp(left, node.op, node.right)
    return None


def defrule(keys: Any, vjp: Vjp | None, result_shape: ResultShape | None = None) -> Callable[[Jvp], Jvp]:
    """Register a decorated forward rule ``jvp(call)`` as it is, with its reverse rule ``vjp``."""
    def decorate(jvp: Jvp) -> Jvp:
        register(keys, Rule(jvp, vjp, result_shape=result_shape))
        return jvp
    return decorate


def zero(call: Call) -> None:
    """The forward rule of ops with zero derivative; both transforms copy their calls as written."""
    return None


ZERO = Rule(zero)


def defzero(keys: Any) -> None:
    """Ops whose derivative is zero (floor, casts to int): called as written in both modes."""
    register(keys, ZERO)


def linear(call: Call) -> Sym | None:
    """The forward rule of an op linear in all its operands: the op on the tangents."""
    if all(t is None for t in call.tangents):
        return None
    return call.fn(*call.zeros(), **call.keywords)


def deflinear(keys: Any, transpose: Vjp | None, entrywise: bool = False) -> None:
    """Ops linear in all their operands: the forward applies the op to the tangents; ``transpose`` is the
    reverse rule (None with ``entrywise``: a constructor the reverse transform takes entry by entry)."""
    register(keys, Rule(linear, transpose, entrywise=entrywise))


def linear_in(position: int) -> Jvp:
    """The forward rule of an op linear in operand ``position``: the op with that operand's tangent."""
    def jvp(call: Call) -> Sym | None:
        t = call.tangents[position]
        if t is None:
            return None
        args = list(call.args)
        args[position] = t
        return call.fn(*args)
    return jvp


def deflinear_in(keys: Any, position: int, transpose: Vjp | None) -> None:
    """Ops linear in operand ``position`` (the others give shapes or indices and pass as written); the
    reverse rule ``transpose`` gives that operand's cotangent (and None for the others)."""
    register(keys, Rule(linear_in(position), transpose))


def method(*names: str) -> list[Any]:
    """Table keys for methods called on Taichi values (``v.dot(w)``)."""
    return [("method", n) for n in names]


def unbound_method(callee: object) -> tuple[str, str] | None:
    """``("method", name)`` when ``callee`` is a method of ``ti.Matrix`` spelled unbound
    (``ti.Vector.normalized``, which is ``ti.Matrix.normalized``), else None."""
    name = getattr(callee, "__name__", None)
    if isinstance(name, str) and getattr(ti.Matrix, name, None) is callee:
        return ("method", name)
    return None


def is_dtype(value: object) -> bool:
    return isinstance(value, type(ti.f64)) or value in (int, float)


def is_constructor(callee: object) -> bool:
    """``ti.math.vec3`` and its kin: a vector or matrix built from scalar entries."""
    return isinstance(callee, (VectorType, MatrixType))


def copy_vjp(g: Sym, out: Sym, x: Sym) -> Contributions:
    """The reverse rule of a copy (``y = x``, a float cast): the cotangent itself."""
    return [g]


CONSTRUCTOR = Rule(linear, entrywise=True)
"""``ti.math.vec3(a, b, c)`` and its kin: linear in the entries, reversed entry by entry."""
FLOAT_CAST = Rule(linear, copy_vjp)
"""``ti.f64(x)``: the value, converted."""


def lookup(callee: object) -> Rule | None:
    """The rule of ``callee``, including families (vector types, dtype casts) and unbound methods, or None."""
    try:
        if callee in TABLE:
            return TABLE[callee]
    except TypeError:  # unhashable callee
        return None
    if isinstance(callee, (VectorType, MatrixType)):
        return ZERO if is_integral(callee.dtype) else CONSTRUCTOR
    if is_dtype(callee):
        return ZERO if is_integral(callee) else FLOAT_CAST
    return TABLE.get(unbound_method(callee))
