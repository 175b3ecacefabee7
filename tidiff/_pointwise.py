"""Pointwise functions: a ``@ti.func`` body mapped over a batch (API.md 1a).

The three engines of any function with a body live here: evaluation is one
:class:`~tidiff._batch.BatchKernel` launch; forward mode is the same launch
over the body's tangent transform (``_tangent``); reverse mode is forward
mode transposed, also one launch (NOTE: [Reverse by transposed forward]).
"""
import numpy as np
import taichi as ti
from taichi.lang import impl

from ._arrays import ArgBatch, unbroadcast
from ._batch import BatchKernel, ScalarKernel, flatten_batch, probe_in_kernel, probe_outputs
from ._bodies import BodyWriter
from ._codegen import compile_source
from ._function import Function
from ._signature import ArgSpec, input_specs, output_specs, parameter_names
from ._tree import flat_tree


def identifier(name):
    """A Python identifier made from a readable name such as ``grad(f)``."""
    out = "".join(c if c.isalnum() else "_" for c in name)
    while "__" in out:
        out = out.replace("__", "_")
    return out.strip("_") or "f"


def _cached(fn, table, key, make):
    cache = fn.__dict__.setdefault(table, {})
    if key not in cache:
        cache[key] = make()
    return cache[key]


def batch_kernel(fn, specs, counter):
    """The cached kernel evaluating ``fn``'s body over a batch, for these input specs."""
    key = tuple(specs)

    def make():
        out_specs, tree = fn.signature(list(key))
        return BatchKernel(fn.body_for(list(key)), key, out_specs, isinstance(tree, tuple), identifier(fn.name))

    bk = _cached(fn, "_batch_kernels", key, make)
    counter.add(bk.kernel)
    return bk


# NOTE: [Scalar calls] A call with no batch dims on a function of scalars
# (``td.grad(p)(1.0)``) runs a kernel taking and returning scalars by value:
# a parallel launch over one-element arrays costs several times more. Such a
# function compiles one more kernel the first time it is called that way.
# Once a call with Python numbers has run such a kernel for the function
# itself, later calls with the same argument types skip the checks and
# dispatch and launch it directly (``Function.__call__``): the numbers were
# checked by the first call, and a kernel taking scalars by value neither
# recompiles for new values nor keeps state between calls.


def scalar_kernel(fn, specs, counter):
    """The cached :class:`ScalarKernel` of ``fn``'s body for these (scalar) input specs."""
    key = tuple(specs)

    def make():
        out_specs, _ = fn.signature(list(key))
        return ScalarKernel(fn.body_for(list(key)), key, out_specs[0], identifier(fn.name))

    sk = _cached(fn, "_scalar_kernels", key, make)
    counter.add(sk.kernel)
    return sk


def evaluate_body(fn, specs, batch, counter):
    if batch.batch_shape == ():
        out_specs, tree = fn.signature(list(specs))
        if ScalarKernel.fits(specs, out_specs, isinstance(tree, tuple)):
            sk = scalar_kernel(fn, specs, counter)
            batch.scalar_kernel = (fn, sk)  # a later call with Python numbers goes straight to it
            return sk(batch.arrays)
    bk = batch_kernel(fn, specs, counter)
    n, inputs = flatten_batch(batch.arrays, specs, batch.batch_shape)
    return [o.reshape(batch.batch_shape + s.shape) for o, s in zip(bk(n, inputs), bk.out_specs)]


# NOTE: [Reverse by transposed forward] The vjp of a body is ``J^T c`` per
# element, computed by the generated ``VjpFunction`` body: one tangent push
# per input component, contracted with ``c``, in one launch. Taichi's own
# reverse mode (``kernel.grad``) is not used for bodies: on this Taichi it
# crashes the process (SIGBUS) on a runtime loop over a dynamically indexed
# local vector of 64 or more entries, which generated bodies are full of; it
# has no adjoint for ``ti.tan`` or ``while`` loops ("Not supported"); it would
# differentiate a custom rule's function instead of the rule; and on the host
# it costs a primal and an adjoint launch plus copies into gradient-carrying
# storage, where the transposed forward body is one launch. Field programs
# do use Taichi's reverse mode (``_fields``).


def vjp_by_forward(fn, specs, batch, cotangents, counter):
    """Outputs, and ``J^T c`` by :func:`cotangents_by_forward` (NOTE: [Reverse by transposed forward])."""
    return evaluate_body(fn, specs, batch, counter), cotangents_by_forward(fn, specs, batch, cotangents, counter)


def cotangents_by_forward(fn, specs, batch, cotangents, counter):
    """``J^T c`` per element from forward mode (``VjpFunction``, one launch), summed onto broadcast arguments."""
    from ._vjp_function import vjp_function

    out_specs, _ = fn.signature(specs)
    cts = [np.zeros(s.shape, s.dtype) if c is None else c for c, s in zip(cotangents, out_specs)]
    vfn = vjp_function(fn)
    vspecs = list(specs) + [ArgSpec(f"ct_{s.name}", s.shape, s.dtype) for s in out_specs]
    shapes = [a.shape[: a.ndim - len(s.shape)] for a, s in zip(list(batch.arrays) + cts, vspecs)]
    full = ArgBatch(list(batch.arrays) + cts, tuple(np.broadcast_shapes(*shapes)))
    full.specs = vspecs
    per_element = iter(evaluate_body(vfn, vspecs, full, counter))
    return [unbroadcast(next(per_element), a.shape) if s.is_float else None for a, s in zip(batch.arrays, specs)]


