"""A parallel loop's adjoint on the CPU: gradients every iteration adds into, summed per chunk of iterations.

NOTE: [Accumulations by chunk] The adjoint of ``for i, j in y: ... W[j, k]
...`` adds every iteration's share into ``W.grad[j, k]``: an atomic add,
into a few entries that every thread hits. On a 2-core CPU the seeds'
linear layer at 100,000 rows took 63 ms for its adjoint, the hand-derived
backward 8 ms (one thread: 40 ms; plain racy adds hardly better: it is the
cache lines the threads fight over, not the instruction). So on the CPU an
ndarray kernel's adjoint has a second form, which a launch takes where its
arrays allow:
- the loop runs over chunks of its outer index (``for c in range(C): for
  i in range(c * L, min(c * L + L, n)): for j in ...``): one chunk is one
  iteration of the parallel loop, its rows in order on one thread;
- an add into ``P.grad`` whose index holds the outer index ``i`` as one of
  its components, where every add into ``P.grad`` in the loop does so at the
  same place, touches what no other chunk touches: a plain add;
- any other add into the gradient of an array of scalars goes to the
  chunk's own copy of it (``P_part[c, ...]``, zeroed scratch of shape ``(C,
  *P.shape)``: NOTE: [Scratch arrays]), and a loop after sums the copies
  into ``P.grad``.
The launch picks C (:meth:`Chunking.count`): at most CHUNKS_PER_THREAD
per Taichi thread, each chunk at least ROWS rows, the copies within
BUDGET entries or the launch's arrays' size. Taichi's CPU backend hands a
range loop to its threads GRAIN iterations at a time, so where the loop has
fewer than GRAIN rows (or the copies do not fit GRAIN chunks) the launch
takes the adjoint with atomic adds instead. The same layer, 100,000 rows,
the adjoint alone with its arrays' allocation: 58-71 ms -> 18-20 ms (the
hand-derived backward reads ``tanh``'s result, where the adjoint computes
each row again: 6.4 ms). Loops with atomic max / min, sums into
top-level locals, a ``ti.loop_config`` or an iteration other than
``range``/``ti.ndrange``/an array from 0 keep their one form; so do kernels
on other archs (a GPU's threads are not chunks).
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from taichi.lang import impl

from .._lang.nodes import assign, augment, for_range, name, taichi
from .._lang.scratch import Scratch
from .._lang.sym import Sym

GRAIN = 512  # iterations Taichi 1.7.4's CPU threads take at a time from a range loop (measured: 512 chunks of
# rows ran on one thread, 1,024 on two)
CHUNKS_PER_THREAD = 4 * GRAIN
ROWS = 8
BUDGET = 1 << 20

Extent = int | tuple[str, int]
"""One extent of a loop: a constant, or ``(array, axis)`` for ``array.shape[axis]``."""


@dataclasses.dataclass(frozen=True)
class Chunking:
    """How a launch splits one parallel loop: the extent of its outer index, and the arrays whose gradients each
    chunk sums into a copy of its own."""

    rows: Extent
    parts: tuple[str, ...]

    def count(self, arrays: dict[str, Any]) -> int:
        """The chunks for a launch with ``arrays`` (by parameter name); 0 where the loop is not worth chunking
        there (NOTE: [Accumulations by chunk])."""
        rows = self.rows if isinstance(self.rows, int) else int(arrays[self.rows[0]].shape[self.rows[1]])
        if rows < GRAIN:  # (the hot path of small launches: nothing more to look at)
            return 0
        size = sum(math.prod(arrays[p].shape) for p in self.parts)
        room = max(BUDGET, sum(math.prod(a.shape) for a in arrays.values() if hasattr(a, "shape")))
        chunks = min(rows // ROWS, CHUNKS_PER_THREAD * impl.current_cfg().cpu_max_num_threads,
                     room // max(size, 1))
        return chunks if chunks > GRAIN else 0


@dataclasses.dataclass(frozen=True)
class Part(Scratch):
    """A chunk's copies of one array's gradient: ``(C, *array.shape)``, zeroed, of the array's type."""

    chunking: Chunking = Chunking(0, ())

    def allocate(self, arrays: dict[str, Any], device: Any) -> Any:
        assert isinstance(self.shape, str)
        shape = (self.chunking.count(arrays), *arrays[self.shape].shape)
        return Scratch(self.param, self.dtype, tuple(shape)).allocate(arrays, device)


