"""Calls of tidiff Functions inside ``@ti.func`` code that tidiff differentiates again.

A ``@ti.func`` may call a transform: ``td.grad(E)(x, 2.0).norm_sqr()``, a name
bound to one, ``td.jvp(E, (x, s), (t, 0.0))`` or ``td.hvp(E, ...)``. The source transforms
(``_tangent``, ``_adjoint``) resolve such a callee while they run and call
through it (``CALLABLE_TYPES``, ``CALLABLE_OBJECTS`` in ``_rules/calls.py``).

NOTE: [Calls through Functions] Every such callee is a :class:`Call`: it
evaluates a Function ``G`` (``function``) at its arguments laid out for ``G``
(``expand``: each of ``G``'s arguments with where it comes from, one of the
call's own arguments or a constant zero) and shapes ``G``'s flat outputs as
the call returns them (``pack``). A Function called by name is the
identity call. The tangent of a call is a call of ``G.tangent()``
(:class:`TangentOf`), its reverse a call of ``G``'s value and cotangent map
(:class:`ReverseOf`); both are calls again, so a function calling
``td.grad(E)`` is differentiated to any order. The generated code calls
these objects, which Taichi calls while it compiles, with the Taichi
values; they pick the bodies for those values and inline them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import taichi as ti

from . import _api
from ._adjoint.transform import NotReversible
from ._lang.compile import Generated
from ._pointwise import value_and_cotangents
from ._protocol import Function, as_function, taichi_callable
from ._rules.calls import CALLABLE_OBJECTS, CALLABLE_TYPES
from ._tree import Tree, flatten_like, unflatten

Source = int | tuple[int, int] | None
"""Where one of ``G``'s arguments comes from: argument ``k`` of the call, entry ``j`` of its tuple
argument ``k``, or nowhere (a constant zero)."""


@dataclass(frozen=True)
class Piece:
    value: Any
    source: Source


def _zero_of(value: Any) -> Any:
    """A zero of a Taichi value's type (a tangent or cotangent that is not given)."""
    return ti.zero(value) if hasattr(value, "ptr") else 0.0


def _flat(value: Any, tree: Tree) -> list[Any]:
    """The leaves of ``value``, structured as ``tree``, in order."""
    return list(flatten_like(tree, value, "a transform called in Taichi code", "its value"))


def _body(fn: Function, args: Sequence[Any]) -> Any:
    body = fn.body_for(fn.specs_for(args))
    if body is None:
        raise TypeError(f"{fn.name} cannot be called inside a @ti.func that is differentiated: it has no @ti.func body")
    return body


def _pick(args: Sequence[Any], source: Source) -> Any:
    if isinstance(source, tuple):
        return args[source[0]][source[1]]
    assert source is not None
    return args[source]


class Call:
    """An object generated code calls: a Function ``G`` at rearranged arguments (NOTE: [Calls through Functions])."""

    _tidiff = Generated(lane_cost=64)  # unknown until Taichi compiles it: a moderate guess keeps widening in bounds

    def __init__(self) -> None:
        taichi_callable(self)
        self.derived: dict[Any, Call] = {}

    def function(self, args: Sequence[Any]) -> Function:
        raise NotImplementedError

    def expand(self, args: Sequence[Any]) -> list[Piece]:
        raise NotImplementedError

    def pack(self, flat: Sequence[Any], args: Sequence[Any]) -> Any:
        raise NotImplementedError

    def unpack(self, value: Any, args: Sequence[Any]) -> list[Any]:
        """The flat outputs of ``G`` a value shaped like the call's result stands for (for cotangents)."""
        raise NotImplementedError

    def leaf_of(self, args: Sequence[Any]) -> list[int | None] | None:
        """For each flat output of ``G`` that :meth:`unpack` gives, the leaf of the call's result it comes from
        (None: a constant zero); None where they are the leaves in order."""
        return None

    def tree(self, args: Sequence[Any]) -> Tree:
        G = self.function(args)
        values = [p.value for p in self.expand(args)]
        return G.signature(G.specs_for(values))[1]

    def __call__(self, *args: Any) -> Any:
        G = self.function(args)
        values = [p.value for p in self.expand(args)]
        return self.pack(list(_as_flat(_body(G, values)(*values), self.tree(args))), args)

    def tangent(self, active: tuple[bool, ...]) -> TangentOf:
        key = ("tangent", active)
        if key not in self.derived:
            self.derived[key] = TangentOf(self, active)
        return self.derived[key]  # type: ignore[return-value]

    def reverse(self, active: tuple[bool, ...], n_outputs: int) -> ReverseOf:
        key = ("reverse", active, n_outputs)
        if key not in self.derived:
            self.derived[key] = ReverseOf(self, active, n_outputs)
        return self.derived[key]  # type: ignore[return-value]


