"""Host values in and out: NumPy, torch tensors and Python numbers.

Every host call goes through :func:`read_args`: it checks each argument's
trailing dims against its core shape and its dtype against the spec, and
finds the broadcast batch shape, so that a bad argument is refused before
anything runs.
"""
import sys

import numpy as np

from ._errors import describe_shape


def _torch():
    return sys.modules.get("torch")


def is_tensor(value):
    torch = _torch()
    return torch is not None and isinstance(value, torch.Tensor)


class ArgBatch:
    """Arguments of one host call as NumPy arrays, with their common batch shape."""

    def __init__(self, arrays, batch_shape, torch_device=None):
        self.arrays = arrays
        self.batch_shape = batch_shape
        self.torch_device = torch_device

    def wrap(self, array):
        """Return a result the way the caller gave arguments: NumPy, or torch on their device."""
        if self.torch_device is None or array is None:
            return array
        return _torch().from_numpy(contiguous(array)).to(self.torch_device)


def to_numpy(value, name, call):
    """A NumPy view (or copy) of ``value``; refuses what holds no numbers."""
    if is_tensor(value):
        value = value.detach()
        if value.is_complex():
            raise TypeError(f"{call}: argument {name!r} is complex; tidiff differentiates real values")
        return value.cpu().numpy()
    if isinstance(value, (bool, np.bool_)):
        return np.asarray(value, dtype=np.int32)
    array = np.asarray(value)
    if array.dtype.kind not in "fiub":
        raise TypeError(
            f"{call}: argument {name!r} must hold real numbers "
            f"(a NumPy array, torch tensor or Python number), got {type(value).__name__} "
            f"of dtype {array.dtype}"
        )
    return array


def cast_to_spec(array, spec, name, call):
    """Cast to the spec's dtype: integers widen to floats, never floats to integers."""
    if array.dtype == spec.dtype:
        return array
    if not spec.is_float and array.dtype.kind == "f":
        raise TypeError(
            f"{call}: argument {name!r} expects integer values ({spec.dtype}), got {array.dtype}"
        )
    return array.astype(spec.dtype)


def read_args(specs, args, call):
    """Check and convert the arguments of a host call against their specs.

    Returns an :class:`ArgBatch`. Raises ``TypeError`` for a wrong count or
    dtype and ``ValueError`` for a wrong core shape or batch dims that do not
    broadcast, naming the argument.
    """
    if len(args) != len(specs):
        names = ", ".join(s.name for s in specs)
        raise TypeError(f"{call}: expected {len(specs)} arguments ({names}), got {len(args)}")
    device = None
    for value in args:
        if is_tensor(value):
            device = value.device
            break
    arrays = []
    for spec, value in zip(specs, args):
        array = cast_to_spec(to_numpy(value, spec.name, call), spec, spec.name, call)
        core = array.shape[array.ndim - len(spec.shape):] if spec.shape else ()
        if array.ndim < len(spec.shape) or core != spec.shape:
            raise ValueError(
                f"{call}: argument {spec.name!r} must have core shape {spec.shape} "
                f"({describe_shape(spec.shape)}) in its trailing dims, got an array of shape {array.shape}"
            )
        arrays.append(array)
    batches = [a.shape[: a.ndim - len(s.shape)] for a, s in zip(arrays, specs)]
    try:
        batch_shape = np.broadcast_shapes(*batches)
    except ValueError:
        listed = ", ".join(f"{s.name}: {b}" for s, b in zip(specs, batches))
        raise ValueError(f"{call}: batch dims do not broadcast ({listed})") from None
    return ArgBatch(arrays, tuple(batch_shape), device)


def unbroadcast(array, shape):
    """Sum a batch-shaped cotangent back onto an argument of ``shape`` (NumPy broadcasting reversed)."""
    array = np.asarray(array)
    if array.shape == tuple(shape):
        return array
    lead = array.ndim - len(shape)
    array = array.sum(axis=tuple(range(lead))) if lead else array
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and array.shape[i] != 1)
    return np.asarray(array.sum(axis=axes, keepdims=True)) if axes else np.asarray(array)


def contiguous(array):
    """A C-contiguous array of the same shape (``np.ascontiguousarray`` turns 0-d into 1-d)."""
    array = np.asarray(array)
    return array if array.flags.c_contiguous else array.copy(order="C")


def owned_copy(array):
    """A copy no caller holds (a NumPy array, or a torch tensor for the engines that take them)."""
    if is_tensor(array):
        return array.detach().clone()
    return np.array(array, copy=True)
