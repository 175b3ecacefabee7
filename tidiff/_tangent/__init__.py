"""Source-to-source forward mode: ``jvp_func(f)`` for a ``@ti.func``, ``jvp_kernel(k, tangents)``
for a kernel over global fields, ``jvp_ndarray_kernel(k, inputs, outputs)`` for a kernel over
ndarrays (the same transformer), and the generated ``source``."""
from typing import Any

from .emit import jvp_func as jvp_func
from .emit import source as source
from .kernels import FieldTangents as FieldTangents
from .kernels import jvp_kernel as jvp_kernel
from .kernels import jvp_ndarray_kernel as jvp_ndarray_kernel
from .rules import CUSTOM_JVPS as CUSTOM_JVPS
from .rules import CUSTOM_VJPS as CUSTOM_VJPS
from .rules import RULES as RULES
from .rules import stop_gradient as stop_gradient


def register_jvp(f: Any, jvp: Any) -> None:
    """Make the transform call ``jvp`` wherever ``f`` is called (the td.custom_jvp hook).

    ``jvp`` is a ``@ti.func`` taking all primals, then all tangents (zeros
    spelled out for inactive ones), and returning ``(out, dout)``.
    """
    CUSTOM_JVPS[f] = jvp


def register_vjp(f: Any, bwd: Any) -> None:
    """Make the reverse transform call ``bwd`` wherever ``f`` is called (the td.custom_vjp hook).

    ``bwd`` is a ``@ti.func`` taking all primals, then one cotangent per output, and
    returning a tuple with one cotangent per primal.
    """
    CUSTOM_VJPS[f] = bwd


__all__ = [
    "jvp_func",
    "jvp_kernel",
    "jvp_ndarray_kernel",
    "FieldTangents",
    "source",
    "register_jvp",
    "register_vjp",
    "stop_gradient",
    "RULES",
    "CUSTOM_JVPS",
    "CUSTOM_VJPS",
]
