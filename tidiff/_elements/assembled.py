"""Element Hessians added into a sparse matrix's values as their pushes compute them.

NOTE: [Blocks added from the pushes] ``td.sparse_hessian``'s element body
returned each element's Hessian block (144 entries for a tet) as one local
value, which its pushes filled a column at a time at run-time positions,
and the kernel then added it into the matrix. A local value indexed at run
time costs Taichi's compile about the square of its size (NOTE: [Blocks
written to the output] in ``_codegen/bodies.py``). The body made here
(:func:`assembling_body`) writes no block: each entry goes into the matrix's
values where a push computes it (``data[start[e, a k + b] + i stride[c[a]] + j]
+= H[a, i, b, j]``, ``_add_blocks``' positions), through :func:`add_entry`,
which Taichi calls while it compiles, with the element kernel's arrays and
the element (set around the body's call: ``assemble_into``). The first
call of the implicit FEM's exact Hessian (n = 8) compiled in 3.8 s, as
much as a host ``td.hessian`` writing its blocks into its output (2.2 s)
plus the block's local value.
"""
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import taichi as ti
from taichi.lang import impl

from .._codegen.batch import identifier
from .._codegen.bodies import BodyWriter, EntrySink, jacobian_blocks
from .._lang.products import compile_time
from .._signature import ArgSpec
from .._transforms import FLAVOUR


@dataclass(frozen=True)
class Assembling:
    """The Taichi values a body adds its entries with: the matrix's values, the pattern's index arrays, the
    element's nodes, the element, and the nodes per element."""

    data: Any
    start: Any
    stride: Any
    nodes: Any
    element: Any
    k: int


_ASSEMBLING: list[Assembling] = []


@compile_time
def assemble_into(data: Any, start: Any, stride: Any, nodes: Any, element: Any, k: int) -> None:
    """From here on (while Taichi compiles the element's body), entries are added into ``data``."""
    _ASSEMBLING.append(Assembling(data, start, stride, nodes, element, k))


@compile_time
def stop_assembling() -> None:
    _ASSEMBLING.pop()


def forget_assembling() -> None:
    """After a launch that compiled an assembling kernel, whether or not its compile got to the end."""
    _ASSEMBLING.clear()


@compile_time
def add_entry(*index_and_value: Any) -> None:
    """Add ``H[a, i, b, j]`` (``H[a, b]`` for scalar nodes) into the matrix, at node ``a``'s row ``i``, node ``b``'s
    column ``j`` (constants or Taichi values)."""
    *index, value = index_and_value
    a, i, b, j = index if len(index) == 4 else (index[0], 0, index[1], 0)
    s = _ASSEMBLING[-1]
    start = impl.subscript(None, s.start, s.element, a * s.k + b)
    stride = impl.subscript(None, s.stride, impl.subscript(None, s.nodes, a))
    ti.atomic_add(impl.subscript(None, s.data, start + i * stride + j), value)


class AddedBlocks(EntrySink):
    """A sink of :func:`jacobian_blocks` adding each entry into the matrix (:func:`add_entry`)."""

    def __init__(self, w: BodyWriter) -> None:
        self.w, self.add = w, w.callee(add_entry, "add_entry")

    def put(self, o: int, a: int, full: tuple[int, ...], index: Sequence[Any], value: Any) -> None:
        self.w.do(self.add(*index, value))


def assembling_body(block: Any, specs: list[ArgSpec]) -> Any:
    """The ``@ti.func`` of one element's Hessian ``block`` (``td.hessian`` of the element's function) that adds its
    entries into the matrix (NOTE: [Blocks added from the pushes]); it returns nothing of use."""
    jacobian = block.jacobian
    lay = jacobian.layout(specs)
    out_specs, tree = block.parent.signature(specs)
    w = BodyWriter(identifier(block.name) + "_added", [s.name for s in specs])
    jacobian_blocks(w, block.parent.body_for(specs), specs, lay.argnums, out_specs, not isinstance(tree, tuple),
                    lay.wanted(), FLAVOUR[jacobian.transform], AddedBlocks(w))
    return w.compile([0], single=True, tag="assembled")
