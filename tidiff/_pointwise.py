"""Pointwise functions: a ``@ti.func`` body mapped over a batch, and the functions derived from one.

A :class:`Pointwise` function implements the protocol by generated code:
``evaluate`` is one launch of its body over the batch (``_codegen.batch``),
``tangent()`` is the body's tangent transform (``_tangent``) as a new
pointwise function, and ``vjp`` is one launch of its cotangent map's body,
summed onto broadcast arguments. Functions derived from a pointwise function
(its tangent, cotangent map and transforms, ``_transforms``) are pointwise
too, so every order is source transformation of source, and every one is
callable inside kernels.

NOTE: [Scalar calls] A call with no batch dims on a function of scalars
(``td.grad(p)(1.0)``) runs a kernel taking and returning scalars by value:
a parallel launch over one-element arrays costs several times more. Such a
function compiles one more kernel the first time it is called that way.
Once a call with Python numbers has run such a kernel, later calls with the
same argument types skip the checks and dispatch and launch it directly:
the numbers were checked by the first call, and a kernel taking scalars by
value neither recompiles for new values nor keeps state between calls.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from taichi.lang import impl

from ._arrays import (
    Batch,
    broadcast_to,
    contiguous,
    of_dtype,
    tensor_device,
    torch_dtype,
    unbroadcast,
    zeros,
)
from ._arrays import torch_module as _torch_module
from ._cache import uses
from ._codegen.batch import BatchKernel, ScalarKernel, flatten_batch, identifier, kernel_shape
from ._codegen.bodies import BodyWriter, cotangent_blocks, tangent_body
from ._derived import CotangentArguments, TangentArguments
from ._lang.launch import DirectLaunch
from ._protocol import Function, require_taichi
from ._signature import ArgSpec
from ._tree import Tree


class Pointwise(Function):
    """A function with a per-element ``@ti.func`` body: the protocol by generated kernels and bodies."""

    pointwise = True
    tensors_in_place = True

    def body_for(self, in_specs: Sequence[ArgSpec]) -> Any:
        """The body for these input specs, made once (:meth:`make_body`); a kind whose body is its own
        (a ``@ti.func``) returns that instead."""
        return self.memo.get(("body", tuple(in_specs)), lambda: self.make_body(list(in_specs)))

    def make_body(self, in_specs: list[ArgSpec]) -> Any:
        raise NotImplementedError

    def evaluate(self, batch: Batch) -> list[Any]:
        specs = list(batch.specs)
        out_specs, tree = self.signature(specs)
        device = tensor_device(batch.arrays)
        if batch.shape == () and device is None and ScalarKernel.fits(specs, out_specs, isinstance(tree, tuple)):
            sk = self.memo.get(("scalar kernel", tuple(specs)), lambda: ScalarKernel(
                self.body_for(specs), specs, out_specs[0], identifier(self.name)))
            uses(sk.kernel)
            return sk([np.asarray(a) for a in batch.arrays])
        bk = self.memo.get(("batch kernel", tuple(specs)), lambda: BatchKernel(
            self.body_for(specs), specs, out_specs, isinstance(tree, tuple), identifier(self.name)))
        uses(bk.kernel)
        n, inputs = flatten_batch(batch.arrays, specs, batch.shape)
        return [o.reshape(batch.shape + s.shape) for o, s in zip(bk(n, inputs, device=device), bk.out_specs,
                                                                 strict=True)]

    def launch_plan(self, batch: Batch) -> Callable[[Sequence[Any]], list[Any]] | None:
        """:meth:`evaluate` of tensors like ``batch``'s as one batch launch (NOTE: [Launch plans] in ``_torch``):
        CPU tensors as their NumPy views, tensors in place as they are (NOTE: [Tensors in place] in ``_arrays``),
        flattened as ``batch``'s were, fresh outputs. None for calls of scalars, which take the scalar kernel, and
        for derived functions computing otherwise."""
        specs = tuple(batch.specs)
        bk = self.memo.peek(("batch kernel", specs))
        device = tensor_device(batch.arrays)
        if type(self).evaluate is not Pointwise.evaluate or bk is None or batch.device is None \
                or (device is None and batch.device.type != "cpu") or not batch.shape:
            return None
        shape, n = batch.shape, int(np.prod(batch.shape, dtype=np.int64))
        inputs = []
        for a, s in zip(batch.arrays, specs, strict=True):
            own = tuple(a.shape[: a.ndim - len(s.shape)])
            flat = (1,) if int(np.prod(own, dtype=np.int64)) == 1 else (n,)
            inputs.append((s.dtype if device is None else torch_dtype(s.dtype),
                           None if own == shape or flat == (1,) else shape + s.shape, flat + kernel_shape(s)))
        outputs = [shape + s.shape for s in bk.out_specs]
        direct = DirectLaunch(bk.kernel)  # NOTE: [Direct launches]

        def launch(args: Sequence[Any]) -> list[Any]:
            arrays = []
            for t, (dtype, broadcast, flat_shape) in zip(args, inputs, strict=True):
                a = t.detach() if device is not None else t.detach().numpy()
                a = a if a.dtype == dtype else (a.to(dtype) if device is not None else a.astype(dtype))
                a = a if broadcast is None else broadcast_to(a, broadcast)
                arrays.append(contiguous(a).reshape(flat_shape))
            results = [o.reshape(out) for o, out in zip(bk(n, arrays, direct, device), outputs, strict=True)]
            return results if device is not None else [_torch_module().from_numpy(o) for o in results]

        return launch

    def vjp(self, batch: Batch, cotangents: Sequence[Any]) -> list[Any]:
        out_specs, _ = self.signature(batch.specs)
        device = tensor_device(batch.arrays)
        cts = [zeros(s.shape, s.dtype, device) if c is None else of_dtype(c, s.dtype, device)
               for c, s in zip(cotangents, out_specs, strict=True)]
        V = cotangent_map(self)
        per_element = iter(V.evaluate(batch.but(list(batch.arrays) + cts, V.arguments.specs_of(batch.specs))))
        return [unbroadcast(next(per_element), np.shape(a)) if s.is_float else None
                for a, s in zip(batch.arrays, batch.specs, strict=True)]

    def tangent(self) -> Function:
        if "tangent" not in self.derived:
            self.derived["tangent"] = PointwiseTangent(self)
        return self.derived["tangent"]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs and not impl.inside_kernel():
            require_taichi(self.name)
            fast = self.memo.peek(("scalar call", tuple(map(type, args))))
            if fast is not None:  # NOTE: [Scalar calls]
                self._counter.hit()
                return np.asarray(fast.kernel(*args), fast.out_spec.dtype)
        result = super().__call__(*args, **kwargs)
        if not kwargs and args and all(type(a) in (float, int) for a in args) and not impl.inside_kernel():
            sk = self.memo.peek(("scalar kernel", tuple(self.specs_for(args))))
            if sk is not None:
                self.memo.put(("scalar call", tuple(map(type, args))), sk)
        return result


def value_and_cotangents(fn: Function) -> PointwiseValueAndCotangents:
    """``(x..., c...) -> (f(x)..., J^T c...)`` as a pointwise function, made once (for calls inside
    differentiated code, ``_inline``)."""
    if "value and cotangents" not in fn.derived:
        fn.derived["value and cotangents"] = PointwiseValueAndCotangents(fn)
    return fn.derived["value and cotangents"]  # type: ignore[return-value]


def cotangent_map(fn: Pointwise) -> PointwiseCotangentMap:
    """``vjp_fn(f)`` as a pointwise function of its own, made once."""
    if "cotangent map" not in fn.derived:
        fn.derived["cotangent map"] = PointwiseCotangentMap(fn)
    return fn.derived["cotangent map"]  # type: ignore[return-value]


class PointwiseTangent(Pointwise):
    """``(x..., dx for each float x...) -> (y_1..y_m, dy_1..dy_m)``, flat: a pointwise function's tangent."""

    def __init__(self, parent: Function) -> None:
        super().__init__(f"jvp({parent.name})", listed=False, arguments=TangentArguments(parent))
        self.parent = parent

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        outs, _ = self.parent.signature(in_specs[: self.parent.arity(in_specs)])
        flat = list(outs) + [ArgSpec("d" + s.name, s.shape, s.dtype) for s in outs]
        return flat, tuple(range(len(flat)))

    def make_body(self, in_specs: list[ArgSpec]) -> Any:
        primal = in_specs[: self.parent.arity(in_specs)]
        outs, tree = self.parent.signature(primal)
        return tangent_body(identifier(self.name), self.parent.body_for(primal), primal, len(outs),
                            not isinstance(tree, tuple))


