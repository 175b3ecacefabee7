"""One kernel launch over a whole batch: a ``@ti.func`` mapped over ndarrays.

:class:`BatchKernel` generates, once per body and input specs, a kernel whose
parallel loop calls the body on element ``i`` of every argument and stores its
results. Arguments are ndarrays of shape ``(n_k,) + core``; a broadcast
argument is passed once (``n_k == 1``) with stride 0, so NumPy broadcasting
costs no copy. Kernels over ndarrays compile per dtype and ndim, never per
batch size. :class:`ScalarKernel` is the by-value variant for calls without
batch dims (NOTE: [Scalar calls] in ``_pointwise``).

NOTE: [The body's loops stay serial] Taichi runs the for loops at a kernel's
outermost scope in parallel, a ``@ti.func`` inlined there included: a body
called at a kernel's top level would have its runtime loops parallelized
(a loop-carried value then comes out wrong without an error, and ``break``
is refused: "Cannot break in the outermost loop"). Every generated kernel
therefore calls the body inside a loop, the batch loop or a serialized
one-iteration one (which costs no more than a call at the top level: a
plain one-iteration loop goes through Taichi's thread pool, 4x the launch
time of W4), so the body's own loops run in order as they do in any kernel
of the user's that calls it from a loop.

Generated names come from one :class:`~tidiff._lang.naming.Namer`, and types
are bound in the namespace (``T0 = ti.types.ndarray(...)``), never spelled
as text: a function named ``r`` or ``ti`` cannot break the kernel.
"""
from __future__ import annotations

import ast
import keyword
from collections.abc import Sequence
from typing import Any

import numpy as np
import taichi as ti
from taichi.lang.matrix import make_matrix
from taichi.lang.util import to_numpy_type, to_taichi_type

from .._arrays import broadcast_to, contiguous, empty
from .._lang.compile import compile_source
from .._lang.naming import Namer, spell_taichi
from .._lang.nodes import assign, call, for_range, function, taichi
from .._lang.nodes import name as node
from .._lang.nodes import statement as statement_of
from .._lang.sym import Sym
from .._signature import ArgSpec


def identifier(name: str) -> str:
    """A Python identifier made from a readable name such as ``grad(f)``."""
    out = "".join(c if c.isalnum() else "_" for c in name)
    while "__" in out:
        out = out.replace("__", "_")
    out = out.strip("_") or "f"
    out = out if not out[0].isdigit() else "f_" + out
    return out + "_" if keyword.iskeyword(out) else out  # a lambda's name, <lambda>


def spec_of_expr(name: str, value: Any) -> ArgSpec:
    """The spec of a Taichi value while a kernel compiles (a Python number is a constant)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        dtype = np.float64 if isinstance(value, float) else np.int32
        return ArgSpec(name, (), np.dtype(dtype))
    ty = value.ptr.get_rvalue_type()
    if value.ptr.is_tensor():
        return ArgSpec(name, tuple(value.get_shape()), np.dtype(to_numpy_type(ty.element_type())))
    return ArgSpec(name, (), np.dtype(to_numpy_type(ty)))


def kernel_shape(spec: ArgSpec) -> tuple[int, ...]:
    """The shape one element has in a kernel: rank above 2 is flattened (see NOTE: [Flat values])."""
    return spec.shape if len(spec.shape) <= 2 else (spec.size,)


def element_type(spec: ArgSpec) -> Any:
    """The Taichi type of one element as a kernel holds it (flat past rank 2)."""
    return ArgSpec(spec.name, kernel_shape(spec), spec.dtype).ti_type()


class _OutputRecorder:
    """Called inside a probe kernel at compile time; records the body's result types."""

    _is_taichi_function = True  # keeps Taichi from warning about a Python call
    __name__ = "the tidiff output probe"  # Taichi names the callee of a TypeError raised in a call

    class func:
        has_print = False

    def __init__(self, name: str = "the function", allow_none: bool = False) -> None:
        self.specs: list[ArgSpec | None] | None = None
        self.is_tuple = False
        self.name, self.allow_none = name, allow_none

    def __call__(self, result: Any) -> None:
        if result is None:
            raise TypeError(f"{self.name} returns nothing: there is no result to differentiate (a @ti.func "
                            "differentiated by tidiff returns its value; one that writes to fields is a kernel "
                            "program: td.function(program, inputs=[...], outputs=[...]))")
        self.is_tuple = isinstance(result, (tuple, list))
        values = list(result) if self.is_tuple else [result]
        nested = [i for i, v in enumerate(values) if isinstance(v, (tuple, list))]
        if nested:  # a nested result (an aux that is a tuple): outputs are values or a flat tuple of them
            raise TypeError(f"{self.name} returns a tuple holding a tuple (its result {nested[0]}); tidiff's outputs "
                            "are values (scalars, vectors, matrices) or a flat tuple of them: return them flat, as "
                            "(out, aux) with one aux value, or (out0, out1, ...) and no has_aux")
        self.specs = [None if v is None and self.allow_none else spec_of_expr(f"out{i}" if self.is_tuple else "out", v)
                      for i, v in enumerate(values)]


