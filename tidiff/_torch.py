"""``td.torch.function``: any tidiff Function as a PyTorch autograd operator (API.md 5).

NOTE: [One recursion] The operator of a Function ``f`` is one
``torch.autograd.Function`` whose rules are operators of other Functions:

    forward(x)        = f(x)                         (f.evaluate)
    backward(c)       = op(vjp_fn(f))(x, c)          summed onto each argument's shape
    jvp(t)            = op(f.tangent())(x, t)[dy]

``vjp_fn(f)`` and ``f.tangent()`` are Functions of the protocol
(``_protocol``), with operators of their own, so double backward is the
backward of ``op(vjp_fn(f))``, forward-over-reverse is the jvp of it, and
every order works for every kind of function without code of its own.
Every numerical call goes through an operator's ``forward`` (or its
``vmap`` rule), never ``.numpy()`` in a rule: under ``torch.func``
transforms rules receive wrapped tensors, and only those see plain ones.

NOTE: [vmap rules] A pointwise Function (a ``@ti.func`` body) batches like a
NumPy gufunc, so ``vmap`` moves the mapped dim to the front of the batch dims
and makes one call. Field programs and ndarray kernels take no batch dims:
their rule calls the operator once per mapped index and stacks the results.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ._composed import cotangent_map_of
from ._protocol import Function, as_function
from ._protocol import function as _td_function
from ._signature import ArgSpec
from ._tree import unflatten


def function(f: Any, **kwargs: Any) -> TorchFunction:
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
        (reverse mode, gradients counted once), a forward-mode rule for
        ``torch.autograd.forward_ad``, differentiable rules to any order
        (NOTE: [One recursion]) and a ``vmap`` rule, so
        ``torch.func.grad/vjp/jvp/jacrev/jacfwd/hessian/vmap`` accept it.
        Kernels compile once per dtype/shape signature, not per call.

    Example:
        >>> op = td.torch.function(f)                     # f: @ti.func (x: vec3, s: f64) -> f64
        >>> x = torch.randn(8, 3, dtype=torch.float64, requires_grad=True)
        >>> op(x, 2.0).sum().backward()                   # x.grad: (8, 3)

    Limitations: a ``@ti.func`` computes in the precision of its arguments
    (float32 tensors in, float32 out); field programs in their fields' dtype.
    """
    if kwargs or (getattr(f, "_is_wrapped_kernel", False) and not isinstance(f, Function)):
        fn = _td_function(f, **kwargs)
    else:
        fn = as_function(f, "td.torch.function")
    return TorchFunction(fn)


class TorchFunction:
    """A tidiff Function as a torch operator; see :func:`function`."""

    def __init__(self, fn: Function) -> None:
        self.fn = fn
        self.op = op_of(fn, fn)
        self.__name__ = fn.name
        self.__doc__ = f"torch operator of {fn.name} (tidiff)"

    def __repr__(self) -> str:
        return f"<td.torch.function {self.fn.name}>"

    def __call__(self, *args: Any) -> Any:
        flat = self.op.apply(*args)
        _, tree = self.fn.signature(self.fn.specs_for(args))
        return unflatten(tree, list(flat))


# -- engines on tensors ---------------------------------------------------------
def _device_of(args: Sequence[Any]) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")


def _to_torch(array: Any, device: torch.device) -> torch.Tensor:
    if isinstance(array, torch.Tensor):
        t = array
    else:
        array = np.asarray(array)
        if not (array.flags.c_contiguous and array.flags.writeable):
            array = np.array(array, order="C")
        t = torch.from_numpy(array)
    return t.to(device) if t.device != device else t


def _evaluate(fn: Function, args: Sequence[Any], owner: Function) -> tuple[torch.Tensor, ...]:
    batch = fn.read(args, f"td.torch.function({owner.name})")
    with owner._counter.tally():
        outs = fn.evaluate(batch)
    device = _device_of(args)
    return tuple(_to_torch(o, device) for o in outs)


def _specs(fn: Function, args: Sequence[Any]) -> list[ArgSpec]:
    return fn.specs_for(args)


