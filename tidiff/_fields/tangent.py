"""The tangent program of a field program: every kernel replaced by its tangent kernel.

NOTE: [Tangent program] For a program ``P: x -> y`` over fields, the
tangent program ``T: (x, dx) -> (y, dy)`` runs P with each kernel replaced
by its tangent kernel (:func:`tidiff._tangent.jvp_kernel`), which carries a
tangent field ``df`` beside every float field ``f``; ``dy = J(x) dx``. T is
an ordinary :class:`~.program.FieldProgram` over the user's fields and the
tangent fields, so it gets twins, loading, zeroing and replayed adjoints
like any other. Taichi's reverse mode over T, with cotangents ``c`` on
``y`` and ``e`` on ``dy``, gives

    d/dx  = J^T c + sum_k e_k H_k dx      d/d(dx) = J^T e

where ``H_k`` is the Hessian of output component ``k``: a Hessian-vector
product in one reverse pass, exactly (DESIGN, "Second order").

The tangent fields themselves are only names for the tangent program's
twins to copy: they live in a ``ti.FieldsBuilder`` tree of their own, are
never written, and read as zeros, so the tangent of a constant or of an
intermediate field is zero when T starts, as it must be.

Fields passed to ``ti.template()`` parameters find their tangent field at
launch: every field of the program and its tangent field is twinned (as a
constant when not declared) and the twins are paired too.

Limitations: those of :func:`tidiff._tangent.jvp_kernel`; a Python-scope ``f.fill(...)``
inside a Python program resets ``f`` but not ``df``, which is only wrong if
an earlier kernel of the same run wrote ``df``.
"""
import taichi as ti

from .._tangent import FieldTangents, jvp_kernel
from .graph import is_kernel
from .rebind import Rebinder
from .twins import _new_like, is_real


class _NoTwins:
    """Rebinding for the tangent program keeps the user's fields (the tangent program twins them itself)."""

    def as_mapping(self):
        return {}


class _TangentRebinder(Rebinder):
    """Rebuilds the program's Python functions with each kernel swapped for its tangent kernel."""

    def __init__(self, graph, tangents):
        super().__init__(graph, _NoTwins())
        self._tangents = tangents

    def rebuild(self, obj):
        if is_kernel(obj):
            return jvp_kernel(obj, self._tangents)
        return super().rebuild(obj)


class TangentFields:
    """A tangent field (same kind, dtype, shape, offset; no gradients) for every float field given."""

    def __init__(self, fields):
        self.fields = [f for f in fields if is_real(f)]
        self._of = {}
        if not self.fields:
            self._tree = None
            return
        builder = ti.FieldsBuilder()
        for field in self.fields:
            tangent = _new_like(field, False)
            offset = list(field.snode.ptr.offset) or None
            builder.dense(ti.axes(*range(len(field.shape))), tuple(field.shape)).place(tangent, offset=offset)
            self._of[id(field)] = tangent
        self._tree = builder.finalize(raise_warning=False)

    def __getitem__(self, field):
        return self._of[id(field)]

    def pairs(self):
        return [(f, self._of[id(f)]) for f in self.fields]

    def destroy(self):
        if self._tree is not None:
            self._tree.destroy()
            self._tree = None


def tangent_program(source, graph, inputs, outputs):
    """The tangent program of ``source`` (see NOTE: [Tangent program]).

    Args:
        source: the user's program (a ``@ti.kernel`` or a Python function).
        graph: its :class:`~.graph.CodeGraph`.
        inputs, outputs: the program's declared fields.

    Returns:
        ``(program, tangent_fields)``: a :class:`~.program.FieldProgram` with
        inputs ``inputs + [dx for each float input]`` and outputs
        ``outputs + [dy for each float output]``, and the
        :class:`TangentFields` to destroy with it.
    """
    from .program import FieldProgram

    fields = TangentFields(list(graph.fields.values()))
    try:
        tangents = FieldTangents(fields.pairs())
        run = _TangentRebinder(graph, tangents).rebuild(source)
        program = FieldProgram(
            run,
            inputs=list(inputs) + [fields[f] for f in inputs if is_real(f)],
            outputs=list(outputs) + [fields[f] for f in outputs if is_real(f)],
            constants=[f for pair in fields.pairs() for f in pair],
        )
        # template kernels get fields at launch: the twins the program runs on
        tangents.add((program._twins[f], program._twins[df]) for f, df in fields.pairs())
    except BaseException:
        fields.destroy()
        raise
    return program, fields
