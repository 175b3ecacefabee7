"""``td.torch.function``: any tidiff Function as a PyTorch operator (docs/torch.md).

NOTE: [One recursion] The operator of a Function ``f`` is a ``torch.library``
operator ``tidiff::<name>_<token>_<n>`` whose autograd rules are operators of other
Functions:

    forward(x)        = f(x)                         (f.evaluate)
    backward(c)       = op(vjp_fn(f))(x, c)          summed onto each argument's shape
    jvp(t)            = op(f.tangent())(x, t)[dy]

``vjp_fn(f)`` and ``f.tangent()`` are Functions of the protocol
(``_protocol``), with operators of their own, so double backward is the
backward of ``op(vjp_fn(f))``, forward-over-reverse is the jvp of it, and
every order works for every kind of function without code of its own.
Every numerical call goes through an operator's kernel (or its ``vmap``
rule), never ``.numpy()`` in a rule: under ``torch.func`` transforms rules
receive wrapped tensors, and only kernels see plain ones.

NOTE: [Operators in the dispatcher] Each operator is defined with
``torch.library.Library`` (schema ``(Tensor[] args) -> Tensor[]``) and has:

- a CPU and a CUDA kernel: the Function's evaluation (Taichi), opaque to
  tracing;
- a fake kernel (``register_fake``): output shapes and dtypes from the
  Function's ``signature``, without running Taichi, so Dynamo, AOTAutograd,
  Inductor and ``torch.export`` trace through the operator as one node;
- an ``Autograd`` kernel applying an ``autograd.Function`` whose
  ``backward`` and ``jvp`` call the operators of the cotangent map and the
  tangent function (the recursion above), and whose ``forward`` calls the
  operator again below autograd;
- a ``vmap`` rule (``register_vmap``, and the autograd.Function's own).

``torch.library.custom_op`` + ``register_autograd`` would do for reverse
mode, but its generated autograd.Function has no forward-mode rule, and
forward mode (``torch.autograd.forward_ad``, ``torch.func.jvp/jacfwd``)
must keep working at every order: hence ``Library.impl(..., "Autograd")``.
Dynamo never sees the autograd.Function (its ``jvp`` made Dynamo refuse it:
"Unsupported custom jvp"): it records a call of the operator; AOTAutograd
runs the Autograd kernel on fake tensors and records the backward's
operators of the cotangent map.

NOTE: [Entering under torch.func] Under ``torch.func`` transforms an
operator is entered through its autograd.Function, not the dispatcher: the
transforms handle an autograd.Function themselves (its ``vmap``, ``jvp`` and
``backward`` at their own level), while one applied inside a dispatcher
kernel finds no interpreter ("could not find kernel for HigherOrderOperator
custom_function_call at dispatch key AutogradCPU"). Its ``forward`` calls
the operator below autograd either way.

NOTE: [Operator names] An operator's name is unique to its process
(``tidiff::<function>_<process token>_<n>``). Inductor and AOTAutograd cache
compiled graphs on disk, keyed by the forward graph, which names its
operators; the cached backward names the operators of the cotangent maps,
which are made lazily, while tracing. With names that a later process could
give again (a counter alone), a cache hit ran a backward naming an operator
that process had not made, or had made for another Function. Graphs with
tidiff operators are therefore compiled again in each process, never loaded
from another's cache.

NOTE: [vmap rules] A pointwise Function (a ``@ti.func`` body) batches like a
NumPy gufunc, so ``vmap`` moves the mapped dim to the front of the batch dims
and makes one call. Field programs and ndarray kernels take no batch dims:
their rule calls the operator once per mapped index and stacks the results.

NOTE: [Operator lifetime] The dispatcher keeps every kernel it is given for
as long as the operator is registered, so the kernels hold the operator
weakly; the operator (with its ``Library``, whose finalizer deregisters it)
lives in ``fn.derived``, as long as the Function it runs.
"""
from __future__ import annotations

import inspect
import itertools
import threading
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ._arrays import torch_dtype, unbroadcast
from ._composite import cotangent_map_of, outputs_cotangent_map_of
from ._fields.values import reading, record
from ._protocol import Function, as_function
from ._protocol import function as _td_function
from ._signature import default_float, default_int
from ._tree import Tree, flat_tree, unflatten


