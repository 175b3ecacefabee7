"""The values of the user's fields one call reads, taken once and kept for its backward.

NOTE: [Field values of a call] A field program reads fields beyond its
inputs: constants (a target, weights, a schedule) and the entries of a field
beside a declared part; an ndarray kernel may read global fields too.
``td.vjp``'s ``vjp_fn`` and a torch backward run the program again later,
and read those fields as they are then: a target changed between a forward
and its backward gave the gradient at the new target (outside code, a torch
loop setting a per-sample target before each forward and one backward for
all of them: ``[0, -12]``, right ``[-2, -6]``). JAX takes what ``vjp_fn``
needs when ``vjp`` returns, and so does tidiff: ``td.vjp`` and each torch
forward hold a record of field values (:func:`record`), and every read of a
user's field under it (by the program, its tangent program, any check of
Taichi's reverse mode) returns what the first read of that call saw.

An ndarray kernel reads global fields itself, with no twin to load a kept
value into: under a record, a field it reads that changed since the
forward is refused by name (:func:`check_unchanged`), as torch refuses a
saved tensor modified in place. A compiled torch graph (``torch.compile``)
runs its backward without the autograd rule that holds the record, so there
the fields are read as they are at the backward (docs/limits.md).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np
from taichi.lang.field import Field

from .._arrays import is_tensor
from .twins import read

_RECORD: ContextVar[dict[int, Any] | None] = ContextVar("tidiff_field_values", default=None)


def record() -> dict[int, Any]:
    """A new record for one call, holding what the call around it (if any) took already."""
    return dict(_RECORD.get() or {})


@contextmanager
def reading(values: dict[int, Any]) -> Iterator[None]:
    """Reads of users' fields inside take (and keep) their values in ``values``."""
    token = _RECORD.set(values)
    try:
        yield
    finally:
        _RECORD.reset(token)


def value_of(field: Field, device: Any = None) -> Any:
    """``field``'s values for this call (its current ones outside a record); not to be written. NumPy, or a
    tensor on ``device`` (NOTE: [Tensors in place] in ``_arrays``); a record keeps what the first read took."""
    values = _RECORD.get()
    if values is None:
        return read(field, device)
    if id(field) not in values:
        values[id(field)] = read(field, device)
    return values[id(field)]


def check_unchanged(fields: Iterable[tuple[str, Field]], call: str) -> None:
    """Under a record, raise ValueError naming a field whose values differ from the record's (an ndarray
    kernel reads them itself: a kept value cannot be loaded); record those not read yet."""
    values = _RECORD.get()
    if values is None:
        return
    for name, field in fields:
        now = read(field)
        kept = values.setdefault(id(field), now)
        kept = kept.cpu().numpy() if is_tensor(kept) else kept  # taken by a field program in place
        if not np.array_equal(kept, now, equal_nan=kept.dtype.kind in "fc"):
            raise ValueError(
                f"{call}: the field `{name}`, which the kernel reads, changed between the forward call and "
                "this derivative of it; an ndarray kernel reads fields as they are, so the derivative would "
                "be at the new values (set such fields before the forward call, or pass them as arguments)")
