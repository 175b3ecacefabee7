"""Kernels over ``ti.types.ndarray()`` parameters as Functions (API.md 1c).

An ndarray kernel writes its results into output arrays it is given::

    @ti.kernel
    def conv(k: ti.types.ndarray(), w: ti.types.ndarray(), out: ti.types.ndarray(), eps: ti.f64):
        ...

    op = td.function(conv, inputs=["k", "w"], outputs={"out": lambda k, w: k.shape},
                     constants={"eps": 1e-3})

The engines run the kernel on the arrays themselves: a torch tensor (or a
NumPy array, seen through a zero-copy torch view) reaches the kernel without a
copy, and Taichi compiles the kernel once per dtype and ndim, never per shape.

- evaluation: outputs are allocated (zeroed, so ``+=`` accumulates from 0)
  and the kernel launched once;
- reverse mode: Taichi's ``kernel.grad`` on the tensors (NOTE: [Gradient
  aliases]);
- forward mode: the kernel's tangent transform (``_ndarray_kernels``), an
  exact jvp in one launch, not assembled from reverse passes;
- second order: Taichi's reverse mode over the tangent kernel gives
  Hessian-vector products (NOTE: [Second order of ndarray kernels]).

# NOTE: [Gradient aliases] Taichi reads ``y.grad`` and accumulates into
# ``x.grad`` of the very tensor objects it is given, and allocates ``.grad``
# for any ``requires_grad`` tensor it sees, even under ``torch.no_grad``
# (taichi #8340). The engines therefore never hand the caller's tensors to
# Taichi: they pass ``t.detach()``, a new tensor object over the same memory,
# whose ``.grad`` slot is tidiff's own. The forward launch gets aliases that
# do not require grad; the reverse launch gets aliases with fresh zeroed
# ``.grad`` buffers (and a *copy* of each cotangent, which the adjoint zeroes
# as it reads it). The caller's ``.grad`` is never touched, so a torch
# backward that returns these gradients counts them exactly once (the trap of
# taichi #8101 is a backward that lets Taichi write ``x.grad`` *and* returns it).
"""
import inspect

import numpy as np

from ._function import Function
from ._signature import ArgSpec
from ._tree import flat_tree


def _torch():
    import torch

    return torch


class _ArrayInfo:
    """What an output-shape rule sees of one input: ``.shape``, ``.ndim``, ``.dtype``."""

    def __init__(self, spec):
        self.shape = tuple(spec.shape)
        self.ndim = len(self.shape)
        self.dtype = spec.dtype

    def __repr__(self):
        return f"<array shape={self.shape} dtype={self.dtype}>"


def _is_ndarray_annotation(ann):
    from taichi.types.ndarray_type import NdarrayType

    return isinstance(ann, NdarrayType)


def _annotation_dtype(ann):
    """The NumPy dtype an ``ndarray(dtype=...)`` annotation fixes (scalar elements), or None."""
    from taichi.lang.util import to_numpy_type

    dtype = getattr(ann, "dtype", None)
    if dtype is None:
        return None
    try:
        return np.dtype(to_numpy_type(dtype))
    except Exception:  # vector/matrix element types: the array's own dtype decides
        return None


