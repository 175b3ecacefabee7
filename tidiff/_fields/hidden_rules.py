"""Derivative rules Taichi's own reverse mode cannot see: refuse them by name instead of ignoring them.

NOTE: [Rules Taichi's reverse mode cannot see] A kernel tidiff's reverse
transform does not take (docs/limits.md) is reversed by Taichi's
``kernel.grad``, which differentiates the code as written. ``td.stop_gradient`` is the identity there, and a
``td.custom_jvp`` / ``td.custom_vjp`` function is its own body, so Taichi
would differentiate through the one and past the rule of the other: a wrong
gradient without an error (``10 * clip_gradient(x)`` would give 10, not 1;
``x * stop_gradient(x)`` 2x, not x). Taichi has no local stop-gradient op to
lower them to (``ti.stop_grad`` takes a field), and a rule nonlinear in its
cotangent cannot be expressed to a linear reverse pass at all. So reverse
mode of a program or kernel that reaches one is refused, naming the rule and
the function calling it; forward mode (tidiff's own tangent transform) takes
them, and so does a transform of the ``@ti.func`` called inside the kernel
(``td.grad(f)(...)`` in the kernel body), which is tidiff's own reverse mode.
``ti.atomic_max`` and ``ti.atomic_min`` are refused the same way: Taichi's
reverse mode gives every entry the gradient that belongs to the winner
(tidiff's adjoint kernels give it to the winner: NOTE: [Atomic extremes in
reverse]; so only kernels Taichi reverses are refused). The error says why
tidiff's transform does not take each such kernel: that is what to rewrite.

An object carries the rule it stands for in ``RULE_ATTRIBUTE`` (a short
description: ``"td.stop_gradient"``, ``"the td.custom_vjp function `clip`"``);
a transform of a ``@ti.func`` called in a kernel (``td.grad(E)``) is followed
to that func through its ``parent`` chain, since Taichi's reverse mode over
the generated derivative code would differentiate through its rules too.
"""
from __future__ import annotations

import ast
import types
from typing import Any

import taichi as ti

from .._errors import TransformError
from .._lang.atomic_results import used_atomic_result
from .._lang.parse import parse, resolve
from .._rules.helpers import RULE_ATTRIBUTE
from .graph import CodeGraph, code_names, python_function, slots

#: Ops whose derivative goes to the winning entry, which Taichi's reverse mode gives to every entry instead
#: (``ti.atomic_max(y[None], x[i])``: ``x.grad`` 1 everywhere, no error): refused as rules are.
_WINNER_OPS = {id(op): f"the derivative of `ti.{op.__name__}` (to the winning entry only)"
               for op in (ti.atomic_max, ti.atomic_min)}
_ORDERED = "the value an atomic returns (NOTE: [Atomic results])"
_RECOMPUTED = {"`ti.random`", "`ti.randn`", _ORDERED}
_WINNER_OPS.update({id(ti.random): "`ti.random`", id(ti.randn): "`ti.randn`"})  # NOTE: [Random numbers in reverse]


def refuse_recomputed(rules: list[tuple[str, str]], what: str) -> None:
    """Raise ``td.TransformError`` where ``rules`` hold ``ti.random``, ``ti.randn`` (NOTE: [Random numbers in
    reverse]) or an atomic's result (NOTE: [Atomic results]): a reverse pass, computing the kernel's values again,
    would get other ones, and so would the forward pushes standing in for it, one run per input entry."""
    redone = [(rule, caller) for rule, caller in rules if rule in _RECOMPUTED]
    if not redone:
        return
    rule, caller = redone[0]
    why = ("the entry's old value, which depends on the order the iterations ran in" if rule == _ORDERED
           else "drawing other numbers than the run it differentiates")
    raise TransformError(
        f"{what} in reverse mode: it uses {rule} (in `{caller}`), and a reverse pass computes the kernel's values "
        f"again: {why} (as would one forward push per input entry)",
        hint="pass such values in as an array (an input of the function, or a constant)" + (
            "" if rule == _ORDERED else ", or take a single td.jvp, which runs the kernel once"))