def probe_in_kernel(body: Any, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], bool]:
    """Result specs of ``body`` read while a kernel compiles: call it on zeros (dead code, removed).

    A kernel cannot launch another, so inside one this replaces :func:`probe_outputs`.
    """
    recorder = _OutputRecorder()
    recorder(body(*[_zero_expr(s) for s in in_specs]))
    assert recorder.specs is not None
    return [s for s in recorder.specs if s is not None], recorder.is_tuple  # each has one: no allow_none


def _zero_expr(spec: ArgSpec) -> Any:
    """A zero of ``spec`` as a Taichi expression of the kernel being compiled.

    NOTE: [Probe zeros are expressions] ``ti.Vector([...])`` called from Python
    code while a kernel compiles gives a Python-side ``Matrix``, not an
    expression; a ``@ti.func`` with a vector or matrix parameter refuses it
    ("expected to be a Matrix"). ``make_matrix`` builds the expression the
    kernel's own ``ti.Vector(...)`` would.
    """
    dtype = to_taichi_type(spec.dtype)
    shape = kernel_shape(spec)
    if shape == ():
        return ti.cast(0, dtype)
    if len(shape) == 1:
        return make_matrix([0] * shape[0], dt=dtype)
    return make_matrix([[0] * shape[1] for _ in range(shape[0])], dt=dtype)


class _Source:
    """One generated kernel's namespace and the namer every name in it comes from."""

    def __init__(self, reserved: Sequence[str]) -> None:
        self.namer = Namer(["ti", *reserved])
        self.namespace: dict[str, Any] = {"ti": ti}

    def bind(self, hint: str, value: Any) -> ast.Name:
        """A fresh namespace name holding ``value`` (a type, a body), as an expression."""
        name = self.namer.fresh(hint)
        self.namespace[name] = value
        return ast.Name(name, ast.Load())

    def compile(self, params: Sequence[tuple[str, ast.expr]], body: list[ast.stmt], hint: str, tag: str,
                returns: ast.expr | None = None) -> Any:
        """The ``@ti.kernel`` ``hint(params) -> returns: body``."""
        kernel = self.namer.fresh(hint)
        fn = spell_taichi(function(kernel, params, body, taichi("kernel").node, returns), "ti")
        return compile_source(fn, kernel, self.namespace, tag)


def _serially(once: str, statement: ast.stmt) -> list[ast.stmt]:
    """``statement`` in a serialized one-iteration loop (NOTE: [The body's loops stay serial]): the loop keeps
    Taichi from running the body's own top-level loops in parallel."""
    return [statement_of(taichi("loop_config")(serialize=True)), for_range(once, [1], [statement])]


def probe_outputs(body: Any, in_specs: Sequence[ArgSpec], name: str) -> tuple[list[ArgSpec], bool, Any]:
    """Learn the result specs of an unannotated body by compiling it once.

    Returns ``(specs, is_tuple, kernel)``; the kernel is returned so its
    compile is counted.
    """
    specs, is_tuple, kernel = probe_results(body, in_specs, name)
    return [s for s in specs if s is not None], is_tuple, kernel  # each has one: no allow_none


def probe_results(body: Any, in_specs: Sequence[ArgSpec], name: str,
                  allow_none: bool = False) -> tuple[list[ArgSpec | None], bool, Any]:
    """:func:`probe_outputs`, where ``allow_none`` lets a result be ``None`` (its spec None)."""
    src = _Source([])
    recorder = _OutputRecorder(f"`{name}`", allow_none)
    fn, record = src.bind(name, body), src.bind("record", recorder)
    params = [(src.namer.fresh(f"a{k}"), src.bind(f"T{k}", ti.types.ndarray(dtype=element_type(s), ndim=1)))
              for k, s in enumerate(in_specs)]
    once = src.namer.fresh("once")
    read = call(record, call(fn, *[Sym(node(p))[0] for p, _ in params]))
    compiled = src.compile(params, _serially(once, statement_of(read)), f"{name}__probe", "probe")
    compiled(*[np.zeros((1,) + kernel_shape(s), s.dtype) for s in in_specs])
    assert recorder.specs is not None
    return recorder.specs, recorder.is_tuple, compiled


