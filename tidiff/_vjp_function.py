"""The cotangent map of a function as a Function of its own: ``(x, c) -> J(x)^T c``.

A vjp that is itself a ``td.Function`` can be transformed again: its jvp in
``x`` is a Hessian-vector product (``sum_k c_k H_k u``), its jvp in ``c`` is
``J u``. The torch operator's double backward is built on it.
"""
import taichi as ti

from ._bodies import BodyWriter, body_params, tangent_functions, vjp_lines
from ._codegen import compile_source
from ._pointwise import DerivedFunction, identifier
from ._signature import ArgSpec


class VjpFunction(DerivedFunction):
    """``(primals..., one cotangent per output) -> (cotangent of each float primal, ...)``, per element.

    Results are per batch element (not summed over broadcast dims); a
    function without a body (a field program) uses its reverse engine.
    """

    def __init__(self, parent):
        super().__init__(f"vjp_fn({parent.name})")
        self.parent = parent
        self._bodies = {}

    def _split(self, specs):
        n = len(specs) - len(self._out_specs_for(specs))
        return specs[:n], specs[n:]

    def _out_specs_for(self, specs):
        # the parent's inputs come first; their count is the parent's arity
        primal = specs[: self._arity(specs)]
        out_specs, _ = self.parent.signature(primal)
        return out_specs

    def _arity(self, specs):
        declared = self.parent.declared_specs()
        return len(declared) if declared is not None else len(self.parent.param_names())

    def declared_specs(self):
        primal = self.parent.declared_specs()
        if primal is None:
            return None
        out_specs, _ = self.parent.signature(primal)
        return list(primal) + [ArgSpec(f"ct_{o.name}", o.shape, o.dtype) for o in out_specs]

    def param_names(self):
        return self.parent.param_names() + ["cotangents"]

    def specs_for(self, args):
        n = self._arity([None] * len(args))
        primal = self.parent.specs_for(args[:n])
        out_specs, _ = self.parent.signature(primal)
        return list(primal) + [ArgSpec(f"ct_{o.name}", o.shape, o.dtype) for o in out_specs]

    def signature(self, in_specs):
        primal, _ = self._split(in_specs)
        outs = [ArgSpec(f"ct_{s.name}", s.shape, s.dtype) for s in primal if s.is_float]
        return outs, tuple(range(len(outs)))

    def _make_body(self, specs):
        primal, cts = self._split(specs)
        parent_body = self.parent.body_for(primal)
        if parent_body is None:
            return None
        out_specs, tree = self.parent.signature(primal)
        floats = tuple(k for k, s in enumerate(primal) if s.is_float)
        params = body_params(primal)
        ct_names = [f"ct_{j}" for j in range(len(cts))]
        jvp_name = identifier(self.parent.name) + "_jvp"
        active = tuple(k in floats for k in range(len(primal)))
        writer = BodyWriter(identifier(self.name), params + ct_names, parent_body, active)
        grads = vjp_lines(writer, jvp_name, params, primal, floats, out_specs, not isinstance(tree, tuple), ct_names)
        source = writer.source([grads[a] for a in floats], single=False)
        namespace = {"ti": ti, **tangent_functions(writer, jvp_name, parent_body, active)}
        return writer.finish(compile_source(source, writer.name, namespace, "vjp"))

    def _evaluate(self, batch, counter):
        if self.body_for(batch.specs) is not None:
            return super()._evaluate(batch, counter)
        primal_specs, _ = self._split(batch.specs)
        n = len(primal_specs)
        from ._arrays import ArgBatch

        inner = ArgBatch(batch.arrays[:n], batch.batch_shape, batch.torch_device)
        inner.specs = primal_specs
        _, grads = self.parent._vjp(inner, batch.arrays[n:], counter)
        return [g for g, s in zip(grads, primal_specs) if s.is_float]


def vjp_function(f):
    """The (cached) :class:`VjpFunction` of a Function."""
    cache = f.__dict__.setdefault("_vjp_function", [])
    if not cache:
        cache.append(VjpFunction(f))
    return cache[0]


