"""``td.custom_jvp``: a ``@ti.func`` with a derivative rule of the user's.

The rule replaces the tangent transform of the function wherever it is
called: in its own transforms, in every function that calls it, on the host
and inside kernels. Reverse mode of any code that reaches a rule transposes
the rule (the per-element Jacobian from forward mode), since Taichi's own
reverse mode would differentiate the function's code and ignore the rule.
"""
import inspect

import taichi as ti

from ._codegen import compile_source
from ._pointwise import FuncFunction, identifier
from ._tangent import CUSTOM_JVPS, register_jvp, stop_gradient


class CustomJvpFunction(FuncFunction):
    """A ``@ti.func`` whose tangent is given by a rule (see :func:`custom_jvp`)."""

    def __init__(self, tifunc):
        super().__init__(tifunc)
        pyfunc = getattr(tifunc, "__wrapped__", None) or tifunc.func.func
        self.__signature__ = inspect.signature(pyfunc)
        self.rule = None
        params = ", ".join(self._names)
        name = identifier(self.name)
        source = f"@ti.func\ndef {name}({params}):\n    return {name}_custom({params})\n"
        self._wrapper = compile_source(source, name, {"ti": ti, f"{name}_custom": self}, "custom")

    def defjvp(self, rule):
        """Attach the rule: a ``@ti.func`` ``(*primals, *tangents) -> (out, tangent_out)``.

        Every primal gets a tangent (zeros for those not differentiated).
        Returns ``rule``, so it can be used as a decorator.
        """
        if not getattr(rule, "_is_taichi_function", False):
            raise TypeError(f"{self.name}.defjvp: the rule must be a @ti.func, got {type(rule).__name__}")
        self.rule = rule
        register_jvp(self, rule)
        return rule

    def body_for(self, in_specs):
        if self.rule is None:
            raise TypeError(f"{self.name} is a td.custom_jvp function without a rule: call {self.name}.defjvp(rule) first")
        return self._wrapper

    def call_in_kernel(self, *args):
        return self.tifunc(*args)


def custom_jvp(f):
    """Give a ``@ti.func`` a derivative rule of your own (JAX's ``jax.custom_jvp``).

    Args:
        f: a ``@ti.func``.

    Returns:
        A ``td.Function`` that calls ``f``; attach the rule with ``defjvp``.
        The rule is a ``@ti.func`` taking all primals, then one tangent per
        primal, and returning ``(out, tangent_out)`` (JAX passes tuples;
        Taichi functions take flat arguments).

    Example:
        >>> @td.custom_jvp
        ... @ti.func
        ... def safe_log(x):
        ...     return ti.log(x)
        >>> @safe_log.defjvp
        ... @ti.func
        ... def safe_log_jvp(x, dx):
        ...     return ti.log(x), dx / ti.max(x, 1e-12)
    """
    if not getattr(f, "_is_taichi_function", False):
        raise TypeError(f"td.custom_jvp: expected a @ti.func, got {type(f).__name__}")
    return CustomJvpFunction(f)


def reaches_custom_rule(body, _seen=None):
    """Whether ``body`` or a ``@ti.func`` it calls (by global or closure name) has a custom rule.

    ``td.stop_gradient`` counts as one: Taichi's reverse mode sees only an identity.
    """
    seen = set() if _seen is None else _seen
    if id(body) in seen:
        return False
    seen.add(id(body))
    pyfunc = getattr(body, "__wrapped__", None) or getattr(getattr(body, "func", None), "func", None)
    if pyfunc is None or not hasattr(pyfunc, "__code__"):
        return False
    names = _names(pyfunc.__code__)
    values = [pyfunc.__globals__.get(n) for n in names]
    values += [c.cell_contents for c in (pyfunc.__closure__ or ()) if _filled(c)]
    values += [getattr(m, n, None) for m in values if inspect.ismodule(m) for n in names]  # td.stop_gradient
    for value in values:
        try:
            if value is stop_gradient or value in CUSTOM_JVPS:
                return True
        except TypeError:  # unhashable
            continue
        if getattr(value, "_is_taichi_function", False) and reaches_custom_rule(value, seen):
            return True
    return False


def _names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _names(const)
    return names


def _filled(cell):
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True
