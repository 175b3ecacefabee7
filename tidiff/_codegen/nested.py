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
element; bench/compile_scaling.py, ``mlp``): first call 2.4 -> 0.7 s.
Inside kernels a body must return its value, so calls there keep the
composed bodies.
"""
from __future__ import annotations

import ast
import itertools
from collections.abc import Sequence
from typing import Any

from .. import _modes
from .._lang.sym import Sym
from .._signature import ArgSpec
from .bodies import TI, BodyWriter, OutputBlocks, _Pushes, _unravel, entry, literal, scalar_type, zero


def runtime_basis(spec: ArgSpec, hot: Sym) -> Sym:
    """A value of ``spec``'s shape: one at flat position ``hot`` (a run-time value), zeros elsewhere.

    Built as a literal of comparisons, never stored into at a run-time position.
    """
    indices = list(itertools.product(*[range(n) for n in spec.shape]))
    flat = spec.shape if len(spec.shape) <= 2 else (spec.size,)
    entries = {idx: TI.cast(Sym(ast.Compare(hot.node, [ast.Eq()], [ast.Constant(k)])), scalar_type(spec.dtype))
               for k, idx in enumerate(indices)}
    if len(spec.shape) > 2:
        entries = {(k,): v for k, v in enumerate(entries.values())}
    return literal(entries, flat, spec.dtype)


def nested_blocks(w: BodyWriter, f_body: Any, specs: Sequence[ArgSpec], f_out: Sequence[ArgSpec],
                  inner_argnums: Sequence[int], inner_items: Sequence[tuple[Any, ...]], outer_argnums: Sequence[int],
                  outer_wanted: Sequence[int], sink: OutputBlocks) -> None:
    """Write the blocks of ``jac_outer(jacrev(f))`` into ``sink`` (NOTE: [Nested blocks]).

    ``inner_items`` are the inner Jacobian's results, each ``("jac", o, a)``
    (block of ``f``'s output ``o`` by argument ``a``); the outer blocks are
    ``(k, b)`` for ``k`` in ``outer_wanted`` (an inner item) and ``b`` in
    ``outer_argnums``, of shape ``f_out[o].shape + specs[a].shape + specs[b].shape``.
    """
    inner_active = tuple(k in inner_argnums for k in range(len(specs)))
    reverse = _modes.reverse_function(f_body, inner_active, len(f_out))
    active = tuple(k in outer_argnums for k in range(len(specs))) + (False,) * len(f_out)
    inner_order = sorted(inner_argnums)
    for o in sorted({inner_items[k][1] for k in outer_wanted}):
        out = f_out[o]
        items = [(k, inner_items[k][2]) for k in outer_wanted if inner_items[k][1] == o]
        with w.loop("q", out.size) as q:
            cotangents = [runtime_basis(c, q) if j == o else zero(c.shape, c.dtype) for j, c in enumerate(f_out)]
            pushes = _Pushes(w, reverse, specs, active)
            pushes.primals = w.args() + cotangents
            for b in outer_argnums:
                def store(dout: Sym, pidx: tuple[Any, ...], b: int = b, out: ArgSpec = out,
                          items: list[tuple[int, int]] = items, q: Sym = q) -> None:
                    for k, a in items:
                        spec, dct = specs[a], dout[inner_order.index(a) + 1]
                        full = out.shape + spec.shape + specs[b].shape
                        for idx in itertools.product(*[range(n) for n in spec.shape]):
                            sink.put(k, b, full, _unravel(out.shape, q) + idx + tuple(pidx),
                                     entry(dct, spec.shape, idx))

                pushes.each(outer_argnums, b, store)