def _sum_to(t: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Sum a per-element result onto an argument's shape (broadcasting reversed); differentiable."""
    shape = tuple(shape)
    if tuple(t.shape) == shape:
        return t
    lead = t.ndim - len(shape)
    if lead:
        t = t.sum(dim=tuple(range(lead)))
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and t.shape[i] != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t


def _zeros_like_output(spec: ArgSpec, shape: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.zeros(tuple(shape), dtype=getattr(torch, spec.dtype.name), device=device)


# -- the operator -----------------------------------------------------------------------
def op_of(fn: Function, owner: Function) -> Any:
    """The autograd.Function of ``fn`` within the operator of ``owner`` (NOTE: [One recursion]).

    Every operator of one recursion counts its calls and compiles against
    ``owner``, the Function the user wrapped (``td.cache_info()[owner.name]``).
    """
    key = ("torch op", owner)
    if key not in fn.derived:
        fn.derived[key] = _make_op(fn, owner)  # type: ignore[index]
    return fn.derived[key]  # type: ignore[index]


def _save(ctx: Any, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
    """Save tensors (for backward and forward AD) and remember the non-tensor arguments."""
    tensors = [a for a in inputs if isinstance(a, torch.Tensor)]
    ctx.save_for_backward(*tensors)
    ctx.save_for_forward(*tensors)
    ctx.template = [None if isinstance(a, torch.Tensor) else ("value", a) for a in inputs]
    ctx.out_shapes = [tuple(o.shape) for o in outputs]


def _restore(ctx: Any) -> list[Any]:
    saved = iter(ctx.saved_tensors)
    return [next(saved) if t is None else t[1] for t in ctx.template]


def _align(args: Sequence[Any], in_dims: Sequence[int | None], core_ndims: Sequence[int]) -> list[Any]:
    """Mapped dim to the front, batch dims right-aligned so every argument broadcasts (NOTE: [vmap rules])."""
    logical = [(a.ndim - (d is not None) - c) if isinstance(a, torch.Tensor) else 0
               for a, d, c in zip(args, in_dims, core_ndims, strict=True)]
    depth = max(logical) if logical else 0
    out = []
    for a, d, n in zip(args, in_dims, logical, strict=True):
        if d is None or not isinstance(a, torch.Tensor):
            out.append(a)
            continue
        a = a.movedim(d, 0)
        out.append(a.reshape((a.shape[0],) + (1,) * (depth - n) + tuple(a.shape[1:])))
    return out


def _make_op(fn: Function, owner: Function) -> Any:
    name = "".join(c if c.isalnum() else "_" for c in fn.name)

    class Op(torch.autograd.Function):
        @staticmethod
        def forward(*args: Any) -> tuple[torch.Tensor, ...]:
            return _evaluate(fn, args, owner)

        @staticmethod
        def setup_context(ctx: Any, inputs: Sequence[Any], output: Sequence[Any]) -> None:
            _save(ctx, inputs, output)

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
            primals = _restore(ctx)
            specs = _specs(fn, primals)
            out_specs, _ = fn.signature(specs)
            device = _device_of(primals)
            cts = [_zeros_like_output(s, shape, device) if g is None else g
                   for g, s, shape in zip(grads, out_specs, ctx.out_shapes, strict=True)]
            per_element = iter(op_of(cotangent_map_of(fn), owner).apply(*primals, *cts))
            result = []
            for p, s in zip(primals, specs, strict=True):
                g = next(per_element) if s.is_float else None
                result.append(_sum_to(g, p.shape) if isinstance(p, torch.Tensor) and g is not None else None)
            return tuple(result)

        @staticmethod
        def jvp(ctx: Any, *tangents: Any) -> tuple[torch.Tensor, ...]:
            primals = _restore(ctx)
            specs = _specs(fn, primals)
            device = _device_of(primals)
            ts = []
            for p, t, s in zip(primals, tangents, specs, strict=True):
                if s.is_float:
                    shape = tuple(p.shape) if isinstance(p, torch.Tensor) else s.shape
                    ts.append(torch.zeros(shape, dtype=getattr(torch, s.dtype.name), device=device) if t is None else t)
            flat = op_of(fn.tangent(), owner).apply(*primals, *ts)
            m = len(flat) // 2
            return tuple(
                t.expand(o.shape) if t.shape != o.shape else t for o, t in zip(flat[:m], flat[m:], strict=True)
            )

        @staticmethod
        def vmap(info: Any, in_dims: Sequence[int | None], *args: Any) -> tuple[Any, Any]:
            if not fn.pointwise:  # one call per mapped index (NOTE: [vmap rules])
                results = []
                for i in range(info.batch_size):
                    sliced = [a.select(d, i) if d is not None and isinstance(a, torch.Tensor) else a
                              for a, d in zip(args, in_dims, strict=True)]
                    results.append(Op.apply(*sliced))
                outs = tuple(torch.stack(list(r)) for r in zip(*results, strict=True))
                return outs, tuple(0 for _ in outs)
            cores = [len(s.shape) for s in _specs(fn, [a for a in args])]
            outs = Op.apply(*_align(args, in_dims, cores))
            return outs, tuple(0 for _ in outs)

    Op.__name__ = Op.__qualname__ = f"{name}_Op"
    return Op
