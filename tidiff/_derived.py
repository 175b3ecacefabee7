"""Functions made from another Function, and the arguments they take.

:class:`SameArguments`: a transform, a composition or a time loop takes the
arguments of the function it is made from, as they are.

A tangent takes ``(x..., dx for each float x)``, a cotangent map (``vjp_fn(f)``)
``(x..., one cotangent per output of f)``: how many arguments a call takes
follows from the parent's (``arity``), and their specs from the primals'
(``specs_of``). Pointwise functions (``_pointwise``) and functions without
a body (``_composite``, ``_kinds/ndarray``) derive from these alike.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._protocol import Function
from ._signature import ArgSpec, with_tangents
from ._tree import Tree


class SameArguments(Function):
    """A Function taking the arguments of ``arguments_of`` as they are: their names, specs and count."""

    arguments_of: Function

    def param_names(self) -> list[str]:
        return self.arguments_of.param_names()

    def declared_specs(self) -> list[ArgSpec] | None:
        return self.arguments_of.declared_specs()

    def specs_for(self, args: Sequence[Any]) -> list[ArgSpec]:
        return self.arguments_of.specs_for(args)

    def arity(self, args: Sequence[Any]) -> int:
        return self.arguments_of.arity(args)


class Derived(Function):
    """A Function made from a ``parent``: the parent's primals first, then arguments of its own
    (tangents, cotangents) whose specs follow from the primals' (:meth:`specs_of`)."""

    def __init__(self, name: str, parent: Function, *, listed: bool = True) -> None:
        super().__init__(name, listed=listed)
        self.parent = parent

    def primal_count(self, args: Sequence[Any]) -> int:
        """How many of a call's leading arguments (values or specs) are the parent's primals."""
        return self.parent.arity(args)

    def arity(self, args: Sequence[Any]) -> int:
        return len(self.specs_for(args))

    def specs_of(self, primal: Sequence[ArgSpec]) -> list[ArgSpec]:
        """All input specs, from the parent's primal specs."""
        raise NotImplementedError

    def declared_specs(self) -> list[ArgSpec] | None:
        primal = self.parent.declared_specs()
        return None if primal is None else self.specs_of(primal)

    def specs_for(self, args: Sequence[Any]) -> list[ArgSpec]:
        return self.specs_of(self.parent.specs_for(args[: self.primal_count(args)]))


class TangentSignature(Derived):
    """The inputs of a tangent function: ``(x..., dx for each float x)``; its outputs are the kind's own."""

    def __init__(self, parent: Function) -> None:
        super().__init__(f"jvp({parent.name})", parent, listed=False)

    def param_names(self) -> list[str]:
        return self.parent.param_names() + [f"d{n}" for n in self.parent.param_names()]

    def specs_of(self, primal: Sequence[ArgSpec]) -> list[ArgSpec]:
        return with_tangents(primal)


class CotangentMapSignature(Derived):
    """The signature of ``vjp_fn(f)``: ``(x..., one cotangent per output of f) -> one cotangent per float x``."""

    def __init__(self, parent: Function) -> None:
        super().__init__(f"vjp_fn({parent.name})", parent)

    def param_names(self) -> list[str]:
        return self.parent.param_names() + ["cotangents"]

    def specs_of(self, primal: Sequence[ArgSpec]) -> list[ArgSpec]:
        """Primal specs, then one cotangent spec per output."""
        outs, _ = self.parent.signature(primal)
        return list(primal) + [ArgSpec(f"ct_{o.name}", o.shape, o.dtype) for o in outs]

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        outs = [ArgSpec(f"ct_{s.name}", s.shape, s.dtype) for s in in_specs[: self.primal_count(in_specs)]
                if s.is_float]
        return outs, tuple(range(len(outs)))
