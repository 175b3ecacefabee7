"""An entry a runtime loop (or a branch) updates, written for the adjoint as a local of the iteration.

NOTE: [Entries updated in a loop, as locals] A kernel iteration that updates
one entry in a runtime loop (``for _ in range(n): h[i] = h[i] * p[i]``)
reads, in each pass, what the pass before wrote. The adjoint reads fields
as the kernel left them (NOTE: [Reads of what the iteration wrote]), so it
saw only the last value: its first vjp was checked against forward mode,
found wrong, and the gradient came by forward pushes, one kernel run per
input component, with a ``td.TaichiReverseWarning``. Locals are reversed
exactly (the loop is reversed as a func's is, NOTE: [Reverse control
flow]), so for its adjoint the kernel is written as the rewrite the
warning asked users for: the entry read into a local before the loop, the
loop updating the local, the local stored after it. That is the same
computation: the iteration owns the entry (another iteration writing it
would race), the loop reads and writes it at one index its passes do not
change, and nothing else in the loop reaches the field: no func reaching
global fields (one given the field by name counts as a use of it), no
helper, no atomic on it, no other index of it. The
read before the loop is one of an entry the kernel then writes, which a
field program keeps (NOTE: [Overwritten values kept]) as it keeps any entry
updated once (``v[i] = v[i] * 0.9``). A loop that only adds into the
entry (``out[i, j] += x[i, k] * W[j, k]``) needs no value, as written, and
is left so, unless the iteration sets the entry before the loop and reads it
after it (a linear layer: ``out[i, j] = b[j]``, the sum, then ``out[i, j] =
ti.tanh(out[i, j])``, whose read saw the ``tanh`` the kernel left): then the
sum is a local too, which starts from the value set. ``h[i] *= e`` reads
the entry (it was taken as written only, and checked). The kernel itself
runs as written.
Measured on a program updating 2,000 entries four times so, then summing
their squares (2-core CPU, a net on the other core): ``td.grad`` 1.89 s warm
before (4,000 tangent runs), 1.2 ms now; first call 2.53 s before, 0.50 s.

NOTE: [Entries set, then updated in a branch] ``y[i] = x[i] * 2``, then
``if x[i] > 0: y[i] = y[i] * x[i]``, then a read of ``y[i]``: the read
after the branch is of a value one side or the other wrote, which the
adjoint does not know, so it read the field as the kernel left it; where
the kernel overwrote the entry after (``y[i] = ti.tanh(y[i])``) that was
wrong, checked and pushed forward, one kernel run per input entry. Such a
branch is written as a loop is: the entry in a local before it (a read of
what the iteration set, known), updated in it, stored after it. Taken where
the iteration sets the entry before the branch and reads it in the branch
or after it, with the loop's conditions on the branch.
"""
from __future__ import annotations

import ast
import copy
from collections.abc import Callable
from typing import Any

import taichi as ti

from .._lang.callees import is_taichi_func
from .._lang.naming import Namer, names_in
from .._lang.parse import Parsed, resolve

_ALLOWED_BUILTINS = {range, min, max, abs, int, float, len}


def entries_as_locals(parsed: Parsed, reaches_fields: Callable[[Any], bool]) -> Parsed:
    """``parsed`` (a kernel) with each entry a runtime loop in a parallel loop updates written as a local (see
    the NOTE; ``reaches_fields(func)``: whether a ``@ti.func`` reads or writes global fields): a new Parsed over a
    copy, or ``parsed`` itself where there is none."""
    tree = copy.deepcopy(parsed.tree)
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    rewriter = _Rewriter(parsed.namespace, bound, Namer(names_in(tree) | set(parsed.namespace)), reaches_fields)
    for stmt in tree.body:
        if isinstance(stmt, ast.For):  # a parallel loop: its runtime loops (of one iteration: no other reaches
            # its entries, NOTE: [Serialized kernels as one iteration])
            rewriter.counters = [] if _once(stmt) else [n.id for n in ast.walk(stmt.target) if isinstance(n, ast.Name)]
            stmt.body = rewriter.block(stmt.body)
    if not rewriter.changed:
        return parsed
    return Parsed(ast.fix_missing_locations(tree), parsed.filename, parsed.first_line, parsed.namespace, parsed.form)


