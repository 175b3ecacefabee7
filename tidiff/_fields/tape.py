"""Record a program's kernel launches and replay their adjoints backwards.

This is what ``ti.ad.Tape`` does, minus what tidiff cannot afford: Tape
clears every gradient in the process and seeds the loss with ones, where
tidiff clears only its own twins and seeds each output with a cotangent.
A :class:`Recorder` stands in ``runtime.target_tape`` while the program
runs, so Taichi hands it every launch, before the launch; it refuses a
kernel tidiff did not rebuild (it would run on the user's own fields).

Replaying ``kernel.grad(*args)`` in reverse is exact under Taichi's global
data access rules: the adjoint of an overwrite zeroes the overwritten
field's gradient (so 1.7.4 zeroes an output's ``.grad`` after a pass that
stores to it: cotangents are set again before every replay).
"""
import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
from taichi.lang import impl
from taichi.lang.field import Field
from taichi.lang.kernel_impl import Kernel

from .._adjoint.accesses import AccessLog
from .._adjoint.kernels import KernelAdjoint, vjp_kernel
from .._errors import taichi_cannot_reverse
from .harmless_warnings import quiet_first_reverse

#: Taichi's helpers that overwrite a field with data from outside (a constant, an
#: external array), by the position of the field argument. Their adjoint is
#: "the field no longer depends on anything": zero its gradient. Taichi cannot
#: build it (``fill_field`` mixes loop and non-loop statements).
_OVERWRITES = {"fill_field": 0, "field_fill_python_scope": 0, "ext_arr_to_tensor": 1, "ext_arr_to_matrix": 1}
#: Taichi's helpers that copy a field out (``to_numpy``): they write no field.
_READERS = {"tensor_to_ext_arr", "matrix_to_ext_arr"}


def is_taichi_helper(kernel: Kernel) -> bool:
    """A kernel of Taichi's own (``fill``, ``from_numpy``, ...), safe on twins."""
    return (getattr(kernel.func, "__module__", "") or "").startswith("taichi.")


class LaunchGuard:
    """Lets through only kernels tidiff owns and Taichi's own helpers; knows the owned kernels' adjoints.

    Args:
        owned: the ``@ti.kernel`` s tidiff rebuilt (their launches reach the
            tape as their primal ``Kernel``).
        call: how messages name the user's call.
    """

    def __init__(self, owned: Iterable[Any], call: str) -> None:
        self._owned = {id(kernel._primal): kernel for kernel in owned}
        self._call = call
        self.ruled: set[tuple[Any, ...]] = set()  # launch sequences found to keep the access rules: a warm call
        # repeating one is not logged again

    def owned(self, kernel: Any) -> Any:
        """The rebuilt ``@ti.kernel`` whose launch reached the tape as ``kernel``, or None."""
        return self._owned.get(id(kernel))

    def adjoint(self, kernel: Any, args: tuple[Any, ...]) -> KernelAdjoint | None:
        """tidiff's adjoint of a launch (NOTE: [Reverse of a kernel]), or None where the transform does not
        take the kernel or these arguments (Taichi's ``kernel.grad`` is replayed instead)."""
        owned = self.owned(kernel)
        if owned is None:
            return None
        found = vjp_kernel(owned, args[0] if getattr(owned, "_is_classkernel", False) and args else None)
        return found if isinstance(found, KernelAdjoint) and found.takes(args) else None

    def check(self, kernel: object) -> None:
        if not isinstance(kernel, Kernel) or id(kernel) in self._owned or is_taichi_helper(kernel):
            return
        raise TypeError(
            f"{self._call}: the program launched kernel '{kernel.func.__name__}', which tidiff did not "
            "rebuild over its own fields (it would read and write the user's fields). Reach kernels and "
            "fields through names, attributes, lists or dicts the program holds; a kernel made while the "
            "program runs, or reached through a property or a class (Sim.step(self)), is not followed."
        )


