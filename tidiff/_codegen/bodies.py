"""The ``@ti.func`` bodies that derived functions generate from their parent's body, built as ASTs.

Every derivative body calls the parent's tangent function (``_tangent``:
forward pushes of basis tangents) or its reverse function (``_adjoint``: one
call per output component) and assembles the results; :mod:`tidiff._modes`
says which. LLVM shares the repeated primal work between the pushes once the
calls are inlined, so the generated code stays as fast as hand-written
derivatives. Results are returned as flat tuples; see ``_tree``.

Every name a body uses, its parameters included, comes from one
:class:`~tidiff._lang.naming.Namer` (a user's parameter keeps its name
unless it would clash), and callees are bound in the body's namespace: no
name of the user's can break a body.

NOTE: [Flat values] A spec with more than two dims is stored as a flat
``ti.Vector`` in row-major order, in kernels and in generated bodies alike;
``entry`` and ``literal`` below are the only places that know this.

NOTE: [Reverse bodies] A gradient by forward pushes costs one push per
input component, and a Hessian built on it one second-order push per pair:
81 for a 3x3 argument. When the reverse transform takes the parent, its reverse
function gives all of a gradient in one call, and the Hessian becomes one
forward push through that call per input component (forward over reverse,
as JAX's ``hessian``). W2, the Neo-Hookean Hessian at B=1e5 on this 2-core
machine: 69 -> 18-25 ms (1.5x the closed form with a fresh output, measured
interleaved), first call 1.6 -> 1.9 s.
"""
from __future__ import annotations

import ast
import contextlib
import itertools
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import taichi as ti
from taichi.lang.util import to_taichi_type

from .. import _modes
from .._lang.compile import compile_source, generated_sources, mark
from .._lang.naming import RULE_HELPERS, Namer
from .._lang.sym import Sym, node_of
from .._rules.kept import KEPT_CALL, keep_push, kept_count, stop_keeping_push
from .._signature import ArgSpec
from .._tangent.lanes import widened_name

TI = Sym(ast.Name("ti", ast.Load()))


def scalar_type(dtype: Any) -> Sym:
    """``ti.f64`` for float64, and so on."""
    return getattr(TI, to_taichi_type(np.dtype(dtype)).to_string())


def _subscript(value: Sym, index: Sequence[Any]) -> Sym:
    nodes = [node_of(i) for i in index]
    return Sym(ast.Subscript(value.node, nodes[0] if len(nodes) == 1 else ast.Tuple(nodes, ast.Load()), ast.Load()))


def entry(value: Sym, shape: tuple[int, ...], index: Sequence[Any]) -> Sym:
    """Element ``index`` of a value of logical ``shape`` held in ``value`` (NOTE: [Flat values])."""
    if len(shape) == 0:
        return value
    if len(shape) <= 2:
        return _subscript(value, index)
    return _subscript(value, [int(np.ravel_multi_index(tuple(index), shape))])


def literal(entries: dict[tuple[int, ...], Any], shape: tuple[int, ...], dtype: Any) -> Sym:
    """A value of ``shape`` whose element ``index`` is ``entries[index]``."""
    if len(shape) == 0:
        return TI.cast(entries[()], scalar_type(dtype))
    if len(shape) == 2:
        rows: list[ast.expr] = [ast.List([node_of(entries[(i, j)]) for j in range(shape[1])], ast.Load())
                                for i in range(shape[0])]
        return TI.Matrix(Sym(ast.List(rows, ast.Load())), dt=scalar_type(dtype))
    items = [node_of(entries[i]) for i in itertools.product(*[range(n) for n in shape])]
    return TI.Vector(Sym(ast.List(items, ast.Load())), dt=scalar_type(dtype))


def basis(spec: ArgSpec, hot: int | None) -> Sym:
    """A tangent for ``spec``: one at flat position ``hot``, zeros elsewhere (``hot=None``: zero)."""
    indices = list(itertools.product(*[range(n) for n in spec.shape]))
    return literal({idx: 1.0 if k == hot else 0.0 for k, idx in enumerate(indices)}, spec.shape, spec.dtype)


