"""The statements both transforms generate for ``ti.atomic_max`` / ``ti.atomic_min`` in a kernel: which
iteration won, the count of winners per entry, and loops over every entry of the counts.

NOTE: [Atomic extremes in reverse] (``_adjoint/kernels.py``) and NOTE: [Atomic extremes forward]
(``_tangent/kernels.py``) say how each mode uses them.
"""
import ast
import copy
from collections.abc import Callable

from .nodes import assign, call, compare, if_, name, statement, taichi


def won(value: ast.expr, field: str, target: ast.Subscript) -> ast.Compare:
    """``ti.cast(value, field.dtype) == field[i]``: whether ``value`` is what the field holds after the kernel
    (compared in the field's type, as the atomic compared them)."""
    dtype = ast.Attribute(name(field), "dtype", ast.Load())
    return compare(call(taichi("cast"), copy.deepcopy(value), dtype), ast.Eq(), copy.deepcopy(target))


def counted(value: ast.expr, field: str, target: ast.Subscript, ties: str) -> ast.If:
    """``if <won>: ti.atomic_add(ties[i], 1)``: one more winner of entry ``i``."""
    at = ast.Subscript(name(ties), copy.deepcopy(target.slice), ast.Load())
    return if_(won(value, field, target), [statement(call(taichi("atomic_add"), at, 1))])


def share(amount: ast.expr, ties: str, target: ast.Subscript) -> ast.BinOp:
    """``amount / ties[i]``: a winner's part of what entry ``i`` has (a tie splits it evenly)."""
    return ast.BinOp(copy.deepcopy(amount), ast.Div(),
                     call(taichi("max"), ast.Subscript(name(ties), copy.deepcopy(target.slice), ast.Load()), 1))


def each_entry(ties: str, shape: tuple[int, ...], fresh: Callable[[str], str],
               body: Callable[[ast.expr], list[ast.stmt]]) -> list[ast.stmt]:
    """``body(index)`` for every entry of the counts field ``ties``: a loop over ``ti.grouped(ties)``, or the
    statements alone for a 0-d field (index ``None``)."""
    if not shape:
        return body(ast.Constant(None))
    entry = fresh("entry")
    return [ast.For(ast.Name(entry, ast.Store()), call(taichi("grouped"), ties), body(name(entry)), [])]


def zeroed(ties: str, shape: tuple[int, ...], fresh: Callable[[str], str]) -> list[ast.stmt]:
    """Every count back to 0."""
    return each_entry(ties, shape, fresh, lambda at: [assign(ast.Subscript(name(ties), at, ast.Load()), 0)])


def lost(ties: str, shape: tuple[int, ...], fresh: Callable[[str], str], gradient: ast.expr) -> list[ast.stmt]:
    """``gradient[i] = 0`` wherever an iteration won entry ``i`` (the old value lost)."""
    def body(at: ast.expr) -> list[ast.stmt]:
        some = compare(ast.Subscript(name(ties), at, ast.Load()), ast.Gt(), 0)
        return [if_(some, [assign(ast.Subscript(copy.deepcopy(gradient), copy.deepcopy(at), ast.Load()), 0.0)])]
    return each_entry(ties, shape, fresh, body)