class Recorder:
    """The object Taichi calls ``target_tape``: records ``(kernel, args)`` per launch."""

    grad_checker = None  # read by Taichi's Python-scope field writes

    def __init__(self, guard: LaunchGuard) -> None:
        self._guard = guard
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []
        self._own: list[KernelAdjoint | None] = []  # per call, tidiff's adjoint (found once, at the launch)
        self._sequence: list[tuple[Any, ...]] = []  # per call, the kernel and its number arguments
        self._ruled: bool | None = None

    def insert(self, kernel: Any, args: tuple[Any, ...]) -> None:
        """Called by Taichi before each launch of a kernel (or a ``grad_replaced`` function) and its arguments."""
        self._guard.check(kernel)
        self.calls.append((kernel, args))
        self._own.append(self._guard.adjoint(kernel, args))
        self._sequence.append((id(kernel), *(a if type(a) in (int, float, bool) else id(a) for a in args)))

    @property
    def keeps_the_rules(self) -> bool:
        """Whether every launch was reversed by tidiff and none wrote an entry an earlier one read (NOTE:
        [Launches that keep the access rules]): the replay is then exact, with no check needed. Found once per
        sequence of launches and arguments."""
        if self._ruled is None:
            sequence = tuple(self._sequence)
            self._ruled = sequence in self._guard.ruled or self._log_keeps_the_rules()
            if self._ruled:
                self._guard.ruled.add(sequence)
        return self._ruled

    def _log_keeps_the_rules(self) -> bool:
        log = AccessLog()
        for (kernel, args), own in zip(self.calls, self._own, strict=True):
            if own is not None:
                log.launch(own.accesses, own.arguments(args))
            elif isinstance(kernel, Kernel) and is_taichi_helper(kernel):
                name = kernel.func.__name__
                if name in _OVERWRITES and isinstance(args[_OVERWRITES[name]], Field):
                    log.overwrite(args[_OVERWRITES[name]])
                elif name not in _READERS:
                    log.unknown()
            else:
                log.unknown()
            if not log.safe:
                return False
        return True

    def replay_adjoints(self) -> None:
        """Run the adjoint of every recorded launch, last first."""
        for (kernel, args), own in zip(reversed(self.calls), reversed(self._own), strict=True):
            name = kernel.func.__name__ if isinstance(kernel, Kernel) and is_taichi_helper(kernel) else None
            if name in _OVERWRITES:
                written = args[_OVERWRITES[name]]
                if isinstance(written, Field) and written.grad is not None:
                    written.grad.fill(0)
            elif getattr(kernel, "_tidiff_replaced", False) and kernel.grad is None:
                raise TypeError(
                    f"the ti.ad.grad_replaced function '{kernel.__name__}' has no gradient function: "
                    f"give it one with @ti.ad.grad_for({kernel.__name__})")
            elif hasattr(kernel, "grad") and not any(_is_external_array(arg) for arg in args):
                if own is not None:  # readers of external arrays (to_numpy) have no adjoint
                    own.launch(*own.arguments(args))
                else:
                    _adjoint(kernel, args)


def _adjoint(kernel: Any, args: tuple[Any, ...]) -> None:
    """``kernel.grad(*args)``, with Taichi's bare "Not supported." named."""
    try:
        with quiet_first_reverse(kernel):  # NOTE: [Harmless warnings]
            kernel.grad(*args)
    except RuntimeError as e:
        name = getattr(getattr(kernel, "func", None), "__name__", None) or getattr(kernel, "__name__", "a kernel")
        raise taichi_cannot_reverse(str(name), e) or e from None


def _is_external_array(arg: object) -> bool:
    """A NumPy array or a torch/paddle tensor: memory Taichi has no gradient for."""
    module = type(arg).__module__.split(".")[0]
    return isinstance(arg, np.ndarray) or module in ("torch", "paddle")


@contextlib.contextmanager
def recording(guard: LaunchGuard) -> Iterator[Recorder]:
    """Install a fresh :class:`Recorder` as Taichi's tape for the duration."""
    runtime = impl.get_runtime()
    previous = runtime.target_tape
    recorder = Recorder(guard)
    runtime.target_tape = recorder
    try:
        yield recorder
    finally:
        runtime.target_tape = previous
