"""What a call goes to (:func:`classify`): an op of the rule table, a user rule (``td.custom_jvp``,
``td.custom_vjp``), a tidiff Function called inside Taichi code, a ``@ti.func`` or helper transformed in
turn. The user rules and callable Functions are registries filled by the modules that define them."""
import ast
import enum
import functools
import weakref
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any

import taichi as ti

from .._lang.callees import STATIC_BUILTINS, refusal, transformable
from .._lang.parse import MISSING, hashable, resolve, static_call
from .table import REFUSED, lookup, zero

CUSTOM_JVPS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
"""callee -> a @ti.func ``(*primals, *tangents) -> (out, dout)`` used instead of transforming it."""

CUSTOM_VJPS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
"""callee -> a @ti.func ``bwd(*primals, *cotangents) -> (cotangent of each primal, ...)``: the
reverse transform calls it with the real cotangent; forward mode of such a callee needs a jvp rule too."""

CALLABLE_TYPES: dict[type, Any] = {}
"""type -> an object with ``tangent(obj, active)`` (one direction, NOTE: [Tangent calls lane by lane]),
``reverse(obj, active, n_outputs)`` and ``outputs(obj)``: callees the transforms call through (tidiff
Functions called inside a @ti.func)."""

CALLABLE_OBJECTS: dict[Any, Any] = {}
"""object -> such a rule, for callees that are one particular object (``td.jvp``)."""


def callable_rule(obj: object) -> Any:
    """The rule for calling through ``obj`` (see CALLABLE_TYPES, CALLABLE_OBJECTS), or None."""
    for kind, rule in CALLABLE_TYPES.items():
        if isinstance(obj, kind):
            return rule
    try:
        return CALLABLE_OBJECTS.get(obj)
    except TypeError:  # unhashable
        return None


def register_jvp(f: Any, jvp: Any) -> None:
    """Make the transforms call ``jvp`` wherever ``f`` is called (the td.custom_jvp hook).

    ``jvp`` is a ``@ti.func`` taking all primals, then all tangents (zeros
    spelled out for inactive ones), and returning ``(out, dout)``.
    """
    CUSTOM_JVPS[f] = jvp


def register_vjp(f: Any, bwd: Any) -> None:
    """Make the reverse transform call ``bwd`` wherever ``f`` is called (the td.custom_vjp hook).

    ``bwd`` is a ``@ti.func`` taking all primals, then one cotangent per output, and
    returning a tuple with one cotangent per primal.
    """
    CUSTOM_VJPS[f] = bwd


class Sort(enum.Enum):
    """What a call in Taichi code goes to; each source transform has one handler per sort."""

    METHOD = "a method of a local value (``v.dot(w)``): its rule is keyed by name"
    LOCAL = "a call of a local value that is no method: refused"
    UNKNOWN = "a name that resolves to nothing: refused"
    PARTIAL = "a functools.partial: expanded to a call of its function, then classified again"
    STATIC = "a builtin Taichi evaluates while it compiles (``len``, ``ti.static``): copied as written"
    CUSTOM = "a td.custom_jvp or td.custom_vjp function: its rules"
    FUNCTION = "a tidiff Function (``td.grad(E)``): called through its derived functions"
    CONSTANT = "an op with zero derivative (``ti.floor``, an integer cast): copied as written"
    OP = "a Taichi op with a derivative rule"
    FUNC = "a @ti.func or a Python helper: transformed in turn"
    REFUSED = "anything else: refused, with the reason"


@dataclass(frozen=True)
class Callee:
    """What :func:`classify` says of a call: its sort, what it calls, and for ``REFUSED`` why."""

    sort: Sort
    obj: Any = None
    reason: str = ""

    @property
    def jvp(self) -> Any:
        """The jvp rule of a ``CUSTOM`` callee, or None (a td.custom_vjp function without one)."""
        return CUSTOM_JVPS.get(self.obj) if hashable(self.obj) else None

    @property
    def bwd(self) -> Any:
        """The bwd rule of a ``CUSTOM`` callee, or None (a td.custom_jvp function)."""
        return CUSTOM_VJPS.get(self.obj) if hashable(self.obj) else None


def is_local(node: ast.expr, local: Container[str]) -> bool:
    """Whether an expression's root (``v`` of ``v.x[0]``) is a local value rather than a global name."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return not isinstance(node, ast.Name) or node.id in local


def classify(node: ast.Call, namespace: dict[str, Any], local: Container[str],
             local_value: Callable[[ast.expr], bool] | None = None) -> Callee:
    """What the call ``node`` goes to, in code whose globals are ``namespace`` and local names ``local``.

    ``local_value(func)`` says whether a callee expression is a value of the
    code rather than a global (default :func:`is_local`; a kernel's transform
    counts ``x[i]`` of a field ``x`` as a value, whose methods are ops). The
    one place that reads a callee: both source transforms and the shape of a
    call's results (``_adjoint/results.py``) ask it, and handle each
    :class:`Sort` in their own way.
    """
    func = node.func
    made = static_call(func, namespace, local)
    if made is not MISSING and callable_rule(made) is not None:  # td.grad(E)(x), made at the call site
        return Callee(Sort.FUNCTION, made)
    if is_local(func, local) if local_value is None else local_value(func):
        return Callee(Sort.METHOD if isinstance(func, ast.Attribute) else Sort.LOCAL)
    callee = resolve(func, namespace)
    if callee is MISSING:
        return Callee(Sort.UNKNOWN)
    return sort_of(callee)


def sort_of(callee: object) -> Callee:
    """What a call of the object ``callee`` goes to (:func:`classify` once the callee is resolved)."""
    if isinstance(callee, functools.partial):
        return Callee(Sort.PARTIAL, callee)
    if callee is ti.static or (hashable(callee) and callee in STATIC_BUILTINS):
        return Callee(Sort.STATIC, callee)
    if hashable(callee) and (callee in CUSTOM_JVPS or callee in CUSTOM_VJPS):
        return Callee(Sort.CUSTOM, callee)
    if callable_rule(callee) is not None:
        return Callee(Sort.FUNCTION, callee)
    rule = lookup(callee)
    if rule is not None and rule.jvp is zero:
        return Callee(Sort.CONSTANT, callee)
    if rule is not None:
        return Callee(Sort.OP, callee)
    if transformable(callee):  # NOTE: [Python helpers]
        return Callee(Sort.FUNC, callee)
    if (getattr(callee, "__module__", None) or "").startswith("taichi"):
        why = REFUSED.get(callee) if hashable(callee) else None
        return Callee(Sort.REFUSED, callee, "no derivative rule" if why is None else f"no derivative rule: {why}")
    return Callee(Sort.REFUSED, callee, refusal(callee) or "no derivative rule")
