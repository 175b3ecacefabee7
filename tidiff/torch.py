"""``td.torch.function``: any tidiff Function as a PyTorch autograd operator (API.md 5).

::

    op = td.torch.function(f)            # f: a td.Function, @ti.func, or ndarray kernel wrapped by td.function
    y = op(x, s)                         # torch tensors in, torch tensors out (on x's device)
    y.sum().backward()                   # reverse mode: Taichi's kernel.grad, once per call
    torch.autograd.gradcheck(op, (x, s), check_forward_ad=True)
    torch.autograd.gradgradcheck(op, (x, s))
    torch.func.jacrev(op)(x, s); torch.func.vmap(op)(xs, s)

Everything numerical runs in tidiff's engines (``Function._evaluate``,
``_vjp``, ``_jvp``); this module only routes torch's calls to them.

# NOTE: [Four operators] Each Function ``f`` gets four ``autograd.Function``s:
#
#   Op(x)                       = f(x)
#   BackwardOp(x, c)            = J(x)^T c            (reverse engine; Op.backward)
#   JvpOp(x, t)                 = J(x) t              (forward engine; Op.jvp)
#   VjpJvpOp(x, c, dx, dc)      = sum_k c_k H_k dx + J^T dc
#                                                      (jvp of V = vjp_function(f))
#
# and each rule is one of the others, so the backward is differentiable:
# BackwardOp.backward(g) = (VjpJvpOp(x, c, g, 0), JvpOp(x, g)),
# BackwardOp.jvp(dx, dc) = VjpJvpOp(x, c, dx, dc),
# JvpOp.backward(g)      = (VjpJvpOp(x, g, t, 0), BackwardOp(x, g)).
# That is second order (gradgradcheck, torch.func.hessian); VjpJvpOp is not
# differentiated again (third order raises). Every numerical call goes
# through an autograd.Function, never ``.numpy()`` in a rule, because under
# ``torch.func`` transforms rules receive wrapped tensors: only an
# autograd.Function's ``forward`` (or its ``vmap`` rule) sees plain ones.
#
# NOTE: [vmap rules] A function with a ``@ti.func`` body batches like a NumPy
# gufunc, so ``vmap`` moves the mapped dim to the front of the batch dims and
# makes one call. Per-element results that a whole-batch vjp would sum
# (BackwardOp, VjpJvpOp) come from ``vjp_function(f)`` evaluated per element,
# then summed over every batch dim but the mapped one. Field programs and
# ndarray kernels take no batch dims: their rule calls the operator once per
# mapped index and stacks the results.
"""
import numpy as np
import torch

from ._arrays import unbroadcast
from ._function import Function, as_function
from ._function import function as _td_function
from ._tree import unflatten
from ._vjp_function import vjp_function

__all__ = ["function", "TorchFunction"]

_ops = {}


def function(f, **kwargs):
    """A PyTorch autograd operator running ``f``'s Taichi kernels.

    Args:
        f: a ``td.Function`` or anything ``td.function`` accepts: a
            ``@ti.func``, a kernel over fields (``inputs=[field, ...]``,
            ``outputs=[field, ...]``) or a kernel over ``ti.types.ndarray()``
            parameters (``inputs=["k", "w"]``, ``outputs={"out": lambda k, w:
            k.shape}``, ``constants={...}``).
        **kwargs: passed to ``td.function`` when ``f`` is not a Function yet.

    Returns:
        A :class:`TorchFunction`: call it on tensors (Python numbers are
        accepted too). Outputs are tensors on the inputs' device, in ``f``'s
        output structure (a tensor, or a tuple). The operator has a backward
        (Taichi's reverse mode, gradients counted once), a forward-mode rule
        for ``torch.autograd.forward_ad``, a differentiable backward (double
        backward through Hessian-vector products) and a ``vmap`` rule, so
        ``torch.func.grad/vjp/jvp/jacrev/jacfwd/hessian/vmap`` accept it.
        Kernels compile once per dtype/shape signature, not per call.

    Example:
        >>> op = td.torch.function(f)                     # f: @ti.func (x: vec3, s: f64) -> f64
        >>> x = torch.randn(8, 3, dtype=torch.float64, requires_grad=True)
        >>> op(x, 2.0).sum().backward()                   # x.grad: (8, 3)

    Limitations: third-order derivatives raise ``NotImplementedError``;
    ``@ti.func`` functions compute in the default float type (float64 with
    ``ti.init(default_fp=ti.f64)``) and return it; ndarray kernels keep
    their inputs' dtype. Second order of a field program needs its
    second-order engine (``FieldFunction.second_order_jvp``).
    """
    if kwargs or _is_kernel(f):
        fn = _td_function(f, **kwargs)
    else:
        fn = as_function(f, "td.torch.function")
    return TorchFunction(fn)


