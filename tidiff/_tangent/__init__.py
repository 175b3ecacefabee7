"""Source-to-source forward mode: ``jvp_func(f)`` for a ``@ti.func``, ``jvp_kernel(k, tangents)``
for a kernel over global fields, ``jvp_ndarray_kernel(k, inputs, outputs)`` for a kernel over
ndarrays (the same transformer), and the generated ``source``."""
from .emit import jvp_func as jvp_func
from .emit import source as source
from .kernels import FieldTangents as FieldTangents
from .kernels import jvp_kernel as jvp_kernel
from .kernels import jvp_ndarray_kernel as jvp_ndarray_kernel

__all__ = ["jvp_func", "jvp_kernel", "jvp_ndarray_kernel", "FieldTangents", "source"]
