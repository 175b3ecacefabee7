"""The tangent program of a field program: every kernel replaced by its tangent kernel.

NOTE: [Tangent program] For a program ``P: x -> y`` over fields, the
tangent program ``T: (x, dx) -> (y, dy)`` runs P with each kernel replaced
by its tangent kernel (:func:`tidiff._tangent.jvp_kernel`), which carries a
tangent field ``df`` beside every *active* float field ``f`` (one that
depends on an input, NOTE: [Known-zero tangents] in
``_tangent/field_flows``); ``dy = J(x) dx``. T is an ordinary
:class:`~.program.FieldProgram` over the user's fields and the tangent
fields, so it gets twins, loading, zeroing and replayed adjoints like any
other. Taichi's reverse mode over T, with cotangents ``c`` on ``y`` and ``e``
on ``dy``, gives

    d/dx  = J^T c + sum_k e_k H_k dx      d/d(dx) = J^T e

where ``H_k`` is the Hessian of output component ``k``: a Hessian-vector
product in one reverse pass, exactly (DESIGN, "Second order").

The tangent fields themselves are only names for the tangent program's
twins: they live in a ``ti.FieldsBuilder`` tree of their own, are never
written, and are declared ``state`` of T (zeroed before each run), so the
tangent of an intermediate field is zero when T starts, as it must be. An
output that does not depend on an input gets a tangent field too, never
written: its tangent reads as zeros.

Objects are rebuilt as for the primal program (:mod:`.rebind`), with each
kernel, and each class kernel of each object, replaced by its tangent
kernel. Fields passed to ``ti.template()`` parameters find their tangent
field at launch: every field of the program and its tangent field is twinned
(as a constant when not declared) and the twins are paired too.

``ti.ad.grad_replaced`` / ``no_grad`` functions have a custom gradient that
forward mode cannot use: the tangent program refuses them by name, as JAX
refuses forward mode of a ``custom_vjp`` function.

A Python-scope ``f.fill(...)`` or ``f.from_numpy(...)`` inside the program
zeroes ``df`` first (the field no longer depends on the inputs), recorded as
a launch of T. Limitations: those of :func:`tidiff._tangent.jvp_kernel`.
"""
import types
from collections.abc import Iterable
from typing import Any, NoReturn

import taichi as ti
from taichi.lang.field import Field

from .._errors import TransformError
from .._tangent import FieldTangents, jvp_kernel
from .activity import active_fields
from .graph import CodeGraph, is_class_kernel, replaced_parts
from .rebind import Rebinder
from .twins import _new_like, fields_builder, is_real


class _TangentRebinder(Rebinder):
    """Rebuilds the program over the user's own fields with each kernel swapped for its tangent kernel."""

    def __init__(self, graph: CodeGraph, tangents: FieldTangents, call: str) -> None:
        super().__init__(graph, {})
        self._tangents = tangents
        self._call = call

    def kernel(self, obj: Any, new: types.FunctionType) -> Any:
        return jvp_kernel(obj, self._tangents)

    def member(self, owner: object, shadow: object, value: Any) -> Any:
        if is_class_kernel(value):
            return jvp_kernel(value, self._tangents, owner=owner)
        return super().member(owner, shadow, value)

    def replaced(self, obj: types.FunctionType) -> NoReturn:
        primal, _ = replaced_parts(obj)
        name = getattr(primal, "__name__", "?")
        raise TransformError(
            f"`{name}` in forward mode: the program calls it through ti.ad.grad_replaced or ti.ad.no_grad, "
            "whose custom gradient gives reverse mode only (as JAX's custom_vjp)",
            hint=f"{self._call}: use reverse mode (td.grad, td.vjp, td.jacrev) of a program calling `{name}`, "
                 "or call its kernels directly to differentiate them",
        )


class TangentFields:
    """A tangent field (same kind, dtype, shape, offset; no gradients) for every float field given."""

    def __init__(self, fields: Iterable[Field]) -> None:
        self.fields = [f for f in fields if is_real(f)]
        self._of: dict[int, Field] = {}
        self._tree: Any = None  # the SNodeTree holding them, until destroyed
        if not self.fields:
            return
        builder = fields_builder("the tangent fields of a program over fields")
        for field in self.fields:
            tangent = _new_like(field, False)
            offset = list(field.snode.ptr.offset) or None
            builder.dense(ti.axes(*range(len(field.shape))), tuple(field.shape)).place(tangent, offset=offset)
            self._of[id(field)] = tangent
        self._tree = builder.finalize(raise_warning=False)

    def __getitem__(self, field: Field) -> Field:
        return self._of[id(field)]

    def pairs(self) -> list[tuple[Field, Field]]:
        return [(f, self._of[id(f)]) for f in self.fields]

    def destroy(self) -> None:
        if self._tree is not None:
            self._tree.destroy()
            self._tree = None


def tangent_program(prog: Any) -> tuple[Any, TangentFields]:  # a FieldProgram (program.py imports this module)
    """The tangent program of a :class:`~.program.FieldProgram` (see NOTE: [Tangent program]).

    Returns:
        ``(program, tangent_fields)``: a :class:`~.program.FieldProgram` with
        inputs ``inputs + [dx for each float input]`` and outputs
        ``outputs + [dy for each float output]``, and the
        :class:`TangentFields` it runs on. Raises ``td.TransformError``
        when a kernel cannot be transformed.
    """
    graph = prog._graph
    everything: dict[int, Any] = {}
    for f in [p.field for p in prog.inputs + prog.outputs] + list(graph.fields.values()) + list(prog.state):
        everything.setdefault(id(f), f)
    float_inputs = [p.field for p in prog.inputs if is_real(p.field)]
    active = active_fields(graph, float_inputs, everything.values())
    active = {key for key, f in everything.items() if is_real(f)} if active is None else active
    for p in prog.inputs:  # every float input carries its tangent, whatever reads it
        if is_real(p.field):
            active.add(id(p.field))
    carried = [f for key, f in everything.items() if key in active]
    zero_outputs = [p.field for p in prog.outputs if is_real(p.field) and id(p.field) not in active]
    # a refused kernel raises after the tangent fields exist: their tree is kept, never freed (freeing a
    # tree makes Taichi recompile every kernel of the process), and the error is remembered by the caller
    fields = TangentFields(carried + [f for f in zero_outputs if f not in carried])
    tangents = FieldTangents([(f, fields[f]) for f in carried])
    run = _TangentRebinder(graph, tangents, prog.call).rebuild(prog._source)
    declared = {id(fields[p.field]) for p in prog.inputs + prog.outputs if is_real(p.field) and p.whole}
    # the tangent program is a program of prog's own class (program.py imports this module, not the reverse)
    program = type(prog)(
        run,
        inputs=list(prog.inputs) + [p.of(fields[p.field]) for p in prog.inputs if is_real(p.field)],
        outputs=list(prog.outputs) + [p.of(fields[p.field]) for p in prog.outputs if is_real(p.field)],
        constants=list(everything.values()),
        state=list(prog.state) + [df for _, df in fields.pairs() if id(df) not in declared],
        name=prog.name, call=prog.call, takes=prog.takes,
    )
    # template kernels get fields at launch: the twins the program runs on
    tangents.add((program.twin(f), program.twin(df)) for f, df in fields.pairs() if id(f) in active)
    program._guard.tangents = tangents  # Taichi's helpers overwriting a field zero its tangent
    return program, fields