def function(f: Any, **kwargs: Any) -> TorchFunction:
    """A PyTorch operator running ``f``'s Taichi kernels.

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
        output structure (a tensor, or a tuple). It calls a ``torch.library``
        operator (``TorchFunction.op``) with a fake kernel, so
        ``torch.compile(fullgraph=True)`` and ``torch.export`` trace it as
        one node; a backward (reverse mode, gradients counted once), a
        forward-mode rule for ``torch.autograd.forward_ad``, differentiable
        rules to any order (NOTE: [One recursion]) and a ``vmap`` rule, so
        ``torch.func.grad/vjp/jvp/jacrev/jacfwd/hessian/vmap`` accept it.
        Kernels compile once per dtype/shape signature, not per call.

    Example:
        >>> @ti.func
        ... def f(x: ti.math.vec3, s: ti.f64) -> ti.f64:
        ...     return s * x.dot(x)
        >>> op = td.torch.function(f)
        >>> x = torch.ones(8, 3, dtype=torch.float64, requires_grad=True)
        >>> op(x, 2.0).sum().backward()
        >>> x.grad[0]
        tensor([4., 4., 4.], dtype=torch.float64)

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
        self.operator = operator_of(fn, fn)
        self.op = self.operator.op  # the torch.library operator (torch.ops.tidiff.<name>.default)
        self.__name__ = fn.name
        self.__doc__ = f"torch operator of {fn.name} (tidiff)"
        self._tree = _declared_tree(fn)

    def __repr__(self) -> str:
        return f"<td.torch.function {self.fn.name}>"

    def __call__(self, *args: Any) -> Any:
        tensors = _as_tensors(args)
        flat = self.operator(*tensors)
        if self._tree is None and not torch.compiler.is_compiling():
            # an unannotated @ti.func: its first eager call tells the structure of its results
            _, self._tree = self.fn.signature(self.fn.specs_for(tensors))
        tree = self._tree if self._tree is not None else flat_tree(len(flat), len(flat) == 1)
        return unflatten(tree, list(flat))


def _declared_tree(fn: Function) -> Tree | None:
    declared = fn.declared_specs()
    return None if declared is None else fn.signature(declared)[1]


@torch.compiler.assume_constant_result
def _default_dtypes() -> tuple[torch.dtype, torch.dtype]:
    """The torch dtypes Python numbers take (Taichi's ``default_fp``, ``default_ip``)."""
    return torch_dtype(default_float()), torch_dtype(default_int())


def _as_tensors(args: Sequence[Any]) -> list[torch.Tensor]:
    """Every argument a tensor on the first tensor's device: Python numbers in ``default_fp``/``default_ip``."""
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (bool, int, float)):
            fp, ip = _default_dtypes()
            out.append(torch.tensor(a, dtype=fp if isinstance(a, float) else ip, device=device))
        else:
            out.append(torch.as_tensor(np.asarray(a), device=device))
    return out


# -- engines on tensors ---------------------------------------------------------
def _device_of(args: Sequence[Any]) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")


