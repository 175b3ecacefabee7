"""A kernel launched again with arguments of its first call's signature, past Taichi's per-call lookup.

NOTE: [Direct launches] ``kernel(*args)`` in Taichi 1.7.4 reads every
argument's features (dtype, ndim, gradient) to find the compiled instance
before it sets the arguments and launches: for an 8-argument batch kernel at
16 rows, that lookup is about a quarter of the call. A launch plan (NOTE:
[Launch plans] in ``_torch``) calls the same kernel with arguments of one
signature every time, so :class:`DirectLaunch` looks the instance up once and
then launches it directly. Where Taichi must see the launch (a tape or a
forward-mode manager recording it) it goes through Taichi's own call.
"""
from __future__ import annotations

from typing import Any

from taichi.lang import impl
from taichi.lang.util import cook_dtype
from taichi.types import ndarray_type, primitive_types
from taichi.types.utils import is_signed


class DirectLaunch:
    """``kernel(*args)`` (a ``@ti.kernel`` or its ``.grad``), its compiled instance looked up on the first call only."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = getattr(kernel, "_primal", kernel)  # the wrapper ti.kernel returns holds the Kernel
        self.compiled: Any = None

    def __call__(self, *args: Any) -> Any:
        runtime = impl.get_runtime()
        if runtime.target_tape is not None or runtime.fwd_mode_manager is not None:
            return self.kernel(*args)
        if self.compiled is None:
            self.compiled = self.kernel.compiled_kernels[self.kernel.ensure_compiled(*args)]
        return self.kernel.launch_kernel(self.compiled, *args)


class NumberLaunch:
    """``kernel(*numbers)`` for a kernel (or its ``.grad``) whose parameters are numbers (and ndarrays without
    gradients, of one type per parameter), launched past Taichi's per-call argument handling after a first call
    through Taichi's own.

    NOTE: [Number launches] A time loop launches the same few kernels with a slot and a step index thousands of
    times (NOTE: [A time loop over buffers]), and a field program's replay launches each recorded kernel's
    adjoint with the numbers its launch had (a stored trajectory's ``t``). Taichi's call reads each argument's
    features, looks the compiled instance up, materializes the field trees and sets each argument through a
    generic recursive setter: about 70 us a launch on a 2-core CPU, as much as the launch of a small kernel
    itself. After the first call, a kernel taking only numbers needs only a launch context with the numbers
    set (integers and floats as its annotations say) and the compiled kernel Taichi handed back: about a third
    of that. A kernel that prints or returns a value, a parameter of another type, or a launch Taichi must see
    (a tape or a forward-mode manager recording) goes through Taichi's call.
    """

    def __init__(self, kernel: Any) -> None:
        self.kernel = getattr(kernel, "_primal", kernel)
        self.kinds: list[str] = []  # per parameter: "float", "int" or "array"
        self.looked = False  # whether the first call looked at the kernel
        self.direct = False
        self.compiled: Any = None
        self.data: Any = None

    def __call__(self, *args: Any) -> Any:
        runtime = impl.get_runtime()
        if not self.direct or runtime.target_tape is not None or runtime.fwd_mode_manager is not None:
            result = self.kernel(*args)
            if not self.looked:
                self.looked = True
                self._prepare(args)
            return result
        context = self.compiled.make_launch_context()
        for i, (kind, value) in enumerate(zip(self.kinds, args, strict=True)):
            if kind == "float":
                context.set_arg_float((i,), float(value))
            elif kind == "int":
                context.set_arg_int((i,), int(value))
            else:
                context.set_arg_ndarray((i,), value.arr)
        runtime.prog.launch_kernel(self.data, context)
        return None

    def _prepare(self, args: tuple[Any, ...]) -> None:
        kernel = self.kernel
        annotations = [a.annotation for a in kernel.arguments]
        self.kinds = [_kind(a) for a in annotations]
        if "other" in self.kinds or kernel.return_type is not None or kernel.has_print or any(
                k == "array" and (getattr(a, "grad", None) is not None or not hasattr(a, "arr"))
                for k, a in zip(self.kinds, args, strict=True)):  # a NumPy array or tensor: through Taichi's call
            return
        self.compiled = kernel.compiled_kernels[kernel.ensure_compiled(*args)]
        prog = impl.get_runtime().prog
        self.data = prog.compile_kernel(prog.config(), prog.get_device_caps(), self.compiled)
        self.direct = True


def _kind(annotation: Any) -> str:
    """How a launch sets an argument of this annotation: "float", "int" (signed), "array" (an ndarray) or
    "other" (through Taichi's call only)."""
    if id(annotation) in primitive_types.real_type_ids:
        return "float"
    if id(annotation) in primitive_types.integer_type_ids and is_signed(cook_dtype(annotation)):
        return "int"
    return "array" if isinstance(annotation, ndarray_type.NdarrayType) else "other"