def zero(shape: tuple[int, ...], dtype: Any) -> Sym:
    """A zero value of logical ``shape`` (flat past rank 2)."""
    if len(shape) == 0:
        return TI.cast(0.0, scalar_type(dtype))
    if len(shape) == 2:
        return TI.Matrix.zero(scalar_type(dtype), shape[0], shape[1])
    return TI.Vector.zero(scalar_type(dtype), int(np.prod(shape)))


def _static_index(shape: tuple[int, ...], p: int) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(p, shape)) if shape else ()


def _dynamic_index(shape: tuple[int, ...], p: Sym) -> tuple[Sym, ...]:
    """The index of flat position ``p`` (a runtime name) of a value of ``shape`` (rank 1 or 2)."""
    if len(shape) != 2:  # rank 1, or flat (NOTE: [Flat values])
        return (p,)
    return (Sym(ast.BinOp(p.node, ast.FloorDiv(), ast.Constant(shape[1]))),
            Sym(ast.BinOp(p.node, ast.Mod(), ast.Constant(shape[1]))))


class BodyWriter:
    """The statements of one generated ``@ti.func``, its namespace and the namer of all its names."""

    def __init__(self, name: str, param_hints: Sequence[str]) -> None:
        self.namer = Namer(["ti", "range", RULE_HELPERS])
        self.params = [self.namer.fresh(h) for h in param_hints]
        self.name = self.namer.fresh(name)
        self.namespace: dict[str, Any] = {"ti": ti}
        self.stmts: list[ast.stmt] = []
        self._bound: dict[int, str] = {}
        self.wide = False  # whether the body holds vector-mode pushes
        self.looped = False  # whether some pushes run in a runtime loop

    def args(self, k: int | None = None, n: int | None = None) -> list[Sym]:
        """The parameters ``k:k+n`` as names (all by default)."""
        params = self.params if k is None else self.params[k:k + (n if n is not None else len(self.params))]
        return [Sym(ast.Name(p, ast.Load())) for p in params]

    def callee(self, obj: Any, hint: str) -> Sym:
        """A namespace name for ``obj`` (one per object)."""
        if id(obj) not in self._bound:
            self._bound[id(obj)] = name = self.namer.fresh(hint)
            self.namespace[name] = obj
        return Sym(ast.Name(self._bound[id(obj)], ast.Load()))

    def let(self, hint: str, value: Any) -> Sym:
        """``hint = value`` under a fresh name; returns the name."""
        name = self.namer.fresh(hint)
        self.stmts.append(ast.Assign([ast.Name(name, ast.Store())], node_of(value)))
        return Sym(ast.Name(name, ast.Load()))

    def store(self, target: Sym, value: Any) -> None:
        """``target = value`` for a subscript or name ``target``."""
        node = target.node
        stored: ast.expr
        if isinstance(node, ast.Subscript):
            stored = ast.Subscript(node.value, node.slice, ast.Store())
        else:
            assert isinstance(node, ast.Name), "a store target is a subscript or a name"
            stored = ast.Name(node.id, ast.Store())
        self.stmts.append(ast.Assign([stored], node_of(value)))

    def do(self, value: Any) -> None:
        """``value`` (a call) as a statement."""
        self.stmts.append(ast.Expr(node_of(value)))

    @contextlib.contextmanager
    def pushes(self, n: int, fn: Any) -> Iterator[Sym]:
        """``for p in range(n):`` around the pushes of ``fn`` written in the block; where ``fn``'s code decomposes
        (a kept call), the decompositions are kept from the first push when a kernel keeps values (NOTE: [Kept
        across pushes] in ``_rules/kept.py``)."""
        if not any(KEPT_CALL in text for text in generated_sources(fn)):
            with self.loop("p", n) as p:
                yield p
            return
        start = self.let("kept_from", self.callee(kept_count, "kept_count")())
        with self.loop("p", n) as p:
            self.do(self.callee(keep_push, "keep_push")(p, start))
            yield p
            self.do(self.callee(stop_keeping_push, "stop_keeping_push")())

    @contextlib.contextmanager
    def loop(self, hint: str, n: int) -> Iterator[Sym]:
        """``for hint in range(n):`` around the statements written in the block."""
        var = self.namer.fresh(hint)
        outer, self.stmts = self.stmts, []
        yield Sym(ast.Name(var, ast.Load()))
        body, self.stmts = self.stmts or [ast.Pass()], outer
        self.stmts.append(ast.For(ast.Name(var, ast.Store()),
                                  ast.Call(ast.Name("range", ast.Load()), [ast.Constant(n)], []), body, []))

    @contextlib.contextmanager
    def when(self, test: ast.expr) -> Iterator[None]:
        """``if test:`` around the statements written in the block."""
        outer, self.stmts = self.stmts, []
        yield
        body, self.stmts = self.stmts or [ast.Pass()], outer
        self.stmts.append(ast.If(test, body, []))

    def compile(self, results: Sequence[Any], single: bool, tag: str) -> Any:
        """The finished ``@ti.func``; a single result is returned bare, else as a flat tuple."""
        value = node_of(results[0]) if single else ast.Tuple([node_of(r) for r in results], ast.Load())
        fn = ast.FunctionDef(self.name, ast.arguments([], [ast.arg(p) for p in self.params], None, [], [], None, []),
                             self.stmts + [ast.Return(value)], [ast.Attribute(TI.node, "func", ast.Load())], None)
        body = compile_source(fn, self.name, self.namespace, tag)
        mark(body, wide=self.wide)
        return body


