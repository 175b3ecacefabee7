"""Functions without a body, made of calls of other functions' engines (field programs, ndarray kernels).

A :class:`Composite` is a fixed list of calls ``g(args)`` whose arguments are
the composite's inputs or constants (basis vectors), and outputs assembled
from the calls' outputs (stacked as rows or columns of a Jacobian). Its
protocol follows from the callees' alone:

- ``evaluate`` runs the calls;
- ``tangent`` is the composite of the calls' tangents, ``g.tangent()(args, dargs)``
  with zero tangents for constants;
- ``vjp`` sums each call's ``g.vjp`` onto the inputs it read.

So transforms of a function without a body (its Jacobians, built here from
its tangent and cotangent map) have a tangent and a vjp again, and every
order comes from the kind's own ``evaluate``, ``vjp`` and ``tangent``.

NOTE: [Cotangent map without a body] For ``V(x, c) = J(x)^T c`` of a function
``f`` with tangent ``T(x, dx) = (f(x), J dx)``:

- ``V`` itself is ``f.vjp``;
- its tangent at ``(x, c)`` along ``(dx, dc)`` is ``(J^T c, J^T dc + sum_k c_k H_k dx)``:
  exactly the cotangent map of ``T`` at ``(x, dx)`` with cotangents
  ``(dc, c)`` on ``(y, dy)``, outputs swapped;
- its vjp with cotangent ``r`` is ``sum_k c_k H_k r`` on ``x`` (the tangent of
  ``V`` along ``(r, 0)``, Hessians being symmetric) and ``J r`` on ``c``
  (the tangent of ``f`` along ``r``).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._arrays import Batch, is_tensor, of_dtype, tensor_device, torch_module, zeros
from ._derived import Arguments, CotangentArguments, OutputsCotangentArguments, TangentArguments, like
from ._pointwise import cotangent_map
from ._protocol import Function
from ._signature import ArgSpec, with_tangents
from ._tree import Tree


@dataclass(frozen=True)
class Const:
    """A constant argument of a call (a basis vector, a zero)."""

    value: np.ndarray


@dataclass(frozen=True)
class Call:
    """``fn(*args)``: each argument an input index of the composite or a :class:`Const`."""

    fn: Function
    args: tuple[int | Const, ...]


@dataclass(frozen=True)
class Output:
    """One output of a composite: call outputs ``parts`` (``(call, output)``) assembled.

    ``stack`` is ``"one"`` (a single part), ``"rows"`` (stacked along a new
    first axis: Jacobian rows, one per output component) or ``"columns"``
    (along a new last axis: one per input component); then reshaped to ``spec.shape``.
    """

    parts: tuple[tuple[int, int], ...]
    spec: ArgSpec
    stack: str = "one"


def _xp(values: Sequence[Any]) -> Any:
    """The array module of ``values``: torch if any is a tensor, else NumPy."""
    return torch_module() if any(is_tensor(v) for v in values) else np


def _assemble(values: list[Any], output: Output) -> Any:
    if output.stack == "one":
        return values[0]
    xp = _xp(values)
    stacked = xp.stack(values, 0 if output.stack == "rows" else -1)
    return stacked.reshape(output.spec.shape)


def _split(cotangent: Any, output: Output, shapes: Sequence[tuple[int, ...]]) -> list[Any]:
    """The cotangent of each part of an assembled output (the inverse of :func:`_assemble`)."""
    if output.stack == "one":
        return [cotangent]
    n = len(output.parts)
    if output.stack == "rows":
        rows = cotangent.reshape((n,) + tuple(shapes[0]))
        return [rows[k] for k in range(n)]
    columns = cotangent.reshape(tuple(shapes[0]) + (n,))
    return [columns[..., k] for k in range(n)]


class Composite:
    """Calls of other functions with outputs assembled from theirs (see the module docstring)."""

    def __init__(self, in_specs: Sequence[ArgSpec], calls: Sequence[Call], outputs: Sequence[Output],
                 tree: Tree) -> None:
        self.in_specs = list(in_specs)
        self.calls = list(calls)
        self.outputs = list(outputs)
        self.tree = tree
        self._call_specs = [self._specs(c) for c in self.calls]
        self._call_outs = [c.fn.signature(s)[0] for c, s in zip(self.calls, self._call_specs, strict=True)]
        self._on_device: dict[tuple[int, Any], Any] = {}

    def _specs(self, call: Call) -> list[ArgSpec]:
        declared = call.fn.declared_specs()
        specs = []
        for k, arg in enumerate(call.args):
            if isinstance(arg, Const):
                name = declared[k].name if declared is not None else f"c{k}"
                specs.append(ArgSpec(name, arg.value.shape, arg.value.dtype))
            else:
                specs.append(self.in_specs[arg])
        return specs

    def signature(self) -> tuple[list[ArgSpec], Tree]:
        return [o.spec for o in self.outputs], self.tree

    def _call_batch(self, c: int, batch: Batch) -> Batch:
        call = self.calls[c]
        device = tensor_device(batch.arrays)
        arrays = [self._const(arg, device) if isinstance(arg, Const) else batch.arrays[arg] for arg in call.args]
        return Batch(tuple(arrays), tuple(self._call_specs[c]), (), batch.device)

    def _const(self, const: Const, device: Any) -> Any:
        """A constant as the call's arrays are: NumPy, or a tensor on their device, made there once (NOTE: [Tensors
        in place] in ``_arrays``)."""
        if device is None:
            return const.value
        key = (id(const), device)
        if key not in self._on_device:
            self._on_device[key] = of_dtype(const.value, const.value.dtype, device)
        return self._on_device[key]

    def _run_key(self, call: Call) -> tuple[Function, tuple[Any, ...]]:
        """The function a call runs forward and its primal arguments: a cotangent map runs its parent."""
        fn, args = call.fn, call.args
        if isinstance(fn, CotangentMap):
            args = args[: fn.parent.arity(self._specs(call))]
            fn = fn.parent
        return fn, tuple(a if isinstance(a, int) else id(a) for a in args)

    def evaluate(self, batch: Batch) -> list[Any]:
        """The calls' results. NOTE: [One forward run per primal] Calls that run the same function at the
        same arguments (its value and its cotangent maps: value_and_grad, the rows of a jacrev) share
        one ``linearize``: one forward run, a pullback per cotangent, as ``ti.ad.Tape`` runs once."""
        keys = [self._run_key(call) for call in self.calls]
        shared = {(id(fn), args) for fn, args in keys if sum(k[0] is fn and k[1] == args for k in keys) > 1}
        linearized: dict[Any, Any] = {}
        results = []
        for c, (call, (fn, args)) in enumerate(zip(self.calls, keys, strict=True)):
            sub = self._call_batch(c, batch)
            if (id(fn), args) not in shared:
                results.append(call.fn.evaluate(sub))
                continue
            if (id(fn), args) not in linearized:
                n = len(args)
                linearized[id(fn), args] = fn.linearize(Batch(sub.arrays[:n], sub.specs[:n], (), sub.device))
            outs, pullback = linearized[id(fn), args]
            if call.fn is fn:
                results.append(list(outs))
            else:
                n = len(args)
                grads = pullback(list(sub.arrays[n:]))
                results.append([g for g, spec in zip(grads, sub.specs[:n], strict=True) if spec.is_float])
        return [_assemble([results[c][j] for c, j in o.parts], o) for o in self.outputs]

    def vjp(self, batch: Batch, cotangents: Sequence[Any]) -> list[Any]:
        per_call: list[list[Any]] = [[None] * len(outs) for outs in self._call_outs]
        for output, ct in zip(self.outputs, cotangents, strict=True):
            if ct is None:
                continue
            shapes = [self._call_outs[c][j].shape for c, j in output.parts]
            for (c, j), part in zip(output.parts, _split(ct, output, shapes), strict=True):
                per_call[c][j] = part if per_call[c][j] is None else per_call[c][j] + part
        grads: list[Any] = [None] * len(self.in_specs)
        for c, call in enumerate(self.calls):
            if all(ct is None for ct in per_call[c]):
                continue
            for arg, g in zip(call.args, call.fn.vjp(self._call_batch(c, batch), per_call[c]), strict=True):
                if g is not None and not isinstance(arg, Const):
                    grads[arg] = g if grads[arg] is None else grads[arg] + g
        device = tensor_device(batch.arrays)
        return [(zeros(s.shape, s.dtype, device) if g is None else g) if s.is_float else None
                for g, s in zip(grads, self.in_specs, strict=True)]

    def tangent(self) -> Composite:
        """``(x..., dx...) -> (outputs..., their tangents...)``: each call replaced by its tangent's."""
        floats = [k for k, s in enumerate(self.in_specs) if s.is_float]
        in_specs = self.in_specs + [ArgSpec("d" + self.in_specs[k].name, self.in_specs[k].shape,
                                            self.in_specs[k].dtype) for k in floats]
        tangent_of = {k: len(self.in_specs) + r for r, k in enumerate(floats)}
        calls = []
        for call, specs in zip(self.calls, self._call_specs, strict=True):
            dargs: list[int | Const] = []
            for arg, spec in zip(call.args, specs, strict=True):
                if not spec.is_float:
                    continue
                if isinstance(arg, Const) or arg not in tangent_of:
                    dargs.append(Const(np.zeros(spec.shape, spec.dtype)))
                else:
                    dargs.append(tangent_of[arg])
            calls.append(Call(call.fn.tangent(), tuple(call.args) + tuple(dargs)))
        m = len(self.outputs)
        outputs = list(self.outputs) + [
            Output(tuple((c, len(self._call_outs[c]) + j) for c, j in o.parts),
                   ArgSpec("d" + o.spec.name, o.spec.shape, o.spec.dtype), o.stack)
            for o in self.outputs
        ]
        return Composite(in_specs, calls, outputs, tuple(range(2 * m)))


