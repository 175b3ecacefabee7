"""Compile and cache-hit counts per transformed function, for ``td.cache_info``."""
import contextlib
import weakref
from dataclasses import dataclass

_registry = weakref.WeakValueDictionary()


@dataclass
class CacheInfo:
    """How many Taichi kernels a function compiled, and how its calls went."""

    compiles: int
    calls: int
    hits: int

    @property
    def misses(self):
        return self.calls - self.hits


def kernel_compiles(kernel):
    """Compiled instances of a ``@ti.kernel`` (primal, forward and adjoint variants)."""
    return len(kernel._primal.compiled_kernels) + len(kernel._adjoint.compiled_kernels)


class Counter:
    """The kernels one function launches and its call/hit tally.

    Engines add the kernels they launch to the counter of the function on
    whose behalf they run, so ``grad(f)`` counts the kernels of ``f`` it uses.
    """

    def __init__(self, owner=None):
        self.kernels = []
        self.extra = []  # objects with a compiles() method (field programs)
        self.calls = 0
        self.hits = 0
        if owner is not None:
            _registry[id(owner)] = owner

    def add_program(self, program):
        if all(p is not program for p in self.extra):
            self.extra.append(program)

    def add(self, kernel):
        if all(k is not kernel for k in self.kernels):
            self.kernels.append(kernel)

    def compiles(self):
        return sum(kernel_compiles(k) for k in self.kernels) + sum(e.compiles() for e in self.extra)

    @contextlib.contextmanager
    def tally(self):
        """Count one call around the block, and a hit if it compiled nothing."""
        before = self.compiles()
        yield
        self.calls += 1
        if self.compiles() == before:
            self.hits += 1


def cache_info():
    """Per transformed function (by name), the kernels it compiled and its cache hits.

    Returns a dict ``{name: CacheInfo(compiles, calls, hits)}``; a second
    call with new values or a new batch size adds a hit and compiles nothing.

    Example:
        >>> td.grad(f)(np.ones((5, 3)), 2.0); td.grad(f)(np.ones((7, 3)), 1.0)
        >>> td.cache_info()["grad(f)"]            # doctest: +SKIP
        CacheInfo(compiles=2, calls=2, hits=1)
    """
    out = {}
    for fn in list(_registry.values()):
        counter = fn._counter
        if counter.calls or counter.kernels:
            name = fn.name
            while name in out:
                name += "'"
            out[name] = CacheInfo(counter.compiles(), counter.calls, counter.hits)
    return out