# -- the tangent, cotangent-map and Jacobian bodies ------------------------------------------------
def tangent_body(name: str, parent: Any, specs: Sequence[ArgSpec], n_out: int, single: bool) -> Any:
    """``(x..., dx for each float x...) -> (y_1..y_m, dy_1..dy_m)``, flat, from the parent's tangent function."""
    active = tuple(s.is_float for s in specs)
    w = BodyWriter(name, [s.name for s in specs] + ["d" + s.name for s in specs if s.is_float])
    r = w.let("r", w.callee(_modes.tangent_function(parent, active), name_of(parent) + "_jvp")(*w.args()))
    if single:
        return w.compile([r[0], r[1]], single=False, tag="jvp")
    return w.compile([r[0][j] for j in range(n_out)] + [r[1][j] for j in range(n_out)], single=False, tag="jvp")


def name_of(fn: Any) -> str:
    return getattr(fn, "__name__", "f")


def _unravel(shape: tuple[int, ...], p: Sym) -> tuple[Sym, ...]:
    """The multi-index of flat position ``p`` (a runtime value) in ``shape``, row-major."""
    index = []
    stride = int(np.prod(shape))
    for k, n in enumerate(shape):
        stride //= n
        q = p if stride == 1 else Sym(ast.BinOp(p.node, ast.FloorDiv(), ast.Constant(stride)))
        index.append(q if k == 0 else Sym(ast.BinOp(q.node, ast.Mod(), ast.Constant(n))))
    return tuple(index)


