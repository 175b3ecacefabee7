"""The time loop of a field program whose kernels run over buffers with a time axis: no data moves per step.

NOTE: [A time loop over buffers] :class:`~.fields.FieldStepper` runs the
program's own kernels, so the carry must be copied into the inputs before
every step, and reverse mode runs each step forward once more to give its
adjoints their values: about 13 launches per step where ``ti.ad.Tape``
over a stored trajectory makes 4. :class:`AxisStepper` runs the kernels
rewritten over buffers with a time axis instead (NOTE: [Fields with a
time axis]), a segment of the checkpoint schedule (NOTE: [Checkpointed
pullback]) at a time:

- the carry at the segment's start sits in slot 0 of each carry buffer;
  step ``r`` of the segment reads slot ``r`` and writes slot ``r + 1``,
  its state in slot ``r`` of the state buffers, its per-step outputs in
  their slot of the loop's whole length: the forward pass launches the
  step's kernels and nothing else, and a segment ends by copying its last
  carry to slot 0 (one launch per segment);
- reverse mode restores a segment's checkpoint into slot 0, runs the
  segment forward (every step's values stay in their slots), then launches
  each step's kernel adjoints last first: the cotangent flows from the
  gradient of slot ``r + 1`` to that of slot ``r``, the parameters'
  gradients add up, and nothing runs forward again. The cotangent at slot
  0 is handed to the end of the segment before (one launch).

So a step costs its kernels twice forward and once in reverse, the floor of
checkpointing. Memory: the checkpoints (``K`` carries), a segment's carries
and states (``ceil(T / K)`` each), and the per-step outputs (the user's
result). The launches of a step are recorded once, from a first run of the
program: a step launches the same kernels with the same numbers every time.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from taichi.lang.exception import TaichiCompilationError

from .._adjoint.kernels import KernelAdjoint, vjp_kernel
from .._arrays import Batch, of_dtype
from .._cache import uses
from .._fields.tape import is_taichi_helper
from .._fields.twins import full_shape, is_real, load, numpy_dtype, read, zero
from .._lang.launch import NumberLaunch
from .._lang.serial import launches, serial_twin
from .fields import FieldStepper, _clear, _copy_slot, _restore_and_move, _save, _tree, _trees, move
from .schedule import Schedule
from .time_axis import Axis, NotLifted, with_time_axis


class AxisStepper(FieldStepper):
    """A field program's time loop over buffers with a time axis (see the NOTE); :meth:`made` says whether the
    program's kernels take the rewrite. It drives the whole schedule itself (:meth:`run_loop`,
    :meth:`pull_back_all`), with segments of its own: keeping every carry is one segment."""

    @staticmethod
    def fits(fn: Any) -> bool:
        """A field function each of whose outputs is one of its program's (not zeros in their place)."""
        return FieldStepper.fits(fn) and None not in fn.program_outputs()

    @classmethod
    def made(cls, fn: Any, carry: Sequence[int | None], each: Sequence[bool], length: int, schedule: Schedule,
             batch: Batch) -> AxisStepper | None:
        """The stepper, or None where a kernel of the program does not take the rewrite (NOTE: [Fields with a
        time axis])."""
        try:
            return cls(fn, carry, each, length, schedule, batch)
        except NotLifted:
            return None

    def __init__(self, fn: Any, carry: Sequence[int | None], each: Sequence[bool], length: int,
                 schedule: Schedule, batch: Batch) -> None:
        super().__init__(fn, carry, each, length)
        inputs = {id(self.program.twin(p.field)) for p in self.program.inputs}
        if any(id(t) in inputs for t in self.reset_twins):
            raise NotLifted("the step writes a parameter")
        calls, keeps_the_rules = self._recorded(batch)
        # keeping every carry is one segment of the whole loop: the stored trajectory, no refill
        self.schedule = Schedule(length, length if schedule.every == 1 else schedule.every)
        self.every = every = self.schedule.every
        self.pairs = list(zip(self.outs, self.ins, strict=True))
        outs = {id(o) for o in self.outs} | {id(t) for t in self.each_twins}
        self.state_twins = tuple(t for t in self.zeroed if id(t) not in outs)
        self.carry_buffers, self.state_buffers, self.reset_buffers, self.step_buffers = _trees(
            [(self.ins, (every + 1,)), (self.state_twins, (every,)), (self.reset_twins, (every,)),
             (self.each_twins, (length,))], grads=True)
        axes: dict[int, Axis] = {}
        for (o, i), b in zip(self.pairs, self.carry_buffers, strict=True):
            axes[id(i)], axes[id(o)] = Axis(b, "slot"), Axis(b, "next")
        for twins, buffers in ((self.state_twins, self.state_buffers), (self.reset_twins, self.reset_buffers)):
            axes.update((id(t), Axis(b, "slot")) for t, b in zip(twins, buffers, strict=True))
        axes.update((id(t), Axis(b, "step")) for t, b in zip(self.each_twins, self.step_buffers, strict=True))
        lifted = [self._lifted(kernel, args, axes) for kernel, args in calls]
        self.launches = [launch for launch, _ in lifted]
        # NOTE: [Launches that keep the access rules]: each slot is written by one step and read after it, so the
        # loop keeps the rules where one step does; with tidiff's adjoints, no check of Taichi's reverse mode
        self.exact = keeps_the_rules and all(own for _, own in lifted)
        self._check_one_step()
        self.last_in_slots = False  # whether the slots hold the last segment of the checkpoints' run
        real = [k for k, (_, i) in enumerate(self.pairs) if is_real(i)]
        self.carry_grads = tuple(self.carry_buffers[k].grad for k in real)
        self.real_ins = tuple(self.ins[k] for k in real)
        self.real_out_grads = tuple(self.outs[k].grad for k in real)
        self.inner_grads = tuple(b.grad for b in self.state_buffers + self.reset_buffers if is_real(b))

    def _recorded(self, batch: Batch) -> tuple[list[tuple[Any, tuple[Any, ...]]], bool]:
        """The launches of one run of the program at the call's arguments (its results stay in the twins), and
        whether tidiff reverses them all, keeping the access rules."""
        program = self.program
        program._prepare(program._convert_args("primal", batch.arrays))
        recorder = program.run()
        calls = recorder.calls
        for kernel, args in calls:
            owned = program._guard.owned(kernel)
            if owned is None or is_taichi_helper(kernel):
                raise NotLifted(f"the step launches `{getattr(kernel, '__name__', kernel)}`, not a kernel of its own")
            numbers = args[1:] if getattr(owned, "_is_classkernel", False) else args
            if any(type(a) not in (int, float, bool) for a in numbers):
                raise NotLifted(f"the step passes `{owned.__name__}` an argument other than a number")
        return calls, recorder.keeps_the_rules

    def _lifted(self, kernel: Any, args: tuple[Any, ...],
                axes: dict[int, Axis]) -> tuple[tuple[Any, tuple[Any, ...], Any], bool]:
        """``(kernel over buffers, its arguments, its adjoint)`` for a recorded launch, and whether the adjoint is
        tidiff's."""
        owned = self.program._guard.owned(kernel)
        bound = getattr(owned, "_is_classkernel", False)
        owner, numbers = (args[0], args[1:]) if bound else (None, args)
        lifted = with_time_axis(owned, owner, axes)
        own = vjp_kernel(lifted)
        if not isinstance(own, KernelAdjoint) and isinstance(vjp_kernel(owned, owner), KernelAdjoint):
            raise NotLifted(f"tidiff reverses `{owned.__name__}` but not its rewrite over buffers: {own}")
        # NOTE: [Number launches]; the kernel and tidiff's adjoint by their faster forms (NOTE: [Small loops run
        # serially])
        adjoint = own.launch if isinstance(own, KernelAdjoint) else NumberLaunch(lifted.grad)
        launch = (launches(lifted, serial_twin(lifted)), tuple(numbers), adjoint)
        return launch, isinstance(own, KernelAdjoint)

    def _check_one_step(self) -> None:
        """One step over the buffers from the carry the recorded run started at gives that run's outputs (a
        rewrite Taichi does not compile, or that computes otherwise, is not used)."""
        expected = [t.to_numpy() for t in self.outs + self.each_twins]
        _save(self.carry_buffers, 0, self.ins, None)
        self._segment(0, 1)
        try:
            self._steps(0, 1)
        except TaichiCompilationError as error:
            raise NotLifted(f"Taichi does not compile the step's kernels over buffers: {error}") from None
        got = [b.to_numpy()[1] for b in self.carry_buffers] + [b.to_numpy()[0] for b in self.step_buffers]
        for g, e in zip(got, expected, strict=True):
            scale = float(np.max(np.abs(e), initial=0.0, where=np.isfinite(e)))
            if not np.allclose(g, e, rtol=1e-12, atol=1e-12 * scale, equal_nan=True):
                raise NotLifted("the step over buffers computes other values than the step")

    # --- the schedule -----------------------------------------------------------------------------
    def begin(self, batch: Batch, slots: int) -> None:
        """Load the arguments, the carry into slot 0; make the checkpoints' store (once)."""
        uses(self.program)
        self.program._prepare(self.program._convert_args("primal", batch.arrays))
        move(self.snapshots, self.reset_twins, ())
        if not self.store:
            self.store = tuple(_tree(self.ins, (len(self.schedule.starts),)))

    def _segment(self, start: int, end: int) -> None:
        """Slots for the steps ``start..end-1``: the carry's after slot 0 and the states zeroed, reset fields
        filled, per-step outputs of these steps zeroed."""
        _clear(self.carry_buffers, 1, self.every + 1, self.step_buffers, self.each_twins, start, end,
               self.state_buffers, self.reset_buffers, self.snapshots)

    def _steps(self, start: int, end: int) -> None:
        for t in range(start, end):
            for kernel, args, _ in self.launches:
                kernel(*args, t - start, t)

    def _segments(self) -> list[tuple[int, int]]:
        return [(s, min(s + self.every, self.length)) for s in self.schedule.starts]

    def run_loop(self, keep: bool = False) -> list[Any]:
        """The outputs of the loop from the arguments :meth:`begin` loaded (``keep``: saving each segment's
        first carry as its checkpoint)."""
        self._forward(keep, to_the_end=True)
        start, end = self._segments()[-1]
        _restore_and_move(self.outs, self.carry_buffers, end - start, (), (), (), None)
        return self.outputs()

    def _forward(self, keep: bool, to_the_end: bool) -> None:
        """Run the segments (``keep``: saving each one's first carry; ``to_the_end``: else stop at the last
        checkpoint)."""
        _save(self.carry_buffers, 0, self.ins, None)
        self.last_in_slots = keep and to_the_end
        segments = self._segments()
        for s, (start, end) in enumerate(segments):
            if s:
                _copy_slot(self.carry_buffers, 0, self.carry_buffers, self.every, self.ins)
            if keep:
                _copy_slot(self.store, s, self.carry_buffers, 0, self.ins)
            if not to_the_end and s == len(segments) - 1:
                return
            self._segment(start, end)
            self._steps(start, end)

    def outputs(self) -> list[Any]:
        outs = self.program._read_outputs()
        specs = self.fn.signature(self.fn.declared_specs())[0]
        device = self.program._device  # NOTE: [Tensors in place] in _arrays
        results = [outs[o] for o in self.where]
        buffers = iter(self.step_buffers)
        for j, _ in self.each:
            results[j] = read(next(buffers), device)
        assert all(r is not None for r in results) and len(results) == len(specs)
        return results

    def pull_back_all(self, cotangents: Sequence[Any], kept: bool) -> list[Any]:
        """The vjp of the loop (NOTE: [A time loop over buffers]); ``kept``: the checkpoints are this call's (a
        run to the end keeping them, if it was the last run, left the last segment's values in their slots)."""
        fresh = kept and self.last_in_slots
        self.last_in_slots = False
        if not kept:
            self._forward(keep=True, to_the_end=False)
        segments = self._segments()
        self._seed(cotangents, segments[-1][1] - segments[-1][0])
        for s in reversed(range(len(segments))):
            start, end = segments[s]
            if not (fresh and s == len(segments) - 1):
                _copy_slot(self.carry_buffers, 0, self.store, s, self.ins)
                self._segment(start, end)
                self._steps(start, end)
            _clear(self.carry_grads, 0, end - start, (), (), 0, 0, self.inner_grads, (), ())
            for t in reversed(range(start, end)):
                for _, args, adjoint in reversed(self.launches):
                    adjoint(*args, t - start, t)
            if s:
                _copy_slot(self.carry_grads, self.every, self.carry_grads, 0, self.real_ins)
        _restore_and_move(self.real_out_grads, self.carry_grads, 0, (), (), (), None)
        return self.gradients()

    def _seed(self, cotangents: Sequence[Any], last: int) -> None:
        """The final carry's cotangent into slot ``last`` of the carry gradients, the per-step outputs' into
        theirs; every other gradient of the program zero."""
        program = self.program
        program.check_reverse()
        each = dict(self.each)
        cts: list[Any] = [None] * len(program.outputs)
        for j, (o, c) in enumerate(zip(self.where, cotangents, strict=True)):
            if j not in each:
                cts[o] = c
        program.clear_gradients()
        program.seed(program._convert("vjp", "cotangents", program.outputs, cts, tangent=True))
        _save(self.carry_grads, last, self.real_out_grads, None)
        for (j, _), buffer in zip(self.each, self.step_buffers, strict=True):
            if not is_real(buffer):
                continue
            c = cotangents[j]
            if c is None:
                zero(buffer.grad)
            else:
                load(buffer.grad, of_dtype(c, numpy_dtype(buffer.grad), program._device))

    def kept_bytes(self) -> int:
        """Bytes the loop keeps beside the program's fields: checkpoints, a segment's slots (values and
        gradients), per-step outputs."""
        def size(f: Any, grads: bool) -> int:
            return math.prod(full_shape(f)) * numpy_dtype(f).itemsize * (2 if grads and is_real(f) else 1)

        slotted = self.carry_buffers + self.state_buffers + self.reset_buffers + self.step_buffers
        return sum(size(f, False) for f in self.store) + sum(size(f, True) for f in slotted)