class PointwiseCotangentMap(Pointwise):
    """``(x..., one cotangent per output) -> (J^T c for each float x, ...)``, per element: ``vjp_fn(f)``."""

    arguments: CotangentArguments

    def __init__(self, parent: Function) -> None:
        super().__init__(f"vjp_fn({parent.name})", arguments=CotangentArguments(parent))
        self.parent = parent

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        return self.arguments.outputs(in_specs)

    def make_body(self, in_specs: list[ArgSpec]) -> Any:
        n = self.parent.arity(in_specs)
        primal = in_specs[:n]
        outs, tree = self.parent.signature(primal)
        w = BodyWriter(identifier(self.name), [s.name for s in primal] + [f"ct_{o.name}" for o in outs])
        cts = w.args(n, len(outs))
        grads = cotangent_blocks(w, self.parent.body_for(primal), primal, outs, not isinstance(tree, tuple), cts)
        return w.compile([grads[a] for a in sorted(grads)], single=False, tag="vjp")


class PointwiseValueAndCotangents(Pointwise):
    """``(x..., one cotangent per output) -> (outputs..., J^T c for each float x...)``, flat."""

    arguments: CotangentArguments

    def __init__(self, parent: Function) -> None:
        super().__init__(f"value_and_vjp_fn({parent.name})", listed=False, arguments=CotangentArguments(parent))
        self.parent = parent

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        outs, _ = self.parent.signature(in_specs[: self.parent.arity(in_specs)])
        grads, _ = self.arguments.outputs(in_specs)
        flat = list(outs) + grads
        return flat, tuple(range(len(flat)))

    def make_body(self, in_specs: list[ArgSpec]) -> Any:
        n = self.parent.arity(in_specs)
        primal = in_specs[:n]
        outs, tree = self.parent.signature(primal)
        V = cotangent_map(self.parent)  # type: ignore[arg-type]
        w = BodyWriter(identifier(self.name), [s.name for s in primal] + [f"ct_{o.name}" for o in outs])
        value = w.let("value", w.callee(self.parent.body_for(primal), identifier(self.parent.name))(*w.args(0, n)))
        grads = w.let("grads", w.callee(V.body_for(in_specs), identifier(V.name))(*w.args()))
        n_grads = sum(s.is_float for s in primal)
        values = [value] if not isinstance(tree, tuple) else [value[j] for j in range(len(outs))]
        return w.compile(values + [grads[k] for k in range(n_grads)], single=False, tag="vjp")
