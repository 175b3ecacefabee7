"""Find what a field program reaches: fields, kernels, ``@ti.func``s, helpers and the objects holding them.

Taichi resolves a name in a kernel or func from the function's globals and
closure, and an attribute (``self.x``, ``sim.step``) or an item
(``fields[0]``) from the Python object it is taken from, so that is where
fields hide. :class:`CodeGraph` follows, from the program:

- every name a function's code uses (nested code objects included), through
  its globals, closure cells and default values;
- the parts of a bound method (``sim.run``: the function and ``sim``) and of a
  ``@ti.data_oriented`` kernel bound to its object;
- the attributes of objects of user classes (``vars(obj)``) and the methods,
  kernels and funcs of their classes;
- the items of lists, tuples and dicts;
- the primal and gradient functions of ``ti.ad.grad_replaced`` / ``no_grad``.

It records which slot holds what, so that :mod:`.rebind` can swap exactly
those slots. Library objects (Taichi's, NumPy's, torch's, tidiff's own) are
never walked.

Limitations: properties are not rebuilt (they run with the rebuilt object as
``self``, which is enough when they read its attributes); a method reached
through its class (``Sim.step(self)``, ``super()``) is the class's own.
"""
import types
from typing import Any, TypeGuard

from taichi.lang.field import Field, ScalarField
from taichi.lang.kernel_impl import Func, _BoundedDifferentiableMethod
from taichi.lang.matrix import MatrixField
from taichi.lang.struct import StructField

SUPPORTED_FIELDS = (ScalarField, MatrixField)
_LIBRARIES = ("taichi", "numpy", "torch", "tidiff", "builtins", "jax", "scipy")
_CONTAINERS = (list, tuple, dict)

#: Where a node holds a value: ``(kind, key)``, e.g. ``("global", name)``, ``("cell", index)``,
#: ``("item", key)`` (see :func:`slots` and :meth:`CodeGraph._children`); keys are names, indices or dict keys.
Slot = tuple[str, Any]
#: One edge of the graph: a slot and the value it holds.
Edge = tuple[Slot, Any]


def is_field(obj: object) -> bool:
    """A dense scalar, vector or matrix field: the kinds tidiff can twin."""
    return isinstance(obj, SUPPORTED_FIELDS)


def is_kernel(obj: object) -> bool:
    """A ``@ti.kernel`` (the wrapper ``ti.kernel`` returns), of a module or of a ``@ti.data_oriented`` class."""
    return callable(obj) and getattr(obj, "_is_wrapped_kernel", False) is True


def is_class_kernel(obj: object) -> bool:
    """A kernel defined in a ``@ti.data_oriented`` class (its ``self`` is bound at launch)."""
    return is_kernel(obj) and getattr(obj, "_is_classkernel", False)


def is_taichi_func(obj: object) -> bool:
    """A ``@ti.func`` / ``ti.real_func`` / ``ti.pyfunc`` wrapper."""
    return getattr(obj, "_is_taichi_function", False) and isinstance(getattr(obj, "func", None), Func)


def is_grad_replaced(obj: object) -> TypeGuard[types.FunctionType]:
    """A function made by ``ti.ad.grad_replaced`` or ``ti.ad.no_grad`` (its gradient is the user's)."""
    return (isinstance(obj, types.FunctionType) and obj.__module__ == "taichi.ad._ad"
            and obj.__qualname__ in ("grad_replaced.<locals>.decorated", "no_grad.<locals>.decorated"))


def replaced_parts(obj: types.FunctionType) -> tuple[Any, Any]:
    """``(primal, gradient)`` of a grad_replaced function: the user's functions (the gradient None for
    no_grad, which has none, or while no ``grad_for`` was given)."""
    primal = _cell(obj, "func")
    grad = getattr(obj, "grad", None)
    if obj.__qualname__.startswith("no_grad"):
        return primal, None
    return primal, None if grad is None else _cell(grad, "func")


def _cell(fn: types.FunctionType, name: str) -> Any:
    """The value of ``fn``'s closure variable ``name`` (Taichi's decorators keep what they wrap in cells)."""
    cells = fn.__closure__ or ()  # None only without free variables, where ``index`` raises first
    return cells[fn.__code__.co_freevars.index(name)].cell_contents


def python_function(obj: Any) -> types.FunctionType | None:
    """The plain Python function behind a kernel, a func, or a function itself; else None."""
    if is_kernel(obj):
        return obj.__wrapped__
    if is_taichi_func(obj):
        return obj.func.func
    if isinstance(obj, types.FunctionType) and not _is_library(obj):
        return obj
    return None


def _is_library(obj: object) -> bool:
    """Taichi's, NumPy's, torch's and tidiff's own objects are never rebuilt (nor walked: they are large)."""
    module = getattr(obj, "__module__", None) or ""
    return module.split(".")[0] in _LIBRARIES