def _as_flat(result: Any, tree: Tree) -> list[Any]:
    """A body's result as the flat list of outputs (a single output comes back bare)."""
    return list(result) if isinstance(tree, tuple) else [result]


class IdentityCall(Call):
    """A Function called by name: ``F(args)``."""

    def __init__(self, fn: Function) -> None:
        super().__init__()
        self.fn = fn

    def function(self, args: Sequence[Any]) -> Function:
        return self.fn

    def expand(self, args: Sequence[Any]) -> list[Piece]:
        return [Piece(a, k) for k, a in enumerate(args)]

    def pack(self, flat: Sequence[Any], args: Sequence[Any]) -> Any:
        return unflatten(self.tree(args), list(flat))

    def unpack(self, value: Any, args: Sequence[Any]) -> list[Any]:
        return _flat(value, self.tree(args))


class TangentOf(Call):
    """The tangent of a call along one direction: ``(args..., tangents of the active ones) -> (out, dout)``.

    NOTE: [Tangent calls lane by lane] A widened tangent function (vector mode,
    NOTE: [Vector-mode pushes]) calls this once per lane, each call a single
    direction: a call is then a call again, differentiated to any order, where
    one call carrying every lane would have to be a Function of its own. Its cost
    is the same: ``G``'s tangent body recomputes the primal in every lane either way.
    """

    def __init__(self, call: Call, active: tuple[bool, ...]) -> None:
        super().__init__()
        self.call, self.active = call, active

    def _primals(self, args: Sequence[Any]) -> list[Any]:
        """The call's own arguments, before the tangents of the active ones."""
        return list(args[: len(self.active)])

    def function(self, args: Sequence[Any]) -> Function:
        return self.call.function(self._primals(args)).tangent()

    def _tangent_pieces(self, pieces: list[Piece], G: Function) -> list[Piece]:
        """The tangent of each float argument of ``G``: the given one where its source is active, else zero."""
        n = len(self.active)
        rank = {k: r for r, k in enumerate(i for i, a in enumerate(self.active) if a)}
        specs = G.specs_for([p.value for p in pieces])
        out = []
        for p, s in zip(pieces, specs, strict=True):
            if not s.is_float:
                continue
            k = p.source[0] if isinstance(p.source, tuple) else p.source
            if k is None or not self.active[k]:
                out.append(Piece(_zero_of(p.value), None))
                continue
            position = n + rank[k]
            out.append(Piece(None, (position, p.source[1]) if isinstance(p.source, tuple) else position))
        return out

    def expand(self, args: Sequence[Any]) -> list[Piece]:
        primal = self._primals(args)
        pieces = self.call.expand(primal)
        tangents = self._tangent_pieces(pieces, self.call.function(primal))
        return pieces + [Piece(_pick(args, t.source) if t.source is not None else t.value, t.source) for t in tangents]

    def pack(self, flat: Sequence[Any], args: Sequence[Any]) -> Any:
        primal = self._primals(args)
        m = len(flat) // 2
        return self.call.pack(flat[:m], primal), self.call.pack(flat[m:], primal)

    def unpack(self, value: Any, args: Sequence[Any]) -> list[Any]:
        primal = self._primals(args)
        return self.call.unpack(value[0], primal) + self.call.unpack(value[1], primal)

    def __call__(self, *args: Any) -> Any:
        values = [p.value for p in self.expand(args)]
        flat = list(_body(self.function(args), values)(*values))  # (y..., dy...)
        return self.pack(flat, args)


