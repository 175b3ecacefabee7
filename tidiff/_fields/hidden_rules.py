"""Reverse mode of code holding a kernel tidiff's transform does not take: refused, naming the kernel and why.

NOTE: [Taichi's reverse mode not run] tidiff reverses every kernel of a
field program or ndarray function by its own transform (NOTE: [Reverse of a
kernel]). A kernel the transform does not take (docs/limits.md) was once
reversed by Taichi's ``kernel.grad`` and checked against forward mode on its
first call. Taichi's reverse mode is wrong without a word for constructs its
users write (tests/test_taichi_pitfalls.py), has no rule for others and
depends on an autodiff stack size, and a check at two points finds a
miscompile but not a value wrong only elsewhere. So it is no longer run:
reverse mode of such code (``td.vjp``, a torch backward) is a
``td.TransformError`` naming each kernel, the construct and its line, before
any adjoint runs; ``reverse_refused`` says so, so that ``td.grad`` and the
Jacobians choose forward mode, tidiff's own tangent transform, which takes
such kernels (``td.jvp``, ``td.jacfwd``). A second-order product whose
tangent program holds a kernel the transform does not take pushes that
program forward, one tangent run per input component. A kernel generic over
``ti.template()`` fields launched on integer fields too (``clear(count)``
beside ``clear(y)``) gets an adjoint of tidiff's per pattern, those
parameters taken as integer fields are (``vjp_kernel``'s ``constants``):
Taichi reversed such launches before. Taichi's reverse mode
stays a cross-check in tests, where it is right (tests/taped.py,
the conformance net). Where such kernels reach a rule, the error names it:
Taichi's reverse mode differentiates code as written, so ``td.stop_gradient``
would be the identity there, a ``td.custom_jvp`` / ``td.custom_vjp`` function
its own body (``10 * clip_gradient(x)`` would give 10, not 1), and
``ti.atomic_max`` would give every entry the winner's gradient (NOTE: [Atomic
extremes in reverse]). At the change, in the whole test suite one kernel
reached ``kernel.grad`` for a number (a parallel loop chaining its
iterations through one entry: a race, which Taichi got wrong and forward
pushes replaced); in the conformance net's kernel programs, none.

An object carries the rule it stands for in ``RULE_ATTRIBUTE`` (a short
description: ``"td.stop_gradient"``, ``"the td.custom_vjp function `clip`"``);
a transform of a ``@ti.func`` called in a kernel (``td.grad(E)``) is followed
to that func through its ``parent`` chain.
"""
from __future__ import annotations

import ast
import types
from typing import Any

import taichi as ti

from .._adjoint.transform import NotReversible
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


def refusal_of(kernel: str, reason: NotReversible) -> str:
    """One entry of a refusal: the kernel's name and why the transform does not take it, and where."""
    return f"`{kernel}` ({reason.described()})"


def describe(refused: list[str]) -> str | None:
    """Why reverse mode is refused for code holding the kernels ``refused`` names (None for none)."""
    if not refused:
        return None
    return (f"tidiff's reverse transform does not take {'; '.join(refused)} (NOTE: [Taichi's reverse mode not "
            "run])")


def reverse_refused_error(what: str, refused: list[str], rules: list[tuple[str, str]]) -> TransformError:
    """The ``td.TransformError`` of reverse mode of ``what`` (a program or kernel) holding kernels tidiff's transform
    does not take (``refused``: each, and why), naming the rules they reach (NOTE: [Taichi's reverse mode not
    run]); raised at once where they draw random numbers or use an atomic's result (:func:`refuse_recomputed`)."""
    refuse_recomputed(rules, what)
    reached = f"; they reach {_listed(rules)}, which Taichi's reverse mode could not apply" if rules else ""
    return TransformError(
        f"{what} in reverse mode: tidiff's reverse transform does not take {'; '.join(refused)}{reached}, and "
        "Taichi's own reverse mode (kernel.grad) does not run in its place (NOTE: [Taichi's reverse mode not run])",
        hint="write the kernel in a form tidiff's transform takes (docs/limits.md says what it does not take yet), "
             "use forward mode (td.jvp, td.jacfwd; td.jacobian and td.hessian choose it), or call a transform of "
             "the @ti.func inside the kernel (td.grad(f)(...) in the kernel body)",
    )


def _listed(rules: list[tuple[str, str]]) -> str:
    return "; ".join(f"{rule} (called in `{caller}`)" for rule, caller in rules)
