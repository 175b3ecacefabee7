"""List comprehensions over a compile-time range, written out as the lists Taichi builds from them.

NOTE: [Unrolled comprehensions] Taichi evaluates a list comprehension while
compiling, its loop variable a Python int: ``ti.Vector([ti.sin(x[i]) * (i + 1)
for i in ti.static(range(3))])`` is ``ti.Vector([ti.sin(x[0]) * 1, ti.sin(x[1])
* 2, ti.sin(x[2]) * 3])``. The transforms had no rule for the comprehension
and refused it (outside code: a common Taichi idiom). Where the range's
bounds are known before compiling (literals, and names of ints the function
sees), the parsed tree holds the written-out list instead, so every
transform differentiates its entries as it would a literal. Comprehensions
with a condition, over other iterables, or with bounds known only to Taichi
stay as written and are refused by name.
"""
import ast
import copy
from typing import Any

import taichi as ti


def unrolled(tree: ast.FunctionDef, resolve: Any) -> None:
    """Write out, in place, every list comprehension of ``tree`` over a compile-time range (see the NOTE);
    ``resolve(node)`` is the object a name stands for, or a sentinel that is no int."""
    _Unroll(resolve).visit(tree)


class _Unroll(ast.NodeTransformer):
    def __init__(self, resolve: Any) -> None:
        self.resolve = resolve

    def visit_ListComp(self, node: ast.ListComp) -> ast.AST:
        self.generic_visit(node)  # inner comprehensions first: a matrix's rows
        if len(node.generators) != 1:
            return node
        loop = node.generators[0]
        indices = self._static_range(loop.iter)
        if loop.ifs or loop.is_async or not isinstance(loop.target, ast.Name) or indices is None:
            return node
        name = loop.target.id
        if any(isinstance(n, (ast.comprehension, ast.Lambda, ast.NamedExpr)) for n in ast.walk(node.elt)):
            return node  # a name bound again inside: left to Taichi
        entries = [_substituted(copy.deepcopy(node.elt), name, k) for k in indices]
        return ast.copy_location(ast.List(entries, ast.Load()), node)

    def _static_range(self, node: ast.expr) -> range | None:
        """``range(...)`` or ``ti.static(range(...))`` with int bounds known now, else None."""
        if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords \
                and self.resolve(node.func) is ti.static:
            node = node.args[0]
        if not (isinstance(node, ast.Call) and self.resolve(node.func) is range and not node.keywords
                and 1 <= len(node.args) <= 3):
            return None
        bounds = [self._int(a) for a in node.args]
        if any(b is None for b in bounds):
            return None
        return range(*bounds)  # type: ignore[arg-type]

    def _int(self, node: ast.expr) -> int | None:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            negated = self._int(node.operand)
            return None if negated is None else -negated
        value: Any = node.value if isinstance(node, ast.Constant) else self.resolve(node)
        return value if isinstance(value, int) and not isinstance(value, bool) else None


def _substituted(node: ast.expr, name: str, value: int) -> ast.expr:
    """``node`` with each read of ``name`` replaced by the constant ``value``."""

    class Substitute(ast.NodeTransformer):
        def visit_Name(self, n: ast.Name) -> ast.AST:
            if n.id == name and isinstance(n.ctx, ast.Load):
                return ast.copy_location(ast.Constant(value), n)
            return n

    return Substitute().visit(node)