def _to_torch(array: Any, device: torch.device, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """A result as a tensor on ``device`` that aliases no input (an operator's outputs are fresh)."""
    if isinstance(array, torch.Tensor):
        t = array
    else:
        t = torch.from_numpy(np.require(array, requirements=("C", "W")))
    if t.device != device:
        return t.to(device)
    if t.numel() and any(t.untyped_storage().data_ptr() == a.untyped_storage().data_ptr() for a in inputs):
        return t.clone()
    return t


# NOTE: [Launch plans] An operator in a model is called thousands of times with tensors of the same dtypes, shapes
# and devices. The first such call runs the full path (argument checks, specs, the reverse-mode check, compiling);
# a function that can then say what its call did as a plain launch (an ndarray kernel: fresh zeroed outputs and one
# launch; its cotangent map, once Taichi's reverse mode is settled right: gradient buffers and one kernel.grad)
# leaves a plan, keyed by those properties in the function's runtime memo, and later calls run only the plan.
# With its kernels launched directly (NOTE: [Direct launches]) and without a second dispatch, issue 40, RWKV at (1, 4,
# 8): forward 1.34x -> 0.92-0.96x a hand-written autograd.Function, forward + backward 1.55x -> 1.10-1.12x.
def _plan_key(args: Sequence[torch.Tensor]) -> tuple[Any, ...]:
    return "torch launch", tuple((a.dtype, a.shape, a.device, a.is_contiguous()) for a in args)


def _evaluate(fn: Function, args: Sequence[torch.Tensor], owner: Function) -> list[torch.Tensor]:
    key = _plan_key(args)
    plan = fn.memo.peek(key)
    if plan is not None:  # NOTE: [Launch plans]
        owner._counter.hit()
        return plan(args)
    batch = fn.read(args, f"td.torch.function({owner.name})")
    with owner._counter.tally():
        outs = fn.evaluate(batch)
    plan = fn.launch_plan(batch)
    if plan is not None:
        fn.memo.put(key, plan)
    device = _device_of(args)
    return [_to_torch(o, device, args) for o in outs]


def _fake(fn: Function, args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Outputs of the right shapes and dtypes from ``fn.signature``, without running Taichi.

    NOTE: [Symbolic shapes] Under dynamic shapes a pointwise function's batch
    dims stay symbolic (they broadcast); every other dim is specialized (a
    guard: another size compiles again), since output shapes of field
    programs and ndarray kernels come from Python code (shape rules) and
    specs are hashed.
    """
    declared = fn.pointwise and fn.declared_specs() is not None
    specs = fn.specs_for(args if declared else [_Concrete(a) for a in args])
    out_specs, _ = fn.signature(specs)
    batch: tuple[Any, ...] = ()
    if fn.pointwise:
        batch = tuple(torch.broadcast_shapes(*[a.shape[: a.ndim - len(s.shape)]
                                               for a, s in zip(args, specs, strict=True)]))
    device = _device_of(args)
    return [torch.empty(batch + tuple(s.shape), dtype=torch_dtype(s.dtype), device=device) for s in out_specs]


class _Concrete:
    """A tensor's shape (specialized to integers, NOTE: [Symbolic shapes]) and dtype, for specs."""

    def __init__(self, t: torch.Tensor) -> None:
        self.shape = tuple(int(d) for d in t.shape)
        self.ndim = len(self.shape)
        self.dtype = t.dtype


def _align(args: Sequence[Any], in_dims: Sequence[int | None], core_ndims: Sequence[int]) -> list[Any]:
    """Mapped dim to the front, batch dims right-aligned so every argument broadcasts (NOTE: [vmap rules])."""
    logical = [(a.ndim - (d is not None) - c) for a, d, c in zip(args, in_dims, core_ndims, strict=True)]
    depth = max(logical) if logical else 0
    out = []
    for a, d, n in zip(args, in_dims, logical, strict=True):
        if d is None:
            out.append(a)
            continue
        a = a.movedim(d, 0)
        out.append(a.reshape((a.shape[0],) + (1,) * (depth - n) + tuple(a.shape[1:])))
    return out


# -- the operator -----------------------------------------------------------------------
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
"""Tensors a launch plan runs on as they are (not fake, functional or other subclasses a tracer passes)."""

_numbers = itertools.count()
_PROCESS = uuid.uuid4().hex[:8]  # NOTE: [Operator names]


def operator_of(fn: Function, owner: Function) -> Operator:
    """The operator of ``fn`` within the operator of ``owner`` (NOTE: [One recursion]).

    Every operator of one recursion counts its calls and compiles against
    ``owner``, the Function the user wrapped (``td.cache_info()[owner.name]``).
    """
    key = ("torch op", owner)
    if key not in fn.derived:
        fn.derived[key] = Operator(fn, owner)  # type: ignore[assignment]
    return fn.derived[key]  # type: ignore[return-value]


class Operator:
    """The ``torch.library`` operator of one Function (NOTE: [Operators in the dispatcher])."""

    def __init__(self, fn: Function, owner: Function) -> None:
        self.fn, self.owner = fn, owner
        stem = "".join(c if c.isalnum() else "_" for c in fn.name).strip("_")[:48] or "function"
        self.name = f"{stem}_{_PROCESS}_{next(_numbers)}"
        self.lib = torch.library.Library("tidiff", "FRAGMENT")  # NOTE: [Operator lifetime]
        self.lib.define(f"{self.name}(Tensor[] args) -> Tensor[]")
        self.op = getattr(torch.ops.tidiff, self.name).default
        self.autograd_function = _autograd_function(self)
        me = weakref.ref(self)
        for key in ("CPU", "CUDA"):
            self.lib.impl(self.name, lambda args: _evaluate(me().fn, args, me().owner), key)  # type: ignore[union-attr]
        self.lib.impl(self.name, lambda args: me().autograd(args), "Autograd")  # type: ignore[union-attr]
        torch.library.register_fake(f"tidiff::{self.name}", lambda args: _fake(me().fn, args), lib=self.lib)  # type: ignore[union-attr]
        torch.library.register_vmap(f"tidiff::{self.name}",
                                    lambda info, in_dims, args: me().vmap(info, in_dims[0], args),  # type: ignore[union-attr]
                                    lib=self.lib)

    def __call__(self, *args: torch.Tensor) -> Sequence[torch.Tensor]:
        if torch._C._are_functorch_transforms_active():  # NOTE: [Entering under torch.func]
            return self.autograd_function.apply(*args)
        return self.op(list(args))

    def autograd(self, args: list[torch.Tensor]) -> list[torch.Tensor]:
        """The Autograd kernel: the rules where a gradient or a tangent can flow, else straight below."""
        if torch.autograd.forward_ad._current_level >= 0 or (
                torch.is_grad_enabled() and any(a.requires_grad for a in args)):
            return list(self.autograd_function.apply(*args))
        return list(self.below_autograd(args))  # autograd.Function.apply costs tens of µs per call

    def below_autograd(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if all(type(a) in _PLAIN_TENSORS for a in args):  # eager tensors: their plan needs no second dispatch
            plan = self.fn.memo.peek(_plan_key(args))  # NOTE: [Launch plans]
            if plan is not None:
                self.owner._counter.hit()
                return tuple(plan(args))
        with torch._C._AutoDispatchBelowAutograd():
            return tuple(self.op(list(args)))

    def vmap(self, info: Any, in_dims: Sequence[int | None], args: Sequence[torch.Tensor]) -> tuple[Any, Any]:
        """One call over the mapped batch, or one per mapped index (NOTE: [vmap rules])."""
        if not self.fn.pointwise:
            results = [self(*[a.select(d, i) if d is not None else a for a, d in zip(args, in_dims, strict=True)])
                       for i in range(info.batch_size)]
            outs = [torch.stack(list(r)) for r in zip(*results, strict=True)]
            return outs, [0] * len(outs)
        cores = [len(s.shape) for s in self.fn.specs_for(args)]
        flat = list(self(*_align(args, in_dims, cores)))
        return flat, [0] * len(flat)

    def keeps_outputs(self, inputs: Sequence[torch.Tensor]) -> bool:
        """Whether a call on ``inputs`` keeps its outputs for a first-order backward that reads them back (NOTE:
        [Outputs read back] in ``_adjoint/read_back.py``): an ndarray kernel's whose adjoint does. Found once per
        dtypes and shapes."""
        read_back_for = getattr(self.fn, "read_back_for", None)
        if read_back_for is None or not all(isinstance(d, int) for p in inputs for d in p.shape):
            return False
        key = ("keeps outputs", tuple((p.dtype, tuple(p.shape)) for p in inputs))
        keeps: bool = self.fn.memo.get(key, lambda: read_back_for(self.fn.specs_for(inputs)) is not None)
        return keeps

    def backward(self, primals: Sequence[torch.Tensor], out_shapes: Sequence[Sequence[int]],
                 grads: Sequence[Any], outputs: Sequence[torch.Tensor] = ()) -> tuple[Any, ...]:
        # NOTE: [Launch plans]: which primals are floats and the outputs' dtypes, once per dtypes and shapes (traced
        # shapes are symbolic, and not kept)
        concrete = all(isinstance(d, int) for p in primals for d in p.shape)
        key = ("torch backward", tuple((p.dtype, tuple(p.shape)) for p in primals)) if concrete else None
        kinds = None if key is None else self.fn.memo.peek(key)
        if kinds is None:
            specs = self.fn.specs_for(primals)
            kinds = ([s.is_float for s in specs], [torch_dtype(s.dtype) for s in self.fn.signature(specs)[0]])
            if key is not None:
                self.fn.memo.put(key, kinds)
        floats, out_dtypes = kinds
        device = _device_of(primals)
        cts = [torch.zeros(tuple(shape), dtype=dtype, device=device) if g is None else g
               for g, dtype, shape in zip(grads, out_dtypes, out_shapes, strict=True)]
        if outputs and not torch.is_grad_enabled():  # first order: the adjoint reads the outputs back (NOTE:
            # [Outputs read back])
            per_element = iter(operator_of(outputs_cotangent_map_of(self.fn), self.owner)(*primals, *outputs, *cts))
        else:
            per_element = iter(operator_of(cotangent_map_of(self.fn), self.owner)(*primals, *cts))
        return tuple(unbroadcast(next(per_element), p.shape) if is_float else None
                     for p, is_float in zip(primals, floats, strict=True))

    def jvp(self, primals: Sequence[torch.Tensor], tangents: Sequence[Any]) -> tuple[torch.Tensor, ...]:
        specs = self.fn.specs_for(primals)
        ts = [torch.zeros(p.shape, dtype=torch_dtype(s.dtype), device=p.device) if t is None else t
              for p, t, s in zip(primals, tangents, specs, strict=True) if s.is_float]
        flat = operator_of(self.fn.tangent(), self.owner)(*primals, *ts)
        m = len(flat) // 2
        return tuple(t.expand(o.shape) if t.shape != o.shape else t for o, t in zip(flat[:m], flat[m:], strict=True))


def _autograd_function(operator: Operator) -> Any:
    """The autograd.Function the operator's Autograd kernel applies; it holds the operator weakly."""
    me = weakref.ref(operator)

    forwards = threading.local()  # the field values forward took, until setup_context keeps them in ctx

    class Rules(torch.autograd.Function):
        @staticmethod
        def forward(*args: Any) -> tuple[torch.Tensor, ...]:
            forwards.values = values = record()  # NOTE: [Field values of a call]
            with reading(values):
                return me().below_autograd(args)  # type: ignore[union-attr]

        @staticmethod
        def setup_context(ctx: Any, inputs: Sequence[Any], output: Sequence[Any]) -> None:
            ctx.kept = len(output) if me().keeps_outputs(inputs) else 0  # type: ignore[union-attr]
            ctx.save_for_backward(*inputs, *output[:ctx.kept])  # NOTE: [Outputs read back]
            ctx.save_for_forward(*inputs)
            ctx.out_shapes = [tuple(o.shape) for o in output]
            ctx.field_values = getattr(forwards, "values", None) or {}
            forwards.values = None

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
            saved = ctx.saved_tensors
            n = len(saved) - ctx.kept
            with reading(ctx.field_values):
                return me().backward(saved[:n], ctx.out_shapes, grads, saved[n:])  # type: ignore[union-attr]

        @staticmethod
        def jvp(ctx: Any, *tangents: Any) -> tuple[torch.Tensor, ...]:
            with reading(ctx.field_values):
                return me().jvp(ctx.saved_tensors, tangents)  # type: ignore[union-attr]

        @staticmethod
        def vmap(info: Any, in_dims: Sequence[int | None], *args: Any) -> tuple[Any, Any]:
            outs, dims = me().vmap(info, in_dims, args)  # type: ignore[union-attr]
            return tuple(outs), tuple(dims)

    Rules.__name__ = Rules.__qualname__ = f"{operator.name}_rules"
    # torch binds apply's arguments to forward's signature at every call: computed once here, not each time
    Rules.forward.__signature__ = inspect.signature(Rules.forward)  # type: ignore[attr-defined]
    return Rules