class _Pushes:
    """Calls of the parent's tangent (or reverse) function from inside a body being written."""

    def __init__(self, w: BodyWriter, parent: Any, specs: Sequence[ArgSpec], active: tuple[bool, ...],
                 out_specs: Sequence[ArgSpec] | None = None, single_out: bool = True) -> None:
        """``out_specs``, where given, are the parent's outputs, kept from looped pushes (:meth:`_kept`)."""
        self.w, self.parent, self.specs, self.active = w, parent, specs, active
        self.out_specs, self.single_out = out_specs, single_out
        self.primals = w.args(0, len(specs))
        self.value: Sym | None = None  # the parent's outputs, as a push or a reverse call returned them
        self.looped = False  # whether some pushes run in a runtime loop

    def _kept(self) -> list[Sym] | None:
        """Names declared before a loop of pushes, to which each push stores the parent's outputs.

        NOTE: [The value beside looped pushes] A Jacobian's value (or aux) is
        the primal output of its own pushes, never a second call of the parent
        after the loop: that call is the user's code as Taichi compiles it in
        this kernel, and Taichi 1.7.4's optimizer can get it wrong where the
        pushes' renamed copy is right (long run, seed 11015: aux 0.4096 beside
        a right Jacobian, torch 1.6036; tests/test_taichi_pitfalls.py). It also
        saves that call's compile time.
        """
        if self.value is not None or self.out_specs is None:
            return None
        return [self.w.let(f"value_{o}", zero(s.shape, s.dtype)) for o, s in enumerate(self.out_specs)]

    def _keep(self, kept: list[Sym] | None, out: Sym) -> None:
        """Store a push's primal outputs ``out`` into the ``kept`` names (a no-op where none were declared)."""
        if kept is None:
            return
        for o, name in enumerate(kept):
            self.w.store(name, out if self.single_out else out[o])
        self.value = kept[0] if self.single_out else Sym(ast.Tuple([k.node for k in kept], ast.Load()))

    def each(self, argnums: Sequence[int], a: int, store: Any) -> None:
        """Push the basis tangent of every component of argument ``a``; ``store(dout, index)`` consumes each.

        ``dout`` is the parent's tangent output for that push; ``index`` the
        component's multi-index in ``a``'s shape (constants, or runtime values in a loop).
        """
        w, spec = self.w, self.specs[a]
        order = sorted(argnums)  # the tangent function takes its tangents in parameter order
        if _modes.widens(self.parent, self.active, spec.size):
            width = spec.size
            fn = _modes.tangent_function(self.parent, self.active, width)
            w.wide = w.wide or width > 1
            lanes = [basis(self.specs[b], p if b == a else None) for p in range(width) for b in order]
            t = w.let(f"t_{a}", w.callee(fn, widened_name(name_of(self.parent) + "_jvp", width))(*self.primals, *lanes))
            self.value = self.value or t[0]
            for lane in range(width):
                store(t[lane + 1], _static_index(spec.shape, lane))
            return
        self.looped = True
        fn = _modes.tangent_function(self.parent, self.active)
        kept = self._kept()
        with w.pushes(spec.size, fn) as p:
            e = w.let("e", zero(spec.shape, spec.dtype))
            w.store(entry(e, (spec.size,) if len(spec.shape) > 2 else spec.shape, _dynamic_index(spec.shape, p)), 1.0)
            tangents = [e if b == a else basis(self.specs[b], None) for b in order]
            t = w.let("t", w.callee(fn, name_of(self.parent) + "_jvp")(*self.primals, *tangents))
            self._keep(kept, t[0])
            store(t[1], _unravel(spec.shape, p))

    def one_loop(self, argnums: Sequence[int]) -> bool:
        """Whether the pushes of all ``argnums`` run in one runtime loop over all their components.

        NOTE: [One loop of pushes] Each argument's pushes are one call of the
        tangent function (widened, or in a loop of its own), and Taichi inlines
        every call: k arguments are k copies of the parent's code, and a chain
        of n transforms k**n copies, whose compile time grows with the square of
        their size (``td.hessian`` by three arguments of a function with a
        3x3 inverse in a loop: 9 copies, over 12 minutes; long run, seed 9302).
        Where the calls would together pass LANE_BUDGET (NOTE: [Vector-mode
        pushes]), all components are pushed by one call in one loop.
        """
        if len(argnums) < 2:
            return False
        size = sum(self.specs[a].size for a in argnums)
        return size * _modes.lane_cost(self.parent, self.active) > _modes.LANE_BUDGET

    def every(self, argnums: Sequence[int], stores: dict[int, Any], one_loop: bool) -> None:
        """Push the basis tangents of every argument in ``argnums``, in one loop (:meth:`one_loop` said so)
        or argument by argument; ``stores[a](dout, index)`` consumes argument ``a``'s."""
        if one_loop:
            self.all_in_one_loop(argnums, stores)
            return
        for a in argnums:
            self.each(argnums, a, stores[a])

    def all_in_one_loop(self, argnums: Sequence[int], stores: dict[int, Any]) -> None:
        """Push the basis tangent of every component of every argument in ``argnums`` by one call in one
        runtime loop (NOTE: [One loop of pushes]); ``stores[a](dout, index)`` consumes argument ``a``'s."""
        w, order = self.w, sorted(argnums)
        self.looped = True
        fn = _modes.tangent_function(self.parent, self.active)
        offsets = dict(zip(order, itertools.accumulate([self.specs[a].size for a in order], initial=0), strict=False))
        total = sum(self.specs[a].size for a in order)
        kept = self._kept()
        with w.pushes(total, fn) as p:
            e = w.let("e", zero((total,), self.specs[order[0]].dtype))
            w.store(_subscript(e, [p]), 1.0)
            tangents = []
            for b in order:
                spec = self.specs[b]
                indices = itertools.product(*[range(n) for n in spec.shape])
                entries = {idx: _subscript(e, [offsets[b] + k]) for k, idx in enumerate(indices)}
                tangents.append(literal(entries, spec.shape, spec.dtype))
            t = w.let("t", w.callee(fn, name_of(self.parent) + "_jvp")(*self.primals, *tangents))
            self._keep(kept, t[0])
            for a in order:
                start, spec = offsets[a], self.specs[a]
                test = ast.Compare(p.node, [ast.Lt()], [ast.Constant(start + spec.size)])
                if start:
                    test = ast.Compare(ast.Constant(start), [ast.LtE(), ast.Lt()],
                                       [p.node, ast.Constant(start + spec.size)])
                with w.when(test):
                    q = p if not start else Sym(ast.BinOp(p.node, ast.Sub(), ast.Constant(start)))
                    stores[a](t[1], _unravel(spec.shape, q))

    def reverse(self, n_outputs: int, cotangents: Sequence[Any]) -> Sym:
        """One call of the parent's reverse function: ``(out, ct of each active argument...)``."""
        fn = _modes.reverse_function(self.parent, self.active, n_outputs)
        r = self.w.let("r", self.w.callee(fn, name_of(self.parent) + "_vjp")(*self.primals, *cotangents))
        self.value = self.value or r[0]
        return r