class NdarrayFunction(Function):
    """A ``@ti.kernel`` over ndarray parameters with named inputs and outputs (API.md 1c).

    Arguments are the ``inputs`` in order, each a whole array (no batch dims:
    the kernel sees the array's full shape). Results are the ``outputs``.
    """

    _torch_native = True  # td.torch hands the engines tensors (any device), not NumPy views

    def __init__(self, kernel, inputs, outputs, constants=None, name=None):
        from ._tangent.parse import kernel_function

        pyfunc = kernel_function(kernel)
        super().__init__(name or pyfunc.__name__)
        self.kernel = kernel
        params = inspect.signature(pyfunc).parameters
        self._params = list(params)
        call = f"td.function({self.name})"
        inputs = [inputs] if isinstance(inputs, str) else list(inputs)
        if isinstance(outputs, str):
            outputs = [outputs]
        if not isinstance(outputs, dict):
            raise TypeError(
                f"{call}: outputs= of an ndarray kernel maps each output parameter to its shape, "
                "e.g. outputs={'out': lambda k, w: k.shape}"
            )
        constants = dict(constants or {})
        for role, names in (("inputs", inputs), ("outputs", list(outputs)), ("constants", list(constants))):
            for n in names:
                if n not in params:
                    raise ValueError(f"{call}: {role} names {n!r}, which is not a parameter of the kernel {self._params}")
        for n in inputs + list(outputs):
            if not _is_ndarray_annotation(params[n].annotation):
                raise TypeError(
                    f"{call}: parameter {n!r} must be annotated ti.types.ndarray() to be an input or output; "
                    "pass scalar parameters through constants={...}"
                )
        overlap = set(inputs) & set(outputs) or (set(inputs) | set(outputs)) & set(constants)
        if overlap:
            raise ValueError(f"{call}: {sorted(overlap)} listed twice among inputs, outputs and constants")
        missing = [n for n in self._params if n not in inputs and n not in outputs and n not in constants]
        if missing:
            raise TypeError(f"{call}: kernel parameters {missing} are neither inputs nor outputs; give their values in constants={{...}}")
        for n, rule in outputs.items():
            if not callable(rule) and not (isinstance(rule, tuple) and all(isinstance(d, int) for d in rule)):
                raise TypeError(f"{call}: outputs[{n!r}] must be a shape tuple or a callable of the inputs, got {rule!r}")
        self.inputs, self.outputs, self.constants = inputs, list(outputs), constants
        self._shape_rules = outputs
        self._in_dtypes = [_annotation_dtype(params[n].annotation) for n in inputs]
        self._out_dtypes = [_annotation_dtype(params[n].annotation) for n in self.outputs]
        self._tangent = None
        self._signatures = {}

    # -- signature -----------------------------------------------------------
    def declared_specs(self):
        return None

    def param_names(self):
        return list(self.inputs)

    def specs_for(self, args):
        """Each argument's whole shape and its own dtype (float32 stays float32)."""
        specs = []
        for name, value, fixed in zip(self.inputs, args, self._in_dtypes):
            if hasattr(value, "shape") and hasattr(value, "dtype"):
                shape, dtype = tuple(value.shape), _numpy_dtype(value.dtype)
            else:
                a = np.asarray(value)
                shape, dtype = a.shape, (np.dtype(np.float64) if a.dtype.kind == "f" else a.dtype)
            specs.append(ArgSpec(name, shape, fixed or dtype))
        return specs

    def signature(self, in_specs):
        key = tuple(in_specs)
        if key not in self._signatures:
            infos = [_ArrayInfo(s) for s in in_specs]
            floats = [s.dtype for s in in_specs if s.is_float]
            default = floats[0] if floats else np.dtype(np.float64)
            outs = []
            for n, fixed in zip(self.outputs, self._out_dtypes):
                rule = self._shape_rules[n]
                shape = rule(*infos) if callable(rule) else rule
                try:
                    shape = tuple(int(d) for d in shape)
                except TypeError:
                    raise TypeError(f"{self.name}: outputs[{n!r}] gave {shape!r}, not a shape") from None
                outs.append(ArgSpec(n, shape, fixed or default))
            self._signatures[key] = (outs, flat_tree(len(outs), len(outs) == 1))
        return self._signatures[key]

    def read(self, args, call=None, native=False):
        """Check the arguments; NumPy views of them, or with ``native`` the (detached) tensors themselves.

        ``native`` is what ``td.torch`` uses: tensors stay on their device and
        the engines return tensors.
        """
        call = call or self.name
        if len(args) != len(self.inputs):
            raise TypeError(f"{call}: expected {len(self.inputs)} arguments ({', '.join(self.inputs)}), got {len(args)}")
        from ._arrays import ArgBatch, is_tensor, to_numpy

        specs = self.specs_for(args)
        arrays, device = [], None
        for spec, value in zip(specs, args):
            if is_tensor(value):
                device = value.device
                if value.is_complex():
                    raise TypeError(f"{call}: argument {spec.name!r} is complex; tidiff differentiates real values")
                if native:
                    value = value.detach()
                    arrays.append(value if _numpy_dtype(value.dtype) == spec.dtype else value.to(_torch_dtype(spec.dtype)))
                    continue
            array = to_numpy(value, spec.name, call)
            arrays.append(array if array.dtype == spec.dtype else array.astype(spec.dtype))
        batch = ArgBatch(arrays, (), device)
        batch.specs = specs
        return batch

    # -- launching -----------------------------------------------------------
    def _launch(self, kernel, tensors, counter, extra=(), counted=None):
        counter.add(counted or kernel)
        args = []
        for p in self._params:
            args.append(tensors[p] if p in tensors else self.constants[p])
        kernel(*args, *extra)

    def _tangent_kernel(self):
        if self._tangent is None:
            from ._ndarray_kernels import tangent_kernel

            self._tangent, self.tangent_source = tangent_kernel(self.kernel, self.inputs, self.outputs)
        return self._tangent

    def _prepare(self, batch):
        """Input tensors (zero-copy views) and the output specs, device and whether to return NumPy."""
        torch = _torch()
        as_numpy = not any(isinstance(a, torch.Tensor) for a in batch.arrays)
        ins = [_as_tensor(a) for a in batch.arrays]
        device = ins[0].device if ins else torch.device("cpu")
        out_specs, _ = self.signature(batch.specs)
        return ins, out_specs, device, as_numpy

    @staticmethod
    def _zeros(spec, device):
        torch = _torch()
        return torch.zeros(spec.shape, dtype=_torch_dtype(spec.dtype), device=device)

    @staticmethod
    def _result(t, as_numpy):
        return t.numpy() if as_numpy else t

    def _evaluate(self, batch, counter):
        ins, out_specs, device, as_numpy = self._prepare(batch)
        outs = [self._zeros(s, device) for s in out_specs]
        self._launch(self.kernel, {**dict(zip(self.inputs, ins)), **dict(zip(self.outputs, outs))}, counter)
        return [self._result(o, as_numpy) for o in outs]

    def _vjp(self, batch, cotangents, counter):
        outs = self._evaluate(batch, counter)
        return outs, self.vjp_only(batch, cotangents, counter)

    def vjp_only(self, batch, cotangents, counter):
        """Input cotangents by Taichi's ``kernel.grad`` (NOTE: [Gradient aliases]); outputs are not recomputed."""
        ins, out_specs, device, as_numpy = self._prepare(batch)
        torch = _torch()
        tensors, grads = {}, []
        for name, t, spec in zip(self.inputs, ins, batch.specs):
            if spec.is_float:
                t = t.detach().requires_grad_(True)
                t.grad = torch.zeros_like(t)
                grads.append(t)
            else:
                grads.append(None)
            tensors[name] = t
        for name, spec, ct in zip(self.outputs, out_specs, cotangents):
            out = torch.empty(spec.shape, dtype=_torch_dtype(spec.dtype), device=device).requires_grad_(True)
            out.grad = self._zeros(spec, device) if ct is None else _fresh(ct, spec, device)
            tensors[name] = out
        self._launch(self.kernel.grad, tensors, counter, counted=self.kernel)
        return [None if g is None else self._result(g.grad, as_numpy) for g in grads]

    def _jvp(self, batch, tangents, counter):
        ins, out_specs, device, as_numpy = self._prepare(batch)
        outs = [self._zeros(s, device) for s in out_specs]
        douts = [self._zeros(s, device) for s in out_specs]
        dins = [
            _fresh(t, s, device) if (t is not None and s.is_float) else self._zeros(s, device)
            for t, s in zip(tangents, batch.specs)
        ]
        kernel = self._tangent_kernel()
        self._launch(kernel, {**dict(zip(self.inputs, ins)), **dict(zip(self.outputs, outs))}, counter, dins + douts)
        return [self._result(o, as_numpy) for o in outs], [self._result(o, as_numpy) for o in douts]

    # -- second order --------------------------------------------------------
    # NOTE: [Second order of ndarray kernels] The tangent kernel computes
    # (y, dy) = (f(x), J(x) dx). Taichi's reverse mode over it, with
    # cotangents (c_y, c_dy) on (y, dy), gives in one pass
    #   on dx:  J^T c_dy
    #   on x:   J^T c_y + sum_k (c_dy)_k H_k dx
    # which is the jvp of x, c -> J^T c in the direction (dx, c_y), and the
    # vjp of the same map (with dx the cotangent of its result, c_dy = c).
    def _tangent_reverse(self, batch, dx, c_y, c_dy, counter):
        """``(dy, grads on x, grads on dx)`` of one reverse pass over the tangent kernel."""
        ins, out_specs, device, as_numpy = self._prepare(batch)
        torch = _torch()

        def with_grad(t):
            t = t.detach().requires_grad_(True)
            t.grad = torch.zeros_like(t)
            return t

        xs = [with_grad(t) if s.is_float else t for t, s in zip(ins, batch.specs)]
        dxs = [
            with_grad(_fresh(d, s, device) if d is not None else self._zeros(s, device)) if s.is_float
            else self._zeros(s, device)
            for d, s in zip(dx, batch.specs)
        ]
        # forward: dy = J dx (plain aliases, so the primal instance without gradients is reused)
        plain = {**dict(zip(self.inputs, ins)), **{n: self._zeros(s, device) for n, s in zip(self.outputs, out_specs)}}
        douts = [self._zeros(s, device) for s in out_specs]
        kernel = self._tangent_kernel()
        self._launch(kernel, plain, counter, [d.detach() for d in dxs] + douts)
        ys, dys = [], []
        for spec, cy, cdy in zip(out_specs, c_y, c_dy):
            y = torch.empty(spec.shape, dtype=_torch_dtype(spec.dtype), device=device).requires_grad_(True)
            y.grad = self._zeros(spec, device) if cy is None else _fresh(cy, spec, device)
            dy = torch.empty(spec.shape, dtype=_torch_dtype(spec.dtype), device=device).requires_grad_(True)
            dy.grad = self._zeros(spec, device) if cdy is None else _fresh(cdy, spec, device)
            ys.append(y)
            dys.append(dy)
        self._launch(kernel.grad, {**dict(zip(self.inputs, xs)), **dict(zip(self.outputs, ys))}, counter, dxs + dys,
                     counted=kernel)
        gx = [self._result(t.grad, as_numpy) if s.is_float else None for t, s in zip(xs, batch.specs)]
        gdx = [self._result(t.grad, as_numpy) if s.is_float else None for t, s in zip(dxs, batch.specs)]
        return [self._result(d, as_numpy) for d in douts], gx, gdx

    def _split_vjp_batch(self, derived, batch):
        from ._arrays import ArgBatch

        n = len(self.inputs)
        inner = ArgBatch(batch.arrays[:n], (), batch.torch_device)
        inner.specs = batch.specs[:n]
        return inner, batch.arrays[n:]

    def second_order_jvp(self, derived, batch, tangents, counter):
        from ._vjp_function import VjpFunction

        if not isinstance(derived, VjpFunction) or derived.parent is not self:
            return super().second_order_jvp(derived, batch, tangents, counter)
        inner, cts = self._split_vjp_batch(derived, batch)
        n = len(self.inputs)
        dx, dc = list(tangents[:n]), list(tangents[n:])
        # V(x, c) = J^T c; its jvp in (dx, dc): x-grad of the pass with c_y = dc, c_dy = c
        _, gx, gdx = self._tangent_reverse(inner, dx, dc, cts, counter)
        floats = [k for k, s in enumerate(inner.specs) if s.is_float]
        return [gdx[k] for k in floats], [gx[k] for k in floats]

    def second_order_vjp(self, derived, batch, cotangents, counter):
        from ._vjp_function import VjpFunction

        if not isinstance(derived, VjpFunction) or derived.parent is not self:
            return super().second_order_vjp(derived, batch, cotangents, counter)
        inner, cts = self._split_vjp_batch(derived, batch)
        floats = [k for k, s in enumerate(inner.specs) if s.is_float]
        g = [None] * len(self.inputs)
        for k, c in zip(floats, cotangents):
            g[k] = c
        # vjp of V(x, c) = J^T c with cotangent g: on c, J g; on x, sum_k c_k H_k g
        dys, gx, gdx = self._tangent_reverse(inner, g, [None] * len(cts), cts, counter)
        return [gdx[k] for k in floats], list(gx) + list(dys)


