"""Decompositions computed once per point and kept across Hessian-vector products.

NOTE: [Decompositions kept across products] ``td.hessian_operator(E)(x)``
is applied many times at one ``x`` (conjugate gradients), and each product
ran every element's Hessian-vector code whole, whose first statements
decompose the element's matrix again (the implicit FEM energy: one
``ti.polar_decompose`` per tet, about 85% of a product's time). The
decomposition's results do not depend on the vector: they are the primal
values the tangent code reads. So the primal call a decomposition's tangent
rule emits is ``_tidiff_rules.kept_<op>(A)``, which Taichi calls while it
compiles: outside a kernel that keeps values, it is the op itself; inside
one (the operator's kernel, NOTE: [Kept values] in ``_elements/kernels.py``)
it is the op and a store of its results when the launch records, and a load
of them when it replays. Element ``e``'s values sit at ``e * width + count``
in one float64 array, ``count`` the values the element has put so far, so a
decomposition in a runtime loop or branch takes a slot per time it runs, in
the order it runs; the order is the same in every launch because only
primal values (the point, never the vector) decide the control flow and
reach these calls: every call the outermost tangent transform emits
decomposes a primal value, and so does every one inside the code it
transforms (its primal values too). A user's own jvp rule calling ``ti.svd``
calls Taichi's op, which is never kept. A launch that records also reports
the most values an element needed (``need``); a value past ``width`` is
neither stored nor ever loaded (it is decomposed again), and the operator
records again with a larger array. Recorded values are exact copies, so
products are the same numbers as before, bit for bit.

NOTE: [Kept across pushes] A Jacobian body pushing basis tangents in a
runtime loop (the element Hessians of ``td.sparse_hessian``: 12 pushes per
tet) calls the same tangent function at the same primal values in every
push, so its decompositions are the same in every push: each push starts
counting where the loop started (``kept_count``), the first records and the
others replay (``keep_push``), within the launch. The implicit FEM assembly
decomposed each tet 12 times. A sparse Hessian's first launch makes the room
its first element needs (a launch over that element alone), so it keeps
from its first call.
"""
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import taichi as ti
from taichi.lang import impl
from taichi.lang.matrix import make_matrix

from .._lang.naming import RULE_HELPERS
from .._lang.products import compile_time, shape_of


@dataclass(frozen=True)
class Keeping:
    """The Taichi values of a kernel that keeps values: its float64 array, the element, the element's count of
    values (a local the kept calls advance), whether the launch records, and the values each element has room for."""

    store: Any
    element: Any
    count: Any
    record: Any
    width: Any


_KEEPING: list[Keeping] = []


@compile_time
def keep_values(store: Any, element: Any, count: Any, record: Any, width: Any) -> None:
    """From here on (while Taichi compiles the element's body), decompositions are kept in ``store``."""
    _KEEPING.append(Keeping(store, element, count, record, width))


@compile_time
def stop_keeping() -> None:
    _KEEPING.pop()


_PUSHED: list[bool] = []  # per loop of pushes being compiled: whether it keeps values


def forget_keeping() -> None:
    """After a launch that compiled a keeping kernel, whether or not its compile got to the end."""
    _KEEPING.clear()
    _PUSHED.clear()


@compile_time
def kept_count() -> Any:
    """Where a loop of pushes starts keeping: the element's count of values so far (0 where nothing keeps)."""
    return _KEEPING[-1].count if _KEEPING else 0


@compile_time
def keep_push(p: Any, start: Any) -> None:
    """At the top of push ``p`` of a Jacobian's loop of pushes (NOTE: [Kept across pushes])."""
    if not _KEEPING:
        _PUSHED.append(False)
        return
    k = _KEEPING[-1]
    k.count._assign(start)
    record = impl.expr_init(ti.select(p == 0, k.record, 0))
    _KEEPING.append(Keeping(k.store, k.element, k.count, record, k.width))
    _PUSHED.append(True)


@compile_time
def stop_keeping_push() -> None:
    """At the bottom of a push."""
    if _PUSHED.pop():
        _KEEPING.pop()


def _shapes(op: str, n: int) -> list[tuple[int, ...]]:
    shapes: dict[str, list[tuple[int, ...]]] = {"svd": [(n, n)] * 3, "polar_decompose": [(n, n)] * 2,
                                                "sym_eig": [(n,), (n, n)]}
    return shapes[op]


