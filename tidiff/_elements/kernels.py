"""One launch over the elements of a mesh: gather each element's nodes, call a per-element body, put its results.

:class:`ElementKernel` generates, once per body and per way of passing each
argument, a kernel whose parallel loop over elements ``e``

- reads each argument as it is passed: a *node* argument (one value per
  node) is gathered through the connectivity, ``x[elements[e, a]]`` for the
  element's ``k`` nodes, into one ``(k,) + node_shape`` value; an *each*
  argument (one value per element, or one for all: stride 0) is ``a[e * s]``;
- calls the body on them;
- puts each result: *sum* adds it into one total, *each* stores it at ``e``,
  *node* scatters its rows back onto the element's nodes (the adjoint of the
  gather: ``out[elements[e, a]] += r[a]``), *blocks* adds it into a sparse
  matrix's value array at positions a :class:`~.pattern.Pattern` computed.

Gathers and scatters are ``@ti.func`` helpers made per ``(k, node_shape)``;
the kernel is built as AST (``_lang.nodes``) like ``_codegen.batch``'s.
"""
# no "from __future__ import annotations": Taichi reads the helpers' annotations as objects

import ast
import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import taichi as ti

from .._arrays import contiguous
from .._codegen.batch import _Source, element_type, kernel_shape
from .._lang.nodes import assign, call, for_range, statement, taichi
from .._lang.nodes import name as node
from .._lang.sym import Sym
from .._rules.kept import forget_keeping, keep_values, stop_keeping
from .._signature import ArgSpec
from .assembled import assemble_into, forget_assembling, stop_assembling

NODE, EACH, SUM, BLOCKS, ADDED, SKIP = "node", "each", "sum", "blocks", "added", "skip"


def node_type(node_shape: tuple[int, ...], dtype: Any) -> Any:
    """The Taichi type of one node's value: a scalar or a vector."""
    return ArgSpec("node", node_shape, dtype).ti_type()


@functools.cache
def _gather(k: int, node_shape: tuple[int, ...]) -> Any:
    if node_shape:
        @ti.func
        def gather_rows(x: ti.template(), c):  # type: ignore[valid-type]
            return ti.Matrix.rows([x[c[a]] for a in ti.static(range(k))])
        return gather_rows

    @ti.func
    def gather(x: ti.template(), c):  # type: ignore[valid-type]
        return ti.Vector([x[c[a]] for a in ti.static(range(k))])
    return gather


@functools.cache
def _scatter(k: int, node_shape: tuple[int, ...]) -> Any:
    if node_shape:
        d = node_shape[0]

        @ti.func
        def scatter_rows(o: ti.template(), c, r):  # type: ignore[valid-type]
            for a in ti.static(range(k)):
                o[c[a]] += ti.Vector([r[a, q] for q in ti.static(range(d))])
        return scatter_rows

    @ti.func
    def scatter(o: ti.template(), c, r):  # type: ignore[valid-type]
        for a in ti.static(range(k)):
            o[c[a]] += r[a]
    return scatter


@functools.cache
def _add_blocks(k: int, d: int, flat: bool) -> Any:
    """Add an element's ``(k d) x (k d)`` block matrix (flat row-major, or a ``(k, k)`` matrix for scalar nodes)
    into ``data``: block ``(a, b)``'s row ``i`` starts at ``start[e, a k + b] + i * stride[c[a]]``."""
    n = k * d

    @ti.func
    def add_blocks(data: ti.template(), start: ti.template(), stride: ti.template(), c, e, h):  # type: ignore[valid-type]
        for a in ti.static(range(k)):
            rs = stride[c[a]]
            for b in ti.static(range(k)):
                s = start[e, a * k + b]
                for i in ti.static(range(d)):
                    for j in ti.static(range(d)):
                        if ti.static(flat):
                            data[s + i * rs + j] += h[(a * d + i) * n + b * d + j]
                        else:
                            data[s + i * rs + j] += h[a, b]
    return add_blocks


