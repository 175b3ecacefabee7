"""Source-to-source forward mode: ``jvp_func(f)`` for a ``@ti.func``, ``jvp_kernel(k, tangents)``
for a kernel over global fields, and the generated ``source``."""
from .emit import jvp_func as jvp_func, source as source
from .kernels import FieldTangents as FieldTangents, jvp_kernel as jvp_kernel
from .rules import CUSTOM_JVPS as CUSTOM_JVPS, RULES as RULES, stop_gradient as stop_gradient


def register_jvp(f, jvp):
    """Make the transform call ``jvp`` wherever ``f`` is called (the td.custom_jvp hook).

    ``jvp`` is a ``@ti.func`` taking all primals, then all tangents (zeros
    spelled out for inactive ones), and returning ``(out, dout)``.
    """
    CUSTOM_JVPS[f] = jvp


__all__ = ["jvp_func", "jvp_kernel", "FieldTangents", "source", "register_jvp", "stop_gradient", "RULES", "CUSTOM_JVPS"]