def is_user_object(obj: object) -> bool:
    """An instance of a user-defined class with a ``__dict__``: its attributes and methods are followed."""
    if isinstance(obj, (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        return False
    return not _is_library(type(obj)) and hasattr(obj, "__dict__")


def code_names(code: types.CodeType) -> set[str]:
    """Every global-or-attribute name ``code`` and its nested code objects use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return names


def slots(fn: types.FunctionType) -> list[Edge]:
    """``(slot, value)`` for each global, closure cell and default value ``fn`` may read.

    A slot is ``("global", name)``, ``("cell", index)`` or ``("default", index)``.
    """
    found: list[Edge] = []
    for name in sorted(code_names(fn.__code__)):
        if name in fn.__globals__:
            found.append((("global", name), fn.__globals__[name]))
    for index, cell in enumerate(fn.__closure__ or ()):
        try:
            found.append((("cell", index), cell.cell_contents))
        except ValueError:  # an empty cell: a name assigned later in the enclosing scope
            continue
    found.extend((("default", index), value) for index, value in enumerate(fn.__defaults__ or ()))
    return found


def class_members(cls: type) -> dict[str, Any]:
    """``name -> value`` of the methods, kernels, funcs and other attributes a class gives its objects.

    The first definition along the MRO wins, as attribute lookup does;
    dunder names, properties and library base classes are left out.
    """
    members: dict[str, Any] = {}
    for klass in cls.__mro__:
        if klass is object or _is_library(klass):
            continue
        for name, value in vars(klass).items():
            if name.startswith("__") or name in members or isinstance(value, property):
                continue
            members[name] = value
    return members


def _name_of(slot: Slot, fn: types.FunctionType | None = None, parent: str = "") -> str:
    """The name a slot gives its value in messages (``x``, ``v0``, ``fields[1]``)."""
    kind, key = slot[0], slot[-1]
    if kind == "global" or kind in ("attr", "member"):
        return key
    if kind == "cell" and fn is not None:  # cells are slots of functions only
        return fn.__code__.co_freevars[key]
    if kind == "item":
        return f"{parent}[{key!r}]" if parent else ""
    return ""


class CodeGraph:
    """The callables, objects and fields reachable from a program.

    Attributes:
        fields: reachable fields, ``id -> field``, in discovery order.
        names: ``id(field) -> name`` the program uses for it (for messages and specs).
        nodes: every walked object, ``id -> obj``.
        edges: ``id(node) -> [(slot, value), ...]``.
        owners: ``id(class kernel) -> [objects it was reached through]``.
        replaced: the ``ti.ad.grad_replaced`` / ``no_grad`` functions reached.
        dirty: ids of nodes that reach a field, a kernel or a replaced
            gradient, hence must be rebuilt.
    """

    def __init__(self, *roots: object) -> None:
        self.fields: dict[int, Field] = {}
        self.names: dict[int, str] = {}
        self.nodes: dict[int, Any] = {}
        self.edges: dict[int, list[Edge]] = {}
        self.owners: dict[int, list[Any]] = {}
        self.replaced: list[types.FunctionType] = []
        self.struct_fields: dict[int, str] = {}  # struct fields the code names (``P.field()``) -> a name
        self._used: set[str] = set()  # every name the walked code uses
        self._unused_members: list[tuple[object, str, Any]] = []
        self._roots = [id(root) for root in roots if not is_field(root)]
        for root in roots:
            if is_field(root):
                self.fields.setdefault(id(root), root)
            else:
                self._visit(root, getattr(root, "__name__", "") or "")
        self._follow_used_members()
        self.dirty = self._find_dirty()

    def kernels(self) -> list[Any]:
        """Every reachable kernel (module kernels and class kernels)."""
        return [obj for obj in self.nodes.values() if is_kernel(obj)]

    def reversed_kernels(self) -> list[Any]:
        """The kernels reverse mode reverses: those reachable other than through a ``ti.ad.grad_replaced`` /
        ``no_grad`` function, whose primal's launches are not recorded and whose gradient is the user's."""
        seen, pending = set(self._roots), list(self._roots)
        while pending:
            for slot, value in self.edges.get(pending.pop(), []):
                if slot[0] != "replaced" and id(value) in self.nodes and id(value) not in seen:
                    seen.add(id(value))
                    pending.append(id(value))
        return [obj for key, obj in self.nodes.items() if key in seen and is_kernel(obj)]

    def kernels_with_owners(self) -> list[tuple[Any, Any]]:
        """``(kernel, owner)`` for each reachable kernel: a class kernel once per object it is bound to."""
        pairs: list[tuple[Any, Any]] = []
        for kernel in self.kernels():
            if is_class_kernel(kernel):
                pairs.extend((kernel, owner) for owner in self.owners.get(id(kernel), ()))
            else:
                pairs.append((kernel, None))
        return pairs

    # --- the walk ---------------------------------------------------------------
    def _visit(self, obj: object, label: str = "") -> None:
        if id(obj) in self.nodes:
            return
        self.nodes[id(obj)] = obj
        self.edges[id(obj)] = []
        fn = python_function(obj)
        if fn is not None:
            self._used |= code_names(fn.__code__)
        if isinstance(obj, _BoundedDifferentiableMethod):  # ``sim.step`` itself: its kernel is a member of ``sim``
            self._used.add(obj._primal.func.__name__)
        for slot, value in self._children(obj):
            if slot[0] == "member" and not is_field(value) and slot[1] not in self._used:
                self._unused_members.append((obj, label, (slot, value)))  # NOTE: [Members the code names]
                continue
            self._edge(obj, label, slot, value)

    def _follow_used_members(self) -> None:
        """Walk the class members that the walked code names, until no newly walked code names another.

        NOTE: [Members the code names] An object's class may hold kernels the program never calls
        (a simulation class with a dozen), so its methods, kernels and funcs are walked only when
        some walked code uses their name (``sim.step()``, ``self.force(i)``): rebuilding a kernel for a tangent program
        transforms it, and one that cannot be differentiated must not fail a program that never
        launches it. A member reached only by a name built at run time (``getattr(sim, name)``) is
        the class's own kernel over the original fields, which the program's launch guard refuses.
        """
        while True:
            used = [entry for entry in self._unused_members if entry[2][0][1] in self._used]
            if not used:
                return
            self._unused_members = [entry for entry in self._unused_members if entry[2][0][1] not in self._used]
            for obj, label, (slot, value) in used:
                self._edge(obj, label, slot, value)

    def _edge(self, obj: object, label: str, slot: Slot, value: Any) -> None:
        """Record one child of ``obj`` and walk it."""
        edges = self.edges[id(obj)]
        if isinstance(value, StructField):  # not twinned: a program reaching one has no derivative (NOTE: [Struct
            # fields refused])
            self.struct_fields.setdefault(id(value), _name_of(slot, python_function(obj), label) or "")
        elif is_field(value):
            self.fields.setdefault(id(value), value)
            fn = python_function(obj)
            name = _name_of(slot, fn, label)
            if name:
                self.names.setdefault(id(value), name)
            edges.append((slot, value))
        elif self._walkable(value):
            edges.append((slot, value))
            fn = python_function(obj)
            self._visit(value, _name_of(slot, fn, label) if slot[0] != "self" else "")
            if slot[0] == "member" and is_class_kernel(value):
                self.owners.setdefault(id(value), []).append(obj)

    @staticmethod
    def _walkable(value: object) -> bool:
        return (python_function(value) is not None or is_grad_replaced(value) or is_user_object(value)
                or isinstance(value, (types.MethodType, _BoundedDifferentiableMethod, staticmethod, classmethod))
                or (isinstance(value, _CONTAINERS) and len(value) > 0))

    def _children(self, obj: object) -> list[Edge]:
        """``(slot, value)`` pairs of one node (see the module docstring for what is followed)."""
        if is_grad_replaced(obj):
            self.replaced.append(obj)
            primal, grad = replaced_parts(obj)
            return [(("replaced", "primal"), primal)] + ([(("replaced", "grad"), grad)] if grad is not None else [])
        fn = python_function(obj)
        if fn is not None:
            return slots(fn)
        if isinstance(obj, types.MethodType):
            return [(("bound", "self"), obj.__self__), (("bound", "func"), obj.__func__)]
        if isinstance(obj, _BoundedDifferentiableMethod):
            owner = obj._kernel_owner
            return [(("bound", "self"), owner)]
        if isinstance(obj, (staticmethod, classmethod)):
            return [(("descriptor", "func"), obj.__func__)]
        if isinstance(obj, dict):
            return [(("item", key), value) for key, value in obj.items()]
        if isinstance(obj, (list, tuple)):
            return [(("item", index), value) for index, value in enumerate(obj)]
        if is_user_object(obj):
            own = vars(obj)
            found = [(("attr", name), value) for name, value in own.items()]
            found += [(("member", name), value) for name, value in class_members(type(obj)).items()
                      if name not in own]
            return found
        return []

    def _find_dirty(self) -> set[int]:
        """Nodes from which a field, a kernel or a replaced gradient can be reached (a fixed point, cycles allowed)."""
        dirty = {key for key, obj in self.nodes.items() if is_kernel(obj) or is_grad_replaced(obj)}
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
