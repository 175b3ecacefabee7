"""A kernel's top-level ``ti.static`` loops around parallel loops, unrolled when the kernel is parsed.

NOTE: [Static loops around parallel loops] A kernel may run stages in a static loop at its top level (``for s in
ti.static(range(2)): for i in y: y[i] = ti.sin(y[i])``). Taichi unrolls it while compiling, so each stage's loop is a
top-level parallel loop. tidiff reads a kernel by its top-level statements (its parallel loops and the statements
beside them), so the adjoint transform did not take such a kernel; Taichi's ``kernel.grad`` reversed it, and where
the stages update a field in place it was found wrong and replaced by forward pushes, one run per input (a survey
of kernels as users write them). The parsed tree holds the loop unrolled, each copy with the counter a constant,
where the range's bounds are known when the kernel is parsed (integers: constants, globals, arithmetic of them) and
the body does not assign the counter; the stages then run as any top-level loops do (NOTE: [Kernels run loop by
loop], [Arrays kept by version]). So is a static loop of statements alone (``for r, c in ti.static(ti.ndrange(3,
3)): M[r, c] = A[r, c]`` filling a top-level local matrix), which the transform took for a parallel loop assigning
``M`` and refused, so that Taichi's ``kernel.grad``, which refuses the kernel too, ran: a ``td.TransformError``.
"""
import ast
import copy
import itertools
from collections.abc import Callable
from typing import Any

import taichi as ti

_OPS: dict[type, Callable[[int, int], int]] = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__,
                                               ast.FloorDiv: int.__floordiv__}


def unrolled_stages(tree: ast.FunctionDef, resolve: Callable[[ast.AST], Any]) -> None:
    """Unroll, in place, each top-level ``for s in ti.static(range(...))`` (or ``for r, c in
    ti.static(ti.ndrange(...))``) of the kernel ``tree``."""
    body: list[ast.stmt] = []
    for stmt in tree.body:
        counts = _stages(stmt, resolve)
        if counts is None:
            body.append(stmt)
            continue
        assert isinstance(stmt, ast.For)
        names = [stmt.target.id] if isinstance(stmt.target, ast.Name) else [
            n.id for n in stmt.target.elts if isinstance(n, ast.Name)] if isinstance(stmt.target, ast.Tuple) else []
        for values in counts:
            for s in stmt.body:
                copied = copy.deepcopy(s)
                for name, k in zip(names, values, strict=True):
                    copied = _Constant(name, k).visit(copied)
                body.append(copied)
    tree.body = [ast.fix_missing_locations(s) for s in body]


def _stages(stmt: ast.stmt, resolve: Callable[[ast.AST], Any]) -> list[tuple[int, ...]] | None:
    """The counters' values of a top-level static loop over a range (or ``ti.ndrange`` of ranges) known now;
    else None."""
    if not (isinstance(stmt, ast.For) and not stmt.orelse and isinstance(stmt.iter, ast.Call)
            and len(stmt.iter.args) == 1 and resolve(stmt.iter.func) is ti.static):
        return None
    names = [stmt.target] if isinstance(stmt.target, ast.Name) else stmt.target.elts \
        if isinstance(stmt.target, ast.Tuple) else []
    if not names or not all(isinstance(n, ast.Name) for n in names) or any(
            isinstance(n, ast.Name) and n.id in {t.id for t in names if isinstance(t, ast.Name)}
            and isinstance(n.ctx, ast.Store) for s in stmt.body for n in ast.walk(s)):
        return None
    inner = stmt.iter.args[0]
    if not (isinstance(inner, ast.Call) and not inner.keywords and inner.args):
        return None
    ranges: list[range] = []
    if isinstance(inner.func, ast.Name) and inner.func.id == "range" and resolve(inner.func) is range \
            and len(inner.args) <= 3:
        bounds = [_integer(a, resolve) for a in inner.args]
        if any(b is None for b in bounds):
            return None
        ranges = [range(*bounds)]  # type: ignore[arg-type]
    elif resolve(inner.func) is ti.ndrange:  # each argument an extent
        extents = [_integer(a, resolve) for a in inner.args]
        if any(e is None for e in extents):
            return None
        ranges = [range(e) for e in extents]  # type: ignore[arg-type]
    if not ranges or len(ranges) != len(names):
        return None
    return list(itertools.product(*ranges))


def _integer(node: ast.expr, resolve: Callable[[ast.AST], Any]) -> int | None:
    """The value of an integer expression of constants and global names, or None."""
    if isinstance(node, ast.Constant):
        return node.value if type(node.value) is int else None
    if isinstance(node, ast.Name):
        value = resolve(node)
        return value if type(value) is int else None
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _integer(node.left, resolve), _integer(node.right, resolve)
        return None if left is None or right is None else _OPS[type(node.op)](left, right)
    return None


class _Constant(ast.NodeTransformer):
    def __init__(self, name: str, value: int) -> None:
        self.name, self.value = name, value

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return ast.copy_location(ast.Constant(self.value), node) if node.id == self.name else node
