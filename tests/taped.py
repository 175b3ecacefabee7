"""``ti.ad.Tape`` for tests, clearing only the gradients the test's fields hold.

Tape's own clearing (``clear_gradients=True``) compiles a kernel over every gradient field of the
process: in a test worker that has run hundreds of tests, thousands of fields, tens of seconds per
Tape (34 s for a one-element kernel in the full suite, 1 s alone).
"""
import contextlib
from collections.abc import Iterator

import taichi as ti


@contextlib.contextmanager
def tape(loss, *fields) -> Iterator[None]:
    """``with ti.ad.Tape(loss=loss):`` with the gradients of ``loss`` and ``fields`` (those that have one)
    cleared first, and no others."""
    for f in (loss, *fields):
        if getattr(f, "grad", None) is not None:
            f.grad.fill(0)
    with ti.ad.Tape(loss=loss, clear_gradients=False):
        yield
