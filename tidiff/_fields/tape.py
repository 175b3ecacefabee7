"""Record a program's kernel launches and replay their adjoints backwards.

This is what ``ti.ad.Tape`` does, minus what tidiff cannot afford: Tape
clears every gradient in the process and seeds the loss with ones, where
tidiff clears only its own twins and seeds each output with a cotangent.
A :class:`Recorder` stands in ``runtime.target_tape`` while the program
runs, so Taichi hands it every launch, before the launch; it refuses a
kernel tidiff did not rebuild (it would run on the user's own fields).

Replaying each launch's adjoint in reverse (tidiff's: NOTE: [Reverse of a
kernel]) is exact under Taichi's global data access rules: the adjoint of an
overwrite zeroes the overwritten field's gradient (cotangents are set again
before every replay). Where a launch overwrites what an earlier one read, the
recorder keeps the old entries (NOTE: [Overwritten values kept]).
"""
import contextlib
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
from taichi.lang import impl
from taichi.lang.field import Field
from taichi.lang.kernel_impl import Kernel

from .._adjoint.accesses import AccessLog, Write
from .._adjoint.kernels import KernelAdjoint, vjp_kernel
from .._errors import TransformError, taichi_cannot_reverse
from .._lang.objects import is_float_field
from .._tangent import FieldTangents
from .harmless_warnings import quiet_first_reverse
from .kept import Copy, Stores, swapped

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
        owned = list(owned)
        self._owned = {id(kernel._primal): kernel for kernel in owned}
        self._unlooked = owned  # kernels whose loops were not looked at yet (NOTE: [Kernels run loop by loop])
        self._call = call
        self.plan: _Plan | None = None  # what the log found for the last sequence of launches: a warm call
        # repeating it is not logged again
        self.stores = Stores()  # the copies of overwritten entries (NOTE: [Overwritten values kept])
        self.tangents: FieldTangents | None = None  # a tangent program's pairs of twins
        self._adjoints: dict[tuple[Any, ...], KernelAdjoint] = {}  # by kernel, object and fields given (other
        # arguments by type): every launch asks

    def owned(self, kernel: Any) -> Any:
        """The rebuilt ``@ti.kernel`` whose launch reached the tape as ``kernel``, or None: a loop of one run loop
        by loop is a kernel of its own (NOTE: [Kernels run loop by loop])."""
        found = self._owned.get(id(kernel))
        if found is None and self._unlooked:  # once every kernel launched, a miss costs a lookup
            looked = [k for k in self._unlooked if hasattr(k, "_tidiff_loops")]
            for k in looked:
                self._owned.update((id(part._primal), part) for part in k._tidiff_loops or ())
            self._unlooked = [k for k in self._unlooked if not hasattr(k, "_tidiff_loops")]
            found = self._owned.get(id(kernel))
        return found

    def adjoint(self, kernel: Any, args: tuple[Any, ...]) -> KernelAdjoint | None:
        """tidiff's adjoint of a launch (NOTE: [Reverse of a kernel]), or None where the transform does not
        take the kernel or these arguments (reverse mode is then refused: NOTE: [Taichi's reverse mode not run])."""
        owned = self.owned(kernel)
        if owned is None:
            return None
        owner = args[0] if getattr(owned, "_is_classkernel", False) and args else None
        key = (id(kernel), id(owner), *(id(a) if isinstance(a, Field) else type(a) for a in args))
        if (known := self._adjoints.get(key)) is not None:
            return known
        found = vjp_kernel(owned, owner)
        if isinstance(found, KernelAdjoint) and not found.takes(args):  # integer fields at template parameters
            given = found.arguments(args)
            found = vjp_kernel(owned, owner, frozenset(found.params[k] for k in found.fields_at
                                                       if not (is_float_field(given[k]) and given[k].grad is not None)))
        if not (isinstance(found, KernelAdjoint) and found.takes(args)):
            return None
        self._adjoints[key] = found
        return found

    def overwrite_tangent(self, kernel: Any, args: tuple[Any, ...]) -> None:
        """In a tangent program, one of Taichi's helpers overwriting a field (``fill``, ``from_numpy``) zeroes
        the field's tangent too, as a launch of the program (NOTE: [Tangent program])."""
        if self.tangents is None or not (isinstance(kernel, Kernel) and is_taichi_helper(kernel)):
            return
        position = _OVERWRITES.get(kernel.func.__name__)
        field = None if position is None else args[position]
        tangent = self.tangents[field] if isinstance(field, Field) else None
        if tangent is not None:
            tangent.fill(0)  # recorded in turn (before the field's own overwrite)

    def check(self, kernel: object) -> None:
        if not isinstance(kernel, Kernel) or is_taichi_helper(kernel) or self.owned(kernel) is not None:
            return
        raise TypeError(
            f"{self._call}: the program launched kernel '{kernel.func.__name__}', which tidiff did not "
            "rebuild over its own fields (it would read and write the user's fields). Reach kernels and "
            "fields through names, attributes, lists or dicts the program holds; a kernel made while the "
            "program runs, or reached through a property or a class (Sim.step(self)), is not followed."
        )


