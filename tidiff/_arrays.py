"""Host values in and out: NumPy, torch tensors and Python numbers.

Every host call goes through :func:`read_args`: it checks each argument's
trailing dims against its core shape and its dtype against the spec, and
finds the broadcast batch shape, so that a bad argument is refused before
anything runs. The result is a :class:`Batch`.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from taichi.lang.util import to_numpy_type, to_pytorch_type, to_taichi_type

from ._signature import ArgSpec, default_float


def _torch() -> Any:
    return sys.modules.get("torch")


def torch_module() -> Any:
    """torch, which is imported wherever a tensor exists (tidiff never imports it for NumPy callers)."""
    return sys.modules["torch"]


def numpy_dtype(dtype: Any) -> np.dtype:
    """The NumPy dtype of a NumPy, torch or Taichi dtype, by Taichi's type maps.

    Taichi has no complex types: a complex torch dtype gives NumPy's complex
    of its size, which the readers of arguments refuse by name.
    """
    if isinstance(dtype, np.dtype):
        return dtype
    if getattr(dtype, "is_complex", False):
        return np.dtype(f"c{dtype.itemsize}")
    try:
        return np.dtype(to_numpy_type(to_taichi_type(dtype)))
    except (AttributeError, TypeError, KeyError):  # Taichi's maps raise AttributeError for torch.bfloat16
        raise TypeError(f"the dtype {dtype} has no Taichi type (Taichi computes in float16, float32, float64 and "
                        "integers); convert the argument first, e.g. tensor.to(torch.float32)") from None


def torch_dtype(dtype: Any) -> Any:
    """The torch dtype of a NumPy, torch or Taichi dtype, by Taichi's type maps."""
    return to_pytorch_type(to_taichi_type(dtype))