def _out(dout: Sym, o: int, single_out: bool) -> Sym:
    return dout if single_out else dout[o]


class Sink(Protocol):
    """Where :func:`jacobian_blocks` puts a Jacobian's entries: :class:`LocalBlocks`, :class:`OutputBlocks`, or an
    element kernel's sparse matrix (``_elements/assembled.py``)."""

    def open(self, o: int, a: int, full: tuple[int, ...], dtype: Any, constant_positions: bool = False,
             in_loop: bool = False) -> None: ...

    def put(self, o: int, a: int, full: tuple[int, ...], index: Sequence[Any], value: Any) -> None: ...

    def put_whole(self, o: int, a: int, full: tuple[int, ...], value: Any) -> None: ...

    def close(self) -> None: ...


class LocalBlocks:
    """Jacobian blocks held in local values of a body, which returns them (NOTE: [Flat values]).

    A block whose entries all come at constant positions (reverse calls) is
    built at the end as one literal of its entries instead of a zero value
    stored into entry by entry: Taichi's store-to-load forwarding costs about
    the square of the stores into a local value (NOTE: [Blocks written to the output]).
    """

    def __init__(self, w: BodyWriter) -> None:
        self.w = w
        self.blocks: dict[tuple[int, int], Sym] = {}
        self.deferred: dict[tuple[int, int], tuple[tuple[int, ...], Any, dict[tuple[int, ...], Any]]] = {}
        self.stored: set[tuple[int, int]] = set()  # scalar blocks written inside a loop

    def open(self, o: int, a: int, full: tuple[int, ...], dtype: Any, constant_positions: bool = False,
             in_loop: bool = False) -> None:
        """Start block (o, a); ``constant_positions``: every entry will come at a constant position;
        ``in_loop``: its entries are written inside a runtime loop (a scalar block too)."""
        if full and constant_positions:
            self.deferred[o, a] = (full, dtype, {})
        elif full or in_loop:
            self.blocks[o, a] = self.w.let(f"J_{o}_{a}", zero(full, dtype))
            if not full:
                self.stored.add((o, a))

    def put(self, o: int, a: int, full: tuple[int, ...], index: Sequence[Any], value: Any) -> None:
        """Entry ``index`` (a multi-index into ``full``, constants or runtime values) of block (o, a)."""
        if not full and (o, a) in self.stored:
            self.w.store(self.blocks[o, a], value)
        elif not full:
            self.blocks[o, a] = self.w.let(f"J_{o}_{a}", value)
        elif (o, a) in self.deferred:
            self.deferred[o, a][2][tuple(index)] = value  # of names bound once: valid at close
        elif len(full) <= 2:
            self.w.store(_subscript(self.blocks[o, a], list(index)), value)
        else:
            self.w.store(_subscript(self.blocks[o, a], [_flat_position(full, tuple(index))]), value)

    def put_whole(self, o: int, a: int, full: tuple[int, ...], value: Any) -> None:
        """All of block (o, a) at once (a block as the arguments' shape)."""
        self.blocks[o, a] = self.w.let(f"J_{o}_{a}", value)

    def close(self) -> None:
        """Build the deferred blocks from their entries (missing entries are zeros)."""
        for (o, a), (full, dtype, entries) in self.deferred.items():
            every = [entries.get(idx, 0.0) for idx in itertools.product(*[range(n) for n in full])]
            shape = full if len(full) <= 2 else (len(every),)
            values = dict(zip(itertools.product(*[range(n) for n in shape]), every, strict=True))
            self.blocks[o, a] = self.w.let(f"J_{o}_{a}", literal(values, shape, dtype))
        self.deferred.clear()