class BatchKernel:
    """A generated kernel evaluating ``body`` over a batch (see module docstring)."""

    def __init__(self, body: Any, in_specs: Sequence[ArgSpec], out_specs: Sequence[ArgSpec], is_tuple: bool,
                 name: str) -> None:
        self.in_specs = list(in_specs)
        self.out_specs = list(out_specs)
        src = _Source([])
        fn = src.bind(name, body)
        n, i, r = (src.namer.fresh(h) for h in ("n", "i", "r"))
        i32 = taichi("i32").node
        params: list[tuple[str, ast.expr]] = [(n, i32)]
        args = []
        for k, spec in enumerate(self.in_specs):
            a, s = src.namer.fresh(f"a{k}"), src.namer.fresh(f"s{k}")
            params += [(a, src.bind(f"T{k}", ti.types.ndarray(dtype=element_type(spec), ndim=1))), (s, i32)]
            args.append(Sym(node(a))[Sym(node(i)) * Sym(node(s))])
        outs = []
        for j, spec in enumerate(self.out_specs):
            o = src.namer.fresh(f"o{j}")
            params.append((o, src.bind(f"U{j}", ti.types.ndarray(dtype=element_type(spec), ndim=1))))
            outs.append(o)
        results = [Sym(node(r))[j] for j in range(len(outs))] if is_tuple else [Sym(node(r))]
        body_of_loop = [assign(r, call(fn, *args))] + [
            assign(Sym(node(o))[Sym(node(i))].node, value) for o, value in zip(outs, results, strict=True)]
        self.kernel = src.compile(params, [for_range(i, [n], body_of_loop)], f"{name}__batch", "batch")

    def __call__(self, n: int, inputs: Sequence[Any], launch: Any = None, device: Any = None) -> list[Any]:
        """Evaluate over ``n`` elements; ``inputs`` are ``(n or 1,) + core`` arrays; ``launch`` calls the kernel
        (a :class:`~.launch.DirectLaunch` of it, for a launch plan); outputs are tensors on ``device`` where one
        is given (NOTE: [Tensors in place] in ``_arrays``), else NumPy."""
        outputs = [empty((n,) + kernel_shape(s), s.dtype, device) for s in self.out_specs]
        if n:
            args: list[Any] = [n]
            for a in inputs:
                args += [a, 0 if a.shape[0] == 1 else 1]
            (launch or self.kernel)(*args, *outputs)
        return [o.reshape((n,) + s.shape) for o, s in zip(outputs, self.out_specs, strict=True)]


class ScalarKernel:
    """One call of a scalar body on scalars, by value: a kernel returning the result.

    A call with no batch dims pays for one plain launch instead of a
    parallel loop over one-element arrays (NOTE: [Scalar calls] in ``_pointwise``).
    """

    def __init__(self, body: Any, in_specs: Sequence[ArgSpec], out_spec: ArgSpec, name: str) -> None:
        self.out_spec = out_spec
        src = _Source([])
        fn = src.bind(name, body)
        params = [(src.namer.fresh(f"a{k}"), src.bind(f"T{k}", s.ti_type())) for k, s in enumerate(in_specs)]
        r, once = src.namer.fresh("r"), src.namer.fresh("once")
        R = src.bind("R", out_spec.ti_type())
        body_of_kernel = [assign(r, taichi("cast")(0, R)),
                          *_serially(once, assign(r, call(fn, *[p for p, _ in params]))),
                          ast.Return(node(r))]
        self.kernel = src.compile(params, body_of_kernel, f"{name}__one", "one", returns=R)

    @staticmethod
    def fits(in_specs: Sequence[ArgSpec], out_specs: Sequence[ArgSpec], is_tuple: bool) -> bool:
        return not is_tuple and all(s.shape == () for s in list(in_specs) + list(out_specs))

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(self.kernel(*[a.item() for a in inputs]), self.out_spec.dtype)]


def flatten_batch(arrays: Sequence[Any], specs: Sequence[ArgSpec],
                  batch_shape: tuple[int, ...]) -> tuple[int, list[Any]]:
    """Arrays (NumPy or tensors) of shape ``(n_k,) + core`` for a kernel: batch dims flattened, broadcast kept
    cheap.

    An argument whose batch dims are all 1 (or absent) is passed as one
    element; one partly broadcast is expanded to the full batch.
    """
    n = int(np.prod(batch_shape, dtype=np.int64))
    flat = []
    for a, s in zip(arrays, specs, strict=True):
        batch = tuple(a.shape[: a.ndim - len(s.shape)])
        if int(np.prod(batch, dtype=np.int64)) == 1:
            a = a.reshape((1,) + s.shape)
        elif batch != batch_shape:
            a = broadcast_to(a, batch_shape + s.shape).reshape((n,) + s.shape)
        else:
            a = a.reshape((n,) + s.shape)
        flat.append(contiguous(a).reshape((a.shape[0],) + kernel_shape(s)))
    return n, flat
