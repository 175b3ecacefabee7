"""``FieldProgram``: value, vjp and jvp of a kernel (or kernels) over global fields.

See the package docstring (:mod:`tidiff._fields`) for the semantics and limits.
"""
from collections import namedtuple

import numpy as np

from . import checks
from .forward import forward_mode
from .graph import CodeGraph
from .rebind import Rebinder
from .tape import LaunchGuard, recording
from .twins import Twins, full_shape, is_real, load, numpy_dtype, read, zero

#: One argument or result: its name, NumPy shape and NumPy dtype.
ArgSpec = namedtuple("ArgSpec", ["name", "shape", "dtype"])


class FieldProgram:
    """A kernel, or a Python function launching kernels, as a function of some fields.

    Args:
        program: a ``@ti.kernel`` without parameters, or a Python function
            without parameters that launches kernels.
        inputs: the fields the program reads as variables (float for a
            derivative; an integer field is a non-differentiable input).
        outputs: the fields it writes as results (not also inputs).
        constants: more fields to twin and load as constants, for programs
            that reach them other than by name (the tangent program's
            tangent fields, passed to template kernels at launch).

    Example::

        prog = FieldProgram(energy, inputs=[x, w], outputs=[loss])
        (value,) = prog.primal([np.ones(16), np.array(2.0)])
        (value,), (dx, dw) = prog.vjp([np.ones(16), np.array(2.0)], [np.array(1.0)])
    """

    def __init__(self, program, inputs, outputs, constants=()):
        checks.check_program(program)
        self.inputs, self.outputs = checks.check_fields(inputs, outputs)
        self.name = getattr(program, "__name__", type(program).__name__)
        graph = CodeGraph(program)
        declared = {id(f): f for f in self.inputs + self.outputs}
        reached = dict(graph.fields)
        reached.update((id(f), f) for f in constants)  # passed at run time, not reached by name
        self._constants = [f for key, f in reached.items() if key not in declared]
        self._twins = Twins(list(declared.values()) + self._constants)
        rebinder = Rebinder(graph, self._twins)
        self._run = rebinder.rebuild(program)
        self._kernels = [rebinder.rebuild(k) for k in graph.kernels()]
        self._guard = LaunchGuard([k._primal for k in self._kernels], self.name)
        self._names = graph.names
        self.in_specs = [self._spec(f) for f in self.inputs]
        self.out_specs = [self._spec(f) for f in self.outputs]
        self._source, self._graph = program, graph
        self._tangent = None

    def _spec(self, field):
        return ArgSpec(self._names.get(id(field), ""), full_shape(field), numpy_dtype(field))

    def compiles(self):
        """How many Taichi kernels (primal, adjoint, forward variants) this program compiled so far."""
        return sum(len(k._primal.compiled_kernels) + len(k._adjoint.compiled_kernels) for k in self._kernels)

    def primal(self, args):
        """The outputs at ``args`` (one array per input), as a list of arrays."""
        args = self._convert_args("primal", args)
        self._prepare(args)
        with recording(self._guard):
            self._run()
        return self._read_outputs()

    def vjp(self, args, cotangents):
        """``(outputs, grads)``: ``grads[i]`` is the cotangents pulled back to input ``i``.

        A ``None`` cotangent is a zero one; an integer input's grad is ``None``.
        """
        args = self._convert_args("vjp", args)
        cotangents = self._convert("vjp", "cotangents", self.outputs, cotangents, tangent=True)
        self._prepare(args)
        with recording(self._guard) as tape:
            self._run()
        outs = self._read_outputs()
        for twin in self._twins.real():
            zero(twin.grad)
        for field, cotangent in zip(self.outputs, cotangents):
            if cotangent is not None:
                load(self._twins[field].grad, cotangent)
        tape.replay_adjoints()
        grads = [read(self._twins[f].grad) if is_real(f) else None for f in self.inputs]
        return outs, grads

    def jvp(self, args, tangents):
        """``(outputs, output_tangents)`` for one tangent per input (``None`` is zero).

        An integer input's tangent is ignored; an integer output's tangent is zeros.
        """
        args = self._convert_args("jvp", args)
        tangents = self._convert("jvp", "tangents", self.inputs, tangents, tangent=True)
        self._prepare(args)
        for twin in self._twins.real():
            zero(twin.dual)
        for field, tangent in zip(self.inputs, tangents):
            if tangent is not None:
                load(self._twins[field].dual, tangent)
        with forward_mode(self._twins.seed, self._guard):
            self._run()
        outs = self._read_outputs()
        out_tangents = [
            read(self._twins[f].dual) if is_real(f) else np.zeros(full_shape(f), numpy_dtype(f)) for f in self.outputs
        ]
        return outs, out_tangents

    def tangent(self):
        """The tangent program ``(x..., dx...) -> (y..., dy...)``, built once (see :mod:`.tangent`).

        ``dx`` is one tangent per float input, ``dy`` one per float output, in
        order. Its ``primal`` is a jvp; its ``vjp`` with cotangent ``e`` on
        ``dy`` gives ``sum_k e_k H_k dx`` (plus ``J^T c`` for cotangent ``c``
        on ``y``) for ``x`` and ``J^T e`` for ``dx``. Raises
        ``td.TransformError`` when a kernel cannot be transformed.
        """
        if self._tangent is None:
            from .tangent import tangent_program

            self._tangent = tangent_program(self._source, self._graph, self.inputs, self.outputs)
        return self._tangent[0]

    def close(self):
        """Free the twin fields; the program cannot be evaluated afterwards."""
        if self._tangent is not None:
            program, fields = self._tangent
            program.close()
            fields.destroy()
        self._twins.destroy()

    def _convert_args(self, call, args):
        return self._convert(call, "args", self.inputs, args)

    def _convert(self, call, role, fields, values, tangent=False):
        """One checked array per field (see :func:`.checks.convert`)."""
        values = list(values)
        call = f"FieldProgram({self.name}).{call}"
        if len(values) != len(fields):
            raise ValueError(f"{call}: expected {len(fields)} {role} (one per field), got {len(values)}")
        return [
            checks.convert(call, role, i, self._names.get(id(f), ""), f, v, tangent)
            for i, (f, v) in enumerate(zip(fields, values))
        ]

    def _prepare(self, args):
        """Load inputs and the constants' current values, zero the outputs."""
        for field, array in zip(self.inputs, args):
            load(self._twins[field], array)
        for field in self._constants:
            load(self._twins[field], read(field))
        for field in self.outputs:
            zero(self._twins[field])

    def _read_outputs(self):
        return [read(self._twins[f]) for f in self.outputs]
