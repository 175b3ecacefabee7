"""The time loop over any Function, through its protocol: carries are host arrays.

Every kind of step works (``@ti.func`` code, ndarray kernels, derived
functions); each step is one ``evaluate`` and each pullback one ``vjp``, with
the arrays going through the host. Field programs get
:class:`~.fields.FieldStepper` instead, which keeps the carry in fields.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._arrays import Batch, is_tensor, owned_copy, tensor_device, zeros


class HostStepper:
    """The schedule's stepper (NOTE: [Checkpointed pullback] in ``schedule``) over ``fn``'s protocol.

    ``carry[j]`` is the input that output ``j`` feeds, or None for an output
    that is only read after the last step; ``each[j]`` says output ``j`` is read
    at every step (NOTE: [Per-step outputs] in ``schedule``).
    """

    def __init__(self, fn: Any, carry: Sequence[int | None], each: Sequence[bool], length: int) -> None:
        self.fn = fn
        self.carry = list(carry)
        self.each = [j for j, e in enumerate(each) if e]
        self.length = length

    def begin(self, batch: Batch, slots: int) -> None:
        self.batch = batch
        self.args = list(batch.arrays)
        self.outs: list[Any] = []
        if len(getattr(self, "kept", ())) < slots:  # kept slots outlive a call (Scan.linearize's pullback)
            self.kept: list[list[Any] | None] = [None] * slots
        self.params = [i for i in range(len(self.args)) if i not in self.carry]
        self.stacked: dict[int, Any] = {}

    def _batch(self) -> Batch:
        return Batch(tuple(self.args), self.batch.specs, (), self.batch.device)

    def step(self) -> None:
        self.outs = self.fn.evaluate(self._batch())

    def record(self, t: int) -> None:
        if not self.each:
            return
        if not self.stacked:
            specs, _ = self.fn.signature(self.batch.specs)
            device = tensor_device(self.batch.arrays)
            self.stacked = {j: zeros((self.length,) + specs[j].shape, specs[j].dtype, device) for j in self.each}
        for j in self.each:
            self.stacked[j][t] = self.outs[j]

    def feed(self) -> None:
        for j, i in enumerate(self.carry):
            if i is not None:
                self.args[i] = self.outs[j]

    def save(self, slot: int) -> None:
        self.kept[slot] = [owned_copy(self.args[i]) for i in self.carry if i is not None]

    def restore(self, slot: int) -> None:
        kept = iter(self.kept[slot] or ())
        for i in self.carry:
            if i is not None:
                self.args[i] = next(kept)

    def outputs(self) -> list[Any]:
        return [self.stacked[j] if j in self.stacked else o for j, o in enumerate(self.outs)]

    def seed(self, cotangents: Sequence[Any]) -> None:
        self.each_cts = {j: cotangents[j] for j in self.each}
        self.cts = [None if j in self.each_cts else c for j, c in enumerate(cotangents)]
        self.grads: list[Any] = [None] * len(self.args)

    def pull_back(self, t: int) -> None:
        for j, c in self.each_cts.items():
            self.cts[j] = None if c is None else c[t]
        grads = self.fn.vjp(self._batch(), self.cts)
        for i in self.params:
            if grads[i] is not None:
                self.grads[i] = grads[i] if self.grads[i] is None else self.grads[i] + grads[i]
        for i in {c for c in self.carry if c is not None}:
            self.grads[i] = grads[i]
        self.cts = [None if i is None else grads[i] for i in self.carry]

    def gradients(self) -> list[Any]:
        device = tensor_device(self.batch.arrays)  # NOTE: [Tensors in place] in _arrays
        return [(zeros(s.shape, s.dtype, device) if g is None else g if is_tensor(g) else np.asarray(g, s.dtype))
                if s.is_float else None  # a sum of 0-d arrays is a NumPy scalar: an array, as every cotangent is
                for g, s in zip(self.grads, self.batch.specs, strict=True)]