class ReverseOf(Call):
    """The reverse of a call: ``(args..., one cotangent per output) -> (out, cotangent of each active argument...)``."""

    def __init__(self, call: Call, active: tuple[bool, ...], n_outputs: int) -> None:
        super().__init__()
        self.call, self.active, self.n_outputs = call, active, n_outputs

    def _split(self, args: Sequence[Any]) -> tuple[list[Any], Any]:
        n = len(self.active)
        cts = list(args[n:])
        return list(args[:n]), cts[0] if self.n_outputs == 1 else tuple(cts)

    def function(self, args: Sequence[Any]) -> Function:
        return value_and_cotangents(self.call.function(args[: len(self.active)]))

    def expand(self, args: Sequence[Any]) -> list[Piece]:
        primal, cts = self._split(args)
        n = len(self.active)
        pieces = self.call.expand(primal)
        flat_cts = self.call.unpack(cts, primal)
        leaves = self.call.leaf_of(primal) or list(range(len(flat_cts)))
        if self.n_outputs == 1:
            return pieces + [Piece(c, None if leaf is None else n) for c, leaf in zip(flat_cts, leaves, strict=True)]
        return pieces + [Piece(c, None if leaf is None else n + leaf)  # one cotangent per output leaf
                         for c, leaf in zip(flat_cts, leaves, strict=True)]

    def pack(self, flat: Sequence[Any], args: Sequence[Any]) -> Any:
        primal, _ = self._split(args)
        G = self.call.function(primal)
        pieces = self.call.expand(primal)
        outs, _ = G.signature(G.specs_for([p.value for p in pieces]))
        value = self.call.pack(flat[: len(outs)], primal)
        grads = iter(flat[len(outs):])
        by_source: dict[Source, Any] = {}
        for p, s in zip(pieces, G.specs_for([p.value for p in pieces]), strict=True):
            if s.is_float:
                g = next(grads)
                if p.source is not None:
                    if isinstance(p.source, tuple):
                        raise NotReversible("a call with tuple arguments")
                    by_source[p.source] = g
        return (value, *[by_source.get(k, _zero_of(a)) for k, (a, on) in enumerate(zip(primal, self.active,
                                                                                      strict=True)) if on])

    def unpack(self, value: Any, args: Sequence[Any]) -> list[Any]:
        raise NotReversible("the reverse of a reverse call inside generated code")


class FlatCall(Call):
    """A call with tuple arguments (``td.jvp(F, (x, s), (t, 0.0))``) taking their entries one by one instead:
    ``(F, x, s, t, 0.0)``. The reverse transform calls this, so that each cotangent of its reverse (``ReverseOf``)
    goes to one argument of the call. ``sizes`` gives each argument's tuple length (None: not a tuple)."""

    def __init__(self, call: Call, sizes: tuple[int | None, ...]) -> None:
        super().__init__()
        self.call, self.sizes = call, sizes
        self.starts = [sum(1 if n is None else n for n in sizes[:k]) for k in range(len(sizes))]

    def nested(self, args: Sequence[Any]) -> list[Any]:
        """The call's own arguments, tuples rebuilt, from the flat ones."""
        return [args[at] if n is None else tuple(args[at:at + n]) for at, n in zip(self.starts, self.sizes,
                                                                                   strict=True)]

    def _flat_source(self, source: Source) -> Source:
        if source is None:
            return None
        if isinstance(source, tuple):
            return self.starts[source[0]] + source[1]
        return self.starts[source]

    def function(self, args: Sequence[Any]) -> Function:
        return self.call.function(self.nested(args))

    def expand(self, args: Sequence[Any]) -> list[Piece]:
        return [Piece(p.value, self._flat_source(p.source)) for p in self.call.expand(self.nested(args))]

    def pack(self, flat: Sequence[Any], args: Sequence[Any]) -> Any:
        return self.call.pack(flat, self.nested(args))

    def leaf_of(self, args: Sequence[Any]) -> list[int | None] | None:
        return self.call.leaf_of(self.nested(args))

    def unpack(self, value: Any, args: Sequence[Any]) -> list[Any]:
        """As the call's, from its value nested as the call returns it or from the flat tuple of its leaves (the
        reverse transform gives one cotangent per leaf: NOTE: [Nested results])."""
        nested = self.nested(args)
        G = self.call.function(nested)
        outs, _ = G.signature(G.specs_for([p.value for p in self.call.expand(nested)]))
        structure = self.call.pack(list(range(len(outs))), nested)
        return self.call.unpack(_refilled(structure, iter(_leaves(value))), nested)