def rules_reached(graph: CodeGraph) -> list[tuple[str, str]]:
    """``(rule, caller)`` for every derivative rule reachable in ``graph`` (see the NOTE above), and in the
    functions of the tidiff transforms it calls; ``caller`` names the function whose code calls the rule."""
    found: dict[tuple[str, str], None] = {}
    seen: set[int] = set()
    graphs = [graph]
    while graphs:
        pending = []
        for obj in graphs.pop().nodes.values():
            fn = python_function(obj)
            if fn is None or id(fn) in seen:
                continue
            seen.add(id(fn))
            if _used_atomic_result(fn) is not None:
                found.setdefault((_ORDERED, fn.__name__), None)
            for value in _called(fn):
                rule = _WINNER_OPS.get(id(value)) or getattr(value, RULE_ATTRIBUTE, None)
                if isinstance(rule, str):
                    found.setdefault((rule, fn.__name__), None)
                    continue
                body = _transformed_func(value)
                if body is not None:
                    pending.append(body)
        if pending:
            graphs.append(CodeGraph(*pending))
    return list(found)


def _used_atomic_result(fn: types.FunctionType) -> ast.Call | None:
    """The first atomic call of ``fn`` whose result its code uses (NOTE: [Atomic results]), or None."""
    try:
        parsed = parse(fn)
    except Exception:  # noqa: BLE001 -- code tidiff cannot read uses no atomic it could see
        return None
    return used_atomic_result(parsed.tree, lambda node: resolve(node, parsed.namespace))


def _called(fn: types.FunctionType) -> list[Any]:
    """What ``fn``'s names may refer to: its globals, cells and defaults, and attributes of modules among them
    (``td.stop_gradient``)."""
    values = [value for _, value in slots(fn)]
    names = code_names(fn.__code__)
    for value in list(values):
        if isinstance(value, types.ModuleType):
            values.extend(getattr(value, name) for name in names if name in vars(value))
    return values


def _transformed_func(value: Any) -> Any:
    """The ``@ti.func`` a tidiff function made from one (``td.grad(E)``, ``td.function(E)``) runs; else None."""
    for _ in range(64):  # a parent chain, never a cycle; bounded all the same
        if value is None or not type(value).__module__.startswith("tidiff."):
            return None
        if getattr(value, "tifunc", None) is not None:
            return value.tifunc
        value = getattr(value, "parent", None)
    return None


def describe(rules: list[tuple[str, str]]) -> str | None:
    """Why Taichi's reverse mode is refused for code reaching ``rules`` (None for none)."""
    if not rules:
        return None
    return f"Taichi's reverse mode cannot apply {_listed(rules)} (NOTE: [Rules Taichi's reverse mode cannot see])"


def _listed(rules: list[tuple[str, str]]) -> str:
    return "; ".join(f"{rule} (called in `{caller}`)" for rule, caller in rules)


def refuse_hidden_rules(rules: list[tuple[str, str]], what: str, refused: list[str] | None = None) -> None:
    """Raise ``td.TransformError`` for reverse mode of ``what`` (a program or kernel) when it reaches rules through
    kernels tidiff's reverse transform does not take (``refused``: each such kernel, and why)."""
    if not rules:
        return
    refuse_recomputed(rules, what)
    why = f"tidiff's reverse transform does not take {'; '.join(refused)}, and " if refused else ""
    raise TransformError(
        f"{what} in reverse mode: it reaches {_listed(rules)}; {why}Taichi's own reverse mode (kernel.grad), "
        "which would run instead, differentiates the code as written and cannot apply these rules",
        hint="write the kernel in a form tidiff's transform takes (docs/limits.md says what it does not take yet), "
             "use forward mode (td.jvp, td.jacfwd) where it takes the code, which applies td.stop_gradient and jvp "
             "rules (a td.custom_vjp function needs one too, defjvp), or call a transform of the @ti.func inside "
             "the kernel (td.grad(f)(...) in the kernel body), tidiff's own reverse mode",
    )
