"""The nesting of what a call returns, read from the code: the index paths of its leaves.

NOTE: [Nested results] The reverse transform gives every leaf of a call's
results a name of its own and a cotangent of its own; the callee's reverse
function takes one cotangent per leaf (its ``return`` is flattened alike).
Generated tangent code returns nested tuples (``(out, dout)`` of a function
with several outputs, ``((J...), (dJ...))`` of a Jacobian's tangent) and
unpacks them (``t, dt = f_jvp_jvp(...)``, then ``t[1]``), so the nesting is
followed through the callee's code: a ``return`` of names bound to tuples
(by a call, a tuple literal or an unpacking) has the nesting of those values,
found the same way in the callee's callees. A name bound anywhere else (in a
branch or a loop) counts as one value. The reverse function of a function
returning several values returns them as one tuple before the cotangents:
``((a, b), ct_x, ...)``; reversing code that calls such a reverse function (a
third reverse transform through a custom_vjp rule, whose reverse returns the
rule's results so) binds each leaf to a name (``r_0_0 = r[0][0]``), and the
callee's reverse takes one cotangent per leaf.
"""
from __future__ import annotations

import ast
from collections.abc import Container
from typing import Any, TypeAlias

from .._lang.parse import Parsed, parse
from .._rules.calls import Sort, callable_rule, classify
from .._rules.table import lookup

Path = tuple[int, ...]
Shape: TypeAlias = "tuple[Shape, ...] | None"
"""None for one value, else a tuple of the shapes of the elements."""


def paths(shape: Shape) -> list[Path]:
    """Index paths of the leaves: ``[()]`` for one value, ``[(0, 0), (0, 1), (1,)]`` for ``((a, b), c)``."""
    if shape is None:
        return [()]
    return [(k,) + p for k, s in enumerate(shape) for p in paths(s)]


def _flat(count: int) -> Shape:
    return None if count == 1 else (None,) * count


def call_shape(node: ast.Call, parsed: Parsed, local: Container[str]) -> Shape:
    """The nesting of what the call ``node`` (in code parsed as ``parsed``, with these local names) returns."""
    callee = classify(node, parsed.namespace, local)
    if callee.sort in (Sort.FUNCTION, Sort.CUSTOM):  # td.grad(E)(x), a custom function: as many as it says
        rule = callable_rule(callee.obj)
        told = rule.shape(callee.obj, node.args, lambda f: call_shape(ast.Call(f, [], []), parsed, local)) \
            if hasattr(rule, "shape") else None  # td.jvp(F, ...): F's results and their tangents
        return told if told is not None else _flat(rule.outputs(callee.obj))
    if callee.sort is Sort.OP:
        rule = lookup(callee.obj)
        return _flat(rule.n_outputs) if rule is not None and rule.n_outputs > 1 else None  # U, S, V = ti.svd(A)
    return function_shape(callee.obj) if callee.sort is Sort.FUNC else None


def function_shape(callee: Any) -> Shape:
    """The nesting of what a ``@ti.func`` (or helper) returns, from its final ``return``."""
    parsed = parse(callee)
    body = parsed.tree.body
    if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
        return None
    env: dict[str, Shape] = {}
    params = {a.arg for a in parsed.tree.args.args}
    for stmt in body[:-1]:
        bound = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for name in bound:
            env[name] = None  # bound in a branch or a loop, or as an entry: one value
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], _expr_shape(stmt.value, env, parsed, params)
            if isinstance(target, ast.Name):
                env[target.id] = value
            elif isinstance(target, ast.Tuple) and isinstance(value, tuple) and len(value) == len(target.elts):
                for element, shape in zip(target.elts, value, strict=True):
                    if isinstance(element, ast.Name):
                        env[element.id] = shape
    return _expr_shape(body[-1].value, env, parsed, params)


def _expr_shape(node: ast.expr, env: dict[str, Shape], parsed: Parsed, params: set[str]) -> Shape:
    if isinstance(node, ast.Tuple):
        return tuple(_expr_shape(e, env, parsed, params) for e in node.elts)
    if isinstance(node, ast.Name):
        return env.get(node.id)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
            and isinstance(node.slice.value, int):
        whole = _expr_shape(node.value, env, parsed, params)
        if isinstance(whole, tuple) and 0 <= node.slice.value < len(whole):
            return whole[node.slice.value]
        return None
    if isinstance(node, ast.Call):
        return call_shape(node, parsed, set(env) | params)
    return None