def jvp_of_body(fn, specs, batch, tangents, counter):
    """Forward mode: the body's tangent transform over the batch, in one launch."""
    tfn = tangent_function(fn, tuple(specs))
    extra = []
    for t, a, s in zip(tangents, batch.arrays, specs):
        if s.is_float:
            extra.append(np.zeros(s.shape, s.dtype) if t is None else np.asarray(t, s.dtype))
    arrays = list(batch.arrays) + extra
    shapes = [a.shape[: a.ndim - len(s.shape)] for a, s in zip(arrays, tfn.in_specs)]
    full = ArgBatch(arrays, tuple(np.broadcast_shapes(*shapes)))
    flat = evaluate_body(tfn, tfn.in_specs, full, counter)
    half = len(flat) // 2
    return flat[:half], flat[half:]


def tangent_function(fn, specs):
    """The (cached) :class:`TangentFunction` of ``fn`` for these input specs."""
    return _cached(fn, "_tangent_functions", tuple(specs), lambda: TangentFunction(fn, specs))


class BodyFunction(Function):
    """A function with a ``@ti.func`` body: the engines run that body over a batch."""

    def _evaluate(self, batch, counter):
        return evaluate_body(self, batch.specs, batch, counter)

    def _vjp(self, batch, cotangents, counter):
        return vjp_by_forward(self, batch.specs, batch, cotangents, counter)

    def _jvp(self, batch, tangents, counter):
        return jvp_of_body(self, batch.specs, batch, tangents, counter)

    def _cotangents(self, batch, cotangents, counter):
        return cotangents_by_forward(self, batch.specs, batch, cotangents, counter)


class DerivedFunction(BodyFunction):
    """A function made from a ``parent`` (a transform, a vjp map): it runs its body when the
    parent has one; otherwise the parent answers for its derivatives (``second_order_*``).

    Subclasses set ``self._bodies = {}`` and write ``_make_body(specs)``.
    """

    def body_for(self, in_specs):
        """The generated body for these input specs, made once by ``_make_body`` (None: no body)."""
        key = tuple(in_specs)
        if key not in self._bodies:
            self._bodies[key] = self._make_body(list(key))
        return self._bodies[key]

    def _jvp(self, batch, tangents, counter):
        if self.body_for(batch.specs) is None:
            return self.parent.second_order_jvp(self, batch, tangents, counter)
        return super()._jvp(batch, tangents, counter)

    def _vjp(self, batch, cotangents, counter):
        if self.body_for(batch.specs) is None:
            return self.parent.second_order_vjp(self, batch, cotangents, counter)
        return super()._vjp(batch, cotangents, counter)

    def _cotangents(self, batch, cotangents, counter):
        if self.body_for(batch.specs) is None:
            return self._vjp(batch, cotangents, counter)[1]
        return super()._cotangents(batch, cotangents, counter)


class FuncFunction(BodyFunction):
    """A ``@ti.func`` as a batched, differentiable function (API.md 1a)."""

    def __init__(self, tifunc, signature=None, name=None):
        pyfunc = getattr(tifunc, "__wrapped__", None) or tifunc.func.func
        super().__init__(name or pyfunc.__name__)
        self.tifunc = tifunc
        self._names = parameter_names(pyfunc)
        specs = input_specs(pyfunc, signature)
        self._declared = specs if all(s is not None for s in specs) else None
        self._out_annotation = output_specs(pyfunc)
        self._signatures = {}

    def declared_specs(self):
        return self._declared

    def param_names(self):
        return self._names

    def signature(self, in_specs):
        key = tuple(in_specs)
        if key not in self._signatures:
            ann = self._out_annotation
            if isinstance(ann, ArgSpec):
                self._signatures[key] = ([ann], 0)
            elif isinstance(ann, list) and all(s.shape != () for s in ann):
                self._signatures[key] = (ann, flat_tree(len(ann), False))
            else:  # no annotation, or a tuple one with scalars (which Taichi 1.7.4 cannot compile)
                if impl.inside_kernel():
                    out_specs, is_tuple = probe_in_kernel(self.tifunc, list(key))
                else:
                    out_specs, is_tuple, kernel = probe_outputs(self.tifunc, list(key), identifier(self.name))
                    self._counter.add(kernel)
                self._signatures[key] = (out_specs, flat_tree(len(out_specs), not is_tuple))
        return self._signatures[key]

    def body_for(self, in_specs):
        return self.tifunc


class TangentFunction(BodyFunction):
    """``(primals, tangents of the float args) -> (outs..., tangent outs...)``, flat."""

    def __init__(self, parent, specs):
        super().__init__(f"jvp({parent.name})", listed=False)
        from ._tangent import jvp_func

        self.parent_specs = list(specs)
        self.parent_out, tree = parent.signature(list(specs))
        self.in_specs = list(specs) + [ArgSpec("d" + s.name, s.shape, s.dtype) for s in specs if s.is_float]
        jvp_body = jvp_func(parent.body_for(list(specs)), tuple(s.is_float for s in specs))
        params = [f"p{k}" for k in range(len(self.in_specs))]  # user names may clash with d-names
        w = BodyWriter(identifier(self.name), params)
        w.line(f"r = {identifier(parent.name)}_jvp({', '.join(params)})")
        if isinstance(tree, tuple):
            m = len(self.parent_out)
            results = [f"r[0][{j}]" for j in range(m)] + [f"r[1][{j}]" for j in range(m)]
        else:
            results = ["r[0]", "r[1]"]
        source = w.source(results, single=False)
        namespace = {"ti": ti, f"{identifier(parent.name)}_jvp": jvp_body}
        self._body = compile_source(source, w.name, namespace, "jvp")
        self.jvp_body = jvp_body

    def declared_specs(self):
        return self.in_specs

    def signature(self, in_specs):
        outs = list(self.parent_out) + [ArgSpec("d" + s.name, s.shape, s.dtype) for s in self.parent_out]
        return outs, tuple(range(len(outs)))

    def body_for(self, in_specs):
        return self._body
