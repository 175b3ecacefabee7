"""A step's kernels rewritten over fields with a time axis, so that a time loop moves no data.

NOTE: [Fields with a time axis] DiffTaichi programs store the trajectory:
``x[t + 1, i] = x[t, i] + dt * v[t + 1, i]``, one slot per step, so the
forward pass moves nothing between steps and the tape reverses each step
by its kernels' adjoints alone. A step written over state fields
(``x_next[i] = x[i] + dt * v_next[i]``) is the same program with the time
axis left out, and :func:`with_time_axis` puts it back: every field the
loop carries, zeroes or resets is given a buffer with a leading axis of
slots, and each access gets the slot in front of its indices:

- a carried input ``x`` and the output that feeds it, ``x_next``, share one
  buffer: ``x[i]`` reads ``X[slot, i]``, ``x_next[i]`` writes ``X[slot + 1, i]``;
- a state field (zeroed before each step) or a field the step writes and
  must find reset at each step is ``F[slot, i]``: each step keeps its own;
- a per-step output is ``Y[step, i]`` in a buffer of all the loop's steps;
- every other field (parameters, constants) is read as it is.

``for i in x`` becomes ``for i in range(n)`` (``ti.ndrange`` for several
indices), ``ti.grouped(x)`` ``ti.grouped(ti.ndrange(...))`` and ``x.shape``
the field's shape. The kernel takes ``slot`` and ``step`` after its own
parameters. Funcs that write fields or reach a buffered one are inlined
first (NOTE: [Funcs that write fields, inlined]); a func that still reaches
a buffered field (one returning early, a method of an object), the
field used whole (passed on, ``x.grad``, ``x.fill``), a field with an
offset, a ``ti.template()`` parameter or a kernel returning a value is not
taken (:class:`NotLifted`, and the loop keeps its carry in the program's
own fields).
"""
from __future__ import annotations

import ast
import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import taichi as ti
from taichi.lang.field import Field
from taichi.types.annotations import Template
from taichi.types.ndarray_type import NdarrayType

from .._fields.graph import CodeGraph
from .._lang.callees import is_helper, is_taichi_func
from .._lang.compile import kernel_like
from .._lang.inline import inlined
from .._lang.naming import Namer, names_in
from .._lang.objects import Unbound, bind, static_value
from .._lang.parse import parse, resolve


class NotLifted(Exception):
    """Why a kernel is not rewritten over buffers (the loop keeps its carry in the program's fields)."""


@dataclass(frozen=True)
class Axis:
    """Where a field lives in the loop: ``buffer`` (its shape after a leading axis of slots) at ``at``:
    ``"slot"`` (the step's slot), ``"next"`` (the slot after it) or ``"step"`` (the step's index)."""

    buffer: Field
    at: str