class Composed(Function):
    """A function that is a :class:`Composite` for each input specs: the protocol follows from it. It is made
    from another function (``arguments``), whose read of its primals it keeps."""

    arguments: Arguments

    def composite(self, specs: Sequence[ArgSpec]) -> Composite:
        return self.memo.get(("composite", tuple(specs)), lambda: self.make_composite(list(specs)))

    def make_composite(self, specs: list[ArgSpec]) -> Composite:
        raise NotImplementedError

    def read(self, args: Sequence[Any], call: str | None = None) -> Batch:
        return self.arguments.read(args, call or self.name)

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        return self.composite(in_specs).signature()

    def evaluate(self, batch: Batch) -> list[Any]:
        return self.composite(batch.specs).evaluate(batch)

    def vjp(self, batch: Batch, cotangents: Sequence[Any]) -> list[Any]:
        return self.composite(batch.specs).vjp(batch, cotangents)

    def tangent(self) -> Function:
        if "tangent" not in self.derived:
            self.derived["tangent"] = ComposedTangent(self)
        return self.derived["tangent"]


class ComposedTangent(Composed):
    """The tangent of a :class:`Composed` function: its composite's tangent, for each input specs."""

    def __init__(self, parent: Composed) -> None:
        super().__init__(f"jvp({parent.name})", listed=False, arguments=TangentArguments(parent))
        self.parent = parent

    def make_composite(self, specs: list[ArgSpec]) -> Composite:
        return self.parent.composite(specs[: self.parent.arity(specs)]).tangent()