class _Plan(NamedTuple):
    """What the log found for one sequence of launches: per launch, the writes to keep; whether the replay is
    exact (``safe``) and whether anything was kept."""

    sequence: tuple[tuple[Any, ...], ...]
    keeps: tuple[tuple[list[Write], list[Write]], ...]
    safe: bool
    kept: bool


class Recorder:
    """The object Taichi calls ``target_tape``: records ``(kernel, args)`` per launch, and keeps what a launch
    overwrites that an earlier one read (NOTE: [Overwritten values kept]; not for a run that is not replayed,
    ``keep=False``)."""

    grad_checker = None  # read by Taichi's Python-scope field writes
    told_by_tidiff = True  # a program's kernels tell it of their launches themselves (NOTE: [Program kernels by
    # their faster form])

    def __init__(self, guard: LaunchGuard, keep: bool = True) -> None:
        self._guard = guard
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []
        self._own: list[KernelAdjoint | None] = []  # per call, tidiff's adjoint (found once, at the launch)
        self._sequence: list[tuple[Any, ...]] = []  # per call, the kernel and its number arguments
        self._keep = keep
        self._kept: list[tuple[tuple[Copy, ...], tuple[Copy, ...]]] = []  # per call, the copies made just before
        # it, swapped back before its adjoint and after it
        self._log = AccessLog()
        self._logged: list[tuple[list[Write], list[Write]]] = []  # per call logged so far, its writes to keep
        self._following = keep  # whether the launches so far repeat the guard's last plan (each compared as it
        # is inserted; a run that keeps nothing is compared when asked)
        self._plan: _Plan | None = None
        self._unwound = False  # whether a replay swapped the kept entries back
        if keep:
            guard.stores.begin()

    def insert(self, kernel: Any, args: tuple[Any, ...]) -> None:
        """Called by Taichi before each launch of a kernel (or a ``grad_replaced`` function) and its arguments."""
        self._guard.check(kernel)
        self._guard.overwrite_tangent(kernel, args)
        self.calls.append((kernel, args))
        self._own.append(self._guard.adjoint(kernel, args))
        self._sequence.append((id(kernel), *(a if type(a) in (int, float, bool) else id(a) for a in args)))
        if self._keep:
            first, later = self._to_keep()
            stores = self._guard.stores
            self._kept.append((stores.keep(first), stores.keep(later)))
        else:
            self._kept.append(((), ()))

    def _to_keep(self) -> tuple[list[Write], list[Write]]:
        """The writes of the launch just inserted to keep: the guard's plan's while the launches repeat it (no
        log is needed), else the log's."""
        k = len(self._sequence) - 1
        plan = self._guard.plan
        if self._following and plan is not None and k < len(plan.sequence) and plan.sequence[k] == self._sequence[k]:
            return plan.keeps[k]
        self._following = False
        self._log_through(k + 1)
        return self._logged[k]

    def _log_through(self, n: int) -> None:
        for (kernel, args), own in zip(self.calls[len(self._logged):n], self._own[len(self._logged):n], strict=True):
            keeps: tuple[list[Write], list[Write]] = ([], [])
            if own is not None:
                keeps = self._log.launch(own.accesses, own.arguments(args))
            elif isinstance(kernel, Kernel) and is_taichi_helper(kernel):
                name = kernel.func.__name__
                if name in _OVERWRITES and isinstance(args[_OVERWRITES[name]], Field):
                    field = args[_OVERWRITES[name]]
                    keeps = ([], [(field, None)] if self._log.overwrite(field) else [])
                elif name not in _READERS:
                    self._log.unknown()
            else:
                self._log.unknown()
            self._logged.append(keeps)

    def plan(self) -> _Plan:
        """What the log finds for the launches recorded (the guard's plan where they repeat it)."""
        if self._plan is None:
            plan = self._guard.plan
            following = self._following or not self._keep and plan is not None and \
                plan.sequence == tuple(self._sequence)
            if following and plan is not None and len(plan.sequence) == len(self._sequence):
                self._plan = plan
            else:
                self._log_through(len(self.calls))
                self._plan = _Plan(tuple(self._sequence), tuple(self._logged), self._log.safe, self._log.kept)
                if self._keep:
                    self._guard.plan = self._plan
        return self._plan

    @property
    def exact(self) -> bool:
        """Whether the replay is exact with no check (NOTE: [Launches that keep the access rules]): every launch
        reversed by tidiff, none reading and then writing the same entries, what later launches overwrote
        kept. Found once per sequence of launches and arguments."""
        return self.plan().safe

    @property
    def keeps_the_rules(self) -> bool:
        """Exact, with nothing kept: no launch wrote an entry an earlier one read."""
        plan = self.plan()
        return plan.safe and not plan.kept

    def replay_adjoints(self) -> None:
        """Run the adjoint of every recorded launch, last first, swapping back what each launch overwrote after
        its adjoint (and forward first, where a replay swapped them back before). Taichi's ``kernel.grad`` runs
        for its own helpers and for ``ti.ad.grad_replaced`` functions (the user's gradient) alone (NOTE:
        [Taichi's reverse mode not run])."""
        for (kernel, _), own in zip(self.calls, self._own, strict=True):
            if own is None and not getattr(kernel, "_tidiff_replaced", False) \
                    and not (isinstance(kernel, Kernel) and is_taichi_helper(kernel)):
                name = kernel.func.__name__ if isinstance(kernel, Kernel) else getattr(kernel, "__name__", "?")
                raise TransformError(
                    f"the kernel `{name}` in reverse mode: tidiff's adjoint of it takes float fields with gradients "
                    "(and numbers) at the ti.template() parameters it reads so, and a launch gave it others, and "
                    "Taichi's own reverse mode (kernel.grad) does not run in its place (NOTE: [Taichi's reverse "
                    "mode not run])", hint="pass a float field at such a parameter, or use forward mode (td.jvp, "
                    "td.jacfwd)")
        if self._unwound:
            for first, later in self._kept:
                swapped(first + later)
        for (kernel, args), own, (first, later) in zip(reversed(self.calls), reversed(self._own),
                                                       reversed(self._kept), strict=True):
            swapped(first[::-1])
            name = kernel.func.__name__ if isinstance(kernel, Kernel) and is_taichi_helper(kernel) else None
            if name in _OVERWRITES:
                written = args[_OVERWRITES[name]]
                if isinstance(written, Field) and written.grad is not None:
                    written.grad.fill(0)
            elif getattr(kernel, "_tidiff_replaced", False) and kernel.grad is None:
                raise TypeError(
                    f"the ti.ad.grad_replaced function '{kernel.__name__}' has no gradient function: "
                    f"give it one with @ti.ad.grad_for({kernel.__name__})")
            elif hasattr(kernel, "grad") and not (isinstance(kernel, Kernel) and is_taichi_helper(kernel)
                                                  and any(_is_external_array(arg) for arg in args)):
                if own is not None:  # Taichi's readers of external arrays (to_numpy) have no adjoint; a user's
                    own.launch(*own.arguments(args))  # kernel given one (a NumPy array of weights) has its own
                else:
                    _adjoint(kernel, args)
            swapped(later[::-1])
        self._unwound = any(first or later for first, later in self._kept)


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
def recording(guard: LaunchGuard, keep: bool = True) -> Iterator[Recorder]:
    """Install a fresh :class:`Recorder` as Taichi's tape for the duration (``keep``: see :class:`Recorder`)."""
    runtime = impl.get_runtime()
    previous = runtime.target_tape
    recorder = Recorder(guard, keep)
    runtime.target_tape = recorder
    try:
        yield recorder
    finally:
        runtime.target_tape = previous
