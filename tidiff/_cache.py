"""Compile and cache-hit counts per transformed function, for ``td.cache_info``.

A call counts against the function the user called (``grad(f)``, ``jvp(f)``):
:meth:`Counter.tally` makes that function's counter the current one for the
call, and every kernel or program an engine launches inside is added to it
(:func:`uses`), so its compiles count for that function.
"""
from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple, overload


class CacheInfo(NamedTuple):
    """How many Taichi kernels a function compiled, and how its calls went."""

    compiles: int
    calls: int
    hits: int

    @property
    def misses(self) -> int:
        return self.calls - self.hits


_registry: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_current: contextvars.ContextVar[Counter | None] = contextvars.ContextVar("tidiff_counter", default=None)


#: Where a kernel keeps what tidiff made of its adjoint (``_adjoint/kernels.py``, one per object a class kernel
#: runs on): the adjoints' ``compiles()`` count (a kernel the transform refused has none).
ADJOINT = "_tidiff_adjoint"
#: Where a program's copy of a kernel keeps the serial twins it launches (``_fields/launches.py``).
SERIAL = "_tidiff_serial"


def kernel_compiles(kernel: Any) -> int:
    """Compiled instances of a ``@ti.kernel`` (primal and adjoint variants, Taichi's adjoint or tidiff's)."""
    own = kernel.__dict__.get(ADJOINT, {}).values()
    serial = kernel.__dict__.get(SERIAL, [])  # (NOTE: [Program kernels by their faster form])
    return len(kernel._primal.compiled_kernels) + len(kernel._adjoint.compiled_kernels) + \
        sum(adjoint.compiles() for adjoint in own if hasattr(adjoint, "compiles")) + \
        sum(len(twin._primal.compiled_kernels) for twin in serial)


class Counter:
    """The kernels one function launches and its call/hit tally."""

    def __init__(self, owner: Any = None) -> None:
        self.kernels: list[Any] = []
        self.programs: list[Any] = []  # objects with a compiles() method (field programs)
        self.calls = 0
        self.hits = 0
        if owner is not None:
            _registry[id(owner)] = owner

    def add(self, thing: Any) -> None:
        """Count the compiles of a ``@ti.kernel`` or of an object with ``compiles()``."""
        group = self.programs if hasattr(thing, "compiles") else self.kernels
        if all(t is not thing for t in group):
            group.append(thing)

    def compiles(self) -> int:
        return sum(kernel_compiles(k) for k in self.kernels) + sum(p.compiles() for p in self.programs)

    @contextlib.contextmanager
    def tally(self) -> Iterator[None]:
        """Count one call around the block, and a hit if it compiled nothing; engines inside add to it."""
        before = self.compiles()
        token = _current.set(self)
        try:
            yield
        finally:
            _current.reset(token)
        self.calls += 1
        if self.compiles() == before:
            self.hits += 1

    def hit(self) -> None:
        """A call that launched a remembered kernel directly (NOTE: [Scalar calls])."""
        self.calls += 1
        self.hits += 1


def uses(thing: Any) -> None:
    """Add a kernel (or program) an engine is about to launch to the current call's counter."""
    counter = _current.get()
    if counter is not None:
        counter.add(thing)


@overload
def cache_info(fn: None = None) -> dict[str, CacheInfo]: ...


@overload
def cache_info(fn: Any) -> CacheInfo: ...


def cache_info(fn: Any = None) -> dict[str, CacheInfo] | CacheInfo:
    """Per transformed function (by name), the kernels it compiled and its cache hits; or those of ``fn``.

    Returns a dict ``{name: CacheInfo(compiles, calls, hits)}``; a second
    call with new values or a new batch size adds a hit and compiles nothing.
    Functions of the same name are told apart by primes, in the order they
    were made (``grad(f)``, ``grad(f)'``); ``cache_info(fn)`` returns the
    ``CacheInfo`` of the function ``fn`` itself (``td.grad(f)``, a
    ``td.function``), whatever its name.

    Example:
        >>> @ti.func
        ... def f(x: ti.math.vec3, s: ti.f64) -> ti.f64:
        ...     return s * x.dot(x)
        >>> g = td.grad(f)
        >>> _ = g(np.ones((5, 3)), 2.0), g(np.ones((7, 3)), 1.0)   # a new batch size compiles nothing
        >>> td.cache_info(g)
        CacheInfo(compiles=1, calls=2, hits=1)
    """
    if fn is not None:
        counter = getattr(fn, "_counter", None)
        if not isinstance(counter, Counter):
            raise TypeError(f"td.cache_info: fn must be a tidiff function (td.function, td.grad(f), ...), got {fn!r}")
        return CacheInfo(counter.compiles(), counter.calls, counter.hits)
    out: dict[str, CacheInfo] = {}
    for fn in list(_registry.values()):
        counter = fn._counter
        if counter.calls or counter.kernels or counter.programs:
            name = fn.name
            while name in out:
                name += "'"
            out[name] = CacheInfo(counter.compiles(), counter.calls, counter.hits)
    return out
