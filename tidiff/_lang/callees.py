"""What a call in Taichi code goes to when it is not a Taichi op: plain Python helpers and partials.

NOTE: [Python helpers] Taichi lets kernels and ``@ti.func`` s call plain
Python functions and lambdas (``op = lambda x: ti.sin(x)`` picked from a
table, a small undecorated helper): Taichi calls them while it compiles,
with Taichi expressions as arguments, and inlines what they build. Their
bodies are Taichi code, so the transforms treat them as they treat a
``@ti.func``: the source is transformed (recursively, cached per callee and
activity pattern) and the generated tangent or reverse function is a
``@ti.func``, which Taichi inlines as it would have inlined the helper.

Two differences from a ``@ti.func`` are kept:

- Taichi hands a helper its arguments as they are, so a Python number stays
  a compile-time constant (``ti.static(range(n))`` works on it). The
  generated function of a helper takes every parameter its body never
  assigns as ``ti.template()`` (passed as is, by reference, which is safe
  since nothing writes it) and only the others by value (``emit.generate``).
  For the same reason an inactive argument is passed as written, not first
  stored in a Taichi variable.
- A ``functools.partial`` is called as Python calls it: ``p(x)`` for
  ``p = partial(h, 2.0)`` is ``h(2.0, x)``, the bound values passed in as
  constants (:func:`expand_partial`). The generated function is then the
  one of ``h``, shared by every partial of it (the cache key is ``h`` and
  the activity pattern; the bound values are arguments).

Defaults are filled in at the call (``parse.positional``), so generated
functions take every parameter. Generated code that calls a helper itself
(a reverse function's forward sweep, for the primal value) calls it through
:class:`Quiet`, so that Taichi does not warn about code the user did not
write. A callee whose source cannot be read, or that is not plain Python (a
builtin, a C extension, a method of an object, a library's function), is
refused at the call: :func:`refusal` says why.
"""
import ast
import functools
import inspect
import sysconfig
import types
from collections.abc import Callable
from typing import Any, TypeGuard

from .source import source_tree

STATIC_BUILTINS = frozenset({len, isinstance, range, bool, any, all, type, hasattr, callable, id})
"""Builtins Taichi evaluates while compiling (``len(v)``) or whose results are booleans: no
derivative, so their calls are copied as written even with differentiable arguments."""
_LIBRARIES = {"taichi", "tidiff", "numpy", "torch", "scipy", "jax"}
"""Packages whose functions are never transformed as helpers (Taichi's own are ops with rules)."""
_CONSTANTS = (int, float, bool, str, type(None))
_STDLIB = sysconfig.get_paths()["stdlib"]


def is_taichi_func(obj: object) -> bool:
    """A ``@ti.func`` (or a function tidiff generated), whose source is that of ``obj.__wrapped__``."""
    return bool(getattr(obj, "_is_taichi_function", False)) and hasattr(obj, "__wrapped__")


def is_helper(obj: object) -> TypeGuard[types.FunctionType]:
    """A plain Python function or lambda of the user's: Taichi calls it while compiling (NOTE: [Python helpers])."""
    return (isinstance(obj, types.FunctionType) and not getattr(obj, "_is_taichi_function", False)
            and not getattr(obj, "_is_wrapped_kernel", False) and _package(obj) not in _LIBRARIES
            and not obj.__code__.co_filename.startswith(_STDLIB))


def _package(fn: Any) -> str:
    return (getattr(fn, "__module__", None) or "").split(".")[0]


def transformable(obj: object) -> bool:
    """A ``@ti.func`` or a plain helper whose source can be read: its call is transformed."""
    return is_taichi_func(obj) or (is_helper(obj) and refusal(obj) is None)


def refusal(obj: object) -> str | None:
    """Why a call of ``obj`` cannot be transformed as source (a phrase), or None when it can."""
    if isinstance(obj, types.FunctionType) and not is_helper(obj):
        return f"a function of {_package(obj) or 'a library'}, which tidiff does not differentiate"
    if is_helper(obj):
        if obj not in _SOURCE_REFUSALS:
            _SOURCE_REFUSALS[obj] = _source_refusal(obj)
        return _SOURCE_REFUSALS[obj]
    if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)) or type(obj).__name__ in (
            "method_descriptor", "wrapper_descriptor", "ufunc", "cython_function_or_method"):
        return "a builtin or C extension function, which has no Python source"
    if isinstance(obj, types.MethodType):
        return "a method of an object, which tidiff does not transform"
    if isinstance(obj, type):
        return "a class, which tidiff does not transform"
    return f"a callable {type(obj).__name__} object, which tidiff does not transform"