def _numpy_dtype(dtype):
    if isinstance(dtype, np.dtype):
        return dtype
    torch = _torch()
    if isinstance(dtype, torch.dtype):
        return np.dtype(str(dtype).replace("torch.", ""))
    return np.dtype(dtype)


def _torch_dtype(dtype):
    return getattr(_torch(), np.dtype(dtype).name)


def _as_tensor(a):
    """A torch view of ``a`` (no copy for contiguous, writable arrays and for tensors)."""
    torch = _torch()
    if isinstance(a, torch.Tensor):
        return a.detach() if a.is_contiguous() else a.detach().contiguous()
    a = np.asarray(a)
    if not (a.flags.c_contiguous and a.flags.writeable):
        a = np.array(a, order="C")
    return torch.from_numpy(a)


def _fresh(value, spec, device):
    """A new contiguous tensor holding ``value`` (Taichi's adjoints zero the buffers they read)."""
    torch = _torch()
    if isinstance(value, torch.Tensor):
        t = value.detach().to(device=device, dtype=_torch_dtype(spec.dtype))
        t = t.expand(spec.shape) if tuple(t.shape) != tuple(spec.shape) else t
        return t.clone(memory_format=torch.contiguous_format)
    return torch.tensor(np.broadcast_to(np.asarray(value, spec.dtype), spec.shape), device=device)
