"""Counting the copies between host and device that code makes (tests and ``bench/gpu.py``).

On a CUDA Taichi runtime data crosses between host and device memory where

- a kernel is launched with an argument in host memory (a NumPy array, a CPU
  tensor): Taichi's launcher copies it to the device and back;
- a kernel returns values: they are read back to the host;
- a CUDA tensor is read on the host (``.cpu()``, ``.numpy()``, ``.item()``,
  ``.tolist()``, ``np.asarray``) or made from host data (``.to("cuda")`` of a
  CPU tensor, ``torch.tensor``/``torch.as_tensor`` on a CUDA device).

:class:`HostCopies` counts each of these while it is entered, by wrapping
Taichi's ``Kernel.launch_kernel`` and those torch entry points; what it counts
is named in :attr:`HostCopies.seen`. Only on a CUDA Taichi runtime do Taichi's
launches count (on the CPU host memory is the device's).
"""
from __future__ import annotations

import collections
import sys
from types import TracebackType
from typing import Any

import numpy as np
from taichi.lang import impl
from taichi.lang.kernel_impl import Kernel

_INHERITED = object()  # an attribute the class inherits: removed again on exit
_READS = ("cpu", "numpy", "item", "tolist", "__array__")


def _on_cuda(value: Any) -> bool:
    device = getattr(value, "device", None)
    return getattr(device, "type", None) == "cuda"


def _names_cuda(device: Any) -> bool:
    return str(device).startswith("cuda")


class HostCopies:
    """``with HostCopies() as copies: ...`` then ``copies.count`` (see the module docstring)."""

    def __init__(self) -> None:
        self.seen: collections.Counter[str] = collections.Counter()
        self._undo: list[tuple[Any, str, Any]] = []

    @property
    def count(self) -> int:
        return sum(self.seen.values())

    def _wrap(self, owner: Any, name: str, make: Any) -> None:
        original = getattr(owner, name)
        self._undo.append((owner, name, owner.__dict__.get(name, _INHERITED)))
        setattr(owner, name, make(original))

    def __enter__(self) -> HostCopies:
        seen = self.seen

        def launch(original: Any) -> Any:
            def launch_kernel(kernel: Any, compiled: Any, *args: Any) -> Any:
                if impl.current_cfg().arch.name == "cuda":
                    for a in args:
                        if isinstance(a, np.ndarray) or (hasattr(a, "data_ptr") and not _on_cuda(a)):
                            seen[f"host array into {kernel.func.__name__}"] += 1
                    if kernel.return_type:
                        seen[f"result of {kernel.func.__name__}"] += 1
                return original(kernel, compiled, *args)
            return launch_kernel

        self._wrap(Kernel, "launch_kernel", launch)
        torch = sys.modules.get("torch")
        if torch is None:
            return self
        for name in _READS:
            def read(original: Any, name: str = name) -> Any:
                def method(tensor: Any, *args: Any, **kwargs: Any) -> Any:
                    if _on_cuda(tensor):
                        seen[f"tensor.{name}"] += 1
                    return original(tensor, *args, **kwargs)
                return method
            self._wrap(torch.Tensor, name, read)

        def to(original: Any) -> Any:
            def method(tensor: Any, *args: Any, **kwargs: Any) -> Any:
                target = kwargs.get("device", args[0] if args and not isinstance(args[0], torch.dtype) else None)
                if target is not None and not isinstance(target, torch.Tensor) and \
                        _names_cuda(target) != _on_cuda(tensor):
                    seen["tensor.to"] += 1
                return original(tensor, *args, **kwargs)
            return method

        self._wrap(torch.Tensor, "to", to)
        for name in ("tensor", "as_tensor"):
            def make(original: Any, name: str = name) -> Any:
                def factory(data: Any, *args: Any, **kwargs: Any) -> Any:
                    if _names_cuda(kwargs.get("device")) and not _on_cuda(data):
                        seen[f"torch.{name}"] += 1
                    return original(data, *args, **kwargs)
                return factory
            self._wrap(torch, name, make)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        for owner, name, original in reversed(self._undo):
            if original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._undo.clear()
