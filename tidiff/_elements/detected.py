"""Sparsity patterns read from an ndarray kernel's index expressions.

NOTE: [Patterns from index expressions] A kernel over ndarrays whose work is
one parallel loop says which entries each iteration touches: ``out[i, j]`` is
written from ``u[i - 1, j]``, ``u[i, j + 1]``, ``u[(i + 1) % n, j]``. Where
every index of the differentiated input and of the output is an integer
expression of the loop's indices, of inner loops' counters with ranges known
at launch, of shapes, constants and locals assigned once from such
expressions, the pattern is those index expressions evaluated at every
iteration (NumPy, one array per index over the whole loop): the Jacobian has
an entry for each output entry an iteration writes and each input entry it
reads; the Hessian of a scalar output, for each two input entries one
iteration reads. Branches are taken as both sides and entries outside the
arrays are dropped (a boundary test ``if i > 0`` guards ``u[i - 1]``), so the
pattern is the entries the code may touch: a superset where a branch never
runs, whose extra entries come out as zeros. A kernel that is not of this
form (indices read from arrays, runtime loops of unknown length, an array
passed to a func, more than one top-level loop) is not read: its pattern is
given as ``sparsity=``.
"""
from __future__ import annotations

import ast
import itertools
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import taichi as ti

from .._arrays import to_numpy
from .._lang.parse import parse, resolve, without_docstring
from .._lang.rebinding import bound_in
from .._signature import ArgSpec

_ATOMICS = (ti.atomic_add, ti.atomic_sub, ti.atomic_min, ti.atomic_max)
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod}


class NotDetected(Exception):
    """Why a kernel's pattern cannot be read from its code."""

    def refusal(self, call: str, name: str) -> TypeError:
        """The error a user gets, naming the kernel, the reason and what to do instead."""
        return TypeError(f"{call}: the sparsity of {name} is not read from its code: {self}; give it as sparsity= "
                         "(the pattern)")


class _Access:
    """An index into an ndarray parameter, with the inner loops enclosing it."""

    def __init__(self, node: ast.Subscript, loops: tuple[ast.For, ...]) -> None:
        self.node, self.loops = node, loops
        index = node.slice
        self.parts = list(index.elts) if isinstance(index, ast.Tuple) else [index]
        if isinstance(index, ast.Constant) and index.value is None:  # out[None]: the one entry of a 0-d array
            self.parts = []


