"""Calls of tidiff Functions inside ``@ti.func`` code that tidiff differentiates again.

A ``@ti.func`` may call a transform: ``td.grad(E)(x, 2.0).norm_sqr()``, or a
name bound to one. The source transforms (``_tangent``, ``_adjoint``) resolve
such a callee while they run and call through it: the generated code calls a
:class:`TangentCall` (or :class:`ReverseCall`) object, which Taichi calls while
it compiles, with the arguments' Taichi values; it then picks the callee's
tangent (or cotangent-map) body for those values and inlines it. So
transforms compose through user code to any order, as in JAX.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import taichi as ti

from ._composed import cotangent_map_of
from ._protocol import Function, taichi_callable
from ._tangent.rules import CALLABLE_TYPES
from ._tree import unflatten


def _zero_of(value: Any) -> Any:
    """A zero of a Taichi value's type (a tangent that is not given)."""
    return ti.zero(value) if hasattr(value, "ptr") else 0.0


def _body(fn: Function, args: Sequence[Any], what: str) -> Any:
    body = fn.body_for(fn.specs_for(args))
    if body is None:
        raise TypeError(f"{fn.name} cannot be called inside a @ti.func that is differentiated: it has no "
                        f"@ti.func body ({what})")
    return body


class TangentCall:
    """``(primals..., tangents of the active ones, lane by lane) -> (out, dout_0, ...)`` for a Function callee."""

    _tidiff_lane_cost = 64  # unknown until Taichi compiles it: a moderate guess keeps widening in bounds

    def __init__(self, fn: Function, active: tuple[bool, ...], width: int) -> None:
        self.fn, self.active, self.width = fn, active, width
        taichi_callable(self)

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        n = len(self.active)
        primals, rest = list(args[:n]), list(args[n:])
        specs = self.fn.specs_for(primals)
        _, tree = self.fn.signature(specs)
        per_lane = sum(self.active)
        tangent = self.fn.tangent()
        out, douts = None, []
        for lane in range(self.width):
            given = iter(rest[lane * per_lane:(lane + 1) * per_lane])
            ts = []
            for k, s in enumerate(specs):
                t = next(given) if self.active[k] else None
                if s.is_float:
                    ts.append(_zero_of(primals[k]) if t is None else t)
            flat = list(_body(tangent, primals + ts, "its tangent")(*primals, *ts))
            m = len(flat) // 2
            out = unflatten(tree, flat[:m])
            douts.append(unflatten(tree, flat[m:]))
        return (out, *douts)


class ReverseCall:
    """``(primals..., one cotangent per output) -> (out, cotangent of each active primal...)`` for a Function callee."""

    def __init__(self, fn: Function, active: tuple[bool, ...], n_outputs: int) -> None:
        self.fn, self.active, self.n_outputs = fn, active, n_outputs
        taichi_callable(self)

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        n = len(self.active)
        primals, cotangents = list(args[:n]), list(args[n:])
        specs = self.fn.specs_for(primals)
        _, tree = self.fn.signature(specs)
        V = cotangent_map_of(self.fn)
        grads = list(_body(V, primals + cotangents, "its cotangent map")(*primals, *cotangents))
        flat = _body(self.fn, primals, "itself")(*primals)
        value = unflatten(tree, list(flat) if isinstance(tree, tuple) else [flat])
        rank = iter(grads)
        by_argument = [next(rank) if s.is_float else None for s in specs]
        return (value, *[g for g, a in zip(by_argument, self.active, strict=True) if a])


class _FunctionCalls:
    """How the source transforms call through a tidiff Function (``CALLABLE_TYPES``)."""

    @staticmethod
    def tangent(fn: Function, active: tuple[bool, ...], width: int) -> TangentCall:
        key = ("tangent call", active, width)
        if key not in fn.derived:
            fn.derived[key] = TangentCall(fn, active, width)  # type: ignore[assignment]
        return fn.derived[key]  # type: ignore[return-value]

    @staticmethod
    def reverse(fn: Function, active: tuple[bool, ...], n_outputs: int) -> ReverseCall:
        key = ("reverse call", active, n_outputs)
        if key not in fn.derived:
            fn.derived[key] = ReverseCall(fn, active, n_outputs)  # type: ignore[assignment]
        return fn.derived[key]  # type: ignore[return-value]

    @staticmethod
    def outputs(fn: Function) -> int:
        """How many values a call returns (the top level of its output tree), where its specs are declared."""
        specs = fn.declared_specs()
        if specs is None:
            return 1
        _, tree = fn.signature(specs)
        return len(tree) if isinstance(tree, tuple) else 1


CALLABLE_TYPES[Function] = _FunctionCalls