class CotangentMap(Function):
    """``vjp_fn(f)`` of a function without a body: ``(x..., c...) -> J^T c`` (NOTE: [Cotangent map without a body])."""

    arguments: CotangentArguments

    def __init__(self, parent: Function) -> None:
        super().__init__(f"vjp_fn({parent.name})", arguments=CotangentArguments(parent))
        self.parent = parent

    def read(self, args: Sequence[Any], call: str | None = None) -> Batch:
        return self.arguments.read(args, call or self.name)

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        return self.arguments.outputs(in_specs)

    def split(self, batch: Batch) -> tuple[Batch, list[Any]]:
        """The parent's primals as a batch of their own, and the cotangents."""
        n = self.parent.arity(batch.specs)
        return Batch(batch.arrays[:n], batch.specs[:n], (), batch.device), list(batch.arrays[n:])

    def evaluate(self, batch: Batch) -> list[Any]:
        inner, cts = self.split(batch)
        grads = self.parent.vjp(inner, cts)
        return [g for g, s in zip(grads, inner.specs, strict=True) if s.is_float]

    def launch_plan(self, batch: Batch) -> Callable[[Sequence[Any]], list[Any]] | None:
        vjp_plan = getattr(self.parent, "vjp_plan", None)  # an ndarray kernel's (NOTE: [Launch plans] in _torch)
        return None if vjp_plan is None else vjp_plan(batch)

    def tangent(self) -> Function:
        if "tangent" not in self.derived:
            self.derived["tangent"] = CotangentMapTangent(self)
        return self.derived["tangent"]

    def vjp(self, batch: Batch, cotangents: Sequence[Any]) -> list[Any]:
        """On ``x``: ``sum_k c_k H_k r``, the tangent along ``(r, 0)``; on ``c``: ``J r`` (NOTE above)."""
        inner, _ = self.split(batch)
        floats = [k for k, s in enumerate(inner.specs) if s.is_float]
        r = [np.zeros(inner.specs[k].shape, inner.specs[k].dtype) if c is None else c
             for k, c in zip(floats, cotangents, strict=True)]
        tangent = self.tangent()
        specs = with_tangents(batch.specs)
        extra = r + [None] * (len(specs) - len(batch.specs) - len(r))  # dc = 0
        on_x = iter(tangent.evaluate(Batch(
            batch.arrays + tuple(like(v, s, inner) for v, s in zip(extra, specs[len(batch.specs):], strict=True)),
            tuple(specs), (), batch.device))[len(floats):])
        T = self.parent.tangent()
        t_specs = with_tangents(inner.specs)
        t_outs = T.evaluate(Batch(
            inner.arrays + tuple(like(v, s, inner) for v, s in zip(r, t_specs[len(inner.specs):], strict=True)),
            tuple(t_specs), (), batch.device))
        m = len(t_outs) // 2
        on_c = [t_outs[m + j] if s.is_float else None for j, s in enumerate(batch.specs[len(inner.specs):])]
        return [next(on_x) if s.is_float else None for s in inner.specs] + on_c


