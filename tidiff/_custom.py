"""``td.custom_jvp`` and ``td.custom_vjp``: a ``@ti.func`` with a derivative rule of the user's.

A vjp rule becomes a jvp rule by transposition (``J u`` assembled from
``J^T e_q``, one call per output component), so both kinds act alike.
The rule replaces the tangent transform of the function wherever it is
called: in its own transforms, in every function that calls it, on the host
and inside kernels; reverse mode of ``@ti.func`` code is forward mode
transposed (``_pointwise``), so it uses the rule too.
"""
import inspect

import taichi as ti

from ._batch import probe_outputs
from ._bodies import BodyWriter, _dynamic_index, basis, zero
from ._codegen import compile_source
from ._pointwise import FuncFunction, identifier
from ._signature import ArgSpec
from ._tangent import register_jvp


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


class CustomVjpFunction(CustomJvpFunction):
    """A ``@ti.func`` whose cotangent map is given by a rule (see :func:`custom_vjp`)."""

    def defvjp(self, bwd):
        """Attach the rule: a ``@ti.func`` ``(*primals, *cotangents) -> tuple of primal cotangents``.

        One cotangent per output comes in; a tuple with one entry per primal
        (in the primal's shape; anything for integer primals) goes out, as in
        JAX. Returns ``bwd``, so it can be used as a decorator.
        """
        call = f"{self.name}.defvjp"
        if not getattr(bwd, "_is_taichi_function", False):
            raise TypeError(f"{call}: the rule must be a @ti.func, got {type(bwd).__name__}")
        specs = self.declared_specs()
        if specs is None:
            raise TypeError(f"{call}: td.custom_vjp needs annotated parameters (or td.function(f, signature=...))")
        out_specs, tree = self.signature(specs)
        cts = [ArgSpec(f"ct_{o.name}", o.shape, o.dtype) for o in out_specs]
        got, is_tuple, kernel = probe_outputs(bwd, specs + cts, identifier(self.name) + "_bwd")
        self._counter.add(kernel)
        shapes = [s.shape for s in specs]
        if not is_tuple or [g.shape for g in got] != shapes:
            returned = [g.shape for g in got] if is_tuple else got[0].shape
            raise TypeError(
                f"{call}: the rule must return a tuple with one cotangent per primal, shaped {shapes}; "
                f"it returned {'a tuple shaped ' if is_tuple else 'a single value shaped '}{returned}"
            )
        self.bwd = bwd
        self.defjvp(self._transposed(bwd, specs, out_specs, not isinstance(tree, tuple)))
        return bwd

    def _transposed(self, bwd, specs, out_specs, single):
        """The jvp rule ``u -> J u`` with row ``q`` of ``J`` read as ``bwd(x, e_q)``."""
        name = identifier(self.name)
        params = [s.name for s in specs]
        tangents = [f"d{p}" for p in params]
        w = BodyWriter(f"{name}_jvp_by_vjp", params + tangents)
        w.line(f"out = {name}_primal({', '.join(params)})")
        for o, spec in enumerate(out_specs):
            if spec.shape:
                w.line(f"dout_{o} = {zero(spec.shape, spec.dtype)}")
            cotangents = [basis(c, None) for c in out_specs]
            if spec.size == 1:
                cotangents[o] = basis(spec, 0)
                indent, target = "", f"dout_{o}" + ("[0]" if spec.shape else "")
            else:
                w.line(f"for q in range({spec.size}):")
                w.line(f"    c = {zero(spec.shape, spec.dtype)}")
                w.line(f"    c[{_dynamic_index(spec.shape, 'q')}] = 1.0")
                cotangents[o] = "c"
                indent, target = "    ", f"dout_{o}[{_dynamic_index(spec.shape, 'q')}]"
            w.line(f"{indent}row = {name}_bwd({', '.join(params + cotangents)})")
            terms = [
                f"row[{k}] * {t}" if s.shape == () else f"(row[{k}] * {t}).sum()"
                for k, (s, t) in enumerate(zip(specs, tangents)) if s.is_float
            ]
            w.line(f"{indent}{target} = {' + '.join(terms) or '0.0'}")
        douts = [f"dout_{o}" for o in range(len(out_specs))]
        w.line("dout = " + (douts[0] if single else "(" + ", ".join(douts) + ",)"))
        source = w.source(["out", "dout"], single=False)
        namespace = {"ti": ti, f"{name}_primal": self.tifunc, f"{name}_bwd": bwd}
        return compile_source(source, w.name, namespace, "custom_vjp")


def custom_vjp(f):
    """Give a ``@ti.func`` a cotangent rule of your own (JAX's ``jax.custom_vjp``).

    Args:
        f: a ``@ti.func`` with annotated parameters.

    Returns:
        A ``td.Function`` that calls ``f``; attach the rule with ``defvjp``.
        The rule takes all primals, then one cotangent per output, and
        returns a tuple with one cotangent per primal (JAX's ``bwd``, without
        residuals: per-element code recomputes what it needs).

    Every transform uses the rule: reverse mode directly, forward mode
    through its transpose (``J u`` from one rule call per output
    component), and second order by transforming the rule's code.

    Example:
        >>> @td.custom_vjp
        ... @ti.func
        ... def clip_grad(x: ti.f64) -> ti.f64:
        ...     return x
        >>> @clip_grad.defvjp
        ... @ti.func
        ... def clip_grad_bwd(x, ct):
        ...     return (ti.math.clamp(ct, -1.0, 1.0),)
    """
    if not getattr(f, "_is_taichi_function", False):
        raise TypeError(f"td.custom_vjp: expected a @ti.func, got {type(f).__name__}")
    return CustomVjpFunction(f)


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
