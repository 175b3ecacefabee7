"""Find what a field program reaches: fields, kernels, ``@ti.func``s, helpers.

Taichi resolves a name in a kernel or func from the function's globals and
closure, so that is where fields hide. :class:`CodeGraph` follows every name a
function's code uses (nested code objects included) through globals and
closure cells, recursively, and records which slot holds what, so that
:mod:`.rebind` can swap exactly those slots.

Only names are followed: a field reached through an attribute (``sim.x``,
``self.x``) or a container (``fields[0]``) is invisible here.
"""
import types

from taichi.lang.field import ScalarField
from taichi.lang.kernel_impl import Func
from taichi.lang.matrix import MatrixField

SUPPORTED_FIELDS = (ScalarField, MatrixField)


def is_field(obj):
    """A dense scalar, vector or matrix field: the kinds tidiff can twin."""
    return isinstance(obj, SUPPORTED_FIELDS)


def is_kernel(obj):
    """A ``@ti.kernel`` (the wrapper ``ti.kernel`` returns)."""
    return callable(obj) and getattr(obj, "_is_wrapped_kernel", False)


def is_taichi_func(obj):
    """A ``@ti.func`` / ``ti.real_func`` / ``ti.pyfunc`` wrapper."""
    return getattr(obj, "_is_taichi_function", False) and isinstance(getattr(obj, "func", None), Func)


def python_function(obj):
    """The plain Python function behind a kernel, a func, or a function itself; else None."""
    if is_kernel(obj):
        return obj.__wrapped__
    if is_taichi_func(obj):
        return obj.func.func
    if isinstance(obj, types.FunctionType) and not _is_library(obj):
        return obj
    return None


def _is_library(fn):
    """Taichi's and NumPy's own functions are never rebuilt (nor walked: they are large)."""
    module = getattr(fn, "__module__", None) or ""
    return module.split(".")[0] in ("taichi", "numpy", "torch", "tidiff")


def _code_names(code):
    """Every global-or-attribute name ``code`` and its nested code objects use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def slots(fn):
    """``(slot, value)`` for each global and closure cell ``fn`` may read.

    A slot is ``("global", name)`` or ``("cell", index)``.
    """
    found = []
    for name in sorted(_code_names(fn.__code__)):
        if name in fn.__globals__:
            found.append((("global", name), fn.__globals__[name]))
    for index, cell in enumerate(fn.__closure__ or ()):
        try:
            found.append((("cell", index), cell.cell_contents))
        except ValueError:  # an empty cell: a name assigned later in the enclosing scope
            continue
    return found


class CodeGraph:
    """The callables and fields reachable from a program, by name.

    Attributes:
        fields: reachable fields, ``id -> field``, in discovery order.
        names: ``id(field) -> name`` the program uses for it (for messages).
        callables: reachable kernels, funcs and Python functions, ``id -> obj``.
        edges: ``id(callable) -> [(slot, value), ...]``.
        dirty: ids of callables that reach a field or a kernel, hence must be rebuilt.
    """

    def __init__(self, root):
        self.fields = {}
        self.names = {}
        self.callables = {}
        self.edges = {}
        self._visit(root)
        self.dirty = self._find_dirty()

    def kernels(self):
        """Every reachable kernel."""
        return [obj for obj in self.callables.values() if is_kernel(obj)]

    def _visit(self, obj):
        if id(obj) in self.callables:
            return
        fn = python_function(obj)
        self.callables[id(obj)] = obj
        self.edges[id(obj)] = []
        for slot, value in slots(fn):
            if is_field(value):
                self.fields.setdefault(id(value), value)
                if slot[0] == "global":
                    self.names.setdefault(id(value), slot[1])
                else:
                    self.names.setdefault(id(value), fn.__code__.co_freevars[slot[1]])
                self.edges[id(obj)].append((slot, value))
            elif python_function(value) is not None:
                self.edges[id(obj)].append((slot, value))
                self._visit(value)

    def _find_dirty(self):
        """Callables from which a field or a kernel can be reached (a fixed point, cycles allowed)."""
        dirty = {key for key, obj in self.callables.items() if is_kernel(obj)}
        changed = True
        while changed:
            changed = False
            for key, edges in self.edges.items():
                if key in dirty:
                    continue
                if any(is_field(value) or id(value) in dirty for _, value in edges):
                    dirty.add(key)
                    changed = True
        return dirty
