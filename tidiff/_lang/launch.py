"""A kernel launched again with arguments of its first call's signature, past Taichi's per-call lookup.

NOTE: [Direct launches] ``kernel(*args)`` in Taichi 1.7.4 reads every
argument's features (dtype, ndim, gradient) to find the compiled instance
before it sets the arguments and launches: for an 8-argument batch kernel at
16 rows, that lookup is about a quarter of the call. A launch plan (NOTE:
[Launch plans] in ``_torch``) calls the same kernel with arguments of one
signature every time, so :class:`DirectLaunch` looks the instance up once and
then launches it directly. Where Taichi must see the launch (a tape or a
forward-mode manager recording it) it goes through Taichi's own call.

NOTE: [Tensor launches] Taichi then sets each argument through a generic
recursive setter that, per tensor, reads an environment variable, builds
NumPy's integer limits, checks devices and gradients: on the RWKV operator's
backward at (1, 4, 8), about as long as the launch of the adjoint kernel
itself. Where every parameter is a number or an ndarray (no template, no
return value, no print, arrays of structure layout), a launch whose tensors
are contiguous, on the device Taichi computes on, and with a contiguous
gradient wherever they require one, and whose NumPy arrays are contiguous
(on the CPU), sets them itself: data pointer, size, shape without the
element's dims, gradient pointer, as Taichi's setter does. Any other launch
(a tensor elsewhere or strided, one requiring a gradient it does not have:
Taichi allocates it) goes through Taichi's call.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np
import taichi as ti
from taichi.lang import impl
from taichi.lang.enums import Layout
from taichi.lang.util import cook_dtype
from taichi.types import ndarray_type, primitive_types
from taichi.types.utils import is_signed

_INT32_MAX = int(np.iinfo(np.int32).max)


class DirectLaunch:
    """``kernel(*args)`` (a ``@ti.kernel`` or its ``.grad``), its compiled instance looked up on the first call only."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = getattr(kernel, "_primal", kernel)  # the wrapper ti.kernel returns holds the Kernel
        self.compiled: Any = None
        self.kinds: list[str] | None = None  # per parameter, "float", "int" or "array" (NOTE: [Tensor launches])
        self.element_dims: list[int] = []  # per parameter, the dims of an array's element
        self.device = ""  # the device type of the tensors a launch sets itself
        self.data: Any = None

    def __call__(self, *args: Any) -> Any:
        runtime = impl.get_runtime()
        if runtime.target_tape is not None or runtime.fwd_mode_manager is not None:
            return self.kernel(*args)
        if self.compiled is None:
            self.compiled = self.kernel.compiled_kernels[self.kernel.ensure_compiled(*args)]
            self._prepare()
        context = self._context(args)
        if context is None:
            return self.kernel.launch_kernel(self.compiled, *args)
        runtime.prog.launch_kernel(self.data, context)
        return None

    def _prepare(self) -> None:
        """Whether launches may set the arguments (NOTE: [Tensor launches]), and what they need for it."""
        kinds, arch = kinds_of(self.kernel), impl.current_cfg().arch
        annotations = [a.annotation for a in self.kernel.arguments]
        if kinds is None or arch not in (ti.x64, ti.arm64, ti.cuda) or any(
                k == "array" and a.layout == Layout.SOA for k, a in zip(kinds, annotations, strict=True)):
            return
        dtypes = [getattr(a, "dtype", None) for a in annotations]
        self.element_dims = [0 if d is None or id(d) in primitive_types.type_ids else d.ndim for d in dtypes]
        self.data = _kernel_data(self.compiled)
        self.kinds, self.device = kinds, "cuda" if arch == ti.cuda else "cpu"

    def _context(self, args: tuple[Any, ...]) -> Any:
        """A launch context with ``args`` set, or None where Taichi's call must set them."""
        torch = sys.modules.get("torch")
        if self.kinds is None or len(args) != len(self.kinds):
            return None
        context = self.compiled.make_launch_context()
        for i, (kind, dims, v) in enumerate(zip(self.kinds, self.element_dims, args, strict=True)):
            if kind == "float" and isinstance(v, (float, int, np.floating, np.integer)):
                context.set_arg_float((i,), float(v))
            elif kind == "int" and isinstance(v, (int, np.integer)):
                context.set_arg_int((i,), int(v))
            elif kind == "array" and type(v) is np.ndarray and self.device == "cpu" and v.flags.c_contiguous \
                    and v.size <= _INT32_MAX:
                context.set_arg_external_array_with_shape((i,), int(v.ctypes.data), v.nbytes, v.shape[:v.ndim - dims],
                                                          0)
            elif kind == "array" and torch is not None and isinstance(v, torch.Tensor) \
                    and v.device.type == self.device and v.is_contiguous() and v.nelement() <= _INT32_MAX:
                grad = v.grad if v.requires_grad else None
                if v.requires_grad and (grad is None or not grad.is_contiguous()):
                    return None
                shape = tuple(v.shape[:v.ndim - dims])
                context.set_arg_external_array_with_shape((i,), int(v.data_ptr()), v.element_size() * v.nelement(),
                                                          shape, 0 if grad is None else int(grad.data_ptr()))
            else:
                return None
        return context


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
    (a tape or a forward-mode manager recording) goes through Taichi's call, but for a launch whose caller tells
    the tape itself (``told=True``: NOTE: [Small loops run serially]), which never does.
    """

    def __init__(self, kernel: Any, told: bool = False) -> None:
        self.kernel = getattr(kernel, "_primal", kernel)
        self.told = told  # whether the caller tells a recording tape of each launch
        self.kinds: list[str] = []  # per parameter: "float", "int" or "array"
        self.looked = False  # whether the first call looked at the kernel
        self.direct = False
        self.compiled: Any = None
        self.data: Any = None

    def __call__(self, *args: Any) -> Any:
        runtime = impl.get_runtime()
        if not self.direct or not self.told and (runtime.target_tape is not None
                                                 or runtime.fwd_mode_manager is not None):
            result = self.kernel.launch_kernel(self.kernel.compiled_kernels[self.kernel.ensure_compiled(*args)],
                                               *args) if self.told else self.kernel(*args)
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
        kinds = kinds_of(self.kernel)
        if kinds is None or any(k == "array" and (getattr(a, "grad", None) is not None or not hasattr(a, "arr"))
                                for k, a in zip(kinds, args, strict=True)):  # a NumPy array or tensor: Taichi's call
            return
        self.kinds = kinds
        self.compiled = self.kernel.compiled_kernels[self.kernel.ensure_compiled(*args)]
        self.data = _kernel_data(self.compiled)
        self.direct = True


def kinds_of(kernel: Any) -> list[str] | None:
    """How a launch past Taichi's call sets each parameter (:func:`_kind`); None for a kernel only Taichi's call
    launches (one printing or returning a value, or a parameter of another kind)."""
    kinds = [_kind(a.annotation) for a in kernel.arguments]
    return None if "other" in kinds or kernel.return_type is not None or kernel.has_print else kinds


def _kernel_data(compiled: Any) -> Any:
    """What Taichi compiled for the kernel instance ``compiled``, to launch with a context."""
    prog = impl.get_runtime().prog
    return prog.compile_kernel(prog.config(), prog.get_device_caps(), compiled)


def _kind(annotation: Any) -> str:
    """How a launch sets an argument of this annotation: "float", "int" (signed), "array" (an ndarray) or
    "other" (through Taichi's call only)."""
    if id(annotation) in primitive_types.real_type_ids:
        return "float"
    if id(annotation) in primitive_types.integer_type_ids and is_signed(cook_dtype(annotation)):
        return "int"
    return "array" if isinstance(annotation, ndarray_type.NdarrayType) else "other"
