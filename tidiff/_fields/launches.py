"""A program's own kernels taking numbers only, launched by the faster of their serial and parallel forms.

NOTE: [Program kernels by their faster form] A program runs on tidiff's copies of the user's kernels (over
twins, ``rebind``), launched by the user's own code through Taichi's call: it tells the tape recording the
program (tidiff's :class:`~.tape.Recorder`) of the launch, looks up the compiled kernel, sets every argument,
and runs each parallel loop on the thread pool. For a DiffTaichi-style step over a few hundred entries that
call is most of the program's time: the 256-mass system of ``bench/time_loop.py`` (300 steps) spent about
36 of its 52 ms a gradient in its 600 forward launches. So a copy taking numbers only (a step's ``t``) is
launched as its adjoint is (NOTE: [Small loops run serially]): the tape is told of the launch as Taichi's
call tells it, of the same kernel with the same arguments, and the faster of its two forms runs, set up
past Taichi's call (NOTE: [Number launches]). Under Taichi's own tape, forward-mode manager or a
``grad_replaced`` function, and for any other kernel, Taichi's call runs as before.
"""
from __future__ import annotations

from typing import Any

from taichi.lang import impl

from .._cache import SERIAL
from .._lang.serial import FasterForm, numbers_only, serial_twin


class FasterLaunch:
    """``kernel(*args)`` for a program's copy ``kernel`` of a user's kernel: by its faster form where it takes
    numbers only (NOTE: [Program kernels by their faster form]), else by Taichi's call."""

    def __init__(self, kernel: Any, source: Any, owner: Any) -> None:
        self.kernel = kernel  # a @ti.kernel (or its Kernel) launched through Taichi's call
        self.source = source  # the @ti.kernel whose code it runs (read for the serial twin)
        self.owner = owner  # the kernel users call, which keeps the twin (SERIAL)
        self.primal = getattr(kernel, "_primal", kernel)  # the Kernel Taichi's call tells the tape of
        self.faster: FasterForm | None = None
        self.looked = False

    def __call__(self, *args: Any) -> Any:
        runtime = impl.get_runtime()
        if not self.looked:
            self.looked = True
            twin = serial_twin(self.source) if numbers_only(self.primal) else None
            if twin is not None:
                self.faster = FasterForm(self.primal, twin, told=True)
                setattr(self.owner, SERIAL, [*getattr(self.owner, SERIAL, []), twin])
        tape = runtime.target_tape
        if self.faster is None or runtime.fwd_mode_manager is not None or runtime.grad_replaced \
                or tape is not None and not getattr(tape, "told_by_tidiff", False):
            return self.kernel(*args)
        if tape is not None:
            tape.insert(self.primal, args)
        self.faster(*args)
        return None