def is_tensor(value: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(value, torch.Tensor)


@dataclasses.dataclass(frozen=True)
class Batch:
    """Checked arguments of one host call.

    ``arrays`` are NumPy arrays, or torch tensors for kinds that take them as
    they are (``Function.native_tensors``); ``shape`` is the broadcast batch
    shape (``()`` for kinds that take no batch dims); ``device`` is the torch
    device results go to, when the caller gave tensors.
    """

    arrays: tuple[Any, ...]
    specs: tuple[ArgSpec, ...]
    shape: tuple[int, ...] = ()
    device: Any = None

    def wrap(self, array: Any) -> Any:
        """Return a result the way the caller gave arguments: NumPy, or torch on their device."""
        if self.device is None or array is None or is_tensor(array):
            return array
        # a broadcast view is read-only, which torch.from_numpy warns about: copied then
        return _torch().from_numpy(np.require(array, requirements=("C", "W"))).to(self.device)

    def unbatched(self, call: str, what: str) -> Batch:
        """This call itself, for a function that takes no batch dims (``what``: "a time loop"); else ValueError."""
        if self.shape:
            raise ValueError(f"{call}: {what} takes no batch dims; the arguments broadcast to batch shape "
                             f"{self.shape} (call it once per element)")
        return self

    def but(self, arrays: Sequence[Any], specs: Sequence[ArgSpec] | None = None) -> Batch:
        """The same call with other arrays (and specs); the batch shape is recomputed."""
        specs = tuple(self.specs if specs is None else specs)
        shapes = [np.shape(a)[: np.ndim(a) - len(s.shape)] for a, s in zip(arrays, specs, strict=True)]
        return Batch(tuple(arrays), specs, tuple(np.broadcast_shapes(*shapes)) if shapes else (), self.device)


def to_numpy(value: Any, name: str, call: str) -> np.ndarray:
    """A NumPy view (or copy) of ``value``; refuses what holds no numbers."""
    if is_tensor(value):
        value = value.detach()
        if value.is_complex():
            raise TypeError(f"{call}: argument {name!r} is complex; tidiff differentiates real values")
        return value.cpu().numpy()
    if isinstance(value, (bool, np.bool_)):
        return np.asarray(value, dtype=np.int32)
    try:
        array = np.asarray(value)
    except ValueError as error:  # a ragged list
        raise ValueError(f"{call}: argument {name!r} is not a rectangular array of numbers ({error})") from None
    if array.dtype.kind not in "fiub":
        raise TypeError(
            f"{call}: argument {name!r} must hold real numbers "
            f"(a NumPy array, torch tensor or Python number), got {type(value).__name__} "
            f"of dtype {array.dtype}"
        )
    return array


def adapt(spec: ArgSpec, value: Any) -> ArgSpec:
    """The spec of one call's argument: a float spec takes the value's float precision
    (NOTE: [Float precision] in ``_signature``); Python numbers take ``default_fp``."""
    if not spec.is_float:
        return spec
    dtype = getattr(value, "dtype", None)
    if dtype is None or isinstance(value, (float, int)):
        return spec if spec.dtype == default_float() else ArgSpec(spec.name, spec.shape, default_float())
    try:
        dtype = numpy_dtype(dtype)
    except TypeError as e:
        raise TypeError(f"argument {spec.name!r}: {e}") from None
    if dtype.kind == "f" and dtype != spec.dtype:
        return ArgSpec(spec.name, spec.shape, dtype)
    return spec


def cast_to_spec(array: np.ndarray, spec: ArgSpec, name: str, call: str) -> np.ndarray:
    """Cast to the spec's dtype: integers widen to floats, never floats to integers."""
    if array.dtype == spec.dtype:
        return array
    if not spec.is_float and array.dtype.kind == "f":
        raise TypeError(f"{call}: argument {name!r} expects integer values ({spec.dtype}), got {array.dtype}")
    return array.astype(spec.dtype)


def read_args(specs: Sequence[ArgSpec], args: Sequence[Any], call: str) -> Batch:
    """Check and convert the arguments of a host call against their specs.

    Returns a :class:`Batch`. Raises ``TypeError`` for a wrong count or
    dtype and ``ValueError`` for a wrong core shape or batch dims that do not
    broadcast, naming the argument.
    """
    if len(args) != len(specs):
        names = ", ".join(s.name for s in specs)
        raise TypeError(f"{call}: expected {len(specs)} arguments ({names}), got {len(args)}")
    device = next((value.device for value in args if is_tensor(value)), None)
    arrays = []
    for spec, value in zip(specs, args, strict=True):
        array = cast_to_spec(to_numpy(value, spec.name, call), spec, spec.name, call)
        core = array.shape[array.ndim - len(spec.shape):] if spec.shape else ()
        if array.ndim < len(spec.shape) or core != spec.shape:
            raise ValueError(
                f"{call}: argument {spec.name!r} must have core shape {spec.shape}"
                f"{' (a scalar)' if not spec.shape else ''} in its trailing dims, got an array of shape {array.shape}"
            )
        arrays.append(array)
    batches = [a.shape[: a.ndim - len(s.shape)] for a, s in zip(arrays, specs, strict=True)]
    try:
        batch_shape = np.broadcast_shapes(*batches)
    except ValueError:
        listed = ", ".join(f"{s.name}: {b}" for s, b in zip(specs, batches, strict=True))
        raise ValueError(f"{call}: batch dims do not broadcast ({listed})") from None
    return Batch(tuple(arrays), tuple(specs), tuple(batch_shape), device)


def unbroadcast(array: Any, shape: Sequence[int]) -> np.ndarray:
    """Sum a batch-shaped cotangent back onto an argument of ``shape`` (NumPy broadcasting reversed)."""
    array = np.asarray(array)
    shape = tuple(shape)
    if array.shape == shape:
        return array
    lead = array.ndim - len(shape)
    array = array.sum(axis=tuple(range(lead))) if lead else array
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and array.shape[i] != 1)
    return np.asarray(array.sum(axis=axes, keepdims=True)) if axes else np.asarray(array)


def owned_copy(array: Any) -> Any:
    """A copy no caller holds (a NumPy array, or a torch tensor for the engines that take them)."""
    if is_tensor(array):
        return array.detach().clone()
    return np.array(array, copy=True)
