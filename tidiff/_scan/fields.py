"""The time loop over a field program, with the carry kept in the program's own fields.

A step of a field program loads its inputs from the host and reads its
outputs back; ``T`` steps that way would copy the state to the host and back
``T`` times. :class:`FieldStepper` loads once and then moves data field to
field on the device, by three template kernels (move, save into a slot,
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

import taichi as ti

from .._arrays import Batch, of_dtype, zeros
from .._cache import uses
from .._fields.twins import _new_like, fields_builder, is_real, load, numpy_dtype, read, zero
from .._tangent.field_flows import kernel_flows


# Each kernel takes tuples of fields and moves all of them in one launch (one launch of several
# loops costs a fraction of one launch per field on CPU: the loop's launch dominates small fields).
# NOTE: [One loop for fields of one shape] Each loop over a field is a task of its own in Taichi's
# launch (about 100 us each on a 2-core CPU, whatever the field's size up to thousands of entries):
# where every field a call moves has one shape, ``like`` is a field of that shape and one loop over
# it moves them all (a step's move of 5 fields of 128 vectors: 530 us -> 210 us); with ``like`` None,
# fields of several shapes take a loop each.
def _given(like):
    return like is not None


@ti.kernel
def _move(dsts: ti.template(), srcs: ti.template(), zeros: ti.template(),  # type: ignore[valid-type]
          like: ti.template()):  # type: ignore[valid-type]
    """Copy ``srcs`` into ``dsts``, then zero ``zeros`` (which may include some of ``srcs``)."""
    if ti.static(_given(like)):
        for index in ti.grouped(like):
            for k in ti.static(range(len(dsts))):
                dsts[k][index] = srcs[k][index]
            for k in ti.static(range(len(zeros))):
                zeros[k][index] = ti.zero(zeros[k][index])
    else:
        for k in ti.static(range(len(dsts))):
            for index in ti.grouped(srcs[k]):
                dsts[k][index] = srcs[k][index]
        for k in ti.static(range(len(zeros))):
            for index in ti.grouped(zeros[k]):
                zeros[k][index] = ti.zero(zeros[k][index])


@ti.kernel
def _restore_and_move(dsts: ti.template(), stores: ti.template(), slot: ti.i32,  # type: ignore[valid-type]
                      more: ti.template(), srcs: ti.template(), zeros: ti.template(),  # type: ignore[valid-type]
                      like: ti.template()):  # type: ignore[valid-type]
    """Restore ``dsts`` from ``slot`` of ``stores``, copy ``srcs`` into ``more``, zero ``zeros``."""
    if ti.static(_given(like)):
        for index in ti.grouped(like):
            for k in ti.static(range(len(dsts))):
                dsts[k][index] = stores[k][slot, index]
            for k in ti.static(range(len(more))):
                more[k][index] = srcs[k][index]
            for k in ti.static(range(len(zeros))):
                zeros[k][index] = ti.zero(zeros[k][index])
    else:
        for k in ti.static(range(len(dsts))):
            for index in ti.grouped(dsts[k]):
                dsts[k][index] = stores[k][slot, index]
        for k in ti.static(range(len(more))):
            for index in ti.grouped(srcs[k]):
                more[k][index] = srcs[k][index]
        for k in ti.static(range(len(zeros))):
            for index in ti.grouped(zeros[k]):
                zeros[k][index] = ti.zero(zeros[k][index])


@ti.kernel
def _save(stores: ti.template(), slot: ti.i32, srcs: ti.template(), like: ti.template()):  # type: ignore[valid-type]
    if ti.static(_given(like)):
        for index in ti.grouped(like):
            for k in ti.static(range(len(srcs))):
                stores[k][slot, index] = srcs[k][index]
    else:
        for k in ti.static(range(len(srcs))):
            for index in ti.grouped(srcs[k]):
                stores[k][slot, index] = srcs[k][index]


@ti.kernel
def _copy_slot(dsts: ti.template(), to: ti.i32, srcs: ti.template(), at: ti.i32,  # type: ignore[valid-type]
               likes: ti.template()):  # type: ignore[valid-type]
    """Slot ``to`` of each of ``dsts`` from slot ``at`` of ``srcs`` (``likes``: fields of one slot's shape)."""
    for k in ti.static(range(len(dsts))):
        for index in ti.grouped(likes[k]):
            dsts[k][to, index] = srcs[k][at, index]


@ti.kernel
def _clear(slotted: ti.template(), lo: ti.i32, hi: ti.i32, stepped: ti.template(),  # type: ignore[valid-type]
           steps_like: ti.template(), first: ti.i32, last: ti.i32, zeros: ti.template(),  # type: ignore[valid-type]
           fills: ti.template(), snapshots: ti.template()):  # type: ignore[valid-type]
    """Zero slots ``lo..hi-1`` of ``slotted`` and ``first..last-1`` of ``stepped`` (``steps_like``: fields of one
    slot's shape), all of ``zeros``; every slot of ``fills`` from its snapshot."""
    for k in ti.static(range(len(slotted))):
        for index in ti.grouped(slotted[k]):
            if lo <= index[0] and index[0] < hi:
                slotted[k][index] = ti.zero(slotted[k][index])
    for k in ti.static(range(len(stepped))):  # the segment's steps only, not the loop's
        for index in ti.grouped(steps_like[k]):
            for t in range(first, last):
                stepped[k][t, index] = ti.zero(stepped[k][t, index])
    for k in ti.static(range(len(zeros))):
        for index in ti.grouped(zeros[k]):
            zeros[k][index] = ti.zero(zeros[k][index])
    for k in ti.static(range(len(fills))):
        for index in ti.grouped(snapshots[k]):
            for s in range(fills[k].shape[0]):
                fills[k][s, index] = snapshots[k][index]


def one_shape(*groups):
    """A field whose shape every field of ``groups`` has (NOTE: [One loop for fields of one shape]), or None.

    Asked once per group of fields (a stepper's are fixed): Taichi reads a field's shape from its SNode
    at every ``.shape``, which costs as much as the launch saved."""
    fields = [f for group in groups for f in group]
    if not fields or not fields[0].shape or any(f.shape != fields[0].shape for f in fields):
        return None
    return fields[0]


def move(dsts, srcs, zeros, like=None):
    """Copy ``srcs`` into ``dsts`` and zero ``zeros``; ``like``: their :func:`one_shape`."""
    if dsts or zeros:
        _move(dsts, srcs, zeros, like)


def save(stores, slot, srcs, like):
    if srcs:
        _save(stores, slot, srcs, like)


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


def _like(field: Any, leading: tuple[int, ...] = (), grads: bool = False) -> tuple[Any, Any]:
    """An unplaced field of ``field``'s kind and dtype (with a gradient where ``grads`` and it is real), and how
    to place it with ``leading`` axes first."""
    real = grads and is_real(field)
    new = _new_like(field, real)
    shape = tuple(field.shape)
    offset = [0] * len(leading) + (list(field.snode.ptr.offset) or [0] * len(shape))

    def place(builder: Any) -> None:
        for member in (new, new.grad) if real else (new,):
            builder.dense(ti.axes(*range(len(offset))), leading + shape).place(member, offset=offset or None)

    return new, place


def _tree(fields: Sequence[Any], leading: tuple[int, ...] = (), grads: bool = False) -> list[Any]:
    """Fields like ``fields`` (with ``leading`` axes first; with gradients where ``grads``), placed in one tree
    that lives as long as they do."""
    return list(_trees(((fields, leading),), grads)[0])


def _trees(groups: Sequence[tuple[Sequence[Any], tuple[int, ...]]], grads: bool = False) -> list[tuple[Any, ...]]:
    """Per group ``(fields, leading)``, fields like them with ``leading`` axes first (with gradients where
    ``grads``), all placed in one tree."""
    if not any(fields for fields, _ in groups):
        return [() for _ in groups]
    builder = fields_builder("the checkpoints of a time loop")
    made = []
    for fields, leading in groups:
        group = []
        for f in fields:
            new, place = _like(f, leading, grads)
            place(builder)
            group.append(new)
        made.append(tuple(group))
    builder.finalize(raise_warning=False)
    return made


def twin_grad(program: Any, o: int) -> Any:
    """The gradient field of the twin of the program's output ``o`` (None for an integer output)."""
    return program.twin(program.outputs[o].field).grad


class FieldStepper:
    """The schedule's stepper (NOTE: [Checkpointed pullback] in ``schedule``) over a field program's twins.

    Args:
        fn: a field Function (``_kinds.fields.FieldFunction`` or its tangent)
            whose inputs and outputs are whole fields (:meth:`fits`).
        carry: per output of ``fn``, the input it feeds, or None.
        each: per output of ``fn``, whether it is read at every step (NOTE: [Per-step outputs] in ``schedule``):
            recorded into a field of ``length`` slots, its cotangent loaded into its twin's grad slot by slot.
    """

    @staticmethod
    def fits(fn: Any) -> bool:
        program = getattr(fn, "program", None)
        return (hasattr(fn, "program_outputs") and program is not None
                and all(p.whole for p in program.inputs + program.outputs))

    def __init__(self, fn: Any, carry: Sequence[int | None], each: Sequence[bool], length: int) -> None:
        self.fn = fn
        self.program = program = fn.program
        self.where = fn.program_outputs()  # output of fn -> output of the program (None: zeros)
        twin = program.twin
        fed = {self.where[j]: i for j, i in enumerate(carry) if i is not None}
        pairs = [(twin(program.outputs[o].field), twin(program.inputs[i].field)) for o, i in fed.items()]
        self.outs, self.ins = tuple(o for o, _ in pairs), tuple(i for _, i in pairs)
        real = [(o, i) for o, i in pairs if o.grad is not None]
        self.out_grads, self.in_grads = tuple(o.grad for o, _ in real), tuple(i.grad for _, i in real)
        real_inputs = {id(twin(program.inputs[i].field)): i for i in fed.values()}
        self.carry_cotangents = [(real_inputs[id(i)], o.grad) for o, i in real]
        self.unfed = tuple(twin(p.field).grad for o, p in enumerate(program.outputs)
                           if o not in fed and is_real(p.field))
        carried = {i for i in carry if i is not None}
        self.carried = tuple(twin(program.inputs[i].field) for i in sorted(carried))
        params = [p.field for i, p in enumerate(program.inputs) if i not in carried]
        kept = {id(twin(f)) for f in [p.field for p in program.outputs] + params}
        self.cleared = tuple(t.grad for t in program._twins.real() if id(t) not in kept) + self.unfed
        written = _written(program)
        state = program._state_ids
        resets = [f for f in program._undeclared + params
                  if id(f) not in state and (written is None or id(f) in written)]
        self.reset_twins, self.snapshots = tuple(twin(f) for f in resets), tuple(_tree(resets))
        self.zeroed = tuple([twin(p.field) for p in program.outputs]
                            + [twin(f) for f in program._undeclared if id(f) in state])
        self.store: tuple = ()
        self.capacity = 0
        self.length = length
        self.each = [(j, self.where[j]) for j, e in enumerate(each) if e]  # (output of fn, of the program)
        self.each_twins = tuple(twin(program.outputs[o].field) for _, o in self.each if o is not None)
        self.each_store: tuple = ()  # made at the first call (a stepper keeping them elsewhere never makes it)
        self.each_grads = tuple(t.grad for t in self.each_twins if t.grad is not None)
        self.each_cts: tuple = ()  # fields of ``length`` slots for their cotangents, made at the first seed
        self.like = {"feed": one_shape(self.ins + self.reset_twins, self.outs + self.snapshots, self.zeroed),
                     "save": one_shape(self.carried),
                     "restore": one_shape(self.carried, self.reset_twins, self.snapshots, self.zeroed),
                     "grads": one_shape(self.out_grads, self.in_grads, self.cleared),
                     "each": one_shape(self.each_twins),
                     "each grads": one_shape(self.each_grads)}
        self.seeded_each = False

    def begin(self, batch: "Batch", slots: int) -> None:
        uses(self.program)
        program = self.program
        program._prepare(program._convert_args("primal", batch.arrays))
        move(self.snapshots, self.reset_twins, ())
        if self.each_twins and not self.each_store:
            self.each_store = tuple(_tree(self.each_twins, (self.length,)))
        if slots > self.capacity:  # once per loop: the schedule's slot count is fixed
            self.store = tuple(_tree(self.carried, (slots,)))
            self.capacity = slots

    # NOTE: the invariant "before a step, the outputs and state fields are zero and the written fields
    # are reset" is kept by whatever put the carry in place (begin, feed, restore), in the same launch
    def step(self) -> None:
        self.tape = self.program.run()

    def record(self, t: int) -> None:
        if self.each_twins:
            save(self.each_store, t, self.each_twins, self.like["each"])

    def feed(self) -> None:
        move(self.ins + self.reset_twins, self.outs + self.snapshots, self.zeroed, self.like["feed"])

    def save(self, slot: int) -> None:
        save(self.store, slot, self.carried, self.like["save"])

    def restore(self, slot: int) -> None:
        _restore_and_move(self.carried, self.store, slot, self.reset_twins, self.snapshots, self.zeroed,
                         self.like["restore"])

    def outputs(self) -> list[Any]:
        outs = self.program._read_outputs()
        specs = self.fn.signature(self.fn.declared_specs())[0]
        device = self.program._device  # NOTE: [Tensors in place] in _arrays
        results = [zeros(s.shape, s.dtype, device) if o is None else outs[o]
                   for o, s in zip(self.where, specs, strict=True)]
        stores = iter(self.each_store)
        for j, o in self.each:
            shape = (self.length,) + specs[j].shape
            results[j] = zeros(shape, specs[j].dtype, device) if o is None else read(next(stores), device)
        return results

    def seed(self, cotangents: Sequence[Any]) -> None:
        program = self.program
        program.check_reverse()
        cts: list[Any] = [None] * len(program.outputs)
        each = dict(self.each)
        for j, (o, c) in enumerate(zip(self.where, cotangents, strict=True)):
            if o is not None and j not in each:
                cts[o] = c
        program.clear_gradients()
        program.seed(program._convert("vjp", "cotangents", program.outputs, cts, tangent=True))
        real = [(j, o) for j, o in self.each if o is not None and twin_grad(program, o) is not None]
        if real and not self.each_cts:
            self.each_cts = tuple(_tree([twin_grad(program, o) for _, o in real], (self.length,)))
        for (j, _), store in zip(real, self.each_cts, strict=True):
            c = cotangents[j]
            if c is None:
                zero(store)
            else:
                load(store, of_dtype(c, numpy_dtype(store), program._device))
        self.seeded_each = bool(real)

    def pull_back(self, t: int) -> None:
        """The gradients but the outputs' and the parameters' are zero here (``seed`` and the last pullback)."""
        self.step()
        if self.seeded_each:
            _restore_and_move(self.each_grads, self.each_cts, t, (), (), (), self.like["each grads"])
        self.tape.replay_adjoints()
        # the carry's cotangent becomes the step before's
        move(self.out_grads, self.in_grads, self.cleared, self.like["grads"])

    def gradients(self) -> list[Any]:
        grads = self.program.gradients()
        for i, grad in self.carry_cotangents:
            grads[i] = read(grad, self.program._device)
        return grads
