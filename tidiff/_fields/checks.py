"""Validate what a :class:`~.program.FieldProgram` is given, at construction and per call.

Every check runs before any twin is touched, so a refused call leaves no
state behind. Messages name the user's call (``td.function(run)``) and the
argument (``inputs[1]``), never tidiff's own classes.
"""
import inspect
import types
from collections.abc import Callable, Iterable
from typing import Any, Literal, overload

import numpy as np
from taichi.lang.field import Field
from taichi.lang.kernel_impl import _BoundedDifferentiableMethod

from .._arrays import is_tensor, of_dtype, runs_in_place
from .._errors import describe_shape
from .graph import (
    is_class_kernel,
    is_field,
    is_grad_replaced,
    is_kernel,
    is_user_object,
)
from .parts import Part, as_part
from .twins import is_real, numpy_dtype


def program_callable(program: Any, call: str) -> Callable[..., Any]:
    """The callable to run: a kernel, a function, a bound method (``sim.run``) or a callable object.

    Raises ``TypeError`` for anything else, and for a class kernel taken
    from its class rather than from an object.
    """
    if is_class_kernel(program):
        raise TypeError(f"{call}: {program.__name__} is a kernel of a @ti.data_oriented class taken from the "
                        "class; pass it bound to its object (sim.run, not Sim.run)")
    if (is_kernel(program) or isinstance(program, (types.FunctionType, types.MethodType, _BoundedDifferentiableMethod))
            or is_grad_replaced(program)):
        return program
    if is_user_object(program) and callable(program):
        return program.__call__
    raise TypeError(f"{call}: expected a @ti.kernel, a Python function or a method that launches kernels, "
                    f"got {type(program).__name__}")


def required_parameters(program: Any) -> list[str]:
    """Names of the parameters a call of ``program`` must pass."""
    if isinstance(program, _BoundedDifferentiableMethod):
        fn, skip = program._primal.func, 0 if program._is_staticmethod else 1
    else:
        fn, skip = (program.__wrapped__ if is_kernel(program) else program), 0
    params = list(inspect.signature(fn).parameters.values())[skip:]
    return [p.name for p in params
            if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def check_program(program: Any, call: str, takes: int = 0) -> Callable[..., Any]:
    """``program`` as a callable taking ``takes`` positional parameters; else ``TypeError``."""
    program = program_callable(program, call)
    required = required_parameters(program)
    if len(required) > takes:
        what = "no parameters" if not takes else f"{takes} parameter{'s' if takes > 1 else ''} (the step index)"
        raise TypeError(
            f"{call}: the program must take {what}, it takes {', '.join(required)}; bind them with a "
            "closure (lambda: step(dt)) or move them into fields"
        )
    return program


def check_fields(inputs: Iterable[Field | Part], outputs: Iterable[Field | Part], call: str,
                 state: Iterable[Field] = ()) -> tuple[list[Part], list[Part], list[Field]]:
    """Fields or parts, each listed once, outputs not overlapping inputs, at least one output.

    Returns ``(inputs, outputs, state)``: inputs and outputs as
    :class:`~.parts.Part`, ``state`` as fields.
    """
    inputs, outputs, state = list(inputs), list(outputs), list(state)
    if not outputs:
        raise ValueError(f"{call}: outputs=[...]: expected at least one output field, got an empty list")
    for role, entries in (("inputs", inputs), ("outputs", outputs), ("state", state)):
        for position, entry in enumerate(entries):
            field = entry.field if isinstance(entry, Part) and role != "state" else entry
            if not is_field(field):
                kind = "a field" if role == "state" else "a field or td.part(field, i)"
                raise TypeError(
                    f"{call}: {role}[{position}]: expected {kind} (ti.field, ti.Vector.field, "
                    f"ti.Matrix.field), got {type(entry).__name__}"
                )
    ins, outs = [as_part(e) for e in inputs], [as_part(e) for e in outputs]
    for role, parts in (("inputs", ins), ("outputs", outs)):
        for position, p in enumerate(parts):
            if any(q.overlaps(p) for q in parts[:position]):
                raise ValueError(f"{call}: {role}[{position}]: this field is already listed in {role}")
    for position, p in enumerate(ins):
        if any(q.overlaps(p) for q in outs):
            raise ValueError(
                f"{call}: inputs[{position}]: this field is also an output. Outputs are zeroed before each "
                "evaluation, which would erase the input; write the result to a separate field"
            )
    declared = {id(p.field) for p in ins + outs if p.whole}
    for position, field in enumerate(state):
        if id(field) in declared:
            raise ValueError(f"{call}: state[{position}]: this field is already an input or output")
    return ins, outs, state


def describe(role: str, position: int, name: str) -> str:
    """``"inputs[0] (field 'x')"``: how messages name an argument."""
    return f"{role}[{position}]" + (f" (field '{name}')" if name else "")


# an argument (``tangent=False``) always converts to an array; a tangent or cotangent may be None
@overload
def convert(call: str, role: str, position: int, name: str, part: Part, value: object,
            tangent: Literal[False] = False) -> np.ndarray: ...


@overload
def convert(call: str, role: str, position: int, name: str, part: Part, value: object,
            tangent: bool) -> np.ndarray | None: ...


def convert(call: str, role: str, position: int, name: str, part: Part, value: object,
            tangent: bool = False) -> np.ndarray | None:
    """``value`` as a NumPy array of the part's shape and its field's dtype.

    A tangent or cotangent (``tangent=True``) may be ``None`` (zero) and is
    ``None`` for an integer field, which has none. Raises ``ValueError``
    naming the argument and the expected shape, or ``TypeError`` for a
    missing or non-numeric value.
    """
    if value is None:
        if tangent:
            return None
        raise TypeError(f"{call}: {describe(role, position, name)}: expected an array, got None")
    if is_tensor(value):
        tensor: Any = value
        if runs_in_place(tensor.device):  # NOTE: [Tensors in place] in _arrays
            return _tensor(call, role, position, name, part, tensor.detach(), tangent)
        value = tensor.detach().cpu().numpy()
    array = np.asarray(value)
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise TypeError(f"{call}: {describe(role, position, name)} must be numeric, got dtype {array.dtype}")
    if array.shape != part.shape:
        raise ValueError(
            f"{call}: {describe(role, position, name)}: expected {describe_shape(part.shape)}, "
            f"got {describe_shape(array.shape)}"
        )
    if tangent and not is_real(part.field):
        return None
    return array.astype(numpy_dtype(part.field), copy=False)


def _tensor(call: str, role: str, position: int, name: str, part: Part, tensor: Any, tangent: bool) -> Any:
    """:func:`convert` of a tensor on Taichi's device: checked as an array is, kept there in the field's dtype."""
    if tensor.is_complex():
        raise TypeError(f"{call}: {describe(role, position, name)} must be real, got dtype {tensor.dtype}")
    if tuple(tensor.shape) != part.shape:
        raise ValueError(
            f"{call}: {describe(role, position, name)}: expected {describe_shape(part.shape)}, "
            f"got {describe_shape(tuple(tensor.shape))}"
        )
    if tangent and not is_real(part.field):
        return None
    return of_dtype(tensor, numpy_dtype(part.field), tensor.device)