class KernelPattern:
    """The parsed loop of an ndarray kernel (``td.function(kernel, ...)``): its reads of one input and writes of
    its output, from which ``pattern`` builds the Jacobian's or Hessian's entries at given shapes."""

    def __init__(self, fn: Any, p: int) -> None:
        try:
            parsed = parse(fn.kernel)
        except OSError as e:  # no source file (a kernel typed at the prompt)
            raise NotDetected(f"its source cannot be read ({e})") from None
        self.namespace, self.constants, self.name = parsed.namespace, fn.constants, fn.name
        self.input, self.output = fn.inputs[p], fn.outputs[0]
        self.arrays = set(fn.inputs) | set(fn.outputs) | {n for n, v in fn.constants.items() if np.ndim(v) > 0}
        body = without_docstring(parsed.tree.body)
        loops = [s for s in body if isinstance(s, ast.For)]
        if len(loops) != 1:
            raise NotDetected(f"it has {len(loops)} top-level loops, not one")
        self.loop = loops[0]
        self.top = {s for s in body if s is not self.loop}
        for s in self.top:
            self._no_array_reads(s, "a statement outside the loop")
        self.targets = _names(self.loop.target, "the loop's target")
        self.assigned = _assigned_once(parsed.tree)
        shared = bound_in(self.top) & bound_in(self.loop.body)
        if shared:
            raise NotDetected(f"its loop updates `{sorted(shared)[0]}`, a variable of the kernel's top level (a value "
                              "carried between iterations)")
        self.atomics = {id(node.args[0]) for node in ast.walk(self.loop) if isinstance(node, ast.Call) and node.args
                        and resolve(node.func, self.namespace) in _ATOMICS}
        self.reads: list[_Access] = []
        self.writes: list[_Access] = []
        self._collect(self.loop.body, ())

    def _no_array_reads(self, node: ast.AST, where: str) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Name) and sub.value.id in self.arrays:
                raise NotDetected(f"{where} indexes `{sub.value.id}`")

    def _collect(self, body: Sequence[ast.stmt], loops: tuple[ast.For, ...]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.For):
                self._no_array_reads(stmt.iter, "a loop's range")
                self._collect(stmt.body, loops + (stmt,))
                continue
            self._uses(stmt, loops)

    def _uses(self, stmt: ast.stmt, loops: tuple[ast.For, ...]) -> None:
        seen: set[int] = set()
        for node in ast.walk(stmt):
            if isinstance(node, ast.For):
                self._collect([node], loops)  # a loop nested in a branch
                seen.update(id(n) for n in ast.walk(node))
            if id(node) in seen:
                continue
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
                name = node.value.id
                seen.add(id(node.value))
                if name == self.input:
                    self.reads.append(_Access(node, loops))
                elif name == self.output:
                    if isinstance(node.ctx, ast.Load) and id(node) not in self.atomics:
                        raise NotDetected(f"it reads its output `{ast.unparse(node)}`")
                    self.writes.append(_Access(node, loops))
                elif name in self.arrays and not isinstance(node.ctx, ast.Load):
                    raise NotDetected(f"it writes `{ast.unparse(node)}`, which is not its output")
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr == "shape":
                seen.add(id(node.value))
            elif isinstance(node, ast.Name) and node.id in (self.input, self.output):
                raise NotDetected(f"it passes `{node.id}` on (`{ast.unparse(stmt).splitlines()[0]}`)")

    # -- at given shapes ------------------------------------------------------------------------------------------
    def integers(self, specs: Sequence[ArgSpec], arrays: Sequence[Any]) -> dict[str, np.ndarray]:
        """The integer arrays of a call (inputs and constants) by name: indices may read them (``x[springs[s, 0]]``),
        so a pattern is kept for their values."""
        named = {s.name: a for s, a in zip(specs, arrays, strict=True)}
        named.update({n: v for n, v in self.constants.items() if n in self.arrays})
        values = {n: np.asarray(to_numpy(a, n, self.name)) for n, a in named.items()}
        return {n: v for n, v in values.items() if v.ndim > 0 and v.dtype.kind in "iu"}

    def pattern(self, specs: dict[str, ArgSpec], integers: dict[str, np.ndarray], hessian: bool, call: str) -> Any:
        """The pattern at the arrays' shapes (``specs`` by parameter name) and integer arrays' values as a scipy CSC
        matrix: outputs by the input's values for a Jacobian, the input's values by themselves for a Hessian."""
        shapes = {name: tuple(s.shape) for name, s in specs.items()}
        shapes.update({n: np.shape(v) for n, v in self.constants.items() if n in self.arrays})
        try:
            return self._pattern(shapes, integers, hessian)
        except NotDetected as reason:
            raise reason.refusal(call, self.name) from None

    def _pattern(self, shapes: dict[str, tuple[int, ...]], integers: dict[str, np.ndarray], hessian: bool) -> Any:
        import scipy.sparse as sparse

        env = _Env(self, shapes, integers)
        points = env.domain(self.loop)
        n_in = int(np.prod(shapes[self.input], dtype=np.int64))
        n_out = 1 if hessian else int(np.prod(shapes[self.output], dtype=np.int64))
        reads = list(self._flat(env, points, self.reads, shapes[self.input]))
        rows_from = reads if hessian else list(self._flat(env, points, self.writes, shapes[self.output]))
        rows, cols = [], []
        for (r, r_ok), (c, c_ok) in itertools.product(rows_from, reads):
            ok = r_ok & c_ok
            rows.append(r[ok])
            cols.append(c[ok])
        size = (n_in if hessian else n_out, n_in)
        data = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        coo = sparse.coo_matrix((np.ones(data.size, np.int32), (data, np.concatenate(cols) if cols else data)),
                                shape=size)
        return sparse.csc_matrix((sparse.csc_matrix(coo) != 0).astype(np.int8))

    def _flat(self, env: _Env, points: dict[str, np.ndarray], accesses: Sequence[_Access],
              shape: tuple[int, ...]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Per access and per value of its inner loops' counters: the flat entry each iteration touches (all the
        entries of an element, for an index shorter than the array's shape) and whether it is inside."""
        count = next(iter(points.values())).size if points else 1
        for access in accesses:
            indexed, element = shape[:len(access.parts)], shape[len(access.parts):]
            if len(access.parts) > len(shape):
                raise NotDetected(f"`{ast.unparse(access.node)}` has more indices than the array has axes")
            for inner in env.counters(access.loops):
                scope = {**points, **inner}
                index = [np.broadcast_to(np.asarray(env.value(e, scope), np.int64), (count,)) for e in access.parts]
                inside = np.ones(count, bool)
                for k, extent in zip(index, indexed, strict=True):
                    inside &= (k >= 0) & (k < extent)
                base = np.ravel_multi_index([np.where(inside, k, 0) for k in index], indexed) if index else \
                    np.zeros(count, np.int64)
                size = int(np.prod(element, dtype=np.int64))
                for e in range(size):
                    yield base * size + e, inside


class _Env:
    """Integer values of the names index expressions use, at given shapes."""

    def __init__(self, kernel: KernelPattern, shapes: dict[str, tuple[int, ...]],
                 integers: dict[str, np.ndarray]) -> None:
        self.kernel, self.shapes, self.integers = kernel, shapes, integers
        self.top: dict[str, Any] = {}
        for stmt in sorted(kernel.top, key=lambda s: s.lineno):
            self._bind_top(stmt)

    def _bind_top(self, stmt: ast.stmt) -> None:
        if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
            return
        target, value = stmt.targets[0], stmt.value
        pairs = list(zip(target.elts, value.elts, strict=False)) if isinstance(target, ast.Tuple) and isinstance(
            value, ast.Tuple) else [(target, value)]
        for t, v in pairs:
            if isinstance(t, ast.Name):
                try:
                    self.top[t.id] = self.value(v, {})
                except NotDetected:
                    pass

    def domain(self, loop: ast.For) -> dict[str, np.ndarray]:
        """Each target's value at every iteration of the top-level loop (flattened, C order)."""
        ranges = self._ranges(loop, {})
        if len(ranges) != len(self.kernel.targets):
            raise NotDetected(f"the loop `for {ast.unparse(loop.target)} in {ast.unparse(loop.iter)}` has "
                              f"{len(self.kernel.targets)} targets over {len(ranges)} axes")
        grids = np.meshgrid(*[np.asarray(r, np.int64) for r in ranges], indexing="ij")
        return {name: g.ravel() for name, g in zip(self.kernel.targets, grids, strict=True)}

    def counters(self, loops: Sequence[ast.For]) -> Iterator[dict[str, int]]:
        """Every combination of the inner loops' counters (a loop's range may depend on outer counters)."""
        if not loops:
            yield {}
            return
        for outer in self.counters(loops[:-1]):
            names = _names(loops[-1].target, "an inner loop's target")
            ranges = self._ranges(loops[-1], outer)
            if len(ranges) != len(names):
                raise NotDetected(f"the inner loop `{ast.unparse(loops[-1].target)}` has {len(names)} targets")
            for values in itertools.product(*ranges):
                yield {**outer, **dict(zip(names, values, strict=True))}

    def _ranges(self, loop: ast.For, scope: dict[str, Any]) -> list[range]:
        it = _unstatic(loop.iter)
        if isinstance(it, ast.Name) and it.id in self.shapes:  # for i, j in u: over u's shape
            return [range(n) for n in self.shapes[it.id]]
        if isinstance(it, ast.Call) and not it.keywords:
            callee = resolve(it.func, self.kernel.namespace)
            if callee is range:
                return [range(*(self._int(a, scope) for a in it.args))]
            if callee is ti.ndrange:
                return [range(*(self._int(e, scope) for e in a.elts)) if isinstance(a, ast.Tuple)
                        else range(self._int(a, scope)) for a in it.args]
        raise NotDetected(f"the loop over `{ast.unparse(loop.iter)}` (range, ti.ndrange or an array's shape only)")

    def _int(self, node: ast.expr, scope: dict[str, Any]) -> int:
        value = self.value(node, scope)
        if np.ndim(value) != 0:
            raise NotDetected(f"`{ast.unparse(node)}` bounds a loop but varies with the outer loop's index")
        return int(value)

    def value(self, node: ast.expr, scope: dict[str, Any]) -> Any:
        """The integer value of ``node`` (an array of one per iteration where it depends on the loop's index)."""
        node = _unstatic(node)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name):
            return self._name(node.id, scope)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](self.value(node.left, scope), self.value(node.right, scope))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = self.value(node.operand, scope)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in self.integers:
            return self._entries(node, self.integers[node.value.id], scope)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "shape" \
                and isinstance(node.value.value, ast.Name) and node.value.value.id in self.shapes:
            return self.shapes[node.value.value.id][self._int(node.slice, scope)]
        if isinstance(node, ast.Call) and len(node.args) == 2 and not node.keywords:
            callee = resolve(node.func, self.kernel.namespace)
            if callee in (min, ti.min):
                return np.minimum(self.value(node.args[0], scope), self.value(node.args[1], scope))
            if callee in (max, ti.max):
                return np.maximum(self.value(node.args[0], scope), self.value(node.args[1], scope))
        raise NotDetected(f"the index expression `{ast.unparse(node)}`")

    def _entries(self, node: ast.Subscript, array: np.ndarray, scope: dict[str, Any]) -> Any:
        """``springs[s, 0]``: the integer array's entries at every iteration."""
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if len(parts) != array.ndim:
            raise NotDetected(f"the index expression `{ast.unparse(node)}` (one index per axis of the array)")
        index = np.broadcast_arrays(*(np.asarray(self.value(e, scope), np.int64) for e in parts))
        for k, extent in zip(index, array.shape, strict=True):
            if k.size and (k.min() < 0 or k.max() >= extent):
                raise NotDetected(f"`{ast.unparse(node)}` reads outside `{ast.unparse(node.value)}`")
        return array[tuple(index)].astype(np.int64)

    def _name(self, name: str, scope: dict[str, Any]) -> Any:
        if name in scope:
            return scope[name]
        if name in self.top:
            return self.top[name]
        if name in self.kernel.assigned:  # a local assigned once in the loop, from an index expression
            return self.value(self.kernel.assigned[name], scope)
        value = self.kernel.constants.get(name, self.kernel.namespace.get(name))
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return int(value)
        raise NotDetected(f"the name `{name}` in an index (not an integer known at launch)")


def _unstatic(node: ast.expr) -> ast.expr:
    """``e`` for ``ti.static(e)``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "static" \
            and len(node.args) == 1:
        return node.args[0]
    return node


def _names(target: ast.expr, what: str) -> list[str]:
    elts = target.elts if isinstance(target, ast.Tuple) else [target]
    if not all(isinstance(e, ast.Name) for e in elts):
        raise NotDetected(f"{what} `{ast.unparse(target)}`")
    return [e.id for e in elts if isinstance(e, ast.Name)]


def _assigned_once(tree: ast.FunctionDef) -> dict[str, ast.expr]:
    """Names bound exactly once in the kernel, by ``name = e`` (or ``a, b = e1, e2``), with their ``e``."""
    counts: dict[str, int] = {}
    values: dict[str, ast.expr] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            counts[node.id] = counts.get(node.id, 0) + 1
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if isinstance(target, ast.Name):
            values[target.id] = node.value
        elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) and len(target.elts) == len(
                node.value.elts):  # a, b = springs[s, 0], springs[s, 1]
            values.update((t.id, v) for t, v in zip(target.elts, node.value.elts, strict=True)
                          if isinstance(t, ast.Name))
    return {n: e for n, e in values.items() if counts.get(n) == 1}
