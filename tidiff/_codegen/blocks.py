"""Jacobians on the host by a kernel that writes each block entry into its output array.

See NOTE: [Blocks written to the output] in ``bodies``. A :class:`BlocksKernel`
runs the same pushes (or reverse calls) a Jacobian body would, inside a
parallel loop over the batch, but stores every entry straight into the
output arrays, so no block is ever a local value indexed at run time.
"""
from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from typing import Any

import taichi as ti
from taichi.lang.util import to_taichi_type

from .._arrays import empty
from .._lang.compile import compile_source
from .._lang.sym import Sym
from .._signature import ArgSpec
from .batch import element_type, kernel_shape
from .bodies import BodyWriter, OutputBlocks, jacobian_blocks, name_of


class KernelWriter(BodyWriter):
    """The statements of one generated kernel: a parallel loop over the batch around them.

    Inside the loop the element values of the inputs carry the inputs'
    names (``args()``), as a body's parameters would; outputs are ndarray
    parameters written at the element index ``index``.
    """

    def __init__(self, name: str, specs: Sequence[ArgSpec]) -> None:
        super().__init__(name, [s.name for s in specs])
        self.specs = list(specs)
        self.count, self.index_name = self.namer.fresh("n"), self.namer.fresh("i")
        self.index = _name(self.index_name)
        self.arrays = [(self.namer.fresh(f"a{k}"), self.namer.fresh(f"s{k}"),
                        self._bind(f"T{k}", ti.types.ndarray(dtype=element_type(s), ndim=1)))
                       for k, s in enumerate(self.specs)]
        self.outputs: list[tuple[str, str]] = []

    def _bind(self, hint: str, value: Any) -> str:
        name = self.namer.fresh(hint)
        self.namespace[name] = value
        return name

    def output(self, hint: str, annotation: Any) -> Any:
        """A new output ndarray parameter; returns its name."""
        name = self.namer.fresh(hint)
        self.outputs.append((name, self._bind(hint.upper() + "_T", annotation)))
        return _name(name)

    def compile_kernel(self, tag: str) -> Any:
        i, n = self.index_name, self.count
        args = [ast.arg(n, ast.Attribute(ast.Name("ti", ast.Load()), "i32", ast.Load()))]
        loads: list[ast.stmt] = []
        for (a, s, t), x in zip(self.arrays, self.params, strict=True):
            args += [ast.arg(a, ast.Name(t, ast.Load())),
                     ast.arg(s, ast.Attribute(ast.Name("ti", ast.Load()), "i32", ast.Load()))]
            position = ast.BinOp(ast.Name(i, ast.Load()), ast.Mult(), ast.Name(s, ast.Load()))
            loads.append(ast.Assign([ast.Name(x, ast.Store())], ast.Subscript(ast.Name(a, ast.Load()), position,
                                                                                ast.Load())))
        args += [ast.arg(o, ast.Name(t, ast.Load())) for o, t in self.outputs]
        loop = ast.For(ast.Name(i, ast.Store()), ast.Call(ast.Name("range", ast.Load()), [ast.Name(n, ast.Load())], []),
                       loads + self.stmts, [])
        fn = ast.FunctionDef(self.name, ast.arguments([], args, None, [], [], None, []), [loop],
                             [ast.Attribute(ast.Name("ti", ast.Load()), "kernel", ast.Load())], None)
        return compile_source(fn, self.name, self.namespace, tag)


def _name(name: str) -> Sym:
    return Sym(ast.Name(name, ast.Load()))


class BlocksKernel:
    """The host kernel of a Jacobian layout: pushes per element, block entries written to the outputs."""

    def __init__(self, name: str, parent: Any, specs: Sequence[ArgSpec], argnums: Sequence[int],
                 items: Sequence[tuple[Any, ...]], flat_specs: Sequence[ArgSpec], out_specs: Sequence[ArgSpec],
                 single_out: bool, wanted: Sequence[int], flavour: str, tag: str,
                 write: Callable[[KernelWriter, OutputBlocks], None] | None = None) -> None:
        """``write``, where given, writes the blocks in place of :func:`jacobian_blocks` (``nested``)."""
        w = KernelWriter(name + "__blocks", specs)
        arrays, targets = {}, []
        for it, spec in zip(items, flat_specs, strict=True):
            if it[0] == "jac":
                arrays[it[1], it[2]] = w.output(f"J_{it[1]}_{it[2]}", ti.types.ndarray(
                    dtype=to_taichi_type(spec.dtype), ndim=1 + len(spec.shape)))
                targets.append((arrays[it[1], it[2]], spec, True))
            else:
                targets.append(
                    (w.output(f"v_{it[1]}", ti.types.ndarray(dtype=element_type(spec), ndim=1)), spec, False)
                )
        sink = OutputBlocks(w, arrays, w.index)
        value = None
        if write is not None:
            write(w, sink)
        else:
            value = jacobian_blocks(w, parent, specs, argnums, out_specs, single_out, wanted, flavour, sink,
                                    keep_value=any(it[0] == "out" for it in items))
        if any(it[0] == "out" for it in items):
            if value is None:
                value = w.let("value", w.callee(parent, name_of(parent))(*w.args()))
            for it, (array, _, _) in zip(items, targets, strict=True):
                if it[0] == "out":
                    w.store(array[w.index], value if single_out else value[it[1]])
        self.kernel = w.compile_kernel(tag)
        self.targets = targets

    def __call__(self, n: int, inputs: Sequence[Any], device: Any = None) -> list[Any]:
        """Evaluate over ``n`` elements; ``inputs`` are ``(n or 1,) + core`` arrays; outputs ``(n,) + shape``, tensors
        on ``device`` where one is given (NOTE: [Tensors in place] in ``_arrays``)."""
        outputs = [empty((n,) + (spec.shape if block else kernel_shape(spec)), spec.dtype, device)
                   for _, spec, block in self.targets]
        if n:
            args: list[Any] = [n]
            for a in inputs:
                args += [a, 0 if a.shape[0] == 1 else 1]
            self.kernel(*args, *outputs)
        return [o.reshape((n,) + spec.shape) for o, (_, spec, _) in zip(outputs, self.targets, strict=True)]