class OutputsCotangentMap(Function):
    """``(x..., y..., c...) -> J^T c``, given ``y = f(x)`` as a launch left it: an ndarray kernel's adjoint then
    reads back what the kernel stored instead of computing it again (NOTE: [Outputs read back] in
    ``_adjoint/read_back.py``), any other function takes the vjp without ``y``. What a torch operator's
    first-order backward calls; ``y`` stands for ``f(x)``, so it has no derivative of its own: that backward's
    graph is not differentiated (double backward takes :class:`CotangentMap`)."""

    arguments: OutputsCotangentArguments

    def __init__(self, parent: Function) -> None:
        super().__init__(f"vjp_fn({parent.name}, outputs)", listed=False, arguments=OutputsCotangentArguments(parent))
        self.parent = parent

    def read(self, args: Sequence[Any], call: str | None = None) -> Batch:
        return self.arguments.read(args, call or self.name)

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        return self.arguments.outputs(in_specs)

    def evaluate(self, batch: Batch) -> list[Any]:
        n = self.parent.arity(batch.specs)
        m = (len(batch.specs) - n) // 2
        inner = Batch(batch.arrays[:n], batch.specs[:n], (), batch.device)
        outputs, cts = list(batch.arrays[n:n + m]), list(batch.arrays[n + m:])
        from_outputs = getattr(self.parent, "vjp_from_outputs", None)  # an ndarray kernel's
        grads = self.parent.vjp(inner, cts) if from_outputs is None else from_outputs(inner, outputs, cts)
        return [g for g, s in zip(grads, inner.specs, strict=True) if s.is_float]

    def launch_plan(self, batch: Batch) -> Callable[[Sequence[Any]], list[Any]] | None:
        vjp_plan = getattr(self.parent, "vjp_plan", None)  # an ndarray kernel's (NOTE: [Launch plans] in _torch)
        return None if vjp_plan is None else vjp_plan(batch, read_back=True)

    def vjp(self, batch: Batch, cotangents: Sequence[Any]) -> list[Any]:
        raise NotImplementedError(f"{self.name} has no derivative: double backward takes vjp_fn({self.parent.name})")

    def tangent(self) -> Function:
        raise NotImplementedError(f"{self.name} has no derivative: double backward takes vjp_fn({self.parent.name})")


