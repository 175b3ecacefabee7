"""Rebuild a program's kernels, funcs and Python functions over twin fields.

Each rebuilt callable is ``types.FunctionType(code, globals_with_twins, name,
defaults, closure_with_twins)`` of the original's own code object, wrapped
again by ``ti.kernel`` / ``ti.func`` as the original was: Taichi reads the
source through the code object (same file and line) and resolves names from
the new globals and cells, so the same code now runs on the twins.

Every reachable kernel is rebuilt (even one that touches fields only
through its parameters) so that the program launches only kernels tidiff
owns; a func or Python function is rebuilt only if it reaches a field or a
kernel. Cycles (recursive Python helpers) are handled by creating each
replacement before filling its globals and cells.

Limitations: globals are copied at construction, so a module global
rebound later is not seen, and a Python program's ``global x = ...``
assignments land in the copy.
"""
import functools
import types

import taichi as ti

from .graph import is_field, is_kernel, is_taichi_func, python_function


class Rebinder:
    """Maps each dirty callable of a :class:`~.graph.CodeGraph` to its rebuilt twin."""

    def __init__(self, graph, twins):
        self._graph = graph
        self._twins = twins.as_mapping()
        self._done = {}

    def rebuild(self, obj):
        """The replacement of ``obj``: a twin field, a rebuilt callable, or ``obj`` itself."""
        if is_field(obj):
            return self._twins.get(id(obj), obj)
        if id(obj) not in self._graph.dirty:
            return obj
        if id(obj) in self._done:
            return self._done[id(obj)]
        old = python_function(obj)
        new_globals = dict(old.__globals__)
        cells = tuple(types.CellType() for _ in old.__code__.co_freevars)
        new = types.FunctionType(old.__code__, new_globals, old.__name__, old.__defaults__, cells)
        new.__kwdefaults__ = old.__kwdefaults__
        functools.update_wrapper(new, old, updated=())
        del new.__wrapped__  # Taichi must read the new function's globals, not the old one's
        self._done[id(obj)] = replacement = _rewrap(obj, new)
        for index, cell in enumerate(old.__closure__ or ()):
            try:
                cells[index].cell_contents = cell.cell_contents
            except ValueError:
                continue
        for (kind, key), value in self._graph.edges[id(obj)]:
            if kind == "global":
                new_globals[key] = self.rebuild(value)
            else:
                cells[key].cell_contents = self.rebuild(value)
        return replacement


def _rewrap(obj, new):
    """Decorate ``new`` the way ``obj`` was decorated."""
    if is_kernel(obj):
        return ti.kernel(new)
    if is_taichi_func(obj):
        if obj.func.pyfunc:
            return ti.pyfunc(new)
        if obj.func.is_real_function:
            return ti.real_func(new)
        return ti.func(new)
    return new