def _kept(op: str) -> Callable[..., Any]:
    decompose = getattr(ti, op)

    @compile_time
    def kept(A: Any, dt: Any = None) -> Any:
        shape = shape_of(A)
        if not _KEEPING or len(shape) != 2 or shape[0] != shape[1]:
            return decompose(A, dt)
        k = _KEEPING[-1]
        dtype = impl.get_runtime().default_fp if dt is None else dt
        shapes = _shapes(op, shape[0])
        flat = _memo(op, shapes, dtype)(k.store, k.element, k.count, k.record, k.width, A)
        return _unflat(flat, shapes)

    kept.__name__ = kept.__qualname__ = f"kept_{op}"
    kept.__doc__ = f"``ti.{op}(A, dt)``, its results kept across launches where a kernel keeps values (NOTE: " \
                   "[Decompositions kept across products])."
    return kept


kept_svd = _kept("svd")
kept_polar_decompose = _kept("polar_decompose")
kept_sym_eig = _kept("sym_eig")

KEPT_CALL = f"{RULE_HELPERS}.kept_"
"""How generated code spells a kept call (a Jacobian body keeps decompositions across its pushes where its
tangent function's code, or a generated function it calls, holds one)."""

KEPT: dict[Any, Any] = {ti.svd: kept_svd, ti.polar_decompose: kept_polar_decompose, ti.sym_eig: kept_sym_eig}
"""Each decomposition, and the call its tangent rule makes of it (the primal statement becomes that call)."""


def _entries(shape: Sequence[int]) -> list[tuple[int, ...]]:
    return [(i,) for i in range(shape[0])] if len(shape) == 1 else \
        [(i, j) for i in range(shape[0]) for j in range(shape[1])]


@compile_time
def _flat(results: Sequence[Any], dtype: Any) -> Any:
    """A decomposition's results as one vector of their entries, in order."""
    return make_matrix([ti.cast(impl.subscript(None, r, *index), dtype)
                        for r in results for index in _entries(shape_of(r))])


def _unflat(flat: Any, shapes: Sequence[tuple[int, ...]]) -> tuple[Any, ...]:
    """The results again, each in a local of its own shape."""
    out, at = [], 0
    for shape in shapes:
        entries = [impl.subscript(None, flat, at + j) for j in range(len(_entries(shape)))]
        at += len(entries)
        rows = entries if len(shape) == 1 else [entries[i * shape[1]:(i + 1) * shape[1]] for i in range(shape[0])]
        out.append(impl.expr_init(make_matrix(rows)))
    return tuple(out)


@compile_time
def _put(store: Any, at: Any, flat: Any, size: int) -> None:
    for j in range(size):
        impl.subscript(None, store, at + j)._assign(impl.subscript(None, flat, j))


@compile_time
def _get(store: Any, at: Any, size: int, dtype: Any) -> Any:
    return make_matrix([ti.cast(impl.subscript(None, store, at + j), dtype) for j in range(size)])


_MEMOS: dict[tuple[str, tuple[tuple[int, ...], ...], Any], Any] = {}


def _memo(op: str, shapes: list[tuple[int, ...]], dtype: Any) -> Any:
    """The ``@ti.func`` that decomposes and stores, or loads, ``op``'s results (their entries in one vector)."""
    key = (op, tuple(shapes), dtype)
    if key not in _MEMOS:
        _MEMOS[key] = _memo_func(getattr(ti, op), sum(len(_entries(s)) for s in shapes), dtype)
    return _MEMOS[key]


def _memo_func(decompose: Any, size: int, dtype: Any) -> Any:
    @ti.func
    def kept(store: ti.template(), e: ti.template(), count: ti.template(), record: ti.template(),  # type: ignore[valid-type]
             width: ti.template(), A):  # type: ignore[valid-type]
        flat = ti.Vector.zero(dtype, size)
        at = e * width + count
        if record or count + size > width:
            flat = _flat(decompose(A, dtype), dtype)
            if record and count + size <= width:
                _put(store, at, flat, size)
        else:
            flat = _get(store, at, size, dtype)
        count += size
        return flat
    return kept