@functools.cache
def _add_rows(q: int, k: int, d: int, form: str) -> Any:
    """Add an element's ``q x (k d)`` Jacobian block into ``data``: its row ``t`` starts at ``row[e] + t * length[e]``,
    node ``a``'s columns at ``start[e, a]`` in it. ``form`` is how the block is held in a kernel: ``"flat"``
    (row-major, rank above 2), ``"ta"`` (``(q, k)``: scalar nodes), ``"aj"`` (``(k, d)``: a scalar result), ``"a"``."""

    @ti.func
    def add_rows(data: ti.template(), row: ti.template(), length: ti.template(), start: ti.template(),  # type: ignore[valid-type]
                 c, e, h):
        base, n = row[e], length[e]
        for t in ti.static(range(q)):
            for a in ti.static(range(k)):
                s = base + t * n + start[e, a]
                for j in ti.static(range(d)):
                    if ti.static(form == "flat"):
                        data[s + j] += h[(t * k + a) * d + j]
                    elif ti.static(form == "ta"):
                        data[s + j] += h[t, a]
                    elif ti.static(form == "aj"):
                        data[s + j] += h[a, j]
                    else:
                        data[s + j] += h[a]
    return add_rows


@ti.func
def same(h):
    """An element's stored block as it is (the assembly launch after a projection)."""
    return h


class KeptValues:
    """What a keeping kernel's launches keep per element (NOTE: [Decompositions kept across products] in
    ``_rules/kept.py``): an array that grows after a launch that needed more room, up to ``LIMIT`` bytes in all
    (decompositions in a long runtime loop: past it, values are decomposed again, as without keeping)."""

    LIMIT = 1 << 30

    def __init__(self, elements: int) -> None:
        self.elements = elements
        self.store = np.zeros(1)
        self.width = 0
        self.need = np.zeros(1, np.int32)
        self.ready = False  # a launch recorded every element's values: the next may replay them
        self.probed = False  # the room was made from the first element's need (ElementKernel.recording)

    def arguments(self, record: bool) -> list[Any]:
        self.need[0] = 0
        return [self.store, int(record), self.width, self.need]

    def launched(self) -> None:
        """After a launch: whether the values it recorded are all there, else room for them next time."""
        need = int(self.need[0])
        if need <= self.width:
            self.ready = True
        else:
            self.room_for(need)

    def room_for(self, need: int) -> None:
        """An array of ``need`` values per element, where it is within ``LIMIT``."""
        if need > self.width and self.elements * need < 2**31 and self.elements * need * 8 <= self.LIMIT:
            self.store, self.width = np.zeros(self.elements * need), need