class Quiet:
    """A helper as generated code calls it: Taichi calls it the same way, without its warning of a
    "non-taichi function" (the user's own call has it; see NOTE: [Python helpers]).

    ``parse.resolve`` sees through it, so generated code transformed again
    transforms the helper.
    """

    _is_taichi_function = True  # what Taichi checks before it warns; it then reads func.has_print

    class func:
        has_print = False

    def __init__(self, helper: types.FunctionType) -> None:
        self.helper = helper

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.helper(*args, **kwargs)


_QUIET: dict[types.FunctionType, Quiet] = {}


def quiet(helper: types.FunctionType) -> Quiet:
    """The one :class:`Quiet` of ``helper``."""
    if helper not in _QUIET:
        _QUIET[helper] = Quiet(helper)
    return _QUIET[helper]


_SOURCE_REFUSALS: dict[types.FunctionType, str | None] = {}
"""helper -> why its source cannot be read, or None: asked at every call of it."""


def _source_refusal(fn: types.FunctionType) -> str | None:
    try:
        source_tree(fn)
    except (OSError, TypeError) as e:
        return f"a Python function whose source is not available ({e})"
    except SyntaxError as e:
        return f"a Python function whose source cannot be parsed ({e.msg})"
    return None


def value_node(value: Any, name_of: Callable[[object], str]) -> ast.expr:
    """The AST node of a Python value passed into generated code: a literal, or a name ``name_of(value)`` binds."""
    if type(value) in _CONSTANTS:
        return ast.Constant(value)
    return ast.Name(name_of(value), ast.Load())


def expand_partial(node: ast.Call, partial: functools.partial, name_of: Callable[[object], str]) -> ast.Call:
    """``p(x, k=v)`` for ``p = functools.partial(h, 2.0, s=3.0)`` -> ``h(2.0, x, s=3.0, k=v)``.

    Python's rule: bound positionals first, call-site keywords override bound
    ones. ``name_of(value)`` binds a value in the generated namespace and
    returns its name.
    """
    assert isinstance(partial, functools.partial)
    args = [value_node(a, name_of) for a in partial.args] + list(node.args)
    keywords: dict[str | None, ast.expr] = {k: value_node(v, name_of) for k, v in partial.keywords.items()}
    keywords.update({k.arg: k.value for k in node.keywords})
    func = ast.Name(name_of(partial.func), ast.Load())
    return ast.copy_location(ast.Call(func, args, [ast.keyword(k, v) for k, v in keywords.items()]), node)


def hint_name(obj: object) -> str:
    """A readable base name for an object bound in generated code."""
    name = getattr(obj, "__name__", "")
    return name if name.isidentifier() else "helper" if callable(obj) else "bound"


def call_name(func: ast.expr, callee: object) -> str:
    """A readable base name for what a call calls: ``h`` for ``mod.h(x)``, ``sin`` for ``OPS["sin"](x)``."""
    if isinstance(func, ast.Subscript) and isinstance(func.slice, ast.Constant):
        key = str(func.slice.value)
        if key.isidentifier():
            return key
    base = ast.unparse(func).split(".")[-1]
    return base if base.isidentifier() else hint_name(callee)


def signature_of(callee: Any) -> inspect.Signature:
    """The Python signature a call of ``callee`` binds against (a bound @ti.func's ``self`` is not passed)."""
    if isinstance(callee, types.MethodType):
        return inspect.Signature(list(signature_of(callee.__func__).parameters.values())[1:])
    fn = callee.__wrapped__ if is_taichi_func(callee) else callee
    return inspect.signature(fn)


def callable_positional(node: ast.Call, callee: Any, error: Callable[[ast.AST, str, str], Exception]) -> list[ast.expr]:
    """A call's arguments in parameter order for a tidiff Function callee (keywords by its parameter names)."""
    if not node.keywords:
        return list(node.args)
    try:
        return list(callee.bind(node.args, {k.arg: k.value for k in node.keywords}, callee.name))
    except TypeError as e:
        raise error(node, f"the call `{ast.unparse(node)}`", str(e)) from None


def callee_hint(func: ast.expr, callee: object) -> str:
    """A readable name hint for a callee: ``h`` for ``m.h``, ``sin`` for ``OPS["sin"]``, the Function's
    name for ``td.grad(E)``."""
    if isinstance(func, (ast.Name, ast.Attribute, ast.Subscript)):
        return call_name(func, callee)
    name = "".join(c if c.isalnum() else "_" for c in getattr(callee, "name", "f"))
    return "_".join(p for p in name.split("_") if p) or "f"
