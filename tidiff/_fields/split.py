"""A kernel whose loops overwrite what an earlier loop of it wrote and a later one read, run loop by loop.

NOTE: [Kernels run loop by loop] A kernel's top-level loops run one after another, as separate launches would. Its
adjoint reads the fields as the whole kernel left them, so where a loop reads what an earlier loop of the same
kernel wrote and that is then overwritten (``y[i] = ti.sin(x[i])``, then ``y[i] = y[i] * x[i] + 1``), the adjoint of
the reading loop reads the later value: the first call's check found it wrong, warned, and the gradient came by
forward pushes, one program run per input. A program's own copy of such a kernel (over its twin fields,
``rebind.py``) runs instead as one kernel per top-level loop, each with the kernel's parameters: the recorder sees a
launch per loop and keeps what each overwrites that an earlier one read (NOTE: [Overwritten values kept]), and every
launch has tidiff's adjoint. Taken where the kernel's top level holds only loops (each with its ``ti.loop_config``);
fields are seen where the kernel and the funcs written out in it (NOTE: [Funcs that write fields, inlined]) index
them by name. Forward mode and the tangent program run the kernel whole, as their tangent kernels are exact.
"""
import ast
import copy
from typing import Any

import taichi as ti
from taichi.lang.field import Field

from .._adjoint.inline import inlined
from .._lang.compile import compile_source, wrap_long_lines
from .._lang.naming import Namer, names_in, taichi_name
from .._lang.objects import bind
from .._lang.parse import parse, resolve, without_docstring


def loop_parts(kernel: Any) -> list[Any] | None:
    """One ``@ti.kernel`` per top-level loop of ``kernel`` (a program's copy of a module-level kernel) where
    a loop overwrites what a loop before it read from a loop before that (NOTE: [Kernels run loop by loop]);
    None where the kernel runs whole."""
    if getattr(kernel, "_is_classkernel", False):
        return None
    try:
        parsed = inlined(bind(parse(kernel), None))
    except Exception:  # noqa: BLE001 -- a kernel tidiff cannot read runs whole, as Taichi runs it
        return None
    groups = _loops(without_docstring(parsed.tree.body), parsed.namespace)
    if groups is None or len(groups) < 2 or not _overwrites_a_read_write(groups, parsed.namespace):
        return None
    namespace = dict(parsed.namespace)
    taichi = taichi_name(Namer(names_in(parsed.tree) | set(namespace)), namespace)
    namespace[taichi] = ti
    parts = []
    for k, group in enumerate(groups):
        fn = copy.deepcopy(parsed.tree)
        fn.name = f"{parsed.tree.name}_loop_{k}"
        fn.body = copy.deepcopy(group)
        fn.decorator_list = [ast.Attribute(ast.Name(taichi, ast.Load()), "kernel", ast.Load())]
        fn.returns = None
        text = wrap_long_lines(ast.unparse(ast.Module([ast.fix_missing_locations(fn)], [])))
        parts.append(compile_source(text + "\n", fn.name, namespace, tag="loop-of-kernel"))
    return parts


def _loops(body: list[ast.stmt], namespace: dict[str, Any]) -> list[list[ast.stmt]] | None:
    """The kernel's top-level loops, each with the ``ti.loop_config(...)`` before it; None where the top level
    holds anything else."""
    groups: list[list[ast.stmt]] = []
    config: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
                and resolve(stmt.value.func, namespace) is ti.loop_config:
            config = [stmt]
        elif isinstance(stmt, ast.For) and not stmt.orelse:
            groups.append(config + [stmt])
            config = []
        else:
            return None
    return groups if not config else None


def _overwrites_a_read_write(groups: list[list[ast.stmt]], namespace: dict[str, Any]) -> bool:
    """Whether a loop writes a field that a loop (it or one before it) reads after a loop before that wrote it."""
    writes = [_fields(group, namespace, ast.Store) for group in groups]
    reads = [_fields(group, namespace, ast.Load) for group in groups]
    return any(writes[i] & reads[j] & writes[k]
               for k in range(len(groups)) for j in range(1, k + 1) for i in range(j))


def _fields(stmts: list[ast.stmt], namespace: dict[str, Any], ctx: type) -> set[int]:
    """The fields (by id) the statements index by name to read (``ast.Load``) or to write (``ast.Store``: an
    assignment's target, an atomic's first argument); an atomic's target is not a read, nor is ``+=``'s (their
    adjoints need no old value), ``*=``'s is."""
    atomic_targets, updated = set(), set()
    for node in ast.walk(ast.Module(stmts, [])):
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute) \
                and node.func.attr.startswith("atomic_"):
            atomic_targets.add(id(node.args[0]))
        elif isinstance(node, ast.AugAssign) and not isinstance(node.op, (ast.Add, ast.Sub)):
            updated.add(id(node.target))
    found = set()
    for node in ast.walk(ast.Module(stmts, [])):
        if not isinstance(node, ast.Subscript):
            continue
        writes = isinstance(node.ctx, ast.Store) or id(node) in atomic_targets
        if not (writes == (ctx is ast.Store) or ctx is ast.Load and id(node) in updated):
            continue
        root: ast.expr = node.value
        while isinstance(root, ast.Subscript):  # v[i][0]
            root = root.value
        field = resolve(root, namespace)
        if isinstance(field, Field):
            found.add(id(field))
    return found
