"""Rebuild a program's kernels, funcs, Python functions and objects over twin fields.

Each rebuilt function is ``types.FunctionType(code, globals_with_twins, name,
defaults, closure_with_twins)`` of the original's own code object, wrapped
again as the original was (a kernel, a class kernel, a func): Taichi reads
the source through the code object (same file and line) and resolves names
from the new globals and cells, so the same code now runs on the twins.

An object of a user class (``sim``) is rebuilt as a *shadow*: a new instance
of the same class, made without ``__init__``, whose attributes are the
rebuilt attributes of the original and whose instance dict also holds the
rebuilt versions of the class's kernels and methods that reach fields (a
``@ti.data_oriented`` object binds a class kernel found there to itself, as
it does for the class's own). ``sim.step()`` on the shadow then launches the
rebuilt kernel with the shadow as ``self``, and ``self.x`` is a twin. Lists,
tuples and dicts holding fields are rebuilt item by item, bound methods as
the rebuilt function bound to the rebuilt object.

Every reachable kernel is rebuilt (even one that touches fields only
through its parameters) so that the program launches only kernels tidiff
owns; anything else is rebuilt only if it reaches a field or a kernel
(:attr:`.graph.CodeGraph.dirty`). Cycles (recursive helpers, objects that
refer to each other) are handled by registering each replacement before
filling it.

Limitations: globals are copied at construction, so a module global
rebound later is not seen, and a Python program's ``global x = ...``
assignments land in the copy; attributes an object gains after
construction are not seen either.
"""
import functools
import types
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from taichi.lang import impl
from taichi.lang.exception import TaichiSyntaxError
from taichi.lang.kernel_impl import (
    AutodiffMode,
    Func,
    Kernel,
    _BoundedDifferentiableMethod,
)

from .graph import (
    CodeGraph,
    is_class_kernel,
    is_field,
    is_grad_replaced,
    is_kernel,
    is_taichi_func,
    python_function,
    replaced_parts,
)
from .launches import FasterLaunch
from .split import loop_parts

_T = TypeVar("_T")


class Rebinder:
    """Maps each dirty node of a :class:`~.graph.CodeGraph` to its rebuilt twin.

    Args:
        graph: the program's :class:`~.graph.CodeGraph`.
        twins: ``id(field) -> replacement field`` (empty: keep the fields).
    """

    def __init__(self, graph: CodeGraph, twins: Mapping[int, Any]) -> None:
        self._graph = graph
        self._twins = twins
        self._done: dict[int, Any] = {}
        self.owners: dict[int, list[object]] = {}  # a rebuilt class kernel -> the shadows it is bound to (its
        # adjoint is made per object: NOTE: [Reverse of a kernel])

    def rebuild(self, obj: _T) -> _T:
        """The replacement of ``obj``: a twin field, a rebuilt callable or object, or ``obj`` itself."""
        if is_field(obj):
            return self._twins.get(id(obj), obj)
        if id(obj) not in self._graph.dirty:
            return obj
        if id(obj) not in self._done:
            self._make(obj)
        return self._done[id(obj)]

    # --- kinds of node ------------------------------------------------------------
    def _make(self, obj: object) -> None:
        if is_grad_replaced(obj):
            self._done[id(obj)] = self.replaced(obj)
        elif (old := python_function(obj)) is not None:
            self._function(obj, old)
        elif isinstance(obj, types.MethodType):
            self._done[id(obj)] = types.MethodType(self.rebuild(obj.__func__), self.rebuild(obj.__self__))
        elif isinstance(obj, _BoundedDifferentiableMethod):
            self._done[id(obj)] = getattr(self.rebuild(obj._kernel_owner), obj.__name__)
        elif isinstance(obj, (staticmethod, classmethod)):
            self._done[id(obj)] = type(obj)(self.rebuild(obj.__func__))
        elif isinstance(obj, list):
            rebuilt_list: list[Any] = []
            self._done[id(obj)] = rebuilt_list  # before the entries are rebuilt: one may reach the list
            rebuilt_list.extend(self.rebuild(value) for value in obj)
        elif isinstance(obj, tuple):
            items = [self.rebuild(value) for value in obj]
            self._done[id(obj)] = type(obj)(*items) if hasattr(type(obj), "_fields") else type(obj)(items)
        elif isinstance(obj, dict):
            self._done[id(obj)] = rebuilt_dict = type(obj)()
            rebuilt_dict.update((key, self.rebuild(value)) for key, value in obj.items())
        else:
            self._object(obj)

    def _function(self, obj: object, old: types.FunctionType) -> None:
        """Rebuild ``obj`` (a kernel, a func or a function) over ``old``, its Python function."""
        new_globals = dict(old.__globals__)
        cells = tuple(types.CellType() for _ in old.__code__.co_freevars)
        new = types.FunctionType(old.__code__, new_globals, old.__name__, old.__defaults__, cells)
        new.__kwdefaults__ = old.__kwdefaults__
        functools.update_wrapper(new, old, updated=())
        del new.__dict__["__wrapped__"]  # Taichi must read the new function's globals, not the old one's
        self._done[id(obj)] = self.kernel(obj, new) if is_kernel(obj) else _rewrap(obj, new)
        for index, cell in enumerate(old.__closure__ or ()):
            try:
                cells[index].cell_contents = cell.cell_contents
            except ValueError:
                continue
        defaults = list(old.__defaults__ or ())
        for (kind, key), value in self._graph.edges[id(obj)]:
            if kind == "global":
                new_globals[key] = self.rebuild(value)
            elif kind == "cell":
                cells[key].cell_contents = self.rebuild(value)
            elif kind == "default":
                defaults[key] = self.rebuild(value)
        new.__defaults__ = tuple(defaults) if old.__defaults__ is not None else None

    def _object(self, obj: object) -> None:
        """A shadow of a user object (see the module docstring)."""
        shadow = object.__new__(type(obj))
        self._done[id(obj)] = shadow
        attributes = vars(shadow)
        attributes.update(vars(obj))
        for (kind, name), value in self._graph.edges[id(obj)]:
            if kind == "attr":
                attributes[name] = self.rebuild(value)
            elif kind == "member" and (is_field(value) or id(value) in self._graph.dirty):
                attributes[name] = self.member(obj, shadow, value)

    # --- what subclasses change -------------------------------------------------------
    def kernel(self, obj: Any, new: types.FunctionType) -> Any:
        """The rebuilt kernel for the rebuilt function ``new`` of kernel ``obj``."""
        return _kernel_like(obj, new)

    def member(self, owner: object, shadow: object, value: Any) -> Any:
        """What the shadow of ``owner`` holds for a class member that reaches fields."""
        if is_class_kernel(value):
            rebuilt = self.rebuild(value)  # the data_oriented object binds it to itself on access
            self.owners.setdefault(id(rebuilt), []).append(shadow)
            return rebuilt
        if isinstance(value, staticmethod):
            return self.rebuild(value.__func__)
        if isinstance(value, classmethod):
            return types.MethodType(self.rebuild(value.__func__), type(owner))
        if isinstance(value, types.FunctionType) or is_taichi_func(value):
            return types.MethodType(self.rebuild(value), shadow)
        return self.rebuild(value)

    def replaced(self, obj: types.FunctionType) -> Callable[..., None]:
        """A ``ti.ad.grad_replaced``/``no_grad`` function over the rebuilt primal and gradient."""
        primal, grad = replaced_parts(obj)
        return _replaced_like(obj, self.rebuild(primal), None if grad is None else self.rebuild(grad))