class EntrySink:
    """A sink putting each entry where it goes as it comes: nothing to open or close, a whole block entry by entry
    (``put`` is the subclass's)."""

    def open(self, o: int, a: int, full: tuple[int, ...], dtype: Any, constant_positions: bool = False,
             in_loop: bool = False) -> None:
        pass

    def close(self) -> None:
        pass

    def put(self, o: int, a: int, full: tuple[int, ...], index: Sequence[Any], value: Any) -> None:
        raise NotImplementedError

    def put_whole(self, o: int, a: int, full: tuple[int, ...], value: Any) -> None:
        for idx in itertools.product(*[range(n) for n in full]):
            self.put(o, a, full, idx, entry(value, full, idx))


class OutputBlocks(EntrySink):
    """Jacobian blocks written straight into a kernel's output arrays at element ``index``.

    NOTE: [Blocks written to the output] A Jacobian assembled in a local value
    of a body, column by column at a runtime index (pushes in a runtime
    loop), makes Taichi's store-to-load forwarding and reaching-definition
    passes cost about the square of the block's size: ``td.hessian`` of a
    32-vector function compiled in 6.9 s, 285 s at 64. Written into the
    output array instead, it compiles in 0.44 s (0.95 s at 64) and runs as
    fast (2.7 against 3.0 ms, B = 1000). Host calls use a kernel doing that
    (``_transforms.PointwiseJacobian``); inside kernels a body must return
    the value, so it keeps the local one.
    """

    def __init__(self, w: BodyWriter, arrays: dict[tuple[int, int], Sym], index: Sym) -> None:
        self.w, self.arrays, self.index = w, arrays, index

    def put(self, o: int, a: int, full: tuple[int, ...], index: Sequence[Any], value: Any) -> None:
        self.w.store(_subscript(self.arrays[o, a], [self.index, *index]), value)


