"""Jacobians of reverse-mode Jacobians on the host, in one kernel with one copy of the reverse function.

NOTE: [Nested blocks] ``jacfwd(jacrev(f))`` of an ``f`` with m output
components would push tangents through the tangent of ``jacrev(f)``'s
body, which holds m copies of ``f``'s reverse function (one per output
component, NOTE: [Reverse bodies] in ``bodies``) and a block literal of
all their cotangents, and the outer pushes then store each of that
block's entries: Taichi's compile time grows with all of it. The same
entries are ``d/dx_a [reverse(f)(x, e_q)]`` along ``e_p``: the tangent of
``f``'s reverse function, seeded with the cotangent ``e_q`` chosen by a
run-time loop index, and written straight into the output arrays at
position ``(q, ..., p)`` (NOTE: [Blocks written to the output] in
``bodies``). One copy of that tangent is compiled whatever m is. For the
4x8 tanh layer's ``jacfwd(jacrev(., 0), 0)`` (a 4x4x8x4x8 block per
element; bench/compile_scaling.py, ``mlp``): first call 2.4 -> 0.7 s. The
cotangents of all outputs read run in one loop, and the tangents of all
outer arguments in one loop inside it (NOTE: [One loop of pushes]), each
write guarded by the output it belongs to: a loop per output and per
argument were a copy each, and Taichi's compile time grows with the square
of the kernel (``jacfwd(jacrev(f, (1, 0)), (1, 0))`` of a function with
two outputs and two arguments: four copies, 74 s; one copy, 6 s).
Inside kernels a body must return its value, so calls there keep the
composed bodies.
"""
from __future__ import annotations

import ast
import itertools
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

from .. import _modes
from .._lang.sym import Sym
from .._signature import ArgSpec
from .bodies import TI, BodyWriter, OutputBlocks, _Pushes, _unravel, entry, literal, scalar_type, zero


def runtime_basis(spec: ArgSpec, hot: Sym, offset: int = 0) -> Sym:
    """A value of ``spec``'s shape: one at flat position ``hot - offset`` (a run-time value), zeros elsewhere.

    Built as a literal of comparisons, never stored into at a run-time position.
    """
    indices = list(itertools.product(*[range(n) for n in spec.shape]))
    flat = spec.shape if len(spec.shape) <= 2 else (spec.size,)
    entries = {idx: TI.cast(Sym(ast.Compare(hot.node, [ast.Eq()], [ast.Constant(offset + k)])),
                            scalar_type(spec.dtype))
               for k, idx in enumerate(indices)}
    if len(spec.shape) > 2:
        entries = {(k,): v for k, v in enumerate(entries.values())}
    return literal(entries, flat, spec.dtype)


def within(index: Sym, start: int, size: int) -> ast.expr:
    """``start <= index < start + size`` (``index < size`` from 0)."""
    if not start:
        return ast.Compare(index.node, [ast.Lt()], [ast.Constant(size)])
    return ast.Compare(ast.Constant(start), [ast.LtE(), ast.Lt()], [index.node, ast.Constant(start + size)])


def nested_blocks(w: BodyWriter, f_body: Any, specs: Sequence[ArgSpec], f_out: Sequence[ArgSpec],
                  inner_argnums: Sequence[int], inner_items: Sequence[tuple[Any, ...]], outer_argnums: Sequence[int],
                  outer_wanted: Sequence[int], sink: OutputBlocks) -> None:
    """Write the blocks of ``jac_outer(jacrev(f))`` into ``sink`` (NOTE: [Nested blocks]).

    ``inner_items`` are the inner Jacobian's results, each ``("jac", o, a)``
    (block of ``f``'s output ``o`` by argument ``a``); the outer blocks are
    ``(k, b)`` for ``k`` in ``outer_wanted`` (an inner item) and ``b`` in
    ``outer_argnums``, of shape ``f_out[o].shape + specs[a].shape + specs[b].shape``.
    One loop runs over the components of every output read (the cotangents),
    and in it one loop over the components of every outer argument (the
    tangents, NOTE: [One loop of pushes]): one copy of the reverse function's
    tangent whatever the numbers of outputs and arguments.
    """
    inner_active = tuple(k in inner_argnums for k in range(len(specs)))
    reverse = _modes.reverse_function(f_body, inner_active, len(f_out))
    active = tuple(k in outer_argnums for k in range(len(specs))) + (False,) * len(f_out)
    inner_order = sorted(inner_argnums)
    outputs = sorted({inner_items[k][1] for k in outer_wanted})
    offsets = dict(zip(outputs, itertools.accumulate([f_out[o].size for o in outputs], initial=0), strict=False))
    with w.loop("q", sum(f_out[o].size for o in outputs)) as q:
        cotangents = [runtime_basis(c, q, offsets[j]) if j in offsets else zero(c.shape, c.dtype)
                      for j, c in enumerate(f_out)]
        pushes = _Pushes(w, reverse, specs, active)
        pushes.primals = w.args() + cotangents

        def store_of(b: int) -> Any:
            def store(dout: Sym, pidx: tuple[Any, ...]) -> None:
                for o in outputs:
                    out, start = f_out[o], offsets[o]
                    q_o = q if not start else Sym(ast.BinOp(q.node, ast.Sub(), ast.Constant(start)))
                    with w.when(within(q, start, out.size)) if len(outputs) > 1 else nullcontext():
                        for k, a in [(k, inner_items[k][2]) for k in outer_wanted if inner_items[k][1] == o]:
                            spec, dct = specs[a], dout[inner_order.index(a) + 1]
                            full = out.shape + spec.shape + specs[b].shape
                            for idx in itertools.product(*[range(n) for n in spec.shape]):
                                sink.put(k, b, full, _unravel(out.shape, q_o) + idx + tuple(pidx),
                                         entry(dct, spec.shape, idx))
            return store

        stores = {b: store_of(b) for b in outer_argnums}
        if len(outer_argnums) > 1:
            pushes.all_in_one_loop(outer_argnums, stores)
        else:
            pushes.each(outer_argnums, outer_argnums[0], stores[outer_argnums[0]])
