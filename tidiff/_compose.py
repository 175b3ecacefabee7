"""``td.compose(g, f)``: the Function ``x -> g(*f(x))``, with its protocol from the two functions'.

A simulation and its loss are two Functions (``td.scan(step, T)`` and a
field program reading the final state); a gradient needs them as one. The
composition's protocol follows from theirs (chain rule):

- ``evaluate``: ``g(f(x))``;
- ``vjp``: ``f.vjp(x, g.vjp(f(x), c))``, ``f`` running once (``f.linearize``);
- ``tangent()``: the composition of the tangents, ``(x, dx) -> f.T -> (y, dy) -> g.T``,
  so every order follows as for any Function.

Each of ``g``'s inputs is one of ``f``'s outputs (``wiring``); ``td.compose``
wires them in order.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._arrays import Batch, is_tensor
from ._derived import SameArguments
from ._errors import describe_shape
from ._protocol import Function, as_function
from ._signature import ArgSpec
from ._tree import Tree


class Compose(Function):
    """``x -> g(y[wiring[0]], y[wiring[1]], ...)`` with ``y = f(x)`` (see the module docstring)."""

    def __init__(self, g: Function, f: Function, wiring: Sequence[int], name: str, *, listed: bool = True) -> None:
        super().__init__(name, listed=listed, arguments=SameArguments(f))
        self.g, self.f, self.wiring = g, f, tuple(wiring)

    def read(self, args: Sequence[Any], call: str | None = None) -> Batch:
        call = call or self.name
        return self.f.read(args, call).unbatched(call, "a composition")

    def _g_specs(self, in_specs: Sequence[ArgSpec]) -> list[ArgSpec]:
        ys = self.f.signature(in_specs)[0]
        return [ys[w] for w in self.wiring]

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        return self.g.signature(self._g_specs(in_specs))

    def _g_batch(self, batch: Batch, ys: Sequence[Any]) -> Batch:
        specs = self._g_specs(batch.specs)
        arrays = [ys[w] if is_tensor(ys[w]) else np.asarray(ys[w], s.dtype) for w, s in zip(self.wiring, specs,
                                                                                             strict=True)]
        return Batch(tuple(arrays), tuple(specs), (), batch.device)

    def evaluate(self, batch: Batch) -> list[Any]:
        return self.g.evaluate(self._g_batch(batch, self.f.evaluate(batch)))

    def vjp(self, batch: Batch, cotangents: Sequence[Any]) -> list[Any]:
        return self.linearize(batch)[1](cotangents)

    def linearize(self, batch: Batch) -> tuple[list[Any], Any]:
        """Both functions linearized once: the value and the pullback of ``value_and_grad`` share the runs."""
        ys, f_pullback = self.f.linearize(batch)
        zs, g_pullback = self.g.linearize(self._g_batch(batch, ys))

        def pullback(cotangents: Sequence[Any]) -> list[Any]:
            on_y: list[Any] = [None] * len(ys)
            for w, c in zip(self.wiring, g_pullback(cotangents), strict=True):
                if c is not None:
                    on_y[w] = c if on_y[w] is None else on_y[w] + c
            return f_pullback(on_y)

        return zs, pullback

    def tangent(self) -> Function:
        if "tangent" not in self.derived:
            specs = self.g.declared_specs()
            assert specs is not None
            m = len(self.f.signature(self.f.declared_specs() or [])[0])
            wiring = list(self.wiring) + [m + w for w, s in zip(self.wiring, specs, strict=True) if s.is_float]
            self.derived["tangent"] = Compose(self.g.tangent(), self.f.tangent(), wiring, f"jvp({self.name})",
                                              listed=False)
        return self.derived["tangent"]


def compose(g: Any, f: Any, name: str | None = None) -> Function:
    """The Function ``x -> g(*f(x))``: ``f``'s outputs, in order, are ``g``'s arguments.

    Args:
        g, f: ``td.Function``\\ s (or ``@ti.func``\\ s) with fixed shapes: ``g``
            takes as many arguments as ``f`` has outputs, each of that
            output's shape and kind of dtype. A loss of a simulation's final
            state is ``td.compose(loss, td.scan(step, T))``.
        name: the name ``td.cache_info()`` and error messages use.

    Returns:
        A ``td.Function`` with ``f``'s arguments and ``g``'s outputs; every
        transform takes it (its vjp is ``f``'s vjp of ``g``'s, its tangent
        the composition of their tangents). It takes no batch dims.

    Example:
        >>> @ti.func
        ... def step(x: ti.f64, v: ti.f64, k: ti.f64):
        ...     return x + 0.01 * v, v - 0.01 * k * x
        >>> @ti.func
        ... def energy(x: ti.f64, v: ti.f64) -> ti.f64:
        ...     return 0.5 * v * v + 2.0 * x * x
        >>> loss = td.compose(energy, td.scan(step, length=1000))    # (x0, v0, k) -> energy at T
        >>> np.round(td.grad(loss, argnums=2)(1.0, 0.0, 4.0), 4)    # by the stiffness k
        np.float64(0.9184)
    """
    gf, ff = as_function(g, "td.compose(g, f)"), as_function(f, "td.compose(g, f)")
    call = f"td.compose({gf.name}, {ff.name})"
    f_specs, g_specs = ff.declared_specs(), gf.declared_specs()
    if f_specs is None or g_specs is None:
        raise TypeError(f"{call}: both functions need shapes known without a call; give the @ti.func "
                        "annotations (or td.function(f, signature=...))")
    ys = ff.signature(list(f_specs))[0]
    if len(ys) != len(g_specs):
        raise ValueError(f"{call}: f has {len(ys)} outputs but g takes {len(g_specs)} arguments")
    for k, (y, s) in enumerate(zip(ys, g_specs, strict=True)):
        if y.shape != s.shape or y.is_float != s.is_float:
            raise ValueError(f"{call}: f's output {k} ({y.name!r}, {describe_shape(y.shape)} of {y.dtype}) is g's "
                             f"argument {k} ({s.name!r}), which expects {describe_shape(s.shape)} of {s.dtype}")
    return Compose(gf, ff, range(len(ys)), name or f"compose({gf.name}, {ff.name})")