def _is_kernel(f):
    return getattr(f, "_is_wrapped_kernel", False) and not isinstance(f, Function)


class TorchFunction:
    """A tidiff Function as a torch operator; see :func:`function`."""

    def __init__(self, fn):
        self.fn = fn
        self.ops = _ops_of(fn)
        self.__name__ = fn.name
        self.__doc__ = f"torch operator of {fn.name} (tidiff)"

    def __repr__(self):
        return f"<td.torch.function {self.fn.name}>"

    def __call__(self, *args):
        flat = self.ops.op.apply(*args)
        specs = _specs(self.fn, args)
        _, tree = self.fn.signature(specs)
        return unflatten(tree, list(flat))


# -- engines on tensors ---------------------------------------------------------
def _specs(fn, args):
    return fn.specs_for(args)


def _read(fn, args, call):
    if getattr(fn, "_torch_native", False):
        return fn.read(args, call, native=True)
    return fn.read(args, call)


def _device_of(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")


def _to_torch(array, device, dtype=None):
    if array is None:
        return None
    if isinstance(array, torch.Tensor):
        t = array
    else:
        array = np.asarray(array)
        if not (array.flags.c_contiguous and array.flags.writeable):
            array = np.array(array, order="C")
        t = torch.from_numpy(array)
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    return t.to(device) if t.device != device else t


def _to_numpy_or_native(fn, value, spec):
    """A tangent/cotangent as the engines take it: NumPy (or a tensor for torch-native Functions)."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if getattr(fn, "_torch_native", False):
            return value
        value = value.to(dtype=getattr(torch, np.dtype(spec.dtype).name)).cpu().numpy()
        return value
    return np.asarray(value, spec.dtype)


def _sum_to(array, shape):
    """Sum a per-element array onto an argument's shape (broadcasting reversed), NumPy or torch."""
    if isinstance(array, torch.Tensor):
        shape = tuple(shape)
        if tuple(array.shape) == shape:
            return array
        lead = array.ndim - len(shape)
        if lead:
            array = array.sum(dim=tuple(range(lead)))
        return array.sum_to_size(shape) if tuple(array.shape) != shape else array
    return unbroadcast(np.asarray(array), tuple(shape))


def _evaluate(fn, args):
    batch = _read(fn, args, f"td.torch.function({fn.name})")
    with fn._counter.tally():
        outs = fn._evaluate(batch, fn._counter)
    device = _device_of(args)
    return tuple(_to_torch(o, device) for o in outs)


def _vjp(fn, primals, cts):
    batch = _read(fn, primals, f"td.torch.function({fn.name}).backward")
    out_specs, _ = fn.signature(batch.specs)
    cts = [_to_numpy_or_native(fn, c, s) for c, s in zip(cts, out_specs)]
    with fn._counter.tally():
        if hasattr(fn, "vjp_only"):  # no need to recompute outputs torch already has
            grads = fn.vjp_only(batch, cts, fn._counter)
        else:
            grads = fn._cotangents(batch, cts, fn._counter)
    device = _device_of(primals)
    return tuple(
        _to_torch(_sum_to(g, np.shape(p)), device, _float_dtype(p))
        for g, p, s in zip(grads, primals, batch.specs) if s.is_float
    )


def _jvp(fn, primals, tangents):
    batch = _read(fn, primals, f"td.torch.function({fn.name}).jvp")
    ts = [_to_numpy_or_native(fn, t, s) if s.is_float else None for t, s in zip(tangents, batch.specs)]
    with fn._counter.tally():
        outs, touts = fn._jvp(batch, ts, fn._counter)
    device = _device_of(primals)
    return tuple(
        _to_torch(np.broadcast_to(t, np.shape(o)) if not isinstance(t, torch.Tensor) else t.expand(o.shape), device)
        for o, t in zip(outs, touts)
    )


def _vjp_jvp(fn, primals, cts, dprimals, dcts):
    """jvp of ``V(x, c) = J^T c`` in ``(dx, dc)``, each result summed onto its primal's shape."""
    V = vjp_function(fn)
    args = tuple(primals) + tuple(cts)
    batch = _read_vjp(V, fn, args)
    n = len(primals)
    specs = batch.specs
    ts = [_to_numpy_or_native(fn, t, s) if s.is_float else None for t, s in zip(list(dprimals) + list(dcts), specs)]
    with fn._counter.tally():
        _, touts = V._jvp(batch, ts, fn._counter)
    device = _device_of(args)
    floats = [p for p, s in zip(primals, specs[:n]) if s.is_float]
    return tuple(_to_torch(_sum_to(t, np.shape(p)), device, _float_dtype(p)) for t, p in zip(touts, floats))


def _read_vjp(V, fn, args):
    """The batch of ``V``'s arguments: as ``fn`` reads its primals (torch-native where ``fn`` is)."""
    if getattr(fn, "_torch_native", False):
        n = _arity(fn)
        inner = fn.read(args[:n], V.name, native=True)
        out_specs, _ = fn.signature(inner.specs)
        cts = [_to_numpy_or_native(fn, c, s) for c, s in zip(args[n:], out_specs)]
        from ._arrays import ArgBatch
        from ._signature import ArgSpec

        batch = ArgBatch(list(inner.arrays) + cts, (), inner.torch_device)
        batch.specs = list(inner.specs) + [ArgSpec(f"ct_{s.name}", s.shape, s.dtype) for s in out_specs]
        return batch
    return V.read(args, V.name)


def _float_dtype(p):
    if isinstance(p, torch.Tensor):
        return p.dtype if p.is_floating_point() else None
    return None


# -- vmap -----------------------------------------------------------------------
def _batchable(fn):
    """Whether ``fn`` maps over leading batch dims in one call (it has a ``@ti.func`` body)."""
    specs = fn.declared_specs()
    return specs is not None and fn.body_for(specs) is not None


def _align(args, in_dims, core_ndims):
    """Mapped dim to the front, batch dims right-aligned so every argument broadcasts (NOTE: [vmap rules])."""
    logical = [
        (a.ndim - (d is not None) - c) if isinstance(a, torch.Tensor) else 0
        for a, d, c in zip(args, in_dims, core_ndims)
    ]
    depth = max(logical) if logical else 0
    out = []
    for a, d, n in zip(args, in_dims, logical):
        if d is None or not isinstance(a, torch.Tensor):
            out.append(a)
            continue
        a = a.movedim(d, 0)
        out.append(a.reshape((a.shape[0],) + (1,) * (depth - n) + tuple(a.shape[1:])))
    return out


def _unmapped_shape(a, d):
    if not isinstance(a, torch.Tensor):
        return ()
    shape = list(a.shape)
    if d is not None:
        del shape[d]
    return tuple(shape)


def _loop(op, info, in_dims, args):
    """The vmap rule of last resort: one call per mapped index, results stacked."""
    results = []
    for i in range(info.batch_size):
        sliced = [a.select(d, i) if d is not None and isinstance(a, torch.Tensor) else a for a, d in zip(args, in_dims)]
        results.append(op.apply(*sliced))
    outs = tuple(
        None if r[0] is None else torch.stack([r_i for r_i in r])
        for r in zip(*results)
    )
    return outs, tuple(None if o is None else 0 for o in outs)


def _per_element_then_sum(V_op, info, in_dims, args, targets, core_ndims):
    """Per-element results of ``V_op`` on aligned args, each summed onto ``(B,) + target shape``."""
    results = V_op.apply(*_align(args, in_dims, core_ndims))
    outs = []
    for r, shape in zip(results, targets):
        if r.shape[0] != info.batch_size:  # nothing mapped reached it (cannot happen with a mapped arg)
            r = r.expand((info.batch_size,) + tuple(r.shape[1:]))
        pad = r.ndim - 1 - len(shape)
        target = (info.batch_size,) + (1,) * pad + tuple(shape)
        outs.append(r.sum_to_size(target).reshape((info.batch_size,) + tuple(shape)))
    return tuple(outs), tuple(0 for _ in outs)


# -- the operators ----------------------------------------------------------------
class _Ops:
    """The four autograd.Functions of one tidiff Function (NOTE: [Four operators])."""

    def __init__(self, fn):
        self.fn = fn
        name = "".join(c if c.isalnum() else "_" for c in fn.name)
        self.op = _make_op(self, name)
        self.backward_op = _make_backward_op(self, name)
        self.jvp_op = _make_jvp_op(self, name)
        self.vjp_jvp_op = _make_vjp_jvp_op(self, name)


def _ops_of(fn):
    hit = _ops.get(id(fn))
    if hit is None or hit.fn is not fn:
        hit = _ops[id(fn)] = _Ops(fn)
    return hit


def _save(ctx, inputs, n_groups=1):
    """Save tensors (for backward and forward AD) and remember the non-tensor arguments."""
    tensors = [a for a in inputs if isinstance(a, torch.Tensor)]
    ctx.save_for_backward(*tensors)
    ctx.save_for_forward(*tensors)
    ctx.template = [None if isinstance(a, torch.Tensor) else ("value", a) for a in inputs]


def _restore(ctx):
    saved = iter(ctx.saved_tensors)
    return [next(saved) if t is None else t[1] for t in ctx.template]


def _core_ndims(fn, args):
    return [len(s.shape) for s in fn.specs_for(args)]


def _make_op(ops, name):
    fn = ops.fn

    class Op(torch.autograd.Function):
        @staticmethod
        def forward(*args):
            return _evaluate(fn, args)

        @staticmethod
        def setup_context(ctx, inputs, output):
            _save(ctx, inputs)

        @staticmethod
        def backward(ctx, *grads):
            primals = _restore(ctx)
            g = ops.backward_op.apply(*primals, *grads)
            return _by_position(g, primals, fn)

        @staticmethod
        def jvp(ctx, *tangents):
            primals = _restore(ctx)
            return ops.jvp_op.apply(*primals, *tangents)

        @staticmethod
        def vmap(info, in_dims, *args):
            if not _batchable(fn):
                return _loop(Op, info, in_dims, args)
            outs = Op.apply(*_align(args, in_dims, _core_ndims(fn, args)))
            return outs, tuple(0 for _ in outs)

    Op.__name__ = Op.__qualname__ = f"{name}_Op"
    return Op


def _by_position(grads, primals, fn):
    """Float-argument results back to one entry per argument: None for integers and Python numbers."""
    it = iter(grads)
    out = []
    for p, s in zip(primals, fn.specs_for(primals)):
        g = next(it) if s.is_float else None
        out.append(g if isinstance(p, torch.Tensor) else None)
    return tuple(out)


def _arity(fn):
    """How many arguments ``fn`` takes (``vjp_function(f)``: f's, then one cotangent per output)."""
    from ._vjp_function import VjpFunction

    if isinstance(fn, VjpFunction):
        specs = fn.parent.declared_specs()
        if specs is None:
            raise NotImplementedError(f"td.torch.function({fn.name}): needs a parent with declared argument types")
        out_specs, _ = fn.parent.signature(specs)
        return _arity(fn.parent) + len(out_specs)
    specs = fn.declared_specs()
    return len(specs) if specs is not None else len(fn.param_names())


def _make_backward_op(ops, name):
    fn = ops.fn

    class BackwardOp(torch.autograd.Function):
        """``(primals..., cotangents...) -> J^T c`` summed onto each float primal's shape."""

        @staticmethod
        def forward(*args):
            n = _arity(fn)
            return _vjp(fn, args[:n], args[n:])

        @staticmethod
        def setup_context(ctx, inputs, output):
            _save(ctx, inputs)

        @staticmethod
        def backward(ctx, *gs):
            args = _restore(ctx)
            n = _arity(fn)
            primals, cts = args[:n], args[n:]
            dx = _by_position(gs, primals, fn)
            on_x = ops.vjp_jvp_op.apply(*primals, *cts, *dx, *([None] * len(cts)))
            on_c = ops.jvp_op.apply(*primals, *dx)
            return tuple(_by_position(on_x, primals, fn)) + tuple(on_c)

        @staticmethod
        def jvp(ctx, *tangents):
            args = _restore(ctx)
            n = _arity(fn)
            return ops.vjp_jvp_op.apply(*args[:n], *args[n:], *tangents[:n], *tangents[n:])

        @staticmethod
        def vmap(info, in_dims, *args):
            n = _arity(fn)
            if not _batchable(fn):
                return _loop(BackwardOp, info, in_dims, args)
            specs = fn.specs_for(args[:n])
            out_specs, _ = fn.signature(specs)
            V = vjp_function(fn)
            targets = [_unmapped_shape(a, d) for a, d, s in zip(args[:n], in_dims[:n], specs) if s.is_float]
            cores = [len(s.shape) for s in specs] + [len(s.shape) for s in out_specs]
            return _per_element_then_sum(_ops_of(V).op, info, in_dims, args, targets, cores)

    BackwardOp.__name__ = BackwardOp.__qualname__ = f"{name}_BackwardOp"
    return BackwardOp


def _make_jvp_op(ops, name):
    fn = ops.fn

    class JvpOp(torch.autograd.Function):
        """``(primals..., tangents...) -> J t``, one tangent per output."""

        @staticmethod
        def forward(*args):
            n = _arity(fn)
            return _jvp(fn, args[:n], args[n:])

        @staticmethod
        def setup_context(ctx, inputs, output):
            _save(ctx, inputs)

        @staticmethod
        def backward(ctx, *gs):
            args = _restore(ctx)
            n = _arity(fn)
            primals, ts = args[:n], args[n:]
            on_x = ops.vjp_jvp_op.apply(*primals, *gs, *ts, *([None] * len(gs)))
            on_t = ops.backward_op.apply(*primals, *gs)
            return tuple(_by_position(on_x, primals, fn)) + tuple(_by_position(on_t, primals, fn))

        @staticmethod
        def jvp(ctx, *tangents):
            raise NotImplementedError(
                f"td.torch.function({fn.name}): forward-over-forward (a third jvp level) is not supported; "
                "use reverse mode for one of the levels (torch.func.jacfwd(torch.func.jacrev(f)))"
            )

        @staticmethod
        def vmap(info, in_dims, *args):
            if not _batchable(fn):
                return _loop(JvpOp, info, in_dims, args)
            n = _arity(fn)
            cores = _core_ndims(fn, args[:n])
            outs = JvpOp.apply(*_align(args, in_dims, cores + cores))
            return outs, tuple(0 for _ in outs)

    JvpOp.__name__ = JvpOp.__qualname__ = f"{name}_JvpOp"
    return JvpOp


def _make_vjp_jvp_op(ops, name):
    fn = ops.fn

    def third_order(*_):
        raise NotImplementedError(
            f"td.torch.function({fn.name}): derivatives above second order are not supported"
        )

    class VjpJvpOp(torch.autograd.Function):
        """``(x, c, dx, dc) -> sum_k c_k H_k dx + J^T dc``, summed onto each float primal's shape."""

        @staticmethod
        def forward(*args):
            n = _arity(fn)
            m = (len(args) - 2 * n) // 2
            primals, cts = args[:n], args[n:n + m]
            dprimals, dcts = args[n + m:2 * n + m], args[2 * n + m:]
            return _vjp_jvp(fn, primals, cts, dprimals, dcts)

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        backward = staticmethod(lambda ctx, *g: third_order())
        jvp = staticmethod(lambda ctx, *t: third_order())

        @staticmethod
        def vmap(info, in_dims, *args):
            n = _arity(fn)
            if not _batchable(fn):
                return _loop(VjpJvpOp, info, in_dims, args)
            specs = fn.specs_for(args[:n])
            out_specs, _ = fn.signature(specs)
            V = vjp_function(fn)
            targets = [_unmapped_shape(a, d) for a, d, s in zip(args[:n], in_dims[:n], specs) if s.is_float]
            cores = [len(s.shape) for s in specs] + [len(s.shape) for s in out_specs]
            # V's jvp per element: JvpOp of V over (x, c; dx, dc)
            return _per_element_then_sum(_ops_of(V).jvp_op, info, in_dims, args, targets, cores + cores)

    VjpJvpOp.__name__ = VjpJvpOp.__qualname__ = f"{name}_VjpJvpOp"
    return VjpJvpOp
