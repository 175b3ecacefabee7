"""Matrix products in the Taichi code tidiff compiles, written entry by entry.

NOTE: [Products entry by entry] Taichi's ``x @ y`` is a ``@ti.func`` of its own
(``matrix_ops._matmul_helper``) that starts from a zero matrix and adds one
product into one entry per statement of a loop its frontend unrolls: a 3x3
product is 27 stores into a local matrix, each statement visited by the
frontend (with a message formatted from its source line) and then by the IR
passes that forward stores to loads, which grow faster than linearly with
the stores into one local value (NOTE: [Where compile time goes] in
``compile.py``). Written as one literal whose entries are sums of products,
the same product compiles in about a third of the time: twelve 3x3 products in
a kernel 1.55 s -> 0.55 s, the same numbers; the first ``td.grad`` of the
implicit FEM energy (a polar decomposition per tet, bench/implicit_fem.py,
n = 8, 2-core CPU beside a conformance run) 2.3-2.6 s -> 1.5-1.6 s, the
first product of its Hessian operator 7.9 s -> 3.9 s. Each operand and the
result are held in a local, as a func's arguments and result are: read as
expressions, a product's entries were copied into every read, and Taichi's
IR passes took longer than they saved. So every ``@`` in the Taichi
functions and kernels tidiff generates, and in its rules, is :func:`matmul`:
the products in Taichi's order (``k`` ascending), ``v @ M`` read as
``M^T v`` and ``v @ w`` as ``v.dot(w)``, as Taichi reads them. Numbers agree
with Taichi's ``@`` to rounding (LLVM may contract the two forms into fused
multiply-adds differently), and an inf in an
operand meets the entries that read it as in NumPy (tests/test_products.py).
A ``@`` inside ``ti.static(...)`` is Python's, left as written. The user's
own functions and kernels, where Taichi compiles them, keep Taichi's ``@``;
tidiff's copies of a program's kernels (their faster forms) and the code it
generates from them use :func:`matmul`.
"""
from __future__ import annotations

import ast
import functools
import operator
from typing import Any

import taichi as ti
from taichi.lang import impl, matrix_ops
from taichi.lang.expr import Expr
from taichi.lang.matrix import make_matrix

from .naming import bound


def compile_time(fn: Any) -> Any:
    """A Python function Taichi calls while it compiles, without its warning of a non-taichi function.

    NOTE: [Helpers run while Taichi compiles] Taichi inlines a ``@ti.func`` by
    parsing and transforming its source at every call: about 7 ms each, and
    the reverse code of a function reading each of a vector's 64 entries
    called ``sum_to`` 128 times (0.9 s of a 1.8 s first call). The helpers
    called once per op (``sum_to``, ``broadcast_like``, ``rebound`` and kin)
    are plain Python functions Taichi calls with its values, which decide on
    the shapes and build the same expressions at the cost of a call.
    """
    fn._is_taichi_function = True
    fn.func = type("func", (), {"has_print": False})
    return fn


def shape_of(value: Any) -> tuple[int, ...]:
    """The shape of a Taichi value while a kernel compiles: ``()`` for scalars."""
    if isinstance(value, Expr):
        return tuple(value.get_shape()) if value.is_tensor() else ()
    if isinstance(value, ti.Matrix):
        return tuple(value.get_shape())
    return ()


@compile_time
def matmul(x: Any, y: Any) -> Any:
    """``x @ y`` as Taichi defines it, each entry one sum of products (NOTE: [Products entry by entry])."""
    sx, sy = shape_of(x), shape_of(y)
    if not sx or not sy:
        return x @ y  # not two Taichi vectors or matrices: whatever ``@`` means for them
    if len(sx) == 1 and len(sy) == 1:
        return matrix_ops.dot(x, y)
    inner = sx[-1] if len(sx) == 2 else sx[0]
    if inner != sy[0]:
        raise ti.TaichiCompilationError(f"matrix product: shapes {sx} and {sy} do not match (x @ y needs "
                                        f"x's columns to be y's rows)")
    x, y = _held(x), _held(y)  # each entry is read several times: an expression would be copied into each read
    if len(sx) == 1:  # v @ M is M^T v
        product = [_total([_at(y, k, i) * _at(x, k) for k in range(inner)]) for i in range(sy[1])]
    elif len(sy) == 1:
        product = [_total([_at(x, i, k) * _at(y, k) for k in range(inner)]) for i in range(sx[0])]
    else:
        product = [[_total([_at(x, i, k) * _at(y, k, j) for k in range(inner)]) for j in range(sy[1])]
                   for i in range(sx[0])]
    return impl.expr_init(make_matrix(product))  # one store of the whole, as a func's result


def _held(value: Any) -> Any:
    """``value`` in a local of its own (as a func's argument): a Taichi value, not a Python constant."""
    return impl.expr_init(value) if isinstance(value, Expr) else value


def _at(value: Any, *index: int) -> Any:
    return impl.subscript(None, value, *index)


def _total(terms: list[Any]) -> Any:
    return functools.reduce(operator.add, terms)


def products_entry_by_entry(module: ast.Module, namespace: dict[str, Any]) -> bool:
    """Every ``x @ y`` in the Taichi functions and kernels of ``module``, outside ``ti.static(...)``, as a call
    of :func:`matmul`, bound in ``namespace``; whether ``module`` changed."""
    functions = [node for node in module.body
                 if isinstance(node, ast.FunctionDef) and any(_taichi_decorator(d) for d in node.decorator_list)]
    if not any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult) for f in functions for n in ast.walk(f)):
        return False
    rewriter = _Products(bound(namespace, matmul, "_tidiff_matmul").id)
    for function in functions:
        rewriter.visit(function)
    return True


def _taichi_decorator(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return _called(target) in ("func", "kernel", "real_func")


def _called(target: ast.expr) -> str:
    return target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")


class _Products(ast.NodeTransformer):
    def __init__(self, name: str) -> None:
        self.name = name

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if _called(node.func) == "static":
            return node  # Python's values while Taichi compiles
        return self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if not isinstance(node.op, ast.MatMult):
            return node
        return ast.copy_location(ast.Call(ast.Name(self.name, ast.Load()), [node.left, node.right], []), node)
