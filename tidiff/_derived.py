"""The arguments of a Function made from another one, as an object the made Function holds.

A transform, a composition or a time loop takes the arguments of the
function it is made from, as they are (:class:`SameArguments`). A tangent takes
``(x..., dx for each float x)`` (:class:`TangentArguments`), a cotangent map
(``vjp_fn(f)``) ``(x..., one cotangent per output of f)``
(:class:`CotangentArguments`): how many arguments a call takes follows from the
parent's (``arity``), and their specs from the primals' (``specs_of``).

A Function whose arguments follow from another's holds one of these as its
``arguments`` (``Function.param_names``, ``declared_specs``, ``arity`` and
``specs_for`` ask it), whatever computes its values: generated bodies
(``_pointwise``), calls of other functions (``_composite``) or kernels
(``_kinds/ndarray``). The two are composed, not inherited, so each Function
class is one way of computing beside one kind of arguments.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ._arrays import Batch, is_tensor, of_dtype, tensor_device, zeros
from ._signature import ArgSpec, with_tangents
from ._tree import Tree


class Parent(Protocol):
    """What arguments made from a parent ask of it: the parent's part of ``_protocol.Function``."""

    def param_names(self) -> list[str]: ...
    def param_defaults(self) -> dict[str, Any]: ...
    def declared_specs(self) -> list[ArgSpec] | None: ...
    def arity(self, args: Sequence[Any]) -> int: ...
    def specs_for(self, args: Sequence[Any]) -> list[ArgSpec]: ...
    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]: ...
    def read(self, args: Sequence[Any], call: str | None = None) -> Batch: ...


class Arguments:
    """The arguments of a Function made from ``parent``: the parent's primals first, then arguments of its own
    (tangents, cotangents) whose specs follow from the primals' (:meth:`specs_of`)."""

    def __init__(self, parent: Parent) -> None:
        self.parent = parent

    def param_names(self) -> list[str]:
        raise NotImplementedError

    def param_defaults(self) -> dict[str, Any]:
        """Defaults of parameters a call may leave out: none, but where the arguments are the parent's."""
        return {}

    def specs_of(self, primal: Sequence[ArgSpec]) -> list[ArgSpec]:
        """All input specs, from the parent's primal specs."""
        raise NotImplementedError

    def primal_count(self, args: Sequence[Any]) -> int:
        """How many of a call's leading arguments (values or specs) are the parent's primals."""
        return self.parent.arity(args)

    def arity(self, args: Sequence[Any]) -> int:
        return len(self.specs_for(args))

    def declared_specs(self) -> list[ArgSpec] | None:
        primal = self.parent.declared_specs()
        return None if primal is None else self.specs_of(primal)

    def specs_for(self, args: Sequence[Any]) -> list[ArgSpec]:
        return self.specs_of(self.parent.specs_for(args[: self.primal_count(args)]))

    def read(self, args: Sequence[Any], call: str) -> Batch:
        """The parent reads its primals (fixed shapes, tensors where it takes them); the rest follow their specs.

        For functions without a per-element body; one with a body reads all its arguments by their specs
        (``Function.read``).
        """
        n = self.primal_count(args)
        inner = self.parent.read(args[:n], call)
        specs = self.specs_of(list(inner.specs))
        if len(args) != len(specs):
            raise TypeError(f"{call}: expected {len(specs)} arguments, got {len(args)}")
        rest = [like(a, s, inner) for a, s in zip(args[n:], specs[n:], strict=True)]
        return Batch(inner.arrays + tuple(rest), tuple(specs), (), inner.device)


class SameArguments(Arguments):
    """The arguments of ``parent`` as they are: their names, specs and count."""

    def param_names(self) -> list[str]:
        return self.parent.param_names()

    def param_defaults(self) -> dict[str, Any]:
        return self.parent.param_defaults()

    def specs_of(self, primal: Sequence[ArgSpec]) -> list[ArgSpec]:
        return list(primal)

    def arity(self, args: Sequence[Any]) -> int:
        return self.parent.arity(args)

    def declared_specs(self) -> list[ArgSpec] | None:
        return self.parent.declared_specs()

    def specs_for(self, args: Sequence[Any]) -> list[ArgSpec]:
        return self.parent.specs_for(args)

    def read(self, args: Sequence[Any], call: str) -> Batch:
        return self.parent.read(args, call)


class TangentArguments(Arguments):
    """The inputs of a tangent function: ``(x..., dx for each float x)``."""

    def param_names(self) -> list[str]:
        return self.parent.param_names() + [f"d{n}" for n in self.parent.param_names()]

    def specs_of(self, primal: Sequence[ArgSpec]) -> list[ArgSpec]:
        return with_tangents(primal)


class CotangentArguments(Arguments):
    """The inputs of ``vjp_fn(f)``: ``(x..., one cotangent per output of f)``."""

    def param_names(self) -> list[str]:
        return self.parent.param_names() + ["cotangents"]

    def specs_of(self, primal: Sequence[ArgSpec]) -> list[ArgSpec]:
        """Primal specs, then one cotangent spec per output."""
        outs, _ = self.parent.signature(primal)
        return list(primal) + [ArgSpec(f"ct_{o.name}", o.shape, o.dtype) for o in outs]

    def outputs(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        """What ``vjp_fn(f)`` returns: one cotangent per float primal."""
        outs = [ArgSpec(f"ct_{s.name}", s.shape, s.dtype) for s in in_specs[: self.primal_count(in_specs)]
                if s.is_float]
        return outs, tuple(range(len(outs)))


class OutputsCotangentArguments(CotangentArguments):
    """The inputs of ``vjp_fn(f)`` given ``f``'s outputs too: ``(x..., each output of f, one cotangent per
    output)`` (NOTE: [Outputs read back] in ``_adjoint/read_back.py``)."""

    def param_names(self) -> list[str]:
        return self.parent.param_names() + ["outputs", "cotangents"]

    def specs_of(self, primal: Sequence[ArgSpec]) -> list[ArgSpec]:
        """Primal specs, then one spec per output, then one cotangent spec per output."""
        outs, _ = self.parent.signature(primal)
        return [*primal, *outs, *[ArgSpec(f"ct_{o.name}", o.shape, o.dtype) for o in outs]]


def like(value: Any, spec: ArgSpec, inner: Batch) -> Any:
    """An extra argument (tangent, cotangent) as the parent's arrays are: a tensor beside tensors."""
    device = tensor_device(inner.arrays)
    if device is not None:
        if value is None:
            return zeros(spec.shape, spec.dtype, device)
        return of_dtype(value.detach() if is_tensor(value) else value, spec.dtype, device).expand(spec.shape)
    if value is None:
        value = np.zeros(spec.shape, spec.dtype)
    if is_tensor(value):
        value = value.detach().cpu().numpy()
    return np.broadcast_to(np.asarray(value, spec.dtype), spec.shape)
