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
