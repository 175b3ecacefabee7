"""What a call goes to beyond the op table: user rules (``td.custom_jvp``, ``td.custom_vjp``) and tidiff
Functions called inside Taichi code, each in a registry filled by the module that defines them."""
import weakref
from typing import Any

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
