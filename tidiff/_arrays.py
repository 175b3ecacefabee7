"""Host values in and out: NumPy, torch tensors and Python numbers.

Every host call goes through :func:`read_args`: it checks each argument's
trailing dims against its core shape and its dtype against the spec, and
finds the broadcast batch shape, so that a bad argument is refused before
anything runs. The result is a :class:`Batch`.

NOTE: [Tensors in place] Taichi launches a kernel on a torch tensor's memory
through its data pointer. A tensor on the device Taichi computes on (a CUDA
tensor on a CUDA runtime: :data:`IN_PLACE`) is therefore given to the kernels
of a pointwise function as it is, loaded into a field program's fields by
``from_torch``, and results are tensors made there (``to_torch``): no copy to
the host and back. Functions that compute so say ``tensors_in_place``. The
first vjp of a function whose reverse mode is checked (NOTE: [Checking
Taichi's reverse mode] in ``_reverse_check``) reads its arguments on the
host, once. A tensor elsewhere (a CUDA tensor on Taichi's
CPU runtime, a CPU tensor on its CUDA runtime) is copied where Taichi
computes and its results back, once per call; on the CPU a tensor's NumPy
view is in place already, and NumPy is what the rest of tidiff computes with.
The array helpers below take NumPy arrays and tensors alike.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from taichi.lang import impl
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


#: Taichi's arch -> the torch device type whose tensors are computed on in place
#: (NOTE: [Tensors in place]).
IN_PLACE: dict[str, str] = {"cuda": "cuda"}


def runs_in_place(device: Any) -> bool:
    """Whether tensors on ``device`` are computed on where they are (NOTE: [Tensors in place])."""
    return device is not None and device.type in IN_PLACE.values() and \
        IN_PLACE.get(impl.current_cfg().arch.name) == device.type


def tensor_device(arrays: Sequence[Any]) -> Any:
    """The device of the first tensor among ``arrays`` (engines given tensors in place), or None (NumPy)."""
    return next((a.device for a in arrays if is_tensor(a)), None)


@dataclasses.dataclass(frozen=True)
class Batch:
    """Checked arguments of one host call.

    ``arrays`` are NumPy arrays, or torch tensors for kinds that take them as
    they are (``Function.native_tensors``, NOTE: [Tensors in place]); ``shape`` is the broadcast batch
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


def on_device(value: Any, spec: ArgSpec, device: Any, call: str) -> Any:
    """``value`` as a tensor of the spec's dtype on ``device`` (NOTE: [Tensors in place]); a tensor there already
    is not copied."""
    torch = torch_module()
    if not is_tensor(value):
        return torch.as_tensor(cast_to_spec(to_numpy(value, spec.name, call), spec, spec.name, call), device=device)
    tensor = value.detach()
    if tensor.is_complex():
        raise TypeError(f"{call}: argument {spec.name!r} is complex; tidiff differentiates real values")
    if not spec.is_float and tensor.dtype.is_floating_point:
        raise TypeError(f"{call}: argument {spec.name!r} expects integer values ({spec.dtype}), got "
                        f"{numpy_dtype(tensor.dtype)}")
    return of_dtype(tensor, spec.dtype, device)


def read_args(specs: Sequence[ArgSpec], args: Sequence[Any], call: str, in_place: bool = False) -> Batch:
    """Check and convert the arguments of a host call against their specs.

    Returns a :class:`Batch`: NumPy arrays, or with ``in_place`` (a pointwise
    function) tensors on the device Taichi computes on where the first tensor
    is there (NOTE: [Tensors in place]). Raises ``TypeError`` for a wrong count
    or dtype and ``ValueError`` for a wrong core shape or batch dims that do
    not broadcast, naming the argument.
    """
    if len(args) != len(specs):
        names = ", ".join(s.name for s in specs)
        raise TypeError(f"{call}: expected {len(specs)} arguments ({names}), got {len(args)}")
    device = tensor_device(args)
    in_place = in_place and runs_in_place(device)
    arrays = []
    for spec, value in zip(specs, args, strict=True):
        array = on_device(value, spec, device, call) if in_place else \
            cast_to_spec(to_numpy(value, spec.name, call), spec, spec.name, call)
        core = array.shape[array.ndim - len(spec.shape):] if spec.shape else ()
        if array.ndim < len(spec.shape) or tuple(core) != spec.shape:
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


def unbroadcast(array: Any, shape: Sequence[int]) -> Any:
    """Sum a batch-shaped cotangent back onto an argument of ``shape`` (NumPy broadcasting reversed); a tensor
    stays a tensor, differentiable."""
    array = array if is_tensor(array) else np.asarray(array)
    shape = tuple(shape)
    if tuple(array.shape) == shape:
        return array
    lead = array.ndim - len(shape)
    array = array.sum(axis=tuple(range(lead))) if lead else array
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and array.shape[i] != 1)
    array = array.sum(axis=axes, keepdims=True) if axes else array
    return array if is_tensor(array) else np.asarray(array)


def empty(shape: tuple[int, ...], dtype: np.dtype, device: Any = None) -> Any:
    """An uninitialised array: NumPy, or a tensor on ``device`` (NOTE: [Tensors in place])."""
    if device is None:
        return np.empty(shape, dtype)
    return torch_module().empty(shape, dtype=torch_dtype(dtype), device=device)


def zeros(shape: tuple[int, ...], dtype: np.dtype, device: Any = None) -> Any:
    """Zeros: NumPy, or a tensor on ``device``."""
    if device is None:
        return np.zeros(shape, dtype)
    return torch_module().zeros(shape, dtype=torch_dtype(dtype), device=device)


def of_dtype(array: Any, dtype: np.dtype, device: Any = None) -> Any:
    """``array`` in ``dtype``: NumPy, or a tensor on ``device`` (not copied where it is one already)."""
    if device is None:
        return np.asarray(array, dtype)
    torch = torch_module()
    wanted = torch_dtype(dtype)
    tensor = array if is_tensor(array) else torch.as_tensor(np.asarray(array))
    return tensor if tensor.dtype == wanted and tensor.device == device else tensor.to(device=device, dtype=wanted)


def broadcast_to(array: Any, shape: tuple[int, ...]) -> Any:
    return array.expand(shape) if is_tensor(array) else np.broadcast_to(array, shape)


def contiguous(array: Any) -> Any:
    """``array`` in C order (not copied where it is); a 0-d array stays 0-d (``np.ascontiguousarray`` makes it 1-d)."""
    return array.contiguous() if is_tensor(array) else np.require(array, requirements="C")


def owned_copy(array: Any) -> Any:
    """A copy no caller holds (a NumPy array, or a torch tensor for the engines that take them)."""
    if is_tensor(array):
        return array.detach().clone()
    return np.array(array, copy=True)