class ElementKernel:
    """A generated kernel over the elements (see the module docstring).

    Args:
        body: the per-element ``@ti.func``; ``in_specs`` its argument specs
            (a node argument's is ``(k,) + node_shape``), ``out_specs`` its results.
        ins: per argument, ``NODE`` or ``EACH``.
        outs: per result, ``SUM``, ``EACH``, ``NODE``, ``SKIP`` (not kept) or ``BLOCKS``: a sparse
            assembler, ``blocks = (add, count)``, called ``add(data, *index, c, e, value)``
            with its ``count`` index arrays (``_add_blocks``, ``_add_rows``); ``ADDED``: the body adds its
            entries into the matrix itself (``blocks = (None, 2)``, NOTE: [Blocks added from the pushes]).
    """

    def __init__(self, body: Any, k: int, in_specs: Sequence[ArgSpec], ins: Sequence[str],
                 out_specs: Sequence[ArgSpec], outs: Sequence[str], is_tuple: bool, name: str,
                 blocks: tuple[Any, int] | None = None, keeps: bool = False) -> None:
        self.in_specs, self.ins, self.out_specs, self.outs = list(in_specs), list(ins), list(out_specs), list(outs)
        self.k, self.keeps = k, keeps
        self._kept: dict[int, KeptValues] = {}  # per element count: what launches that record keep (recording)
        src = _Source([])
        fn = src.bind(name, body)
        m, e, c, r = (src.namer.fresh(h) for h in ("m", "e", "c", "r"))
        i32 = taichi("i32").node
        conn = src.namer.fresh("elements")
        params: list[tuple[str, ast.expr]] = [
            (m, i32), (conn, src.bind("C", ti.types.ndarray(dtype=ti.types.vector(k, ti.i32), ndim=1)))]
        args: list[ast.expr] = []
        for j, (spec, how) in enumerate(zip(self.in_specs, self.ins, strict=True)):
            a = src.namer.fresh(f"a{j}")
            if how == NODE:
                params.append((a, src.bind(f"T{j}", ti.types.ndarray(dtype=node_type(spec.shape[1:], spec.dtype),
                                                                      ndim=1))))
                args.append(call(src.bind("gather", _gather(k, spec.shape[1:])), a, c))
            else:
                s = src.namer.fresh(f"s{j}")
                params += [(a, src.bind(f"T{j}", ti.types.ndarray(dtype=element_type(spec), ndim=1))), (s, i32)]
                args.append(Sym(node(a))[Sym(node(e)) * Sym(node(s))].node)
        results = [Sym(node(r))[j] for j in range(len(self.outs))] if is_tuple else [Sym(node(r))]
        puts: list[ast.stmt] = []
        before: list[ast.stmt] = []
        after: list[ast.stmt] = []
        for j, (spec, how, value) in enumerate(zip(self.out_specs, self.outs, results, strict=True)):
            if how == SKIP:  # a result not wanted (Taichi drops the code computing only it)
                continue
            o = src.namer.fresh(f"o{j}")
            if how in (BLOCKS, ADDED):
                assert blocks is not None
                add, count = blocks
                index = [src.namer.fresh(f"index{t}") for t in range(count)]
                data = ArgSpec(spec.name, (), spec.dtype).ti_type()  # the matrix's value array
                params.append((o, src.bind(f"U{j}", ti.types.ndarray(dtype=data, ndim=1))))
                params += [(t, src.bind("I", ti.types.ndarray())) for t in index]
                if how == ADDED:
                    before.append(statement(call(src.bind("assemble_into", assemble_into), o, *index, c, e,
                                                 ast.Constant(k))))
                    after.append(statement(call(src.bind("stop_assembling", stop_assembling))))
                else:
                    puts.append(statement(call(src.bind("add", add), o, *index, c, e, value)))
                continue
            if how == NODE:
                params.append((o, src.bind(f"U{j}", ti.types.ndarray(dtype=node_type(spec.shape[1:], spec.dtype),
                                                                      ndim=1))))
                puts.append(statement(call(src.bind("scatter", _scatter(k, spec.shape[1:])), o, c, value)))
                continue
            params.append((o, src.bind(f"U{j}", ti.types.ndarray(dtype=element_type(spec), ndim=1))))
            if how == EACH:
                puts.append(assign(Sym(node(o))[Sym(node(e))], value))
            else:
                total = ast.Subscript(node(o), ast.Constant(0), ast.Store())
                puts.append(ast.AugAssign(total, ast.Add(), value.node))
        loop = [assign(c, Sym(node(conn))[Sym(node(e))]), *before, assign(r, call(fn, *args)), *after, *puts]
        if keeps:
            params += self._keeping(src, e, loop, len(before) + 1)
        # the body is called inside the element loop: its own loops stay serial (NOTE: [The body's loops stay
        # serial] in _codegen.batch)
        self.kernel = src.compile(params, [for_range(e, [m], loop)], f"{name}__elements", "elements")

    @staticmethod
    def _keeping(src: _Source, e: str, loop: list[ast.stmt], at: int) -> list[tuple[str, ast.expr]]:
        """NOTE: [Kept values] A kernel that keeps values (a Hessian operator's, a sparse Hessian's) takes a float64
        array, whether the launch records, the values each element has room for, and an int32 array where a
        recording launch puts the most values an element needed that had no room (0 where all had); around the
        body's call, its decompositions keep their results there (NOTE: [Decompositions kept across products] in
        ``_rules/kept.py``)."""
        store, record, width, need, count = (src.namer.fresh(h) for h in ("kept", "record", "width", "need", "count"))
        i32 = taichi("i32").node
        begin = call(src.bind("keep_values", keep_values), store, e, count, record, width)
        grow = ast.If(ast.Compare(node(count), [ast.Gt()], [node(width)]),
                      [statement(call(taichi("atomic_max"), Sym(node(need))[0], count))], [])
        report = ast.If(node(record), [grow], [])  # only an element that found no room reports: no atomic else
        loop[at:at + 1] = [assign(count, ast.Constant(0)), statement(begin), loop[at],  # around the body's call
                           statement(call(src.bind("stop_keeping", stop_keeping))), report]
        return [(store, src.bind("K", ti.types.ndarray(dtype=ti.f64, ndim=1))), (record, i32), (width, i32),
                (need, src.bind("N", ti.types.ndarray(dtype=ti.i32, ndim=1)))]

    def recording(self, elements: np.ndarray, inputs: Sequence[Any], outputs: Sequence[Any],
                  blocks: Sequence[Any] = ()) -> None:
        """A launch that records what it keeps (a sparse Hessian's: each element's pushes share the decompositions
        of its first, NOTE: [Kept across pushes]), in an array kept per element count, grown after a launch that
        needed more room: every call of a sparse Hessian over the same elements, made anew or not, keeps."""
        kept = self._kept.setdefault(len(elements), KeptValues(len(elements)))
        if not kept.probed and len(elements) > 1:  # the first launch: the first element says how much room to make
            probe = KeptValues(1)
            self(elements[:1], inputs, [np.zeros_like(o) for o in outputs], blocks, keeping=probe.arguments(True))
            kept.room_for(int(probe.need[0]))
            kept.probed = True
        self(elements, inputs, outputs, blocks, keeping=kept.arguments(True))
        kept.launched()

    def __call__(self, elements: np.ndarray, inputs: Sequence[Any], outputs: Sequence[Any],
                 blocks: Sequence[Any] = (), keeping: Sequence[Any] = ()) -> None:
        """Launch over ``elements`` (``(M, k)`` int32); ``inputs`` as the kernel reads them (node arrays
        ``(N,) + node_shape``, each arrays ``(M or 1,) + shape``), ``outputs`` zeroed arrays it adds into or
        stores to (none for ``SKIP`` results), ``blocks`` the index arrays of a ``BLOCKS`` output, ``keeping``
        (a kernel that keeps values) the kept values' array, whether to record, its width and the need's array."""
        m = len(elements)
        if not m:
            return
        args: list[Any] = [m, elements]
        for a, spec, how in zip(inputs, self.in_specs, self.ins, strict=True):
            if how == NODE:
                args.append(a)
            else:
                args += [contiguous(a).reshape((a.shape[0],) + kernel_shape(spec)), 0 if a.shape[0] == 1 else 1]
        kept = [(spec, how) for spec, how in zip(self.out_specs, self.outs, strict=True) if how != SKIP]
        for o, (spec, how) in zip(outputs, kept, strict=True):
            args.append(o if how in (NODE, BLOCKS, ADDED) else o.reshape((o.shape[0],) + kernel_shape(spec)))
            if how in (BLOCKS, ADDED):
                args += list(blocks)
        try:
            self.kernel(*args, *keeping)
        finally:  # a compile that failed inside the body leaves what it set around the call behind
            forget_keeping()
            forget_assembling()