def chunked(header: ast.For, extents: str | list[Extent], gradients: dict[str, bool],
            fresh: Callable[[str], str]) -> tuple[list[ast.stmt], list[Part], Chunking] | None:
    """The chunked form of the adjoint loop ``header`` (NOTE: [Accumulations by chunk]) and the copies it
    takes, or None where it has none. ``extents`` are the loop's (``extremes.array_extents``); ``gradients``
    maps each array whose gradient the loop may add into to whether it holds scalars."""
    counters = _counters(header.target)
    if counters is None or isinstance(extents, list) and len(extents) != len(counters):
        return None
    bounds = [_extent((extents, k) if isinstance(extents, str) else extents[k]) for k in range(len(counters))]
    outer = counters[0]
    if any(isinstance(n, ast.Name) and n.id == outer and isinstance(n.ctx, ast.Store) for n in ast.walk(
            ast.Module(header.body, []))):
        return None
    adds = _adds(header.body, gradients)
    private = {p for p, found in adds.items() if _private(found, outer) and not _escapes(header.body, p, found)}
    shared = sorted(p for p in adds if p not in private and gradients[p])
    if not shared and not private:
        return None
    parts = {p: fresh(f"{p}_part") for p in shared}
    chunk = fresh("chunk")
    body = [_Redirected(parts, private, chunk).visit(stmt) for stmt in copy.deepcopy(header.body)]
    for counter, bound in reversed(list(zip(counters[1:], bounds[1:], strict=True))):
        body = [for_range(counter, [bound], body)]
    rows_extent = extents[0] if isinstance(extents, list) else (extents, 0)
    chunking = Chunking(rows_extent, tuple(shared))
    if not parts:  # rows in parallel, the rest in order: the private adds plain
        return [for_range(outer, [bounds[0]], body)], [], chunking
    rows, length, chunks = fresh("rows"), fresh("chunk_rows"), fresh("chunks")
    first = Sym(name(chunk)) * Sym(name(length))
    stmts: list[ast.stmt] = [
        assign(rows, bounds[0]),
        assign(chunks, Sym(name(parts[shared[0]])).shape[0]),
        assign(length, (Sym(name(rows)) + Sym(name(chunks)) - 1) // Sym(name(chunks))),
        for_range(chunk, [name(chunks)], [for_range(outer, [first, taichi("min")(first + Sym(name(length)),
                                                                                     Sym(name(rows)))], body)])]
    stmts += [_summed(p, parts[p], _rank(adds[p]), chunks, fresh) for p in shared]
    return stmts, [Part(parts[p], p, p, chunking) for p in shared], chunking


def _counters(target: ast.expr) -> list[str] | None:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
        return [e.id for e in target.elts if isinstance(e, ast.Name)]
    return None


def _extent(extent: Extent | tuple[str, int]) -> ast.expr:
    if isinstance(extent, int):
        return ast.Constant(extent)
    array, axis = extent
    return Sym(name(array)).shape[axis].node


def _gradient_of(node: ast.expr, gradients: dict[str, bool] | set[str]) -> str | None:
    """``P`` for ``P.grad[...]`` of an array the loop adds into."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "grad" \
            and isinstance(node.value.value, ast.Name) and node.value.value.id in gradients:
        return node.value.value.id
    return None


def _index(node: ast.Subscript) -> list[ast.expr]:
    return list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]


def _adds(body: list[ast.stmt], gradients: dict[str, bool]) -> dict[str, list[ast.Subscript]]:
    """The entries each array's gradient is added into (``P.grad[idx] += e`` or ``-=``), by array; an array
    whose gradient is used otherwise too (read, assigned) is left out."""
    adds: dict[str, list[ast.Subscript]] = {}
    other: set[str] = set()
    for node in ast.walk(ast.Module(body, [])):
        if isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Add, ast.Sub)):
            p = _gradient_of(node.target, gradients)
            if p is not None:
                assert isinstance(node.target, ast.Subscript)
                if any(isinstance(e, ast.Constant) and e.value is None for e in _index(node.target)):
                    other.add(p)  # ``s.grad[None]``, of a 0-d array: not taken
                else:
                    adds.setdefault(p, []).append(node.target)
                continue
        for child in ast.iter_child_nodes(node):
            p = _gradient_of(child, gradients) if isinstance(child, ast.expr) else None
            if p is not None and not (isinstance(node, ast.AugAssign) and child is node.target):
                other.add(p)
    return {p: found for p, found in adds.items() if p not in other and len({len(_index(s)) for s in found}) == 1}


def _private(found: list[ast.Subscript], outer: str) -> bool:
    """Whether every add has the outer index as the same component of its index."""
    places = [{k for k, e in enumerate(_index(s)) if isinstance(e, ast.Name) and e.id == outer} for s in found]
    return bool(set.intersection(*places))


def _escapes(body: list[ast.stmt], p: str, found: list[ast.Subscript]) -> bool:
    """Whether ``P`` is used otherwise than read by entry, by its shape or by the adds found: passed to a call,
    its gradient reached elsewhere."""
    seen = {id(s.value.value) for s in found if isinstance(s.value, ast.Attribute)}
    for node in ast.walk(ast.Module(body, [])):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Name) and child.id == p and id(child) not in seen and not (
                    isinstance(node, ast.Subscript) and child is node.value
                    or isinstance(node, ast.Attribute) and node.attr == "shape"):
                return True
    return False


def _rank(found: list[ast.Subscript]) -> int:
    return len(_index(found[0]))


def _summed(array: str, part: str, rank: int, chunks: str, fresh: Callable[[str], str]) -> ast.For:
    """``for k in ti.ndrange(*P.shape): P.grad[k] += the sum of P_part[c, k] over the chunks``."""
    ks = [fresh(f"k{d}") for d in range(rank)]
    c, total = fresh("c"), fresh(f"{array}_sum")
    entry = [name(k) for k in ks]
    body: list[ast.stmt] = [
        assign(total, Sym(name(part))[tuple([ast.Constant(0), *entry])]),
        for_range(c, [1, name(chunks)], [augment(total, ast.Add(), Sym(name(part))[tuple([name(c), *entry])])]),
        _plain_add(ast.Subscript(ast.Attribute(name(array), "grad", ast.Load()), _slice(entry), ast.Store()),
                   ast.Add(), name(total))]
    extents = [Sym(name(array)).shape[d].node for d in range(rank)]
    iterated = taichi("ndrange")(*extents).node if rank > 1 else ast.Call(name("range"), extents, [])
    target: ast.expr = ast.Tuple([ast.Name(k, ast.Store()) for k in ks], ast.Store()) if rank > 1 \
        else ast.Name(ks[0], ast.Store())
    return ast.For(target, iterated, body, [])


def _slice(entry: Sequence[ast.expr]) -> ast.expr:
    return entry[0] if len(entry) == 1 else ast.Tuple(list(entry), ast.Load())


def _plain_add(target: ast.Subscript, op: ast.operator, value: ast.expr) -> ast.stmt:
    """``target = target op value``: an add no other thread races (Taichi makes ``+=`` on a global atomic)."""
    read = copy.deepcopy(target)
    read.ctx = ast.Load()
    return ast.Assign([target], ast.BinOp(read, op, value))


def _pure(index: list[ast.expr]) -> bool:
    """Whether evaluating the index twice is evaluating it once: names, numbers and arithmetic."""
    return all(isinstance(n, (ast.Name, ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop,
                              ast.expr_context)) for e in index for n in ast.walk(e))


class _Redirected(ast.NodeTransformer):
    """The adds into shared gradients sent to the chunk's copy; those into private ones made plain."""

    def __init__(self, parts: dict[str, str], private: set[str], chunk: str) -> None:
        self.parts, self.private, self.chunk = parts, private, chunk

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.stmt:
        target = node.target
        p = _gradient_of(target, {*self.parts, *self.private})
        if p is None or not isinstance(node.op, (ast.Add, ast.Sub)):
            return node
        assert isinstance(target, ast.Subscript)
        index = _index(target)
        if p in self.parts:
            target = ast.Subscript(name(self.parts[p]), _slice([name(self.chunk), *index]), ast.Store())
        if not _pure(index):
            return ast.AugAssign(target, node.op, node.value)
        return _plain_add(target, node.op, node.value)
