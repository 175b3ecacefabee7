"""Core shapes and dtypes of a function's arguments and results.

An :class:`ArgSpec` says what one argument (or result) holds per batch
element: its *core shape* (``()`` scalar, ``(n,)`` vector, ``(n, m)``
matrix) and its element dtype. They come from a ``@ti.func``'s annotations,
from ``td.function(f, signature=...)``, or from the fields of a kernel
program.
"""
import inspect
from typing import NamedTuple

import numpy as np
import taichi as ti
from taichi.lang import impl
from taichi.lang.matrix import MatrixType
from taichi.lang.util import to_numpy_type


class ArgSpec(NamedTuple):
    """One argument or result: its name, core shape and NumPy dtype.

    A named tuple, not a dataclass: specs key every kernel cache and are
    hashed on every call.
    """

    name: str
    shape: tuple
    dtype: np.dtype

    @property
    def is_float(self):
        return self.dtype.kind == "f"

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def ti_type(self):
        """The Taichi type of one element: a scalar dtype, vector or matrix type."""
        scalar = to_taichi_dtype(self.dtype)
        if len(self.shape) == 0:
            return scalar
        if len(self.shape) == 1:
            return ti.types.vector(self.shape[0], scalar)
        if len(self.shape) == 2:
            return ti.types.matrix(self.shape[0], self.shape[1], scalar)
        raise ValueError(f"{self.name}: Taichi values have at most 2 dims, got core shape {self.shape}")


def default_float():
    return np.dtype(to_numpy_type(impl.get_runtime().default_fp))


def default_int():
    return np.dtype(to_numpy_type(impl.get_runtime().default_ip))


def to_taichi_dtype(dtype):
    return {
        np.dtype(np.float64): ti.f64,
        np.dtype(np.float32): ti.f32,
        np.dtype(np.int32): ti.i32,
        np.dtype(np.int64): ti.i64,
    }[np.dtype(dtype)]


def _scalar_dtype(ann):
    """NumPy dtype of a scalar annotation (``float``, ``int``, ``ti.f64``, ...)."""
    if ann is None or ann is float:
        return default_float()
    if ann is int:
        return default_int()
    return np.dtype(to_numpy_type(ann))


def spec_from_annotation(name, ann):
    """The spec an annotation gives: ``ti.math.vec3`` -> shape (3,), and so on.

    A tuple ``(3,)`` or ``(2, 2)`` of ints is read as a float core shape.
    """
    if isinstance(ann, MatrixType):
        shape = (ann.n,) if ann.ndim == 1 else (ann.n, ann.m)
        return ArgSpec(name, shape, _scalar_dtype(ann.dtype))
    if isinstance(ann, tuple) and all(isinstance(d, int) for d in ann):
        return ArgSpec(name, ann, default_float())
    try:
        return ArgSpec(name, (), _scalar_dtype(ann))
    except Exception:
        raise TypeError(
            f"argument {name!r}: cannot read a core shape from annotation {ann!r}; "
            "expected float, int, ti.f32/ti.f64/ti.i32, ti.math.vecN/matN, "
            "ti.types.vector/matrix or a shape tuple such as (3,)"
        ) from None


def parameter_names(pyfunc):
    return list(inspect.signature(pyfunc).parameters)


def input_specs(pyfunc, signature=None):
    """Specs of a function's parameters, or None where a parameter has no annotation.

    ``signature`` (a sequence in parameter order, or a dict by name) overrides
    annotations; each entry is a Taichi type or a shape tuple.
    """
    params = inspect.signature(pyfunc).parameters
    names = list(params)
    if signature is not None:
        if isinstance(signature, dict):
            unknown = set(signature) - set(names)
            if unknown:
                raise ValueError(f"signature names unknown parameters {sorted(unknown)}; parameters are {names}")
            anns = [signature.get(n, params[n].annotation) for n in names]
        else:
            signature = list(signature)
            if len(signature) != len(names):
                raise ValueError(
                    f"signature gives {len(signature)} entries for {len(names)} parameters {names}"
                )
            anns = signature
    else:
        anns = [params[n].annotation for n in names]
    return [
        None if ann is inspect.Parameter.empty else spec_from_annotation(name, ann)
        for name, ann in zip(names, anns)
    ]


def output_specs(pyfunc):
    """Specs from a return annotation, or None when there is none to read."""
    ann = inspect.signature(pyfunc).return_annotation
    if ann is inspect.Signature.empty or ann is None:
        return None
    origin = getattr(ann, "__origin__", None)
    if origin is tuple:
        return [spec_from_annotation(f"out{i}", a) for i, a in enumerate(ann.__args__)]
    if isinstance(ann, tuple) and not all(isinstance(d, int) for d in ann):
        return [spec_from_annotation(f"out{i}", a) for i, a in enumerate(ann)]
    return spec_from_annotation("out", ann)
