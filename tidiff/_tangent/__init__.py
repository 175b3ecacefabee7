"""Source-to-source forward mode for ``@ti.func``: ``jvp_func(f)`` and its generated ``source``."""
from .emit import jvp_func as jvp_func, source as source
from .rules import CUSTOM_JVPS as CUSTOM_JVPS, RULES as RULES, stop_gradient as stop_gradient


def register_jvp(f, jvp):
    """Make the transform call ``jvp`` wherever ``f`` is called (the td.custom_jvp hook).

    ``jvp`` is a ``@ti.func`` taking all primals, then all tangents (zeros
    spelled out for inactive ones), and returning ``(out, dout)``.
    """
    CUSTOM_JVPS[f] = jvp


__all__ = ["jvp_func", "source", "register_jvp", "stop_gradient", "RULES", "CUSTOM_JVPS"]
