"""The checkpoint schedule of a time loop: which steps run forward, which carries are kept, and the pullback.

NOTE: [Checkpointed pullback] Reverse mode of ``T`` steps needs the carry
before every step, in reverse order. Storing all ``T`` carries costs ``T``
states; recomputing each one from the start costs ``T**2 / 2`` steps.
The two-level schedule (``jax.checkpoint`` over segments, Griewank's
"checkpointing" in its simplest form) sits between them: with ``K``
checkpoints the loop is cut into segments of ``c = ceil(T / K)`` steps,

- the forward pass keeps the carry at the start of each segment (``K`` slots),
- the reverse pass takes the segments last first: it restores the segment's
  checkpoint, runs the segment forward again keeping its carries (``c - 2``
  more slots: the first is the checkpoint, the last is used where it
  stands), then pulls the cotangent back through its steps, last first,
  each from its kept carry.

Memory: ``K + c - 2`` kept carries, smallest (about ``2 sqrt T``) at ``K = sqrt T``.
Work: about ``T`` steps forward, ``T`` again to refill the segments, and for
each step its pullback (the step's forward run again, recorded, then its
adjoint). ``K = T`` keeps every carry (the stored trajectory): no refill.

The schedule is written against a *stepper* (``host.HostStepper``,
``fields.FieldStepper``) holding the carry and the parameters:

``begin(batch, slots)``, ``step()`` (the step at the carry; its results become
the outputs), ``record(t)`` (keep step ``t``'s per-step outputs), ``feed()``
(outputs to carry), ``save(slot)``, ``restore(slot)``, ``outputs()`` (the last
step's, per-step outputs stacked over the steps), ``seed(cotangents)`` (on the
outputs), ``pull_back(t)`` (step ``t``'s vjp at the carry: the cotangent
moves from the outputs, and step ``t``'s part of the per-step outputs'
cotangents, to the carry, then becomes the outputs' cotangent of the step
before; the parameters' gradients accumulate) and ``gradients()``.

NOTE: [Per-step outputs] A step's last outputs may be read at every step
(``jax.lax.scan``'s ``ys``): the forward passes that run every step (the
loop itself, and reverse mode's pass keeping checkpoints to the end) record
them, and the pullback of step ``t`` adds step ``t``'s slice of their
cotangent to what comes back from the steps after it. Refilling a segment
records nothing: the steps' values are known, only their carries are needed.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Schedule:
    """``length`` steps cut into segments of ``every`` steps, a checkpoint at the start of each."""

    length: int
    every: int

    @classmethod
    def of(cls, length: int, checkpoints: int | None) -> Schedule:
        """The schedule keeping ``checkpoints`` carries (``None``: about ``sqrt(length)``)."""
        k = max(1, math.isqrt(length - 1) + 1) if checkpoints is None else checkpoints
        return cls(length, -(-length // k))

    @property
    def starts(self) -> range:
        """The first step of each segment."""
        return range(0, self.length, self.every)

    @property
    def slots(self) -> int:
        """Carries kept at once: one per segment, and the inner carries of one segment but its last."""
        return len(self.starts) + max(0, self.every - 2)

    def buffer_slot(self, offset: int) -> int:
        """The slot of the carry ``offset`` steps into a segment (``offset >= 1``)."""
        return len(self.starts) + offset - 1


def run(stepper: Any, length: int) -> list[Any]:
    """The outputs after ``length`` steps, keeping nothing."""
    for t in range(length):
        if t:
            stepper.feed()
        stepper.step()
        stepper.record(t)
    return stepper.outputs()


def keep_checkpoints(stepper: Any, schedule: Schedule, to_the_end: bool = False) -> list[Any] | None:
    """Run forward keeping a carry at each segment's start; stop at the last one, or run on to the
    outputs (``to_the_end``), which are returned."""
    starts = schedule.starts
    t = 0
    for s, start in enumerate(starts):
        while t < start:
            stepper.step()
            if to_the_end:
                stepper.record(t)
            stepper.feed()
            t += 1
        stepper.save(s)
    if not to_the_end:
        return None
    for t in range(starts[-1], schedule.length):
        if t > starts[-1]:
            stepper.feed()
        stepper.step()
        stepper.record(t)
    return stepper.outputs()


def pull_back(stepper: Any, schedule: Schedule, cotangents: Sequence[Any], kept: bool = False) -> list[Any]:
    """The vjp of ``length`` steps by the schedule (NOTE: [Checkpointed pullback]); ``kept``: the
    checkpoints are in place already (:func:`keep_checkpoints`)."""
    starts = schedule.starts
    if not kept:  # forward to the last checkpoint: the last segment is refilled anyway
        keep_checkpoints(stepper, schedule)
    stepper.seed(cotangents)
    for s in reversed(range(len(starts))):
        start = starts[s]
        end = min(start + schedule.every, schedule.length)
        stepper.restore(s)
        for t in range(start + 1, end):
            stepper.step()
            stepper.feed()
            if t < end - 1:  # the segment's last carry is used where it stands
                stepper.save(schedule.buffer_slot(t - start))
        for t in reversed(range(start, end)):
            if t < end - 1:
                stepper.restore(s if t == start else schedule.buffer_slot(t - start))
            stepper.pull_back(t)
    return stepper.gradients()