def element_kernel(owner: Any, make_body: Callable[[], Any], k: int, in_specs: Sequence[ArgSpec], ins: Sequence[str],
                   out_specs: Sequence[ArgSpec], outs: Sequence[str], is_tuple: bool, name: str,
                   blocks: tuple[Any, int] | None = None, keeps: bool = False) -> ElementKernel:
    """The :class:`ElementKernel` of the body ``make_body()`` makes, made once per runtime and kept by ``owner``'s
    memo (the per-element Function it computes): element sums over other meshes with ``k`` nodes share it."""
    key = ("element kernel", name, k, tuple(in_specs), tuple(ins), tuple(out_specs), tuple(outs), blocks, keeps)
    return owner.memo.get(key, lambda: ElementKernel(make_body(), k, in_specs, ins, out_specs, outs, is_tuple, name,
                                                     blocks, keeps))


def as_elements(values: np.ndarray) -> np.ndarray:
    """The connectivity as the kernels read it: ``(M, k)`` int32, C-contiguous."""
    return np.ascontiguousarray(values, dtype=np.int32)


@ti.kernel
def fill_builder(builder: ti.types.sparse_matrix_builder(), rows: ti.types.ndarray(ndim=1),  # type: ignore[valid-type]
                 cols: ti.types.ndarray(ndim=1), values: ti.types.ndarray(ndim=1)):  # type: ignore[valid-type]
    """A ``ti.linalg.SparseMatrixBuilder`` given the triplets of a pattern's values (``SparseMatrix.build_from_ndarray``
    of Taichi 1.7.4 reads past 16 triplets wrongly: an assertion fails in Eigen)."""
    for t in range(values.shape[0]):
        builder[rows[t], cols[t]] += values[t]
