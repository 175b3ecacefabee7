"""Core shapes and dtypes of a function's arguments and results.

An :class:`ArgSpec` says what one argument (or result) holds per batch
element: its *core shape* (``()`` scalar, ``(n,)`` vector, ``(n, m)``
matrix) and its element dtype. Core shapes come from a ``@ti.func``'s
annotations, from ``td.function(f, signature=...)``, or from the fields of a
kernel program.

NOTE: [Float precision] An annotation says whether an argument holds floats
or integers and its core shape; a float argument's precision is the one its
value has (float32 in, float32 out), and a Python number takes Taichi's
``default_fp``. Annotations such as ``ti.math.vec3`` are float32 types in
Taichi 1.7.4 whatever ``default_fp`` is, and a ``@ti.func`` does not cast
vector or matrix arguments to their annotation, so taking the annotation's
precision would round float64 values to float32 without need. (A *scalar*
annotation such as ``ti.f64`` does cast, inside the function: such a
function computes that argument in float64, and returns the caller's dtype.)
Where float arguments of one call differ in precision, all are read in the
widest (:func:`widest_float`): results are in that precision, so their
arithmetic must be too; a float32 argument computed in float32 would carry
float32 error (1e-7) into a float64 result.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import taichi as ti
from taichi.lang import impl
from taichi.lang.matrix import MatrixType
from taichi.lang.util import to_numpy_type, to_taichi_type


class ArgSpec(NamedTuple):
    """One argument or result: its name, core shape and NumPy dtype.

    A named tuple, not a dataclass: specs key every kernel cache and are
    hashed on every call.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def is_float(self) -> bool:
        return self.dtype.kind == "f"

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def ti_type(self) -> Any:
        """The Taichi type of one element: a scalar dtype, vector or matrix type."""
        scalar = to_taichi_type(self.dtype)
        if len(self.shape) == 0:
            return scalar
        if len(self.shape) == 1:
            return ti.types.vector(self.shape[0], scalar)
        if len(self.shape) == 2:
            return ti.types.matrix(self.shape[0], self.shape[1], scalar)
        raise ValueError(f"{self.name}: Taichi values have at most 2 dims, got core shape {self.shape}")

    def renamed(self, name: str) -> ArgSpec:
        return ArgSpec(name, self.shape, self.dtype)


def with_tangents(specs: Sequence[ArgSpec]) -> list[ArgSpec]:
    """``specs``, then the spec of a tangent (``d<name>``, same shape and dtype) for each float one:
    the inputs of a tangent function."""
    return list(specs) + [ArgSpec("d" + s.name, s.shape, s.dtype) for s in specs if s.is_float]


def default_float() -> np.dtype:
    return np.dtype(to_numpy_type(impl.get_runtime().default_fp))


def default_int() -> np.dtype:
    return np.dtype(to_numpy_type(impl.get_runtime().default_ip))


def result_float(specs: Sequence[ArgSpec]) -> np.dtype:
    """The float dtype results take: the widest float argument's, else ``default_fp``."""
    floats = [s.dtype for s in specs if s.is_float]
    return np.result_type(*floats) if floats else default_float()


def widest_float(specs: Sequence[ArgSpec]) -> list[ArgSpec]:
    """``specs`` with every float one in the widest float precision among them (NOTE: [Float precision])."""
    floats = {s.dtype for s in specs if s.is_float}
    if len(floats) < 2:
        return list(specs)
    wide = np.result_type(*floats)
    return [ArgSpec(s.name, s.shape, wide) if s.is_float else s for s in specs]


def _scalar_dtype(ann: Any) -> np.dtype:
    """NumPy dtype of a scalar annotation (``float``, ``int``, ``ti.f64``, ...); floats are ``default_fp``."""
    if ann is None or ann is float:
        return default_float()
    if ann is int:
        return default_int()
    dtype = np.dtype(to_numpy_type(ann))
    return default_float() if dtype.kind == "f" else dtype


def spec_from_annotation(name: str, ann: Any) -> ArgSpec:
    """The spec an annotation gives: ``ti.math.vec3`` -> shape (3,), and so on (NOTE: [Float precision]).

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


def parameter_names(pyfunc: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(pyfunc).parameters)


def input_specs(pyfunc: Callable[..., Any], signature: Sequence[Any] | Mapping[str, Any] | None = None,
                call: str = "td.function") -> list[ArgSpec | None]:
    """Specs of a function's parameters, None where a parameter has no annotation.

    ``signature`` (a sequence in parameter order, or a dict by name) overrides
    annotations; each entry is a Taichi type or a shape tuple.
    """
    params = inspect.signature(pyfunc).parameters
    names = list(params)
    if signature is not None:
        if isinstance(signature, Mapping):
            unknown = set(signature) - set(names)
            if unknown:
                raise ValueError(
                    f"{call}: signature names unknown parameters {sorted(unknown)}; parameters are {names}"
                )
            anns = [signature.get(n, params[n].annotation) for n in names]
        else:
            anns = list(signature)
            if len(anns) != len(names):
                raise ValueError(f"{call}: signature gives {len(anns)} entries for {len(names)} parameters {names}")
    else:
        anns = [params[n].annotation for n in names]
    return [
        None if ann is inspect.Parameter.empty else spec_from_annotation(name, ann)
        for name, ann in zip(names, anns, strict=True)
    ]


def output_specs(pyfunc: Callable[..., Any]) -> ArgSpec | list[ArgSpec] | None:
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
