"""Entries a later launch overwrites, kept for the adjoints of the launches that read them.

NOTE: [Overwritten values kept] A kernel's adjoint runs after every later
launch of the program and reads the fields as the program left them (NOTE:
[Reverse of a kernel]). Where a later launch writes entries an earlier one
read (DiffTaichi's electric.py: ``nn1(t)`` reads ``x[t]``, then
``advance(t)`` writes it; a field cleared by ``fill`` and read again), the
recorder copies those entries just before the writing launch, and the
replay swaps them back just after that launch's adjoint: every earlier
adjoint then sees what its launch read, as if the access rules held. What
is copied is what the write's index says per position (NOTE: [Launches that
keep the access rules]): ``x[t]`` launched with ``t = 5`` copies entry 5,
``x[t, i]`` row 5, an index it cannot evaluate the whole field.

The copies go to stores, one per field and pattern of known positions: an
ndarray with a leading axis of copies (grown by doubling, kept by the
program for its later calls), written and swapped back by two small
generated kernels launched with numbers and the store (NOTE: [Number
launches]). A swap, not a copy, puts them back, so a replay leaves the
values the writes made in the store: a second replay of one recording (a
pullback called twice) swaps them forward first.

What it does not cover keeps the forward-mode check (NOTE: [Checking
Taichi's reverse mode]): a launch reading entries and then writing them
itself (its adjoint would need both values), and every launch after one
whose accesses are unknown (reversed by Taichi, or a helper of Taichi's
other than ``fill`` and ``from_numpy``).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import taichi as ti
from taichi.lang import impl
from taichi.lang.field import Field

from .._adjoint.accesses import Where, Write
from .._lang.compile import compile_source
from .._lang.launch import NumberLaunch
from .twins import element_shape, numpy_dtype

#: Copies a store holds before its first growth.
FIRST_CAPACITY = 16


class Copy(NamedTuple):
    """One copy: which store, which of its slots, and the index values at the known positions."""

    store: Store
    slot: int
    at: tuple[int, ...]

    def swap(self) -> None:
        """Exchange the field's entries with the copy (the replay's way back, and forward again)."""
        self.store.swap(self.slot, self.at)


class Store:
    """The copies of one field's entries at one pattern of known index positions."""

    def __init__(self, field: Field, known: tuple[bool, ...]) -> None:
        self.field, self.known = field, known
        self.rest = tuple(n for n, k in zip(field.shape, known, strict=True) if not k)
        self.used = 0
        self.array: Any = None
        keep, swap = _kernels(field, known)
        self._keep, self._swap = NumberLaunch(keep), NumberLaunch(swap)

    def keep(self, at: tuple[int, ...]) -> Copy:
        """Copy the field's entries at ``at`` (the known positions' values) into the next slot."""
        if self.array is None or self.used == self.array.shape[0]:
            self._grow()
        slot = self.used
        self.used += 1
        self._keep(slot, *at, self.array)
        return Copy(self, slot, at)

    def swap(self, slot: int, at: tuple[int, ...]) -> None:
        self._swap(slot, *at, self.array)

    def _grow(self) -> None:
        size = FIRST_CAPACITY if self.array is None else 2 * self.array.shape[0]
        grown = _ndarray_like(self.field, (size, *self.rest))
        if self.array is not None:
            values = np.zeros(grown.shape + element_shape(self.field), numpy_dtype(self.field))
            values[: self.array.shape[0]] = self.array.to_numpy()
            grown.from_numpy(values)
        self.array = grown


class Stores:
    """A program's stores, by field and pattern; a recording starts them from slot 0."""

    def __init__(self) -> None:
        self._stores: dict[tuple[int, tuple[bool, ...]], Store] = {}

    def begin(self) -> None:
        for store in self._stores.values():
            store.used = 0

    def keep(self, writes: Sequence[Write]) -> tuple[Copy, ...]:
        """Copy the entries each write will overwrite (Taichi's tape set aside: these launches are not the
        program's)."""
        if not writes:
            return ()
        with _untaped():
            return tuple(self._store(field, where).keep(_known_values(where)) for field, where in writes)

    def _store(self, field: Field, where: Where) -> Store:
        known = (False,) * len(field.shape) if where is None else tuple(w is not None for w in where)
        key = (id(field), known)
        if key not in self._stores:
            self._stores[key] = Store(field, known)
        return self._stores[key]


def swapped(copies: Sequence[Copy]) -> None:
    """Swap each copy, taping nothing."""
    if copies:
        with _untaped():
            for copy in copies:
                copy.swap()


def _known_values(where: Where) -> tuple[int, ...]:
    return () if where is None else tuple(w for w in where if w is not None)


@contextlib.contextmanager
def _untaped() -> Iterator[None]:
    runtime = impl.get_runtime()
    tape, runtime.target_tape = runtime.target_tape, None
    try:
        yield
    finally:
        runtime.target_tape = tape


def _ndarray_like(field: Field, shape: tuple[int, ...]) -> Any:
    """An ndarray of ``shape`` holding entries of the field's type (scalars, vectors or matrices)."""
    element = element_shape(field)
    if len(element) == 1:
        return ti.Vector.ndarray(element[0], field.dtype, shape)
    if len(element) == 2:
        return ti.Matrix.ndarray(element[0], element[1], field.dtype, shape)
    return ti.ndarray(field.dtype, shape)


def _kernels(field: Field, known: tuple[bool, ...]) -> tuple[Any, Any]:
    """``keep(slot, k..., store)`` and ``swap(slot, k..., store)`` for entries of ``field`` whose positions
    ``known`` are given (``k0``, ...) and the others run over the field's extent."""
    offset = tuple(field.snode.ptr.offset) or (0,) * len(known)  # a field's first index per position
    free = [d for d, k in enumerate(known) if not k]
    entry = "field[{}]".format(", ".join(f"k{d}" if k else f"j{d}" for d, k in enumerate(known)) or "None")
    copy = "store[{}]".format(", ".join(["slot", *(f"j{d} - {offset[d]}" for d in free)]))
    params = ", ".join(["slot: ti.i32", *(f"k{d}: ti.i32" for d, k in enumerate(known) if k),
                        "store: ti.types.ndarray()"])
    ranges = [f"({offset[d]}, {offset[d] + field.shape[d]})" for d in free]
    header = f"    for {', '.join(f'j{d}' for d in free)} in ti.ndrange({', '.join(ranges)}):\n" if free else ""
    indent = " " * (8 if header else 4)
    bodies = {"keep": [f"{copy} = {entry}"], "swap": [f"value = {entry}", f"{entry} = {copy}", f"{copy} = value"]}
    made = []
    for kind, body in bodies.items():
        source = f"@ti.kernel\ndef {kind}({params}):\n{header}" + "".join(f"{indent}{line}\n" for line in body)
        made.append(compile_source(source, kind, {"ti": ti, "field": field}, tag="kept"))
    return made[0], made[1]
