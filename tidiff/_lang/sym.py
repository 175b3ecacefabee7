"""Symbolic expressions: write derivative rules as ``g * ti.cos(x)`` and get an AST.

Rules in ``_rules/`` receive primal operands and tangents as :class:`Sym`
objects; Python operators on them build ``ast`` nodes, folding constants so
that generated code reads ``2 * x * dx`` rather than ``2 * x ** (2 - 1) * dx``.
"""
from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

from .naming import RULE_HELPERS, TAICHI

_FOLD: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.Pow: operator.pow}


def node_of(value: Any) -> ast.expr:
    """The AST node of a Sym, or a constant for a Python number."""
    if isinstance(value, Sym):
        return value.node
    if isinstance(value, (int, float, bool)):
        return ast.Constant(value)
    if isinstance(value, ast.expr):
        return value
    if isinstance(value, tuple):  # an index of several entries: m[i, j]
        return ast.Tuple([node_of(v) for v in value], ast.Load())
    raise TypeError(f"cannot use {value!r} in a derivative rule")


def _constant(node: ast.expr) -> int | float | None:
    """The number a node stands for (``2``, ``-2``), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _constant(node.operand)
        return None if inner is None else -inner
    return None


def _number(value: int | float) -> ast.expr:
    return ast.Constant(value) if value >= 0 else ast.UnaryOp(ast.USub(), ast.Constant(-value))


def binop(op: ast.operator, left: Any, right: Any) -> Sym:
    """``left op right`` with constants folded and ``* 1``, ``** 1`` dropped."""
    left, right = node_of(left), node_of(right)
    a, b = _constant(left), _constant(right)
    if a is not None and b is not None and type(op) in _FOLD and not (
            isinstance(op, (ast.Div, ast.Pow)) and b == 0):
        return Sym(_number(_FOLD[type(op)](a, b)))
    if isinstance(op, (ast.Add, ast.Sub)) and b is not None and b < 0:  # x - -1.0 -> x + 1.0
        return binop(ast.Sub() if isinstance(op, ast.Add) else ast.Add(), left, _number(-b))
    if isinstance(op, (ast.Mult, ast.Pow, ast.Div)) and b == 1:
        return Sym(left)
    if isinstance(op, ast.Mult) and a == 1:
        return Sym(right)
    return Sym(ast.BinOp(left, op, right))


class Sym:
    """An AST expression that composes with Python operators."""

    __slots__ = ("node",)
    node: ast.expr

    def __init__(self, node: ast.expr) -> None:
        object.__setattr__(self, "node", node)

    def __add__(self, other: Any) -> Sym: return binop(ast.Add(), self, other)
    def __radd__(self, other: Any) -> Sym: return binop(ast.Add(), other, self)
    def __sub__(self, other: Any) -> Sym: return binop(ast.Sub(), self, other)
    def __rsub__(self, other: Any) -> Sym: return binop(ast.Sub(), other, self)
    def __mul__(self, other: Any) -> Sym: return binop(ast.Mult(), self, other)
    def __rmul__(self, other: Any) -> Sym: return binop(ast.Mult(), other, self)
    def __truediv__(self, other: Any) -> Sym: return binop(ast.Div(), self, other)
    def __rtruediv__(self, other: Any) -> Sym: return binop(ast.Div(), other, self)
    def __pow__(self, other: Any) -> Sym: return binop(ast.Pow(), self, other)
    def __floordiv__(self, other: Any) -> Sym: return binop(ast.FloorDiv(), self, other)
    def __rfloordiv__(self, other: Any) -> Sym: return binop(ast.FloorDiv(), other, self)
    def __mod__(self, other: Any) -> Sym: return binop(ast.Mod(), self, other)
    def __matmul__(self, other: Any) -> Sym: return binop(ast.MatMult(), self, other)

    def __neg__(self) -> Sym:
        value = _constant(self.node)
        return Sym(_number(-value)) if value is not None else Sym(ast.UnaryOp(ast.USub(), self.node))

    def _compare(self, op: ast.cmpop, other: Any) -> Sym:
        return Sym(ast.Compare(self.node, [op], [node_of(other)]))

    def __lt__(self, other: Any) -> Sym: return self._compare(ast.Lt(), other)
    def __le__(self, other: Any) -> Sym: return self._compare(ast.LtE(), other)
    def __gt__(self, other: Any) -> Sym: return self._compare(ast.Gt(), other)
    def __ge__(self, other: Any) -> Sym: return self._compare(ast.GtE(), other)
    def eq(self, other: Any) -> Sym: return self._compare(ast.Eq(), other)

    def __and__(self, other: Any) -> Sym: return binop(ast.BitAnd(), self, other)

    def __getitem__(self, index: Any) -> Sym:
        if isinstance(self.node, ast.Tuple) and isinstance(index, int):  # (a, b)[1] is b
            return Sym(self.node.elts[index])
        return Sym(ast.Subscript(self.node, node_of(index), ast.Load()))

    def __getattr__(self, attr: str) -> Sym:
        return Sym(ast.Attribute(self.node, attr, ast.Load()))

    def __call__(self, *args: Any, **kwargs: Any) -> Sym:
        keywords = [ast.keyword(k, node_of(v)) for k, v in kwargs.items()]
        return Sym(ast.Call(self.node, [node_of(a) for a in args], keywords))

    def __repr__(self) -> str:
        return f"Sym({ast.unparse(self.node)})"


def name(identifier: str) -> Sym:
    """A Sym for a variable or module name."""
    return Sym(ast.Name(identifier, ast.Load()))


ti = name(TAICHI)
"""Taichi as rules spell it (``T.sin(x)``): a placeholder that generated code names (``spell_taichi``)."""
helpers = name(RULE_HELPERS)
"""The rule helpers as rules call them (``helpers.sum_to(v, x)``)."""


def zero_like(value: Any) -> Sym:
    """A zero of the same Taichi type as ``value``: ``ti.zero(x)``, ``0.0`` for a constant."""
    node = node_of(value)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return Sym(ast.Constant(type(node.value)(0)))
    if isinstance(node, (ast.List, ast.Tuple)):
        return Sym(type(node)([zero_like(e).node for e in node.elts], ast.Load()))
    return ti.zero(Sym(node))