class _Rewriter:
    def __init__(self, namespace: dict[str, Any], bound: set[str], namer: Namer,
                 reaches_fields: Callable[[Any], bool]) -> None:
        self.namespace, self.bound, self.namer, self.reaches_fields = namespace, bound, namer, reaches_fields
        self.counters: list[str] = []  # the parallel loop's
        self.changed = False

    def block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for k, stmt in enumerate(stmts):
            if isinstance(stmt, (ast.For, ast.While)) and not self.static(stmt):
                out += self.loop(stmt, stmts[:k], stmts[k + 1:])
            elif isinstance(stmt, ast.If) and (found := self.entries(stmt, stmts[:k], stmts[k + 1:])):
                out += self.localized(stmt, found)  # NOTE: [Entries set, then updated in a branch]
            else:
                if isinstance(stmt, (ast.If, ast.For, ast.While)):  # a branch, or a loop unrolled: its loops
                    stmt.body, stmt.orelse = self.block(stmt.body), self.block(stmt.orelse)
                out.append(stmt)
        return out

    def static(self, loop: ast.For | ast.While) -> bool:
        """A ``for`` over ``ti.static(...)`` (unrolled when Taichi compiles it)."""
        return isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call) \
            and resolve(loop.iter.func, self.namespace) is ti.static

    def loop(self, loop: ast.For | ast.While, earlier: list[ast.stmt], later: list[ast.stmt]) -> list[ast.stmt]:
        """The loop, each entry it updates read into a local before it and stored after it; loops inside it
        rewritten too. ``earlier`` and ``later``: the statements of its block before and after it."""
        localized = self.localized(loop, self.entries(loop, earlier, later))
        loop.body = self.block(loop.body)
        return localized

    def localized(self, stmt: ast.stmt, entries: list[tuple[str, ast.expr]]) -> list[ast.stmt]:
        """``stmt`` with each of ``entries`` read into a local before it, updated there, stored after it."""
        before: list[ast.stmt] = []
        after: list[ast.stmt] = []
        for root, index in entries:
            local = self.namer.fresh(f"{root}_entry")
            _Replace(root, ast.dump(index), local).visit(stmt)
            before.append(ast.Assign([ast.Name(local, ast.Store())],
                                     ast.Subscript(ast.Name(root, ast.Load()), copy.deepcopy(index), ast.Load())))
            after.append(ast.Assign([ast.Subscript(ast.Name(root, ast.Load()), copy.deepcopy(index), ast.Store())],
                                    ast.Name(local, ast.Load())))
            self.changed = True
        return [*before, stmt, *after]

    def entries(self, loop: ast.For | ast.While | ast.If, earlier: list[ast.stmt], later: list[ast.stmt]
                ) -> list[tuple[str, ast.expr]]:
        """``(field, index)`` of each entry the loop (or branch) updates and may keep in a local (see the NOTEs)."""
        if any(isinstance(n, ast.Call) and not self.plain(n) for n in ast.walk(loop)):
            return []
        assigned = {n.id for n in ast.walk(loop) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        written = _written_entries(loop)
        found = []
        for root in sorted(self.stored(loop)):
            uses = [n for n in ast.walk(loop) if isinstance(n, ast.Name) and n.id == root]
            entries = [n for n in ast.walk(loop) if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)
                       and n.value.id == root]
            shapes = [n for n in ast.walk(loop) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                      and n.value.id == root and n.attr == "shape"]
            if len(uses) != len(entries) + len(shapes) or len({ast.dump(e.slice) for e in entries}) != 1:
                continue  # the field reached otherwise, or at two indices
            index = entries[0].slice
            if any(isinstance(n, ast.Call) for n in ast.walk(index)) or assigned & {
                    n.id for n in ast.walk(index) if isinstance(n, ast.Name)}:
                continue  # an index the loop's passes may change
            parts = index.elts if isinstance(index, ast.Tuple) else [index]
            if not set(self.counters) <= {p.id for p in parts if isinstance(p, ast.Name)}:
                continue  # an entry other iterations may reach too (a sum into loss[None])
            updates = {id(n.target) for n in ast.walk(loop) if isinstance(n, ast.AugAssign)
                       and not isinstance(n.op, (ast.Add, ast.Sub))}  # ``h[i] *= e`` reads the entry too
            if isinstance(loop, ast.If):  # NOTE: [Entries set, then updated in a branch]
                if not (_set_in(earlier, root, index) and (_read_in([loop], root, index)
                                                           or _read_in(later, root, index))):
                    continue
            elif all(id(e) in written and id(e) not in updates for e in entries) and not (
                    _set_in(earlier, root, index) and _read_in(later, root, index)):
                continue  # written only (h[i] += e): its adjoint needs no value, as written
            found.append((root, index))
        return found

    def stored(self, loop: ast.AST) -> set[str]:
        """Names not bound in the kernel (fields, arrays) whose entries the loop writes (or a component of)."""
        return {n.value.id for n in _written_entries(loop).values() if isinstance(n, ast.Subscript)
                and isinstance(n.value, ast.Name) and n.value.id not in self.bound}

    def plain(self, call: ast.Call) -> bool:
        """A call that reaches no field: of Taichi's own (not an atomic), of a Python builtin, of a rule helper of
        tidiff's (in a tangent kernel), or of a ``@ti.func`` reading and writing no global field (one given the field
        by name is told by its uses)."""
        fn = resolve(call.func, self.namespace)
        if fn in _ALLOWED_BUILTINS or is_taichi_func(fn) and not self.reaches_fields(fn):
            return True
        module = getattr(fn, "__module__", None) or ""
        if module.startswith("tidiff._rules"):
            return True
        name = getattr(fn, "__name__", "") or ""
        return module.startswith("taichi") and not name.startswith("atomic") and not is_taichi_func(fn) \
            and not getattr(fn, "_is_taichi_function", False)


