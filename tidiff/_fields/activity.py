"""Which fields of a program depend on its inputs (NOTE: [Known-zero tangents] in ``_tangent/field_flows``)."""
from collections.abc import Iterable, Sequence

from taichi.lang.field import Field

from .._tangent.field_flows import kernel_flows
from .graph import CodeGraph, is_field
from .twins import is_real


def active_fields(graph: CodeGraph, inputs: Iterable[Field], fields: Iterable[Field]) -> set[int] | None:
    """Ids of the float fields that can carry a nonzero tangent, or None for all of them.

    Args:
        graph: the program's :class:`~.graph.CodeGraph`.
        inputs: the float fields the tangents are seeded in.
        fields: every field the program has (reached and declared).

    A field is active if it is an input, or some kernel writes it from an
    active field, to a fixed point over every kernel in any order (a Python
    program may launch them in any order, any number of times). The fields of
    one list are active together (a ``ti.static`` loop indexes them alike).
    A kernel taking ``ti.template()`` fields makes every float field active.
    """
    flows: list[tuple[frozenset[int], frozenset[int]]] = []
    for kernel, owner in graph.kernels_with_owners():
        summary = kernel_flows(kernel, owner)
        if summary is None:
            return None
        flows.extend(summary)
    floats = {id(f) for f in fields if is_real(f)}
    groups = [frozenset(id(f) for f in group) for group in _field_lists(graph)]
    active = {id(f) for f in inputs} & floats
    changed = True
    while changed:
        changed = False
        for written, read in flows:
            new = (written & floats) - active
            if new and read & active:
                active |= new
                changed = True
        for group in groups:
            if group & active and not group & floats <= active:
                active |= group & floats
                changed = True
    return active


def _field_lists(graph: CodeGraph) -> list[Sequence[Field]]:
    """Lists and tuples of fields the program reaches."""
    return [obj for obj in graph.nodes.values()
            if isinstance(obj, (list, tuple)) and obj and all(is_field(v) for v in obj)]