def _leaves(value: Any) -> list[Any]:
    return [leaf for v in value for leaf in _leaves(v)] if isinstance(value, tuple) else [value]


def _refilled(structure: Any, leaves: Any) -> Any:
    """``structure``'s nesting of tuples, its leaves taken from ``leaves`` in order."""
    if isinstance(structure, tuple):
        return tuple(_refilled(s, leaves) for s in structure)
    return next(leaves)


class JvpCall(Call):
    """A call ``td.jvp(F, primals, tangents)``: the Function ``F.tangent()`` at ``(primals, float tangents)``."""

    def function(self, args: Sequence[Any]) -> Function:
        return as_function(args[0], "td.jvp").tangent()

    def expand(self, args: Sequence[Any]) -> list[Piece]:
        fn = as_function(args[0], "td.jvp")
        primals, tangents = list(args[1]), list(args[2])
        specs = fn.specs_for(primals)
        return ([Piece(p, (1, i)) for i, p in enumerate(primals)]
                + [Piece(tangents[i], (2, i)) for i, s in enumerate(specs) if s.is_float])

    def _tree(self, args: Sequence[Any]) -> Tree:
        fn = as_function(args[0], "td.jvp")
        return fn.signature(fn.specs_for(list(args[1])))[1]

    def pack(self, flat: Sequence[Any], args: Sequence[Any]) -> Any:
        m = len(flat) // 2
        tree = self._tree(args)
        return unflatten(tree, list(flat[:m])), unflatten(tree, list(flat[m:]))

    def unpack(self, value: Any, args: Sequence[Any]) -> list[Any]:
        tree = self._tree(args)
        return _flat(value[0], tree) + _flat(value[1], tree)

    def reverse(self, active: tuple[bool, ...], n_outputs: int) -> ReverseOf:
        raise NotReversible("a call of td.jvp with its tuple arguments: the reverse transform calls it flat")

    def flat(self, sizes: tuple[int | None, ...]) -> FlatCall | None:
        """This call taking the entries of its primals and tangents one by one (:class:`FlatCall`), where both are
        tuples written out (``sizes``: each argument's tuple length), else None."""
        if len(sizes) != 3 or sizes[0] is not None or sizes[1] is None or sizes[1] != sizes[2]:
            return None
        key = ("flat", sizes)
        if key not in self.derived:
            self.derived[key] = FlatCall(self, sizes)
        return self.derived[key]  # type: ignore[return-value]


