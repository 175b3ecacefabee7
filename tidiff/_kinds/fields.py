"""A kernel, or a Python function launching kernels, over global fields (docs/kernel-programs.md).

The engine is ``_fields.FieldProgram`` (twins of the fields, recorded
launches and replayed adjoints, the tangent program); this module gives it
the protocol:

- ``evaluate`` runs the program on its twins;
- ``vjp`` replays the adjoints of the recorded launches (as ``ti.ad.Tape``);
- ``tangent()`` is the *tangent program* (NOTE: [Tangent program] in
  ``_fields/tangent.py``) as a field function again: every kernel replaced by
  tidiff's tangent transform of it, so forward mode is exact where Taichi's
  ``FwdMode`` is not (an output overwritten by several kernels, ``ti.floor``,
  a norm of a constant zero vector), and its vjp is second order.

Field programs have fixed shapes: they take no batch dims.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._arrays import Batch, broadcast_to, contiguous, tensor_device, zeros
from .._cache import uses
from .._errors import describe_shape
from .._fields import FieldProgram
from .._fields.hidden_rules import describe, refuse_recomputed
from .._protocol import Function, register_kind
from .._reverse_check import checked_vjp, pushed_vjp, wrong_reverse
from .._signature import ArgSpec
from .._tree import Tree, flat_tree


class FieldFunction(Function):
    """A program over fields with declared inputs and outputs, as a Function."""

    tensors_in_place = True

    def __init__(self, program: FieldProgram, name: str, *, listed: bool = True) -> None:
        super().__init__(name, listed=listed)
        self.program = program
        self._counter.add(program)
        self._in = [ArgSpec(*s) for s in program.in_specs]
        self._out = [ArgSpec(*s) for s in program.out_specs]

    def param_names(self) -> list[str]:
        return [s.name for s in self._in]

    def declared_specs(self) -> list[ArgSpec]:
        return list(self._in)

    def specs_for(self, args: Sequence[Any]) -> list[ArgSpec]:
        return list(self._in)  # a field's dtype is its own, whatever the argument's

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        return list(self._out), flat_tree(len(self._out), len(self._out) == 1)

    def read(self, args: Sequence[Any], call: str | None = None) -> Batch:
        """Arrays of exactly the fields' shapes (no batch dims), in the fields' dtypes."""
        call = call or self.name
        if len(args) == len(self._in):
            for value, spec in zip(args, self._in, strict=True):
                if value is None:
                    raise TypeError(f"{call}: argument {spec.name!r} (a field): expected an array, got None")
                shape = tuple(np.shape(value)) if not isinstance(value, str) else None
                if shape is not None and shape != spec.shape and shape != ():
                    extra = " (a field program takes no batch dims)" if shape[-len(spec.shape):] == spec.shape \
                        or not spec.shape else ""
                    raise ValueError(f"{call}: argument {spec.name!r} (a field): expected {describe_shape(spec.shape)},"
                                     f" got {describe_shape(shape)}{extra}")
        batch = super().read(args, call)
        arrays = tuple(_exactly(a, s.shape) for a, s in zip(batch.arrays, self._in, strict=True))
        return Batch(arrays, batch.specs, (), batch.device)

    def evaluate(self, batch: Batch) -> list[Any]:
        uses(self.program)
        return list(self.program.primal(batch.arrays))

    def vjp(self, batch: Batch, cotangents: Sequence[Any]) -> list[Any]:
        return checked_vjp(self, batch, cotangents, lambda: self.unchecked_vjp(batch, cotangents),
                           f"the field program `{self.name}`", exact=lambda: self.program.replay_exact)

    def unchecked_vjp(self, batch: Batch, cotangents: Sequence[Any]) -> list[Any]:
        """The vjp by reverse mode alone (replaying the recorded launches' adjoints), unchecked."""
        uses(self.program)
        cts = [None if c is None else _exactly(c, s.shape) for c, s in zip(cotangents, self._out, strict=True)]
        _, grads = self.program.vjp(batch.arrays, cts)
        return list(grads)

    def reverse_refused(self) -> str | None:
        refuse_recomputed(self.program.hidden_rules(), f"the field program `{self.program.name}`")  # forward pushes
        # would draw anew
        return describe(self.program.refused()) or wrong_reverse(self)

    def program_outputs(self) -> list[int | None]:
        """Per output, the program output holding it (None: zeros, not computed)."""
        return list(range(len(self._out)))

    def linearize(self, batch: Batch) -> tuple[list[Any], Any]:
        """One recorded run; the pullback replays its adjoints (as ``ti.ad.Tape``: one forward pass)."""
        uses(self.program)
        outs, pullback = self.program.linearize(batch.arrays)
        specs = self.signature(self._in)[0]
        device = tensor_device(batch.arrays)
        outs = [zeros(s.shape, s.dtype, device) if o is None else outs[o]
                for o, s in zip(self.program_outputs(), specs, strict=True)]
        return outs, lambda cotangents: checked_vjp(
            self, batch, cotangents, lambda: list(pullback(self._program_cotangents(cotangents))),
            f"the field program `{self.name}`", exact=lambda: self.program.replay_exact)

    def _program_cotangents(self, cotangents: Sequence[Any]) -> list[Any]:
        """Cotangents of the program's outputs: each in its output's shape (those of zero outputs dropped)."""
        specs = self.signature(self._in)[0]
        by_output = [None if c is None else _exactly(c, s.shape) for c, s in zip(cotangents, specs, strict=True)]
        kept: list[Any] = [None] * len(self.program.out_specs)
        for o, c in zip(self.program_outputs(), by_output, strict=True):
            if o is not None:
                kept[o] = c
        return kept

    def tangent(self) -> Function:
        if "tangent" not in self.derived:
            self.derived["tangent"] = FieldTangent(self)
        return self.derived["tangent"]


class FieldTangent(FieldFunction):
    """``(x..., dx for each float x...) -> (y..., dy for each y...)``: the tangent program as a field function.

    The tangent program has a tangent output for each *float* output; an
    integer output's tangent is zeros.
    """

    def __init__(self, parent: FieldFunction) -> None:
        super().__init__(parent.program.tangent(), f"jvp({parent.name})", listed=False)
        self.parent = parent
        self._primal_out = list(parent._out)
        self._out = self._primal_out + [ArgSpec("d" + s.name, s.shape, s.dtype) for s in self._primal_out]

    def _float_outputs(self) -> list[int]:
        return [o for o, s in enumerate(self._primal_out) if s.is_float]

    def program_outputs(self) -> list[int | None]:
        m = len(self._primal_out)
        rank = {o: m + r for r, o in enumerate(self._float_outputs())}
        return list(range(m)) + [rank.get(o) for o in range(m)]

    def evaluate(self, batch: Batch) -> list[Any]:
        uses(self.program)
        outs = list(self.program.primal(batch.arrays))
        m = len(self._primal_out)
        tangents = iter(outs[m:])
        device = tensor_device(batch.arrays)
        return outs[:m] + [next(tangents) if s.is_float else zeros(s.shape, s.dtype, device) for s in self._primal_out]

    def vjp(self, batch: Batch, cotangents: Sequence[Any]) -> list[Any]:
        """Reverse mode over the tangent program (second order); where tidiff's reverse transform does not take a
        kernel of it, pushed forward instead of refused: the primal's own reverse mode, tidiff's, chose this way
        (NOTE: [Taichi's reverse mode not run])."""
        refused = describe(self.program.refused())
        if refused is not None:
            return pushed_vjp(self, batch, cotangents, refused)
        return super().vjp(batch, cotangents)

    def linearize(self, batch: Batch) -> tuple[list[Any], Any]:
        refused = describe(self.program.refused())
        if refused is not None:
            return self.evaluate(batch), lambda cotangents: pushed_vjp(self, batch, cotangents, refused)
        return super().linearize(batch)

    def unchecked_vjp(self, batch: Batch, cotangents: Sequence[Any]) -> list[Any]:
        """Reverse mode over the tangent program (second order), unchecked."""
        m = len(self._primal_out)
        kept = list(cotangents[:m]) + [cotangents[m + o] for o in self._float_outputs()]
        uses(self.program)
        cts = [None if c is None else _exactly(c, s.shape) for c, s in zip(kept, self.program.out_specs, strict=True)]
        _, grads = self.program.vjp(batch.arrays, cts)
        return list(grads)


def _exactly(array: Any, shape: tuple[int, ...]) -> Any:
    """``array`` broadcast to ``shape``, contiguous (NumPy or a tensor in place, NOTE: [Tensors in place])."""
    return contiguous(broadcast_to(array, shape))


def _accepts(f: Any, options: dict[str, Any]) -> bool:
    return callable(f)


def _make(f: Any, *, inputs: Any = None, outputs: Any = None, signature: Any = None, name: str | None = None,
          constants: Any = None, state: Any = None) -> FieldFunction:
    fn_name = name or getattr(f, "__name__", None) or type(f).__name__
    call = f"td.function({fn_name})"
    if inputs is None or outputs is None:
        raise TypeError(
            f"{call}: {fn_name!r} is a kernel or Python program; declare the fields it reads and "
            "writes: td.function(f, inputs=[...], outputs=[...])"
        )
    if signature is not None:
        raise TypeError(f"{call}: signature= is for @ti.func; a field program's shapes come from its fields")
    if constants is not None:
        raise TypeError(f"{call}: constants= is for kernels over ndarrays (inputs named by parameter)")
    program = FieldProgram(f, inputs=inputs, outputs=outputs, state=state or (), name=fn_name, call=call)
    return FieldFunction(program, fn_name)


register_kind("field program", _accepts, _make)
