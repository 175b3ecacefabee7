"""The time loop over a field program, with the carry kept in the program's own fields.

A step of a field program loads its inputs from the host and reads its
outputs back; ``T`` steps that way would copy the state to the host and back
``T`` times. :class:`FieldStepper` loads once and then moves data field to
field on the device, by three template kernels (copy, save into a slot,
restore from a slot), each compiled once per pair of fields:

- ``feed`` copies each carried output twin into its input twin;
- checkpoints are slots of one store field per carried input (``(slots,) +
  shape``), in a tree of the stepper's own, allocated once;
- the pullback moves cotangents the same way, from the inputs' gradients to
  the outputs' gradients, and lets the parameters' gradients accumulate
  over the steps (Taichi's adjoints add into them).

NOTE: [A step is a function of its inputs] Checkpointing recomputes steps,
so each step must be what one call of the step Function computes: the same
values of every other field at every step. Before each step the stepper
zeroes the outputs and the declared ``state`` fields, and puts back the
values (taken once, when the loop starts) of every other field a kernel of
the program writes; read-only fields are loaded once. Which fields a kernel
writes comes from the same analysis as the known-zero tangents
(``_tangent/field_flows``); a program with a ``ti.template()`` kernel is
assumed to write every field.
"""
# no "from __future__ import annotations": Taichi reads the kernels' annotations as objects

from collections.abc import Sequence
from typing import Any

import numpy as np
import taichi as ti

from .._arrays import Batch
from .._cache import uses
from .._fields.twins import _new_like, is_real, zero
from .._tangent.field_flows import kernel_flows


@ti.kernel
def _copy(dst: ti.template(), src: ti.template()):  # type: ignore[valid-type]
    for index in ti.grouped(src):
        dst[index] = src[index]


@ti.kernel
def _save(store: ti.template(), slot: ti.i32, src: ti.template()):  # type: ignore[valid-type]
    for index in ti.grouped(src):
        store[slot, index] = src[index]


@ti.kernel
def _restore(dst: ti.template(), store: ti.template(), slot: ti.i32):  # type: ignore[valid-type]
    for index in ti.grouped(dst):
        dst[index] = store[slot, index]


def _written(program: Any) -> set[int] | None:
    """Ids of the fields some kernel of the program writes, or None when that cannot be known."""
    written: set[int] = set()
    for kernel, owner in program._graph.kernels_with_owners():
        flows = kernel_flows(kernel, owner)
        if flows is None:
            return None
        for w, _ in flows:
            written |= w
    return written


def _like(field: Any, leading: tuple[int, ...] = ()) -> tuple[Any, Any]:
    """An unplaced field of ``field``'s kind and dtype, and how to place it with ``leading`` axes first."""
    new = _new_like(field, False)
    shape = tuple(field.shape)
    offset = [0] * len(leading) + (list(field.snode.ptr.offset) or [0] * len(shape))

    def place(builder: Any) -> None:
        builder.dense(ti.axes(*range(len(offset))), leading + shape).place(new, offset=offset or None)

    return new, place


def _tree(fields: Sequence[Any], leading: tuple[int, ...] = ()) -> list[Any]:
    """Fields like ``fields`` (with ``leading`` axes first), placed in one tree that lives as long as they do."""
    if not fields:
        return []
    builder = ti.FieldsBuilder()
    made = []
    for f in fields:
        new, place = _like(f, leading)
        place(builder)
        made.append(new)
    builder.finalize(raise_warning=False)
    return made


class FieldStepper:
    """The schedule's stepper (NOTE: [Checkpointed pullback] in ``schedule``) over a field program's twins.

    Args:
        fn: a field Function (``_kinds.fields.FieldFunction`` or its tangent)
            whose inputs and outputs are whole fields (:meth:`fits`).
        carry: per output of ``fn``, the input it feeds, or None.
    """

    @staticmethod
    def fits(fn: Any) -> bool:
        program = getattr(fn, "program", None)
        return (hasattr(fn, "program_outputs") and program is not None
                and all(p.whole for p in program.inputs + program.outputs))

    def __init__(self, fn: Any, carry: Sequence[int | None]) -> None:
        self.fn = fn
        self.program = program = fn.program
        self.where = fn.program_outputs()  # output of fn -> output of the program (None: zeros)
        twin = program.twin
        fed = {self.where[j]: i for j, i in enumerate(carry) if i is not None}
        self.pairs = [(twin(program.outputs[o].field), twin(program.inputs[i].field)) for o, i in fed.items()]
        self.unfed = [twin(p.field) for o, p in enumerate(program.outputs) if o not in fed and is_real(p.field)]
        carried = {i for i in carry if i is not None}
        self.carried = [twin(program.inputs[i].field) for i in sorted(carried)]
        params = [p.field for i, p in enumerate(program.inputs) if i not in carried]
        self.keep = [p.field for p in program.outputs] + params
        written = _written(program)
        state = program._state_ids
        resets = [f for f in program._undeclared + params
                  if id(f) not in state and (written is None or id(f) in written)]
        self.resets = list(zip([twin(f) for f in resets], _tree(resets), strict=True))
        self.zeroed = [twin(p.field) for p in program.outputs] + [twin(f) for f in program._undeclared
                                                                     if id(f) in state]
        self.store: list[Any] = []
        self.capacity = 0

    def begin(self, batch: "Batch", slots: int) -> None:
        uses(self.program)
        program = self.program
        program._prepare(program._convert_args("primal", batch.arrays))
        for twin, snapshot in self.resets:
            _copy(snapshot, twin)
        if slots > self.capacity:  # once per loop: the schedule's slot count is fixed
            self.store = _tree(self.carried, (slots,))
            self.capacity = slots

    def step(self) -> None:
        for twin in self.zeroed:
            zero(twin)
        for twin, snapshot in self.resets:
            _copy(twin, snapshot)
        self.tape = self.program.run()

    def feed(self) -> None:
        for out, into in self.pairs:
            _copy(into, out)

    def save(self, slot: int) -> None:
        for twin, store in zip(self.carried, self.store, strict=True):
            _save(store, slot, twin)

    def restore(self, slot: int) -> None:
        for twin, store in zip(self.carried, self.store, strict=True):
            _restore(twin, store, slot)

    def outputs(self) -> list[Any]:
        outs = self.program._read_outputs()
        specs = self.fn.signature(self.fn.declared_specs())[0]
        return [np.zeros(s.shape, s.dtype) if o is None else outs[o] for o, s in zip(self.where, specs, strict=True)]

    def seed(self, cotangents: Sequence[Any]) -> None:
        program = self.program
        cts: list[Any] = [None] * len(program.outputs)
        for o, c in zip(self.where, cotangents, strict=True):
            if o is not None:
                cts[o] = c
        program.clear_gradients()
        program.seed(program._convert("vjp", "cotangents", program.outputs, cts, tangent=True))

    def pull_back(self) -> None:
        self.step()
        self.program.clear_gradients(keep=self.keep)
        self.tape.replay_adjoints()
        for out, into in self.pairs:
            if out.grad is not None:
                _copy(out.grad, into.grad)
        for out in self.unfed:  # read after the last step only: no cotangent before it
            zero(out.grad)

    def gradients(self) -> list[Any]:
        return self.program.gradients()
