"""Kernels over ``ti.types.ndarray()`` parameters (docs/torch.md).

An ndarray kernel writes its results into output arrays it is given::

    @ti.kernel
    def conv(k: ti.types.ndarray(), w: ti.types.ndarray(), out: ti.types.ndarray(), eps: ti.f64):
        ...

    op = td.function(conv, inputs=["k", "w"], outputs={"out": lambda k, w: k.shape},
                     constants={"eps": 1e-3})

The engines run the kernel on the arrays themselves: a torch tensor (or a
NumPy array, seen through a zero-copy torch view) reaches the kernel without
a copy, and Taichi compiles the kernel once per dtype and ndim, never per shape.

- ``evaluate``: outputs are allocated (zeroed, so ``+=`` accumulates from 0)
  and the kernel launched once;
- ``vjp``: tidiff's adjoint of the kernel on the tensors (NOTE: [Reverse of an
  ndarray kernel] in ``_adjoint/kernels.py``; NOTE: [Gradient aliases]); a
  ``td.TransformError`` where the transform does not take the kernel (NOTE:
  [Taichi's reverse mode not run] in ``_fields/hidden_rules.py``);
- ``tangent()``: the kernel's tangent transform (``_tangent/kernels.py``), an
  ndarray kernel again (:class:`NdarrayTangent`): its vjp is the adjoint of
  the tangent kernel, which is second order, and its own tangent is the
  tangent kernel of the tangent kernel.

NOTE: [Gradient aliases] An adjoint kernel (tidiff's, as Taichi's
``kernel.grad`` would) reads ``y.grad`` and accumulates into
``x.grad`` of the very tensor objects it is given, and allocates ``.grad``
for any ``requires_grad`` tensor it sees, even under ``torch.no_grad``
(taichi #8340). The engines therefore never hand the caller's tensors to
Taichi: they pass ``t.detach()``, a new tensor object over the same memory,
whose ``.grad`` slot is tidiff's own. The forward launch gets aliases that
do not require grad; the reverse launch gets aliases with fresh zeroed
``.grad`` buffers (and a *copy* of each cotangent, which the adjoint zeroes
as it reads it). The caller's ``.grad`` is never touched, so a torch
backward that returns these gradients counts them exactly once (the trap of
taichi #8101 is a backward that lets Taichi write ``x.grad`` *and* returns it).

NOTE: [Differentiating ndarray inputs] ``ti.types.ndarray(needs_grad=False)``
on an input is Taichi's way of saying "no gradient here"; tidiff gives that
input zero derivatives in every mode (``vjp`` and ``jvp`` alike), as if the
argument were integer-valued.
"""
from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import taichi as ti
from taichi.lang.util import to_numpy_type
from taichi.types.ndarray_type import NdarrayType

from .._adjoint.kernels import KernelAdjoint, vjp_ndarray_kernel
from .._adjoint.transform import NotReversible
from .._adjoint.versions import versioned
from .._arrays import Batch, is_tensor, numpy_dtype, to_numpy, torch_dtype
from .._cache import uses
from .._derived import TangentArguments
from .._errors import TransformError
from .._fields.graph import CodeGraph
from .._fields.hidden_rules import describe, refusal_of, refuse_recomputed, reverse_refused_error, rules_reached
from .._fields.values import check_unchanged
from .._lang.activity import root_names, stores
from .._lang.compile import info
from .._lang.launch import DirectLaunch
from .._lang.parse import kernel_function
from .._lang.scratch import Scratch
from .._lang.source import source_tree
from .._protocol import Function, register_kind
from .._reverse_check import checked_vjp, wrong_reverse
from .._signature import ArgSpec
from .._tangent import jvp_ndarray_kernel
from .._tree import Tree, flat_tree


def _torch() -> Any:
    import torch

    return torch


class _ArrayInfo:
    """What an output-shape rule sees of one input: ``.shape``, ``.ndim``, ``.dtype``."""

    def __init__(self, spec: ArgSpec) -> None:
        self.shape = tuple(spec.shape)
        self.ndim = len(self.shape)
        self.dtype = spec.dtype

    def __repr__(self) -> str:
        return f"<array shape={self.shape} dtype={self.dtype}>"


def _annotation(kernel: Any, name: str) -> Any:
    return inspect.signature(kernel_function(kernel)).parameters[name].annotation


def _is_ndarray_annotation(ann: Any) -> bool:
    return isinstance(ann, NdarrayType)


def _annotation_dtype(ann: Any) -> np.dtype | None:
    """The NumPy dtype an ``ndarray(dtype=...)`` annotation fixes (scalar elements), or None."""
    dtype = getattr(ann, "dtype", None)
    if dtype is None:
        return None
    try:
        return np.dtype(to_numpy_type(dtype))
    except Exception:  # vector/matrix element types: the array's own dtype decides
        return None


