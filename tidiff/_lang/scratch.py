"""Arrays a generated ndarray kernel takes after its own parameters, allocated zeroed at each launch.

NOTE: [Scratch arrays] An ndarray kernel's arrays are shaped at each call,
so what the transforms of an atomic max / min count and keep (NOTE: [Atomic
extremes in reverse], [Atomic extremes forward]) cannot be fields made with
the generated kernel, as they are for a kernel over fields: the counts of
winners per entry (shaped like the target) and each iteration's value
(shaped like the parallel loop's iterations, ``range(x.shape[0])``: NOTE:
[Winners by kept values]) are ndarray parameters the generated kernel takes
after the kernel's own, which each launch allocates zeroed from the shapes
(and element types) of the arrays it is given. A tangent kernel's scratch
arrays are parameters of it, so its adjoint reads them as constants, as
the tangent kernel left them (the tangent kernel then runs first).
"""
from __future__ import annotations

import ast
import dataclasses
from typing import Any

import taichi as ti
from taichi.lang.matrix import MatrixType
from taichi.types.ndarray_type import NdarrayType

from .._arrays import _torch, torch_dtype
from .naming import Namer
from .nodes import name


@dataclasses.dataclass(frozen=True)
class Scratch:
    """One scratch array: the parameter's name, its element type (a Taichi type, or the name of an array
    parameter whose type it takes) and its shape (an array parameter's name, whose shape it takes, or extents:
    constants and ``(array parameter, axis)``)."""

    param: str
    dtype: Any
    shape: str | tuple[int | tuple[str, int], ...]

    def allocate(self, arrays: dict[str, Any], device: Any) -> Any:
        """The zeroed array for a launch with these arrays (torch tensors, by parameter name)."""
        shape = tuple(arrays[self.shape].shape) if isinstance(self.shape, str) else tuple(
            e if isinstance(e, int) else int(arrays[e[0]].shape[e[1]]) for e in self.shape)
        dtype = arrays[self.dtype].dtype if isinstance(self.dtype, str) else torch_dtype(self.dtype)
        return _torch().zeros(shape, dtype=dtype, device=device)

    def parameter(self, helpers: dict[str, Any], namer: Namer) -> ast.arg:
        """The generated kernel's parameter, its annotation a helper named in ``helpers``."""
        annotation = namer.fresh(f"{self.param}_type")
        helpers[annotation] = ti.types.ndarray(dtype=None if isinstance(self.dtype, str) else self.dtype,
                                               ndim=None if isinstance(self.shape, str) else len(self.shape))
        return ast.arg(self.param, name(annotation))


def holds_scalars(annotation: Any) -> bool:
    """Whether a kernel parameter's annotation is an ndarray of scalars (it names no vector or matrix type)."""
    return isinstance(annotation, NdarrayType) and not isinstance(annotation.dtype, MatrixType)