class HvpCall(JvpCall):
    """A call ``td.hvp(F, primals, tangents)``: the tangent of ``F``'s value and gradient by its float arguments
    (as ``td.hvp`` computes it), returning ``(value, H @ tangents)`` with ``None`` for integer arguments."""

    @staticmethod
    def _floats(args: Sequence[Any]) -> tuple[Function, tuple[int, ...]]:
        fn = as_function(args[0], "td.hvp")
        return fn, tuple(k for k, s in enumerate(fn.specs_for(list(args[1]))) if s.is_float)

    def function(self, args: Sequence[Any]) -> Function:
        fn, floats = self._floats(args)
        return _api.value_and_grad(fn, floats).tangent()  # (value, gradients..., dvalue, dgradients...)

    def pack(self, flat: Sequence[Any], args: Sequence[Any]) -> Any:
        _, floats = self._floats(args)
        return flat[0], _api.by_argument(flat[2 + len(floats):], floats, len(args[1]))

    def unpack(self, value: Any, args: Sequence[Any]) -> list[Any]:
        """The outputs ``pack`` leaves out (the gradients, the value's tangent) are zeros."""
        _, floats = self._floats(args)
        primals, (v, hv) = list(args[1]), value
        return [v, *[_zero_of(primals[k]) for k in floats], _zero_of(v), *[hv[k] for k in floats]]

    def leaf_of(self, args: Sequence[Any]) -> list[int | None]:
        """The value is leaf 0 of ``(value, (hv_0, ..., hv_n))``, ``hv_k`` leaf ``1 + k``; the rest are zeros."""
        _, floats = self._floats(args)
        return [0, *[None] * len(floats), None, *[1 + k for k in floats]]


class _Rule:
    """How the source transforms call through a callee (``CALLABLE_TYPES``, ``CALLABLE_OBJECTS``)."""

    def __init__(self, call_of: Any) -> None:
        self.call_of = call_of

    def tangent(self, callee: Any, active: tuple[bool, ...]) -> Call:
        return self.call_of(callee).tangent(active)

    def reverse(self, callee: Any, active: tuple[bool, ...], n_outputs: int) -> Call:
        return self.call_of(callee).reverse(active, n_outputs)

    def flat(self, callee: Any, sizes: tuple[int | None, ...]) -> FlatCall | None:
        """The call taking its tuple arguments' entries one by one, where it has such a form (``td.jvp``,
        ``td.hvp``: :meth:`JvpCall.flat`), else None."""
        call = self.call_of(callee)
        return call.flat(sizes) if isinstance(call, JvpCall) else None

    def shape(self, callee: Any, args: Sequence[Any], shape_of: Any) -> Any:
        """The nesting of a call's results where the call's own arguments tell it (``adjoint/results.py``), else
        None: ``td.jvp(F, ...)`` returns ``(out, dout)`` shaped as ``F``'s results (``shape_of(args[0])``),
        ``td.hvp(F, (x, s), ...)`` the value and one entry per primal."""
        call = self.call_of(callee)
        if isinstance(call, HvpCall):
            return (None, (None,) * len(args[1].elts)) if len(args) == 3 and hasattr(args[1], "elts") else None
        if isinstance(call, JvpCall) and args:
            inner = shape_of(args[0])
            return (inner, inner)
        return None

    @staticmethod
    def outputs(callee: Any) -> int:
        """How many values a call returns (the top of its output tree), where that is known before Taichi compiles."""
        if isinstance(callee, Function):
            specs = callee.declared_specs()
            if specs is None:
                return 1
            tree = callee.signature(specs)[1]
            return len(tree) if isinstance(tree, tuple) else 1
        if isinstance(callee, FlatCall):
            return _Rule.outputs(callee.call)
        if isinstance(callee, (TangentOf, JvpCall)):  # an HvpCall too: (value, H @ tangents)
            return 2
        if isinstance(callee, ReverseOf):
            return 1 + sum(callee.active)
        return 1


def identity_call(fn: Function) -> IdentityCall:
    if "identity call" not in fn.derived:
        fn.derived["identity call"] = IdentityCall(fn)  # type: ignore[assignment]
    return fn.derived["identity call"]  # type: ignore[return-value]


_JVP_CALL = JvpCall()
CALLABLE_TYPES[Function] = _Rule(identity_call)
CALLABLE_TYPES[Call] = _Rule(lambda call: call)
_HVP_CALL = HvpCall()
CALLABLE_OBJECTS[_api.jvp] = _Rule(lambda _: _JVP_CALL)
CALLABLE_OBJECTS[_api.hvp] = _Rule(lambda _: _HVP_CALL)
__all__ = ["Call", "FlatCall", "HvpCall", "IdentityCall", "JvpCall", "ReverseOf", "TangentOf"]