def _once(loop: ast.For) -> bool:
    """``for _ in range(1)``."""
    return isinstance(loop.iter, ast.Call) and isinstance(loop.iter.func, ast.Name) and loop.iter.func.id == "range" \
        and len(loop.iter.args) == 1 and isinstance(loop.iter.args[0], ast.Constant) and loop.iter.args[0].value == 1


def _set_in(stmts: list[ast.stmt], root: str, index: ast.expr) -> bool:
    """Whether one of the statements is ``root[index] = e``."""
    return any(isinstance(s, ast.Assign) and len(s.targets) == 1 and _is_entry(s.targets[0], root, index)
               for s in stmts)


def _read_in(stmts: list[ast.stmt], root: str, index: ast.expr) -> bool:
    """Whether the statements read ``root[index]`` (``x[i] *= e`` reads it too)."""
    return any(isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load) and _is_entry(n, root, index)
               or isinstance(n, ast.AugAssign) and not isinstance(n.op, (ast.Add, ast.Sub))
               and _is_entry(n.target, root, index) for s in stmts for n in ast.walk(s))


def _is_entry(node: ast.expr, root: str, index: ast.expr) -> bool:
    return isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == root \
        and ast.dump(node.slice) == ast.dump(index)


def _written_entries(loop: ast.AST) -> dict[int, ast.expr]:
    """The subscripts and attributes on the way to what assignments write (``v[i]`` in ``v[i][0] += e``), by id."""
    found: dict[int, ast.expr] = {}
    for node in ast.walk(loop):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AugAssign) else []
        for target in targets:
            while isinstance(target, (ast.Attribute, ast.Subscript)):
                found[id(target)] = target
                target = target.value
    return found


class _Replace(ast.NodeTransformer):
    """Every ``root[index]`` becomes the local, read or written."""

    def __init__(self, root: str, index: str, local: str) -> None:
        self.root, self.index, self.local = root, index, local

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id == self.root and ast.dump(node.slice) == self.index:
            return ast.copy_location(ast.Name(self.local, node.ctx), node)
        self.generic_visit(node)
        return node
