"""What forward mode cannot take, told without transforming (as google/tangent's ``fence.py``).

NOTE: [Modes chosen without transforming] Forward mode refuses one thing the
reverse transform takes: a ``td.custom_vjp`` function without a jvp rule (as
in JAX). Mode choice asked for it by generating the tangent function and
catching the refusal, so a first ``td.grad(f)(x)`` generated an ``f_jvp`` it
never used (628 of its 1,355 calls into tidiff). A function whose code, and
the code of every ``@ti.func`` and helper it calls, calls no such function is
never refused: :func:`may_refuse` says so by reading the calls
(``_rules/calls.classify``), and only a function that reaches one is
transformed to see whether an active call does. Reverse functions, and the
tangent functions made from them, go through such calls' code (NOTE:
[Forward mode of a gradient's code] in ``emit.py``): never refused.
"""
import ast
from typing import Any

from .._lang.activity import local_names
from .._lang.compile import info
from .._lang.generate import owned_cache
from .._lang.parse import parse
from .._rules.calls import CUSTOM_JVPS, Sort, classify, sort_of


def may_refuse(f: Any) -> bool:
    """Whether forward mode of ``f`` may meet a ``td.custom_vjp`` function without a jvp rule: ``f``, or a
    ``@ti.func`` or helper it calls (to any depth), calls one, whichever arguments are active. Code this
    cannot read (a ``@ti.real_func``, a source that does not parse) may: the transform then says why."""
    if info(f).reverse:
        return False
    customs = _custom_callees(f, set())
    return customs is None or any(custom not in CUSTOM_JVPS for custom in customs)


def _custom_callees(f: Any, seen: set[int]) -> list[Any] | None:
    """The custom-rule functions ``f``'s code calls, directly or through the functions it transforms in turn;
    None where some code cannot be read."""
    if id(f) in seen:
        return []
    seen.add(id(f))
    cache = owned_cache(f, "_tidiff_fence")  # a function's calls are read once
    if "calls" not in cache:
        cache["calls"] = _calls(f)
    if cache["calls"] is None:
        return None
    customs, funcs = cache["calls"]
    found = list(customs)
    for callee in funcs:
        more = _custom_callees(callee, seen)
        if more is None:
            return None
        found += more
    return found


def _calls(f: Any) -> tuple[list[Any], list[Any]] | None:
    """``(custom-rule callees, @ti.func and helper callees)`` of the calls in ``f``'s own code, or None when
    it cannot be read."""
    try:
        parsed = parse(f)
    except (TypeError, OSError, SyntaxError):
        return None
    local = local_names(parsed.tree)
    customs, funcs = [], []
    for node in ast.walk(parsed.tree):
        if isinstance(node, ast.Call):
            callee = classify(node, parsed.namespace, local)
            if callee.sort is Sort.PARTIAL:  # p(x) calls the partial's function
                callee = sort_of(callee.obj.func)
            if callee.sort is Sort.CUSTOM:
                customs.append(callee.obj)
            elif callee.sort is Sort.FUNC:
                funcs.append(callee.obj)
    return customs, funcs
