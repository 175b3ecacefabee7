"""What tidiff makes for a function lives as long as that function (issue 12, item 5).

Transforms, generated bodies, their ``linecache`` entries and cache counters are
owned by the function they come from (``Function.derived``, ``RuntimeMemo``, the
caches on each ``@ti.func``), never by a module-level table keyed by ``id()``:
throwaway functions leave nothing behind. (Kernels Taichi has compiled are
Taichi's: it keeps every kernel object for the life of the process.)

Growth is counted in live Python objects, not with ``tracemalloc``: tracemalloc
keeps the file name of every frame it records, and generated code runs under
file names of its own.
"""
import gc
import linecache
import types
import weakref

import taichi as ti

import tidiff as td


def template(x: ti.f64, y: ti.f64) -> ti.f64:
    return ti.sin(x) * y + x * x


def throwaway(i, generate):
    """A fresh ``@ti.func`` with the template's code (so its source can be read) and transforms of it;
    with ``generate``, their bodies too (code generation only: Taichi compiles nothing)."""
    fresh = types.FunctionType(template.__code__, template.__globals__, f"throwaway_{i}")
    fresh.__annotations__ = dict(template.__annotations__)
    f = ti.func(fresh)
    g = td.grad(f, argnums=(0, 1))
    h = td.hessian(f)
    td.jacfwd(g), td.torch  # more derived functions, memoized on their parents
    if generate:
        specs = g.declared_specs()
        g.body_for(specs)
        h.body_for(specs)
    return weakref.ref(f), weakref.ref(g), weakref.ref(h)


def live_objects():
    gc.collect()
    return len(gc.get_objects())


def test_ten_thousand_throwaway_functions_leave_nothing_behind():
    for i in range(20):  # warm up: first-time imports and Taichi's own caches
        throwaway(i, generate=True)
    lines, objects = len(linecache.cache), live_objects()
    refs = [throwaway(i, generate=i < 200) for i in range(10_000)]
    gc.collect()
    alive = sum(r() is not None for triple in refs for r in triple)
    assert alive == 0, f"{alive} of {3 * len(refs)} functions and transforms are still referenced"
    del refs
    assert len(linecache.cache) <= lines + 5, "generated source outlived its functions in linecache"
    grown = live_objects() - objects
    assert grown < 2_000, f"{grown} more live objects after 10,000 throwaway functions"
