"""Validate what a :class:`~.program.FieldProgram` is given, at construction and per call.

Every check runs before any twin is touched, so a refused call leaves no
state behind.
"""
import inspect

import numpy as np

from .._errors import describe_shape
from .graph import is_field, is_kernel
from .twins import full_shape, is_real, numpy_dtype


def check_program(program):
    """A parameterless ``@ti.kernel`` or plain Python callable; else ``TypeError``."""
    if getattr(program, "_is_classkernel", False) or hasattr(program, "_kernel_owner"):
        raise TypeError(
            "FieldProgram(program=...): kernels of @ti.data_oriented classes are not supported; "
            "pass a module-level @ti.kernel or a plain function that launches kernels"
        )
    if not (is_kernel(program) or inspect.isfunction(program)):
        raise TypeError(
            "FieldProgram(program=...): expected a @ti.kernel or a plain Python function "
            f"with no parameters that launches kernels, got {type(program).__name__}"
        )
    fn = program.__wrapped__ if is_kernel(program) else program
    required = [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        raise TypeError(
            f"FieldProgram(program={fn.__name__}): the program must take no parameters, "
            f"it takes {', '.join(required)}; bind them with a closure or move them into fields"
        )


def check_fields(inputs, outputs):
    """Fields only, each listed once, outputs not also inputs, at least one output."""
    inputs, outputs = list(inputs), list(outputs)
    if not outputs:
        raise ValueError("FieldProgram(outputs=...): expected at least one output field, got an empty list")
    for role, fields in (("inputs", inputs), ("outputs", outputs)):
        seen = set()
        for position, field in enumerate(fields):
            if not is_field(field):
                raise TypeError(
                    f"FieldProgram({role}[{position}]): expected a Taichi scalar, vector or "
                    f"matrix field (ti.field, ti.Vector.field, ti.Matrix.field), got {type(field).__name__}"
                )
            if id(field) in seen:
                raise ValueError(f"FieldProgram({role}[{position}]): this field is already listed in {role}")
            seen.add(id(field))
    output_ids = {id(f) for f in outputs}
    for position, field in enumerate(inputs):
        if id(field) in output_ids:
            raise ValueError(
                f"FieldProgram(inputs[{position}]): this field is also an output. Outputs are zeroed "
                "before each evaluation, which would erase the input; write the result to a separate field"
            )
    return inputs, outputs


def describe(role, position, name):
    """``"inputs[0] (field 'x')"``: how messages name an argument."""
    return f"{role}[{position}]" + (f" (field '{name}')" if name else "")


def convert(call, role, position, name, field, value, tangent=False):
    """``value`` as a NumPy array of the field's shape and dtype.

    A tangent or cotangent (``tangent=True``) may be ``None`` (zero) and is
    ``None`` for an integer field, which has none. Raises ``ValueError``
    naming the argument and the expected shape, or ``TypeError`` for a
    missing or non-numeric value.
    """
    if value is None:
        if tangent:
            return None
        raise TypeError(f"{call}: {describe(role, position, name)}: expected an array, got None")
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise TypeError(f"{call}: {describe(role, position, name)} must be numeric, got dtype {array.dtype}")
    expected = full_shape(field)
    if array.shape != expected:
        raise ValueError(
            f"{call}: {describe(role, position, name)}: expected {describe_shape(expected)}, "
            f"got {describe_shape(array.shape)}"
        )
    if tangent and not is_real(field):
        return None
    return array.astype(numpy_dtype(field), copy=False)