def _kernel_like(obj: Any, new: types.FunctionType) -> Any:
    """A kernel over ``new`` made the way ``ti.kernel`` made ``obj`` (a module or a class kernel)."""
    classkernel = is_class_kernel(obj)
    primal = Kernel(new, autodiff_mode=AutodiffMode.NONE, _classkernel=classkernel)
    adjoint = Kernel(new, autodiff_mode=AutodiffMode.REVERSE, _classkernel=classkernel)
    primal.grad = adjoint

    if classkernel:
        @functools.wraps(new)
        def wrapped(*args: Any, **kwargs: Any) -> Any:  # a data_oriented object binds it; never called unbound
            raise TaichiSyntaxError(f"the class kernel {new.__name__} was called without its object")
    else:
        looked: list[list[Any] | None] = []  # the kernel's loops run one by one (NOTE: [Kernels run loop by loop])
        launches: list[FasterLaunch] = []  # the whole kernel's launch, or its loops'

        @functools.wraps(new)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if not looked:
                looked.append(loop_parts(wrapped))
                with_attributes(wrapped, _tidiff_loops=looked[0])  # the launch guard owns them too
                launches.extend([FasterLaunch(primal, wrapped, wrapped)] if looked[0] is None else
                                [FasterLaunch(part, part, wrapped) for part in looked[0]])
            if kwargs:
                return primal(*args, **kwargs)
            for launch in launches:  # NOTE: [Program kernels by their faster form]
                launch(*args)
            return None

        with_attributes(wrapped, grad=adjoint, _tidiff_launches=launches)
    return with_attributes(wrapped, _is_wrapped_kernel=True, _is_classkernel=classkernel, _primal=primal,
                           _adjoint=adjoint)


def _rewrap(obj: Any, new: types.FunctionType) -> Any:
    """Decorate ``new`` the way ``obj`` was decorated (a func keeps its class, real and py flags)."""
    if not is_taichi_func(obj):
        return new
    old = obj.func
    fun = Func(new, _classfunc=old.classfunc, _pyfunc=old.pyfunc, is_real_function=old.is_real_function)

    @functools.wraps(new)
    def decorated(*args: Any, **kwargs: Any) -> Any:
        return fun.__call__(*args, **kwargs)

    return with_attributes(decorated, _is_taichi_function=True, _is_real_function=old.is_real_function, func=fun)


def _replaced_like(obj: types.FunctionType, primal: Callable[..., Any],
                   grad: Callable[..., Any] | None) -> Callable[..., None]:
    """What ``ti.ad.grad_replaced(primal)`` with ``grad_for`` gives (``no_grad``: an empty gradient)."""

    def decorated(*args: Any, **kwargs: Any) -> None:
        runtime = impl.get_runtime()
        runtime.grad_replaced = True  # kernels launched inside are not recorded: the gradient is ``grad``
        if runtime.target_tape:
            runtime.target_tape.insert(decorated, args)
        try:
            primal(*args, **kwargs)
        finally:
            runtime.grad_replaced = False

    decorated.__name__ = decorated.__qualname__ = getattr(primal, "__name__", "decorated")
    no_gradient = obj.__qualname__.startswith("no_grad")
    return with_attributes(decorated, autodiff_mode=AutodiffMode.NONE, _tidiff_replaced=True,
                           grad=(lambda *args, **kwargs: None) if no_gradient else grad)


def with_attributes(fn: Any, **attributes: Any) -> Any:
    """``fn`` with ``attributes`` set: the marks Taichi's decorators put on the functions they make
    (``_is_wrapped_kernel``, ``grad``, ``func``), which Taichi reads back."""
    for name, value in attributes.items():
        setattr(fn, name, value)
    return fn