def with_time_axis(kernel: Any, owner: object, axes: Mapping[int, Axis]) -> Any:
    """``kernel`` (a kernel tidiff rebuilt over twins; ``owner`` its object for a class kernel) over the
    buffers of ``axes`` (``id(field) -> Axis``): a kernel taking the kernel's parameters, then ``slot`` and
    ``step`` (see the NOTE). Raises :class:`NotLifted`."""
    bound = getattr(kernel, "_is_classkernel", False)
    ids = {id(a.buffer) for a in axes.values()} | set(axes)
    parsed = inlined(bind(parse(Unbound(kernel)) if bound else parse(kernel), owner),
                     also=lambda callee: _reaches(callee, ids))
    tree, namespace = copy.deepcopy(parsed.tree), dict(parsed.namespace)
    name = tree.name
    if tree.returns is not None:
        raise NotLifted(f"the kernel `{name}` returns a value")
    for arg in tree.args.args:
        if _passes_memory(arg.annotation, namespace):
            raise NotLifted(f"the kernel `{name}` takes a field or an array as parameter `{arg.arg}`")
    local = {a.arg for a in tree.args.args} | {n.id for n in ast.walk(tree)
                                               if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    namer = Namer(names_in(tree) | set(namespace))
    buffered = {n: axes[id(v)] for n, v in namespace.items()
                if n not in local and isinstance(v, Field) and id(v) in axes}
    for n, field in ((n, namespace[n]) for n in buffered):
        if any(field.snode.ptr.offset or ()):
            raise NotLifted(f"the field `{n}` of the kernel `{name}` has an offset")
    slot, step, taichi = namer.fresh("slot"), namer.fresh("step"), namer.fresh("ti")
    names = {n: namer.fresh(f"{n}_in_time") for n in buffered}
    namespace.update({names[n]: a.buffer for n, a in buffered.items()})
    namespace[taichi] = ti
    rewriter = _Rewriter(buffered, names, slot, step, taichi, namespace, local, name, ids)
    body = [rewriter.visit(stmt) for stmt in tree.body]
    params = [ast.arg(p, ast.Attribute(ast.Name(taichi, ast.Load()), "i32", ast.Load())) for p in (slot, step)]
    return kernel_like(tree, f"{name}_in_time", body, namespace, taichi, "time-axis", params)


def _reaches(callee: Any, ids: set[int]) -> bool:
    """Whether a func reaches one of the fields of ``ids`` (itself or through its callees)."""
    return any(i in ids for i in CodeGraph(callee).fields)


def _passes_memory(annotation: ast.expr | None, namespace: dict[str, Any]) -> bool:
    """Whether a parameter's annotation is ``ti.template()`` or an ndarray type (not a number)."""
    if annotation is None:
        return False
    node = annotation.func if isinstance(annotation, ast.Call) else annotation
    value = resolve(node, namespace)
    return value is ti.template or value is ti.types.ndarray or isinstance(value, (Template, NdarrayType))


class _Rewriter(ast.NodeTransformer):
    """Accesses of buffered fields with the slot in front (see the NOTE)."""

    def __init__(self, buffered: dict[str, Axis], names: dict[str, str], slot: str, step: str, taichi: str,
                 namespace: dict[str, Any], local: set[str], kernel: str, ids: set[int]) -> None:
        self.buffered, self.names, self.slot, self.step, self.taichi = buffered, names, slot, step, taichi
        self.namespace, self.local, self.kernel = namespace, local, kernel
        self.ids = ids  # the buffered fields and their buffers

    def _field(self, node: ast.AST) -> str | None:
        return node.id if isinstance(node, ast.Name) and node.id in self.buffered else None

    def _shape(self, n: str) -> tuple[int, ...]:
        return tuple(self.namespace[n].shape)

    def _ti(self, attr: str) -> ast.expr:
        return ast.Attribute(ast.Name(self.taichi, ast.Load()), attr, ast.Load())

    def _at(self, n: str) -> ast.expr:
        at = self.buffered[n].at
        if at == "step":
            return ast.Name(self.step, ast.Load())
        here = ast.Name(self.slot, ast.Load())
        return ast.BinOp(here, ast.Add(), ast.Constant(1)) if at == "next" else here

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        n = self._field(node.value)
        if n is None:
            return self.generic_visit(node)
        index = self.visit(node.slice)
        entries = [] if isinstance(index, ast.Constant) and index.value is None \
            else list(index.elts) if isinstance(index, ast.Tuple) else [index]
        return ast.copy_location(ast.Subscript(ast.Name(self.names[n], ast.Load()),
                                               ast.Tuple([self._at(n), *entries], ast.Load()), node.ctx), node)

    def visit_For(self, node: ast.For) -> ast.AST:
        n = self._field(node.iter)
        if n is not None:
            shape: list[ast.expr] = [ast.Constant(s) for s in self._shape(n)]
            node.iter = ast.Call(ast.Name("range", ast.Load()), shape, []) \
                if isinstance(node.target, ast.Name) and len(shape) == 1 else ast.Call(self._ti("ndrange"), shape, [])
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        func = None if isinstance(node.func, ast.Name) and node.func.id in self.local \
            else resolve(node.func, self.namespace)
        if func is ti.grouped and len(node.args) == 1 and (n := self._field(node.args[0])) is not None:
            ranges = ast.Call(self._ti("ndrange"), [ast.Constant(s) for s in self._shape(n)], [])
            return ast.copy_location(ast.Call(node.func, [ranges], []), node)
        if (is_taichi_func(func) or is_helper(func)) and _reaches(func, self.ids):
            raise NotLifted(f"the kernel `{self.kernel}` calls `{ast.unparse(node.func)}`, which reaches a field "
                            "the loop keeps a slot of per step")
        return self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        n = self._field(node.value)
        if n is not None and node.attr == "shape":
            return ast.copy_location(ast.Tuple([ast.Constant(s) for s in self._shape(n)], ast.Load()), node)
        self._no_container(node)
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.buffered:
            raise NotLifted(f"the kernel `{self.kernel}` uses the field `{node.id}` other than by its entries, "
                            "its loop or its shape")
        self._no_container(node)
        return node

    def _no_container(self, node: ast.Name | ast.Attribute) -> None:
        """A list, tuple or dict holding a buffered field (``xs[k][i]`` in a static loop) would reach the field,
        not its buffer."""
        value = static_value(node, self.namespace, self.local)
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
        if any(id(v) in self.ids for v in items):
            raise NotLifted(f"the kernel `{self.kernel}` reaches a field the loop keeps a slot of through "
                            f"`{ast.unparse(node)}`")
