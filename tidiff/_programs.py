"""Kernels and Python programs over global fields as Functions (API.md 1b).

The engine itself is ``_fields.FieldProgram`` (twins, replayed adjoints,
forward mode); this adapter gives it the Function interface. Field programs
have fixed shapes: they take no batch dims.
"""
import numpy as np

from ._arrays import contiguous
from ._function import Function
from ._signature import ArgSpec
from ._tree import flat_tree


class FieldFunction(Function):
    """A kernel or Python program over global fields, with declared inputs and outputs."""

    def __init__(self, program, inputs, outputs, name=None):
        from ._fields import FieldProgram

        super().__init__(name or getattr(program, "__name__", "program"))
        self.program = FieldProgram(program, inputs=inputs, outputs=outputs)
        self._counter.add_program(self.program)
        self._in = [ArgSpec(*s) for s in self.program.in_specs]
        self._out = [ArgSpec(*s) for s in self.program.out_specs]

    def declared_specs(self):
        return self._in

    def signature(self, in_specs):
        return self._out, flat_tree(len(self._out), len(self._out) == 1)

    def read(self, args, call=None):
        batch = super().read(args, call)
        if batch.batch_shape != ():
            raise ValueError(
                f"{call or self.name}: a field program takes arrays of exactly its fields' shapes "
                f"{[s.shape for s in self._in]}, with no batch dims; got batch dims {batch.batch_shape}"
            )
        batch.arrays = [contiguous(np.broadcast_to(a, s.shape)) for a, s in zip(batch.arrays, self._in)]
        return batch

    def _evaluate(self, batch, counter):
        counter.add_program(self.program)
        return list(self.program.primal(batch.arrays))

    def _vjp(self, batch, cotangents, counter):
        counter.add_program(self.program)
        cts = [np.zeros(s.shape, s.dtype) if c is None else np.broadcast_to(c, s.shape) for c, s in zip(cotangents, self._out)]
        outs, grads = self.program.vjp(batch.arrays, [contiguous(c) for c in cts])
        return list(outs), list(grads)

    def _jvp(self, batch, tangents, counter):
        counter.add_program(self.program)
        ts = [np.zeros(s.shape, s.dtype) if t is None else np.broadcast_to(t, s.shape) for t, s in zip(tangents, self._in)]
        outs, touts = self.program.jvp(batch.arrays, [contiguous(t) for t in ts])
        return list(outs), list(touts)