def as_tensor(a: Any) -> Any:
    """A torch view of ``a`` (no copy for contiguous, writable arrays and for tensors)."""
    torch = _torch()
    if isinstance(a, torch.Tensor):
        return a.detach() if a.is_contiguous() else a.detach().contiguous()
    return torch.from_numpy(np.require(a, requirements=("C", "W")))


def fresh(value: Any, spec: ArgSpec, device: Any) -> Any:
    """A new contiguous tensor holding ``value`` (Taichi's adjoints zero the buffers they read)."""
    torch = _torch()
    if isinstance(value, torch.Tensor):
        t = value.detach().to(device=device, dtype=torch_dtype(spec.dtype))
        t = t.expand(spec.shape) if tuple(t.shape) != tuple(spec.shape) else t
        return t.clone(memory_format=torch.contiguous_format)
    return torch.tensor(np.broadcast_to(np.asarray(value, spec.dtype), spec.shape), device=device)


def zeros(spec: ArgSpec, device: Any) -> Any:
    return _torch().zeros(spec.shape, dtype=torch_dtype(spec.dtype), device=device)


ShapeRule = Callable[..., Any] | tuple[int, ...]


class NdarrayFunction(Function):
    """A ``@ti.kernel`` over ndarray parameters with named inputs and outputs (docs/torch.md).

    Arguments are the ``inputs`` in order, each a whole array (no batch dims:
    the kernel sees the array's full shape). Results are the ``outputs``.
    """

    native_tensors = True  # evaluate/vjp take tensors (any device) as they are, NumPy as NumPy

    def __init__(self, kernel: Any, inputs: Sequence[str], outputs: dict[str, ShapeRule],
                 constants: dict[str, Any] | None = None, name: str | None = None, *, listed: bool = True,
                 frozen: Sequence[bool] | None = None, zeroed: Sequence[bool] | None = None,
                 scratch: Sequence[Scratch] = ()) -> None:
        super().__init__(name or kernel_function(kernel).__name__, listed=listed)
        self.kernel = kernel
        self.scratch = list(scratch)  # a tangent kernel's arrays after its parameters (NOTE: [Scratch arrays])
        self.params = list(inspect.signature(kernel_function(kernel)).parameters)
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.constants = dict(constants or {})
        self.shape_rules = dict(outputs)
        self.in_dtypes = [_annotation_dtype(_annotation(kernel, n)) for n in self.inputs]
        self.out_dtypes = [_annotation_dtype(_annotation(kernel, n)) for n in self.outputs]
        # NOTE: [Differentiating ndarray inputs]: no derivative through these; their tangents read as zeros
        self.frozen = list(frozen) if frozen is not None else [
            getattr(_annotation(kernel, n), "needs_grad", None) is False for n in self.inputs]
        self.zeroed = list(zeroed) if zeroed is not None else [False] * len(self.inputs)
        self._graph: CodeGraph | None = None  # what the kernel reaches; a tangent kernel has its primal kernel's
        self._hidden_rules: list[tuple[str, str]] | None = None
        self._fields: list[tuple[str, Any]] | None = None

    def _code_graph(self) -> CodeGraph:
        if self._graph is None:
            self._graph = CodeGraph(self.kernel)
        return self._graph

    def global_fields(self) -> list[tuple[str, Any]]:
        """``(name, field)`` for each global field the kernel reaches: found once; a tangent kernel has its
        primal kernel's."""
        if self._fields is None:
            graph = self._code_graph()
            self._fields = [(graph.names.get(key, "?"), f) for key, f in graph.fields.items()]
        return self._fields

    def hidden_rules(self) -> list[tuple[str, str]]:
        """The derivative rules the kernel reaches that Taichi's reverse mode cannot apply (NOTE: [Rules
        Taichi's reverse mode cannot see]): found once; a tangent kernel has its primal kernel's."""
        if self._hidden_rules is None:
            self._hidden_rules = rules_reached(self._code_graph())
        return self._hidden_rules

    def reverse_refused(self) -> str | None:
        floats = [d for d in self.in_dtypes if d is not None and d.kind == "f"]
        default = floats[0] if floats else np.dtype(np.float64)  # the annotations' types; float64 where they say none
        found = self._adjoint_or_why([d or default for d in self.in_dtypes], [d or default for d in self.out_dtypes])
        if not isinstance(found, NotReversible):
            return wrong_reverse(self)  # tidiff's adjoint applies every rule
        refuse_recomputed(self.hidden_rules(), f"the ndarray kernel `{self.name}`")  # forward pushes would draw anew
        return describe([refusal_of(self.name, found)])

    def adjoint_for(self, specs: Sequence[ArgSpec]) -> KernelAdjoint | None:
        """tidiff's adjoint of the kernel for inputs of these specs (NOTE: [Reverse of an ndarray kernel]), or
        None where the transform does not take the kernel (reverse mode is then refused)."""
        return self._adjoint([s.dtype for s in specs], [s.dtype for s in self.signature(specs)[0]])

    def refusal(self, specs: Sequence[ArgSpec]) -> list[str]:
        """Why tidiff's reverse transform does not take the kernel for inputs of these specs (none where it does)."""
        found = self._adjoint_or_why([s.dtype for s in specs], [s.dtype for s in self.signature(specs)[0]])
        return [refusal_of(self.name, found)] if isinstance(found, NotReversible) else []

    def _adjoint(self, in_dtypes: Sequence[np.dtype], out_dtypes: Sequence[np.dtype]) -> KernelAdjoint | None:
        adjoint = self._adjoint_or_why(in_dtypes, out_dtypes)
        return None if isinstance(adjoint, NotReversible) else adjoint

    def _adjoint_or_why(self, in_dtypes: Sequence[np.dtype], out_dtypes: Sequence[np.dtype]
                        ) -> KernelAdjoint | NotReversible:
        def element(dtype: np.dtype, differentiable: bool) -> Any:
            return (ti.f32 if dtype == np.float32 else ti.f64) if differentiable and dtype.kind == "f" else None

        arrays = {n: element(d, not f) for n, d, f in zip(self.inputs, in_dtypes, self.frozen, strict=True)}
        arrays.update({n: element(d, True) for n, d in zip(self.outputs, out_dtypes, strict=True)})
        arrays.update({s.param: None for s in self.scratch})  # read as the kernel left them
        return vjp_ndarray_kernel(self.kernel, arrays, self.outputs)  # outputs allocated zeroed at every launch

    def exact(self, adjoint: KernelAdjoint) -> bool:
        """Whether ``adjoint`` gives the kernel's derivative without a check: the kernel writes no input, and
        every output it reads is read where no later write changes it, so that the adjoint, after the kernel
        ran, reads what the kernel read (NOTE: [Reverse of an ndarray kernel]). Found once per adjoint: every
        vjp asks."""
        def find() -> bool:
            ins = {self.params.index(n) for n in self.inputs}
            outs = {self.params.index(n) for n in self.outputs}
            accesses = [a for a in adjoint.accesses.accesses if not a.won]  # what an atomic max / min left is
            # read after the kernel ran: exact
            return not any(a.field in ins if a.kind == "store" else a.field in outs and (a.anywhere or any(
                b.kind == "store" and b.field == a.field for b in accesses[k + 1:])) for k, a in enumerate(accesses))

        exact: bool = self.memo.get(("exact", id(adjoint)), find)  # adjoints live as long as their kernel
        return exact

    def reads_outputs(self, adjoint: KernelAdjoint) -> bool:
        """Whether ``adjoint`` reads the outputs (or scratch arrays) as the kernel left them (then the kernel runs
        first)."""
        def find() -> bool:
            outs = {self.params.index(n) for n in self.outputs + [s.param for s in self.scratch]}
            return not self.exact(adjoint) or any(a.kind == "load" and a.field in outs
                                                  for a in adjoint.accesses.accesses)

        reads: bool = self.memo.get(("reads outputs", id(adjoint)), find)  # every vjp asks
        return reads

    # -- signature -----------------------------------------------------------
    def param_names(self) -> list[str]:
        return list(self.inputs)

    def arity(self, args: Sequence[Any]) -> int:
        return len(self.inputs)

    def concrete(self, specs: Sequence[ArgSpec]) -> NdarrayFunction:
        return self

    def specs_for(self, args: Sequence[Any]) -> list[ArgSpec]:
        """Each argument's whole shape and its own dtype (float32 stays float32)."""
        specs = []
        for name, value, fixed in zip(self.inputs, args, self.in_dtypes, strict=False):
            if hasattr(value, "shape") and hasattr(value, "dtype"):
                shape, dtype = tuple(value.shape), numpy_dtype(value.dtype)
            else:
                a = np.asarray(value)
                shape, dtype = a.shape, (np.dtype(np.float64) if a.dtype.kind == "f" else a.dtype)
            specs.append(ArgSpec(name, shape, fixed or dtype))
        return specs

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        return self.memo.get(("signature", tuple(in_specs)), lambda: self._signature(list(in_specs)))

    def _signature(self, in_specs: list[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        infos = [_ArrayInfo(s) for s in in_specs]
        floats = [s.dtype for s in in_specs if s.is_float]
        default = floats[0] if floats else np.dtype(np.float64)
        outs = []
        for n, fixed in zip(self.outputs, self.out_dtypes, strict=True):
            rule = self.shape_rules[n]
            shape = rule(*infos) if callable(rule) else rule
            try:
                shape = tuple(int(d) for d in shape)
            except TypeError:
                raise TypeError(f"{self.name}: outputs[{n!r}] gave {shape!r}, not a shape") from None
            outs.append(ArgSpec(n, shape, fixed or default))
        return outs, flat_tree(len(outs), len(outs) == 1)

    def read(self, args: Sequence[Any], call: str | None = None) -> Batch:
        """Check the arguments: tensors stay tensors (on their device), anything else becomes NumPy."""
        call = call or self.name
        if len(args) != len(self.inputs):
            raise TypeError(
                f"{call}: expected {len(self.inputs)} arguments ({', '.join(self.inputs)}), got {len(args)}"
            )
        specs = self.specs_for(args)
        arrays, device = [], None
        for spec, value in zip(specs, args, strict=True):
            if is_tensor(value):
                device = value.device
                if value.is_complex():
                    raise TypeError(f"{call}: argument {spec.name!r} is complex; tidiff differentiates real values")
                value = value.detach()
                arrays.append(value if numpy_dtype(value.dtype) == spec.dtype else value.to(torch_dtype(spec.dtype)))
                continue
            array = to_numpy(value, spec.name, call)
            if array.shape != spec.shape:
                array = np.broadcast_to(array, spec.shape)
            arrays.append(array if array.dtype == spec.dtype else array.astype(spec.dtype))
        return Batch(tuple(arrays), tuple(specs), (), device)

    # -- engines ---------------------------------------------------------------
    def _launch(self, kernel: Any, tensors: dict[str, Any], counted: Any = None, extra: Sequence[Any] = ()) -> None:
        uses(counted or kernel)
        check_unchanged(self.global_fields(), f"the ndarray kernel `{self.name}`")  # NOTE: [Field values of a call]
        kernel(*[tensors[p] if p in tensors else self.constants[p] for p in self.params], *extra)

    def _inputs(self, batch: Batch) -> tuple[list[Any], list[ArgSpec], Any, bool]:
        """Input tensors (zero-copy views; zeros for zeroed tangents), output specs, device, whether NumPy."""
        as_numpy = not any(is_tensor(a) for a in batch.arrays)
        ins = [as_tensor(a) for a in batch.arrays]
        device = ins[0].device if ins else _torch().device("cpu")
        ins = [zeros(s, device) if z else t for t, s, z in zip(ins, batch.specs, self.zeroed, strict=True)]
        out_specs, _ = self.signature(batch.specs)
        return ins, out_specs, device, as_numpy

    @staticmethod
    def _result(t: Any, as_numpy: bool) -> Any:
        return t.numpy() if as_numpy else t

    def evaluate(self, batch: Batch) -> list[Any]:
        ins, out_specs, device, as_numpy = self._inputs(batch)
        outs = [zeros(s, device) for s in out_specs]
        self._launch(self.kernel, self._with_scratch({**dict(zip(self.inputs, ins, strict=True)),
                                                      **dict(zip(self.outputs, outs, strict=True))}, device))
        return [self._result(o, as_numpy) for o in outs]

    def _with_scratch(self, tensors: dict[str, Any], device: Any) -> dict[str, Any]:
        """``tensors`` (by parameter name) with the kernel's scratch arrays added, zeroed (NOTE: [Scratch
        arrays])."""
        for s in self.scratch:
            tensors[s.param] = s.allocate(tensors, device)
        return tensors

    def launch_plan(self, batch: Batch) -> Callable[[Sequence[Any]], list[Any]] | None:
        """:meth:`evaluate` of tensors like ``batch``'s, its checks and specs taken from ``batch`` (NOTE: [Launch
        plans] in ``_torch``): fresh zeroed outputs, one launch. None for a kernel reading global fields, whose
        values a derivative's record checks at every launch."""
        if self.global_fields() or self.scratch or not all(is_tensor(a) and a.is_contiguous() for a in batch.arrays):
            return None
        torch = _torch()
        out_specs, _ = self.signature(batch.specs)
        inputs, arguments = self._plan_inputs(batch.specs), self._plan_arguments()
        outputs = [(s.shape, torch_dtype(s.dtype)) for s in out_specs]
        kernel = DirectLaunch(self.kernel)  # NOTE: [Direct launches]

        def launch(args: Sequence[Any]) -> list[Any]:
            device = args[0].device
            outs = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype in outputs]
            kernel(*arguments(inputs(args, device), outs))
            return outs

        return launch

    def _plan_inputs(self, specs: Sequence[ArgSpec]) -> Callable[[Sequence[Any], Any], list[Any]]:
        """A plan's input tensors from a call's: detached, in the specs' dtypes (a call's own may differ), zeros for
        the zeroed ones."""
        torch = _torch()
        converted = [torch_dtype(s.dtype) for s in specs]
        zeroed = [(s.shape, torch_dtype(s.dtype)) if z else None for s, z in zip(specs, self.zeroed, strict=True)]

        def inputs(args: Sequence[Any], device: Any) -> list[Any]:
            return [torch.zeros(z[0], dtype=z[1], device=device) if z is not None else a.detach() if a.dtype == c else
                    a.detach().to(c) for a, c, z in zip(args, converted, zeroed, strict=True)]

        return inputs

    def _plan_arguments(self) -> Callable[[Sequence[Any], Sequence[Any]], list[Any]]:
        """The kernel's arguments, in its parameters' order, from a plan's input and output tensors."""
        order = [(self.inputs.index(p) if p in self.inputs else -1, self.outputs.index(p) if p in self.outputs else -1,
                  self.constants.get(p)) for p in self.params]

        def arguments(ins: Sequence[Any], outs: Sequence[Any]) -> list[Any]:
            return [ins[i] if i >= 0 else outs[o] if o >= 0 else constant for i, o, constant in order]

        return arguments

    def vjp_plan(self, batch: Batch, read_back: bool = False) -> Callable[[Sequence[Any]], list[Any]] | None:
        """:meth:`unchecked_vjp` of tensors like ``batch``'s (primals, then one cotangent per output; with
        ``read_back``, primals, the outputs the kernel left, then the cotangents: :meth:`vjp_from_outputs`), as a
        plan (NOTE: [Launch plans] in ``_torch``) returning the float inputs' cotangents. Only where that reverse
        mode needs no check (tidiff's exact adjoint), and not for kernels reading global fields."""
        if self.by_version() is not None:  # its vjp takes cotangents of the versions too
            return None
        n = len(self.inputs)
        specs = list(batch.specs[:n])
        own = self.read_back_for(specs) if read_back else self.adjoint_for(specs)
        if own is None or not self.exact(own) or self.global_fields() or self.scratch \
                or not all(is_tensor(a) for a in batch.arrays) or not all(a.is_contiguous() for a in batch.arrays[:n]):
            return None  # cotangents may be expanded (a sum's): the plan copies them
        torch = _torch()
        out_specs = self.signature(specs)[0]
        inputs, arguments = self._plan_inputs(specs), self._plan_arguments()
        differentiated = [s.is_float and not f for s, f in zip(specs, self.frozen, strict=True)]
        floats = [(k, s.shape, torch_dtype(s.dtype)) for k, s in enumerate(specs) if s.is_float]
        outputs = [(s.shape, torch_dtype(s.dtype)) for s in out_specs]
        m = len(outputs)
        adjoint = DirectLaunch(own.kernel)
        chunked = None if own.chunked is None else DirectLaunch(own.chunked.kernel)  # NOTE: [Accumulations by chunk]
        primal = DirectLaunch(self.kernel) if self.reads_outputs(own) else None  # what the
        # adjoint reads of the outputs (what an atomic max / min left)
        allocate = torch.zeros if primal is not None else torch.empty

        def launch(args: Sequence[Any]) -> list[Any]:
            device = args[0].device
            ins = inputs(args[:n], device)
            for k, d in enumerate(differentiated):
                if d:  # NOTE: [Gradient aliases]: Taichi's adjoint of a tensor is its .grad
                    ins[k] = ins[k].detach().requires_grad_(True)
                    ins[k].grad = torch.zeros_like(ins[k])
            given = args[n:n + m] if read_back else [None] * m
            outs = []
            for (shape, dtype), y, ct in zip(outputs, given, args[n + m:] if read_back else args[n:], strict=True):
                out = allocate(shape, dtype=dtype, device=device) if y is None else y.detach().to(dtype).contiguous()
                if dtype.is_floating_point:  # an integer output carries no cotangent
                    out.requires_grad_(True)
                    out.grad = ct.detach().to(dtype).clone(memory_format=torch.contiguous_format)
                outs.append(out)
            if primal is not None:
                primal(*arguments([t.detach() for t in ins], [t.detach() for t in outs]))
            launched = arguments(ins, outs)
            if own is None:
                adjoint(*launched)
            else:
                arrays = dict(zip(self.params, launched, strict=True))
                form = own.for_launch(arrays)
                run = adjoint if form is own or chunked is None else chunked
                run(*launched, *scratch_arrays(form, arrays, device))
            return [ins[k].grad if differentiated[k] else torch.zeros(shape, dtype=dtype, device=device)
                    for k, shape, dtype in floats]

        return launch

    def read_back_for(self, specs: Sequence[ArgSpec]) -> KernelAdjoint | None:
        """The adjoint reading back what the kernel stored (NOTE: [Outputs read back]) for inputs of these specs,
        where a vjp given the outputs a launch left may run it instead of :meth:`unchecked_vjp`'s: tidiff's exact
        adjoint, reading no output as the kernel left them, of a kernel without versions, global fields or
        scratch arrays. None elsewhere."""
        if self.by_version() is not None or self.global_fields() or self.scratch:
            return None
        own = self.adjoint_for(specs)
        if own is None or own.read_back is None or not self.exact(own) or self.reads_outputs(own) \
                or not set(own.reads_back) <= set(self.outputs):
            return None
        return own.read_back

    def vjp_from_outputs(self, batch: Batch, outputs: Sequence[Any], cotangents: Sequence[Any]) -> list[Any]:
        """:meth:`vjp`, given the outputs a launch on ``batch`` left (NOTE: [Outputs read back])."""
        if self.read_back_for(batch.specs) is None:
            return self.vjp(batch, cotangents)
        return self.unchecked_vjp(batch, cotangents, outputs)

    def by_version(self) -> tuple[NdarrayFunction, int] | None:
        """The kernel written with versions, as a function whose outputs are this one's and then the versions,
        and how many versions it has (NOTE: [Arrays kept by version]); None where the kernel needs none."""
        def make() -> tuple[NdarrayFunction, int] | None:
            made = versioned(self.kernel, self.outputs)
            if made is None:
                return None
            kernel, extra = made
            outputs = {**self.shape_rules, **{p: self.shape_rules[a] for p, a in extra}}
            return NdarrayFunction(kernel, self.inputs, outputs, self.constants, self.name, listed=False,
                                   frozen=self.frozen, zeroed=self.zeroed, scratch=self.scratch), len(extra)

        found: tuple[NdarrayFunction, int] | None = self.memo.get(("by version",), make)
        return found

    def vjp(self, batch: Batch, cotangents: Sequence[Any]) -> list[Any]:
        """Input cotangents by tidiff's adjoint of the kernel (NOTE: [Gradient aliases]), checked against forward
        mode where it is not exact (NOTE: [Checking Taichi's reverse mode]); a ``td.TransformError`` where the
        transform does not take the kernel (NOTE: [Taichi's reverse mode not run])."""
        if (versions := self.by_version()) is not None:  # NOTE: [Arrays kept by version]
            return versions[0].vjp(batch, [*cotangents, *[None] * versions[1]])
        own = self.adjoint_for(batch.specs)
        if own is None:
            raise self.refused_error(batch.specs)
        return checked_vjp(self, batch, cotangents, lambda: self.unchecked_vjp(batch, cotangents),
                           f"the ndarray kernel `{self.name}`", lambda: self.exact(own))

    def refused_error(self, specs: Sequence[ArgSpec]) -> TransformError:
        """The error of reverse mode where tidiff's transform does not take the kernel for inputs of these specs."""
        return reverse_refused_error(f"the ndarray kernel `{self.name}`", self.refusal(specs) or [f"`{self.name}`"],
                                     self.hidden_rules())

    def unchecked_vjp(self, batch: Batch, cotangents: Sequence[Any], outputs: Sequence[Any] | None = None) \
            -> list[Any]:
        """The vjp by reverse mode alone, unchecked: tidiff's adjoint of the kernel (run after the kernel itself
        where the kernel reads its outputs; a ``td.TransformError`` where the transform does not take it). Given
        ``outputs`` (those a launch on ``batch`` left), the adjoint reading them back (NOTE: [Outputs read
        back]; :meth:`vjp_from_outputs`)."""
        if (versions := self.by_version()) is not None:  # NOTE: [Arrays kept by version]
            return versions[0].unchecked_vjp(batch, [*cotangents, *[None] * versions[1]])
        own = self.adjoint_for(batch.specs) if outputs is None else self.read_back_for(batch.specs)
        if own is None:
            raise self.refused_error(batch.specs)
        ins, out_specs, device, as_numpy = self._inputs(batch)
        tensors: dict[str, Any] = {}
        grads: list[Any] = []
        for name, t, spec, frozen in zip(self.inputs, ins, batch.specs, self.frozen, strict=True):
            if spec.is_float and not frozen:
                t = t.detach().requires_grad_(True)
                t.grad = _torch().zeros_like(t)
                grads.append(t)
            else:
                grads.append(None)
            tensors[name] = t
        for name, spec, ct, y in zip(self.outputs, out_specs, cotangents, outputs or [None] * len(self.outputs),
                                     strict=True):
            out = zeros(spec, device) if y is None else fresh(y, spec, device)
            if spec.is_float:  # an integer output (a count beside a sum) carries no cotangent
                out.requires_grad_(True)
                out.grad = zeros(spec, device) if ct is None else fresh(ct, spec, device)
            tensors[name] = out
        self._with_scratch(tensors, device)  # one set, for the kernel and its adjoint
        if self.reads_outputs(own):  # the outputs as the kernel left them, to be read again,
            for name in self.outputs:  # from zeros, as every launch starts (NOTE: [Entries read first from zeroed
                tensors[name].detach().zero_()  # outputs]): a copy of what the forward gave
            self._launch(self.kernel, {n: t.detach() for n, t in tensors.items()})
        arrays = {**self.constants, **tensors}
        own = own.for_launch(arrays)  # NOTE: [Accumulations by chunk]
        extra = scratch_arrays(own, arrays, device)
        self._launch(own.kernel, tensors, counted=self.kernel, extra=extra)
        return [self._result(g.grad, as_numpy) if g is not None else
                (self._result(zeros(s, device), as_numpy) if s.is_float else None)
                for g, s in zip(grads, batch.specs, strict=True)]

    def tangent_at(self, specs: Sequence[ArgSpec]) -> NdarrayFunction:
        """The concrete tangent for these input specs: the tangent kernel, with a tangent per float input."""
        mask = tuple(s.is_float for s in specs)

        def make() -> NdarrayFunction:
            active = [p for p, m in zip(self.inputs, mask, strict=True) if m]
            kept = [s.param for s in self.scratch]  # a tangent kernel's own: taken as they are
            kernel, d_inputs, d_outputs, scratch = jvp_ndarray_kernel(self.kernel, active, self.outputs, kept)
            n = len(self.inputs)
            rules: dict[str, ShapeRule] = {}
            for names in (self.outputs, d_outputs):  # outputs and their tangents: shapes from the primals
                for out, name in zip(self.outputs, names, strict=True):
                    rule = self.shape_rules[out]
                    rules[name] = (lambda *infos, rule=rule: rule(*infos[:n])) if callable(rule) else rule
            frozen_floats = [f for f, m in zip(self.frozen, mask, strict=True) if m]
            tangent = NdarrayFunction(kernel, self.inputs + d_inputs, rules, self.constants, f"jvp({self.name})",
                                      listed=False, frozen=self.frozen + frozen_floats,
                                      zeroed=self.zeroed + frozen_floats, scratch=self.scratch + scratch)
            tangent._hidden_rules = self.hidden_rules()
            tangent._fields = self.global_fields()
            return tangent

        return self.memo.get(("tangent", mask), make)

    def tangent(self) -> Function:
        if "tangent" not in self.derived:
            self.derived["tangent"] = NdarrayTangent(self)
        return self.derived["tangent"]


class NdarrayTangent(Function):
    """``(x..., dx for each float x...) -> (y..., dy for each y...)`` of an ndarray function.

    For each pattern of float inputs this is a concrete :class:`NdarrayFunction`
    over the tangent kernel (``_tangent.kernels.jvp_ndarray_kernel``), which takes
    the kernel's parameters, then one tangent per float input and one per
    output, and writes outputs and their tangents. Its vjp is Taichi's reverse
    mode over the tangent kernel (second order); its tangent is this again,
    one level up.
    """

    native_tensors = True

    def __init__(self, parent: NdarrayFunction | NdarrayTangent) -> None:
        super().__init__(f"jvp({parent.name})", listed=False, arguments=TangentArguments(parent))
        self.parent = parent

    def concrete(self, specs: Sequence[ArgSpec]) -> NdarrayFunction:
        primal = list(specs[: self.parent.arity(specs)])
        return self.parent.concrete(primal).tangent_at(primal)

    def read(self, args: Sequence[Any], call: str | None = None) -> Batch:
        return self.concrete(self.specs_for(args)).read(args, call or self.name)

    def kernel_source(self, specs: Sequence[ArgSpec]) -> str:
        """The generated source of the tangent kernel for these specs (for ``td.source``)."""
        source = info(self.concrete(specs).kernel).source
        assert source is not None  # a generated kernel
        return source

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        outs, _ = self.concrete(in_specs).signature(in_specs)
        return outs, tuple(range(len(outs)))

    def evaluate(self, batch: Batch) -> list[Any]:
        return self.concrete(batch.specs).evaluate(batch)

    def vjp(self, batch: Batch, cotangents: Sequence[Any]) -> list[Any]:
        return self.concrete(batch.specs).vjp(batch, cotangents)

    def reverse_refused(self) -> str | None:
        return self.parent.reverse_refused()

    def tangent(self) -> Function:
        if "tangent" not in self.derived:
            self.derived["tangent"] = NdarrayTangent(self)
        return self.derived["tangent"]


def _accepts(f: Any, options: dict[str, Any]) -> bool:
    inputs = options.get("inputs")
    return bool(getattr(f, "_is_wrapped_kernel", False)) and (
        isinstance(inputs, str) or (inputs is not None and all(isinstance(n, str) for n in inputs)))


def _make(kernel: Any, *, inputs: Any, outputs: Any = None, constants: dict[str, Any] | None = None,
          name: str | None = None, signature: Any = None) -> NdarrayFunction:
    fn_name = name or kernel_function(kernel).__name__
    call = f"td.function({fn_name})"
    if signature is not None:
        raise TypeError(f"{call}: signature= is for @ti.func; an ndarray kernel's shapes come from its arguments")
    if outputs is None:
        raise TypeError(f"td.function: {fn_name!r} is an ndarray kernel; name its outputs and their shapes: "
                        "outputs={'out': lambda k, w: k.shape}")
    params = inspect.signature(kernel_function(kernel)).parameters
    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    if isinstance(outputs, str):
        outputs = [outputs]
    if not isinstance(outputs, dict):
        raise TypeError(f"{call}: outputs= of an ndarray kernel maps each output parameter to its shape, "
                        "e.g. outputs={'out': lambda k, w: k.shape}")
    constants = dict(constants or {})
    for role, names in (("inputs", inputs), ("outputs", list(outputs)), ("constants", list(constants))):
        for n in names:
            if n not in params:
                raise ValueError(f"{call}: {role} names {n!r}, which is not a parameter of the kernel {list(params)}")
    for n in inputs + list(outputs):
        if not _is_ndarray_annotation(params[n].annotation):
            raise TypeError(f"{call}: parameter {n!r} must be annotated ti.types.ndarray() to be an input or output; "
                            "pass scalar parameters through constants={...}")
    overlap = set(inputs) & set(outputs) or (set(inputs) | set(outputs)) & set(constants)
    if overlap:
        raise ValueError(f"{call}: {sorted(overlap)} listed twice among inputs, outputs and constants")
    missing = [n for n in params if n not in inputs and n not in outputs and n not in constants]
    if missing:
        raise TypeError(f"{call}: kernel parameters {missing} are neither inputs nor outputs; give their values in "
                        "constants={...}")
    for n, rule in outputs.items():
        if not callable(rule) and not (isinstance(rule, tuple) and all(isinstance(d, int) for d in rule)):
            raise TypeError(f"{call}: outputs[{n!r}] must be a shape tuple or a callable of the inputs, got {rule!r}")
    _refuse_written_inputs(kernel, inputs, call)
    return NdarrayFunction(kernel, inputs, outputs, constants=constants, name=name)


def _refuse_written_inputs(kernel: Any, inputs: Sequence[str], call: str) -> None:
    """ValueError naming an input the kernel body writes (``x[i] = ...``, ``x[i] += ...``, an atomic op on
    ``x[i]``): the engines run the kernel on the caller's own arrays, which would be changed, and the derivative
    of an in-place update is not that of any function of the inputs (outside code: jacrev, jacfwd and vjp
    gave three different wrong answers, and the caller's array was advanced a step). Kernels it calls are
    not read."""
    try:
        tree, filename, first_line = source_tree(kernel_function(kernel))
    except (OSError, TypeError):
        return
    for node, target in stores(tree):
        if isinstance(node, ast.Call) or isinstance(target, (ast.Subscript, ast.Attribute)):
            roots = root_names(target)
            if roots and roots[0] in inputs:
                raise ValueError(
                    f"{call}: inputs= lists {roots[0]!r}, which the kernel writes ({filename}:"
                    f"{first_line + node.lineno - 1}: `{ast.unparse(node).strip()}`); tidiff never writes your "
                    "inputs, and an in-place update has no derivative as a function of them: write the new values "
                    f"into an output parameter (outputs={{'{roots[0]}_new': ...}}) instead")


register_kind("ndarray kernel", _accepts, _make)


def scratch_arrays(adjoint: KernelAdjoint, arrays: dict[str, Any], device: Any) -> list[Any]:
    """The zeroed arrays ``adjoint`` takes after the kernel's parameters, for a launch with ``arrays`` (by parameter
    name: NOTE: [Scratch arrays] in ``_lang/scratch.py``)."""
    return [s.allocate(arrays, device) for s in adjoint.scratch]
