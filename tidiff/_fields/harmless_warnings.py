"""Taichi warnings that tidiff's own kernels cause and are known to be harmless, kept off the terminal.

NOTE: [Harmless warnings] Second derivatives of field programs and ndarray
kernels (``td.hvp``, ``td.hessian``) run Taichi's reverse mode over tidiff's
tangent kernel. Compiling it, Taichi 1.7.4 warns "Loading variable N before
anything is stored to it" at every product ``a @ b`` of local matrices,
pointing into its own ``matrix_ops._matmul_helper``: a 2-D FEM energy printed
24 such warnings, with Hessian-vector products equal to central differences
of the gradient to 1e-9 (tests/test_fields_second_order.py). docs/limits.md
calls the same warning on *user* code a sign that Taichi's reverse mode is
not to be trusted (a local vector written at a runtime index in a loop),
so only the known case is dropped: the first compile of a tangent kernel's
reverse, a warning located in Taichi's own library code. Everything else
Taichi prints then is written back as it came.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import taichi

_TAICHI_LIBRARY = os.path.dirname(os.path.abspath(taichi.__file__))
_HEADER = re.compile(r"^\[[A-Z] \d\d/\d\d/\d\d \d\d:\d\d:\d\d\.\d+ \d+\] ", re.M)
_LOCATION = re.compile(r'File "([^"]+)", line \d+, in \w+:')
_UNSTORED = re.compile(r"Loading variable \d+ before anything is stored to it\.\s*$")
_compiled: set[int] = set()


def is_tangent_kernel(kernel: Any) -> bool:
    """Whether ``kernel`` is a tangent kernel tidiff generated (its source file is ``<tidiff-jvp-...>``)."""
    code = getattr(getattr(kernel, "func", None), "__code__", None)
    return code is not None and code.co_filename.startswith("<tidiff-jvp-")


def harmless(block: str) -> bool:
    """Whether one logged message is the known one (NOTE: [Harmless warnings])."""
    located = _LOCATION.search(block)
    return ("TaichiWarning" in block.splitlines()[0] and located is not None
            and os.path.abspath(located.group(1)).startswith(_TAICHI_LIBRARY) and _UNSTORED.search(block) is not None)


def kept(text: str) -> str:
    """``text`` (what Taichi wrote to stderr) without its harmless messages."""
    starts = [m.start() for m in _HEADER.finditer(text)]
    if not starts:
        return text
    pieces = [text[: starts[0]]] + [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)], strict=True)]
    return pieces[0] + "".join(p for p in pieces[1:] if not harmless(p))


@contextlib.contextmanager
def quiet_first_reverse(kernel: Any) -> Iterator[None]:
    """Around ``kernel.grad(...)``: on the first call for a tangent kernel, which compiles it, what Taichi writes
    to stderr is held and written back without its harmless messages."""
    if not is_tangent_kernel(kernel) or id(kernel) in _compiled:
        yield
        return
    _compiled.add(id(kernel))
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = kept(held.read().decode(errors="replace"))
            if text:
                sys.stderr.write(text)
                sys.stderr.flush()
