"""Kernels and funcs that reach fields through objects: ``self`` bound, attribute chains named.

NOTE: [Fields through objects] Taichi evaluates ``self.x``, ``sim.springs``
or ``fields[0]`` in a kernel at compile time, from the Python objects they
are taken from. The tangent transform pairs *names* with tangents, so before
it runs, a kernel or func is specialized to the objects it reads:

- a method (a ``@ti.data_oriented`` class kernel, or a ``@ti.func`` taken from
  an object) loses its first parameter, whose name is bound to the object in
  the namespace: the generated kernel is a plain kernel of that object;
- every chain of attributes and constant subscripts that ends at a field, a
  list or tuple of fields, or a ``@ti.func`` (``self.x``, ``sim.fields``,
  ``self.force``) is replaced by a fresh global name bound to it
  (``self_x``); other chains (``self.n``, ``self.dt``) stay, Taichi reads
  them from the bound object.

The tangent of a list of fields is the list of their tangent fields, so
``fields[k][i]`` in a ``ti.static`` loop pairs with ``dfields[k][i]``.
"""
import ast
import types
from collections.abc import Container
from typing import Any, TypeGuard

import numpy as np
from taichi.lang._ndarray import Ndarray
from taichi.lang.field import Field
from taichi.lang.util import to_numpy_type

from .naming import names_in
from .parse import MISSING, Parsed, entry, parse, python_function, resolve

_BOUND = "_tidiff_bound"


class Unbound:
    """A class kernel seen as a plain kernel by :func:`~.parse.parse` (its ``self`` is bound by :func:`bind`)."""

    _is_wrapped_kernel = True

    def __init__(self, kernel: Any) -> None:
        self.__wrapped__ = kernel.__wrapped__
        self.kernel = kernel


def fields_of(value: object) -> tuple[Field, ...]:
    """The fields a namespace value stands for: a field, or a non-empty list, tuple or dict (its values) of
    fields; else ()."""
    if isinstance(value, Field):
        return (value,)
    entries = list(value.values()) if isinstance(value, dict) else value
    if isinstance(entries, (list, tuple)) and entries and all(isinstance(v, Field) for v in entries):
        return tuple(entries)
    return ()


def is_float_field(value: object) -> bool:
    """Whether ``value`` is a field of floats (one that can carry gradients and tangents)."""
    return isinstance(value, Field) and np.dtype(to_numpy_type(value.dtype)).kind == "f"


def is_method_func(value: object) -> TypeGuard[types.MethodType]:
    """A ``@ti.func`` bound to an object (``self.force``)."""
    return isinstance(value, types.MethodType) and getattr(value.__func__, "_is_taichi_function", False)


def _worth_a_name(value: object) -> bool:
    return (bool(fields_of(value)) or isinstance(value, Ndarray) or is_method_func(value)
            or getattr(value, "_is_taichi_function", False))


def static_value(node: ast.AST, namespace: dict[str, Any], local: Container[str]) -> Any:
    """The value of a chain ``a.b[0].c`` rooted at a global name, or MISSING."""
    if isinstance(node, ast.Name):
        return MISSING if node.id in local else resolve(node, namespace)
    if isinstance(node, ast.Attribute):
        base = static_value(node.value, namespace, local)
        if base is MISSING:
            return MISSING
        try:
            return getattr(base, node.attr)
        except Exception:  # noqa: BLE001 -- a property that raises, a missing attribute: Taichi will say
            return MISSING
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return entry(static_value(node.value, namespace, local), node.slice.value)
    return MISSING


def bind(parsed: Parsed, owner: object) -> Parsed:
    """Specialize a parsed kernel or func to ``owner`` and name its attribute chains (see the NOTE).

    Idempotent: a parse is bound once.
    """
    if getattr(parsed, _BOUND, False):
        return parsed
    setattr(parsed, _BOUND, True)
    if owner is not None:
        first = parsed.tree.args.args.pop(0)
        parsed.namespace[first.arg] = owner
    local = _locals(parsed.tree)
    taken = names_in(parsed.tree) | set(parsed.namespace)
    named: dict[int, str] = {}

    class Namer(ast.NodeTransformer):
        def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
            return self.chain(node)

        def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
            return self.chain(node)

        def chain(self, node: ast.Attribute | ast.Subscript) -> ast.AST:
            if isinstance(node, ast.Attribute) and node.attr in ("grad", "dual") \
                    and isinstance(static_value(node.value, parsed.namespace, local), Field):
                return self.generic_visit(node)  # x.grad stays: the transform refuses it by name
            value = static_value(node, parsed.namespace, local)
            if value is not MISSING and _worth_a_name(value):
                name = named.get(id(value))
                if name is None:
                    name = _fresh(ast.unparse(node), taken)
                    named[id(value)] = name
                    parsed.namespace[name] = value
                return ast.copy_location(ast.Name(name, ast.Load()), node)
            return self.generic_visit(node)

    parsed.tree.body = [Namer().visit(stmt) for stmt in parsed.tree.body]
    return parsed


def _fresh(text: str, taken: set[str]) -> str:
    hint = "".join(c if c.isalnum() else "_" for c in text).strip("_") or "f"
    hint = hint if hint[0].isalpha() else "f_" + hint
    name, n = hint, 0
    while name in taken:
        n += 1
        name = f"{hint}_{n}"
    taken.add(name)
    return name


def _locals(tree: ast.FunctionDef) -> set[str]:
    """Parameters and every name the function binds (a local shadows a global)."""
    bound = {a.arg for a in tree.args.args}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
    return bound


_PARSED: dict[tuple[Any, int], tuple[Parsed, Any]] = {}


def parsed_for(f: Any, owner: object = None) -> Parsed:
    """``f`` (a kernel, func, bound func or :class:`Unbound`) parsed, bound to its object and chains named.

    Made once per function and object; do not mutate the result (transforms
    parse again).
    """
    if is_method_func(f):
        f, owner = f.__func__, f.__self__
    key = (f, id(owner))
    if key not in _PARSED:
        _PARSED[key] = (bind(parse(f), owner), owner)  # the owner is kept alive with its parse
    return _PARSED[key][0]


def method_parts(f: Any) -> tuple[Any, Any]:
    """``(function, object)`` of a func bound to an object, else ``(f, None)``."""
    return (f.__func__, f.__self__) if is_method_func(f) else (f, None)


def argcount(f: Any) -> int:
    """How many arguments a call of ``f`` passes (a bound func's ``self`` is not one)."""
    fn, owner = method_parts(f)
    return python_function(fn).__code__.co_argcount - (owner is not None)