def jacobian_blocks(w: BodyWriter, parent: Any, specs: Sequence[ArgSpec], argnums: Sequence[int],
                    out_specs: Sequence[ArgSpec], single_out: bool, wanted: Sequence[int],
                    flavour: str, sink: Sink, keep_value: bool = False) -> Sym | None:
    """Write Jacobian blocks, one per (output in ``wanted``, argnum), of shape ``out.shape + arg.shape``,
    into ``sink``; returns the parent's outputs where a push or reverse call computed them (else None),
    and, with ``keep_value``, where pushes in a loop did (NOTE: [The value beside looped pushes])."""
    active = tuple(k in argnums for k in range(len(specs)))
    pushes = _Pushes(w, parent, specs, active, out_specs if keep_value else None, single_out)
    mode = _modes.jacobian_mode(parent, active, specs, argnums, out_specs, wanted, flavour)
    order = sorted(argnums)
    if mode.way == "reverse":
        for o in wanted:
            for a in argnums:
                if out_specs[o].shape:
                    sink.open(o, a, out_specs[o].shape + specs[a].shape, out_specs[o].dtype, constant_positions=True)
        for o in wanted:
            out = out_specs[o]
            for q, oidx in enumerate(itertools.product(*[range(n) for n in out.shape])):
                r = pushes.reverse(len(out_specs), [basis(c, q if k == o else None) for k, c in enumerate(out_specs)])
                for a in argnums:
                    spec, ct = specs[a], r[order.index(a) + 1]
                    full = out.shape + spec.shape
                    if not out.shape:
                        sink.put_whole(o, a, full, ct)
                        continue
                    for idx in itertools.product(*[range(n) for n in spec.shape]):
                        sink.put(o, a, full, oidx + idx, entry(ct, spec.shape, idx))
        sink.close()
        return pushes.value
    one_loop = pushes.one_loop(argnums)
    stores = {}
    for a in argnums:
        spec = specs[a]
        for o, out in enumerate(out_specs):
            if o in wanted:
                sink.open(o, a, out.shape + spec.shape, out.dtype, in_loop=one_loop)

        def store(dout: Sym, index: tuple[Any, ...], a: int = a, spec: ArgSpec = spec) -> None:
            for o in wanted:
                out = out_specs[o]
                for oidx in itertools.product(*[range(n) for n in out.shape]):
                    sink.put(o, a, out.shape + spec.shape, oidx + tuple(index),
                             entry(_out(dout, o, single_out), out.shape, oidx))

        stores[a] = store
    pushes.every(argnums, stores, one_loop)
    w.looped = w.looped or pushes.looped
    return pushes.value


def _flat_position(shape: tuple[int, ...], index: tuple[Any, ...]) -> Any:
    """The row-major flat position of ``index`` (constants or runtime values) in ``shape``."""
    if all(isinstance(i, int) for i in index):
        return int(np.ravel_multi_index(index, shape)) if shape else 0
    position: Any = 0  # an int while every index so far is a constant
    for n, i in zip(shape, index, strict=True):
        if isinstance(position, int) and isinstance(i, int):
            position = position * n + i
            continue
        scaled = position * n if isinstance(position, int) else ast.BinOp(position, ast.Mult(), ast.Constant(n))
        if isinstance(scaled, int):
            position = node_of(i) if scaled == 0 else ast.BinOp(ast.Constant(scaled), ast.Add(), node_of(i))
        else:
            position = ast.BinOp(scaled, ast.Add(), node_of(i))
    return Sym(position)


def cotangent_blocks(w: BodyWriter, parent: Any, specs: Sequence[ArgSpec], out_specs: Sequence[ArgSpec],
                     single_out: bool, cotangents: Sequence[Sym]) -> dict[int, Sym]:
    """Per-element ``J^T c`` for every float argument, in its shape: ``{a: name}``."""
    argnums = [k for k, s in enumerate(specs) if s.is_float]
    active = tuple(s.is_float for s in specs)
    pushes = _Pushes(w, parent, specs, active)
    mode = _modes.cotangent_mode(parent, active, len(out_specs))
    if mode.way == "reverse":
        r = pushes.reverse(len(out_specs), cotangents)
        return {a: r[k + 1] for k, a in enumerate(argnums)}
    grads: dict[int, Sym] = {}
    one_loop = pushes.one_loop(argnums)
    stores = {}
    for a in argnums:
        spec = specs[a]
        grads[a] = w.let(f"g_{a}", zero(spec.shape, spec.dtype)) if spec.shape or one_loop else \
            Sym(ast.Name("_", ast.Load()))

        def store(dout: Sym, index: tuple[Any, ...], a: int = a, spec: ArgSpec = spec) -> None:
            terms = []
            for o, (out, c) in enumerate(zip(out_specs, cotangents, strict=True)):
                d = _out(dout, o, single_out)
                terms.append(d * c if out.shape == () else (d * c).sum())
            total = terms[0]
            for term in terms[1:]:
                total = total + term
            if len(spec.shape) > 2:  # flat (NOTE: [Flat values])
                w.store(_subscript(grads[a], [_flat_position(spec.shape, tuple(index))]), total)
            elif spec.shape:
                w.store(_subscript(grads[a], list(index)), total)
            elif one_loop:
                w.store(grads[a], total)
            else:
                grads[a] = w.let(f"g_{a}", total)

        stores[a] = store
    pushes.every(argnums, stores, one_loop)
    return grads