class CotangentMapTangent(Composed):
    """The tangent of ``V = vjp_fn(f)``: ``(x, c, dx, dc) -> (J^T c, J^T dc + sum_k c_k H_k dx)``.

    One call of the cotangent map of ``f``'s tangent (NOTE: [Cotangent map without a body]).
    """

    def __init__(self, vjp_map: CotangentMap) -> None:
        super().__init__(f"jvp({vjp_map.name})", listed=False, arguments=TangentArguments(vjp_map))
        self.vjp_map, self.parent = vjp_map, vjp_map.parent

    def make_composite(self, specs: list[ArgSpec]) -> Composite:
        n = self.parent.arity(specs)
        primal = specs[:n]
        m = len(self.vjp_map.arguments.specs_of(primal)) - n
        cts = specs[n:n + m]
        floats = [k for k, s in enumerate(primal) if s.is_float]
        float_cts = [j for j, s in enumerate(cts) if s.is_float]
        k = len(floats)
        # the tangent's inputs: x (n), c (m), then dx for each float x, dc for each float c
        dx = [n + m + r for r in range(k)]
        dc = {j: n + m + k + r for r, j in enumerate(float_cts)}
        c_y = [dc[j] if j in dc else Const(np.zeros(cts[j].shape, cts[j].dtype)) for j in range(m)]
        c_dy = [n + j for j in range(m)]
        # the cotangent map of T(x, dx) at cotangents (c_y, c_dy) on (y, dy): (gx..., gdx...)
        call = Call(cotangent_map_of(self.parent.tangent()), tuple(range(n)) + tuple(dx) + tuple(c_y) + tuple(c_dy))
        outputs = [Output(((0, k + r),), ArgSpec(f"ct_{primal[i].name}", primal[i].shape, primal[i].dtype))
                   for r, i in enumerate(floats)]
        outputs += [Output(((0, r),), ArgSpec(f"dct_{primal[i].name}", primal[i].shape, primal[i].dtype))
                    for r, i in enumerate(floats)]
        return Composite(specs, [call], outputs, tuple(range(2 * k)))


def outputs_cotangent_map_of(fn: Function) -> OutputsCotangentMap:
    """:class:`OutputsCotangentMap` of ``fn``, made once."""
    if "outputs cotangent map" not in fn.derived:
        fn.derived["outputs cotangent map"] = OutputsCotangentMap(fn)
    return fn.derived["outputs cotangent map"]  # type: ignore[return-value]


def cotangent_map_of(fn: Function) -> Function:
    """``vjp_fn(f)`` as a Function, made once: pointwise for a pointwise ``f``, else a :class:`CotangentMap`."""
    if fn.pointwise:
        return cotangent_map(fn)  # type: ignore[arg-type]
    if "cotangent map" not in fn.derived:
        fn.derived["cotangent map"] = CotangentMap(fn)
    return fn.derived["cotangent map"]
