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

NOTE: [Sums into an owned entry, then read] ``x[i] += d[i]``, then ``if
x[i] < 0.0: x[i] = 0.0`` (a ground contact): a sum needs no value for its
own adjoint, so the entry's value after it was unknown, and the test read
the field as the kernel left it, clamped to 0, taking the other side
(silently wrong before NOTE: [Fields read by tests]; then checked, wrong,
pushed forward). Where the iteration owns the entry (its index holds each
parallel counter by itself) and a later statement of the block reads it,
the sum is written ``x[i] = x[i] + d[i]``: the same value (no other
iteration adds there), now known to the reads after it; the read of what
the entry held is one a field program keeps (NOTE: [Overwritten values
kept]). An update of a component read later (``vel[i][1] -= g``, then
``pos[i] += dt * vel[i]``) is written ``v = vel[i]; v[1] -= g; vel[i] =
v``: the entry stored whole, which the reads after it see (a bouncing
particle written by components was checked and pushed forward).

NOTE: [Entries read first from zeroed outputs] An ndarray kernel's outputs
hold zeros whenever it starts: tidiff allocates them so, for every launch
(``+=`` sums from 0). A recurrence into an output carried by a runtime loop
(RWKV's time mixing, ``for c: for t: state[c] = a[c] * state[c] + e[t, c];
out[t, c] = state[c]``) first reads the entry before the loop, where it
holds 0; the adjoint read it as the kernel left it (the last step's value),
so the kernel was checked, found wrong and pushed forward, one run per input
entry. Where that read is the kernel's first access of the entry (no use of
the array before the loop in the kernel's source, and every runtime loop
around it has its counter in the index, so no earlier pass reached it), the
local starts as a zero of the array's type instead, a constant. An array of
vectors or matrices is left as it was.

NOTE: [Loops interchanged for a carried entry] Written step by step, the
recurrence is ``for t: for c: state[c] = ...`` (serialized, or in each row
of a parallel loop): the entry the passes over ``t`` carry sits in the
inner loop over ``c``, whose passes change its index, so it is no local of
either loop. Where the inner passes reach disjoint entries (every array the
inner body writes is reached only by entries with ``c`` itself at one same
place in the index), its locals are each pass's own (first assigned at the
body's top level, used nowhere else), its bounds do not depend on ``t`` and
it calls nothing that reaches fields, the two loops are the same
computation the other way round, each ``c`` taking its ``t`` in order; the
adjoint takes them so (``for c: for t:``) where that leaves an entry carried
over ``t``, which is then a local of the inner loop. The kernel runs as
written.
"""
from __future__ import annotations

import ast
import copy
from collections.abc import Callable
from typing import Any

import taichi as ti
from taichi.lang.matrix import MatrixType
from taichi.types.ndarray_type import NdarrayType

from .._lang.callees import is_taichi_func
from .._lang.naming import Namer, bound, names_in
from .._lang.nodes import holds_counters, own_index
from .._lang.parse import Parsed, annotation_value, resolve

_ALLOWED_BUILTINS = {range, min, max, abs, int, float, len}


def entries_as_locals(parsed: Parsed, reaches_fields: Callable[[Any], bool], zeroed: dict[str, Any] | None = None
                      ) -> Parsed:
    """``parsed`` (a kernel) with each entry a runtime loop in a parallel loop updates written as a local (see
    the NOTE; ``reaches_fields(func)``: whether a ``@ti.func`` reads or writes global fields): a new Parsed over a
    copy, or ``parsed`` itself where there is none. ``zeroed``: arrays holding zeros when the kernel starts (an
    ndarray kernel's outputs), with their element types (NOTE: [Entries read first from zeroed outputs])."""
    tree = copy.deepcopy(parsed.tree)
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    rewriter = _Rewriter(parsed.namespace, bound, Namer(names_in(tree) | set(parsed.namespace)), reaches_fields)
    rewriter.zeroed, rewriter.tree = _scalar_arrays(tree, parsed.namespace, zeroed or {}), tree
    if rewriter.zeroed:
        rewriter.order, rewriter.names_at = _preorder(tree)
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
        self.zeroed: dict[str, Any] = {}  # arrays of scalars holding zeros when the kernel starts -> element type
        self.order: dict[int, int] = {}  # statement id -> its place in the kernel's source order
        self.names_at: dict[str, list[int]] = {}  # name -> the places of its uses, before any rewrite
        self.enclosing: list[ast.For | ast.While] = []  # the runtime loops around the block being rewritten
        self.tree: ast.AST = ast.Module([], [])  # the kernel

    def block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for k, stmt in enumerate(stmts):
            if isinstance(stmt, (ast.For, ast.While)) and not self.static(stmt):
                out += self.loop(stmt, list(out), stmts[k + 1:])
            elif isinstance(stmt, ast.AugAssign) and (entry := self.component_updated(stmt, stmts[k + 1:])):
                out += self.whole_update(stmt, *entry)  # NOTE: [Sums into an owned entry, then read]
            elif isinstance(stmt, ast.AugAssign) and self.summed_then_read(stmt, stmts[k + 1:]):
                target = stmt.target
                assert isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                first = self.read_first(stmt, target.value.id, target.slice)  # an output's 0, where read first
                out.append(_as_update(stmt, self.zero(target.value.id) if first else None))  # NOTE: [Sums into
                self.changed = True  # an owned entry, then read]
            elif isinstance(stmt, ast.If) and (found := self.entries(stmt, list(out), stmts[k + 1:])):
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
        self.interchange(loop)  # NOTE: [Loops interchanged for a carried entry]
        localized = self.localized(loop, self.entries(loop, earlier, later))
        self.enclosing.append(loop)
        try:
            loop.body = self.block(loop.body)
        finally:
            self.enclosing.pop()
        return localized

    def localized(self, stmt: ast.stmt, entries: list[tuple[str, ast.expr]]) -> list[ast.stmt]:
        """``stmt`` with each of ``entries`` read into a local before it, updated there, stored after it."""
        before: list[ast.stmt] = []
        after: list[ast.stmt] = []
        for root, index in entries:
            local = self.namer.fresh(f"{root}_entry")
            first = self.zero(root) if self.read_first(stmt, root, index) else None
            _Replace(root, ast.dump(index), local).visit(stmt)
            before.append(ast.Assign([ast.Name(local, ast.Store())], first or ast.Subscript(
                ast.Name(root, ast.Load()), copy.deepcopy(index), ast.Load())))
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
            if len(uses) != len(entries) + len(shapes):
                continue  # the field reached otherwise
            index = entries[0].slice
            if any(isinstance(n, ast.Call) for n in ast.walk(index)) or not own_index(entries, self.counters, assigned):
                continue  # at two indices, at one the loop's passes may change, or one other iterations may reach
                # too (a sum into loss[None])
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

    def interchange(self, outer: ast.For | ast.While) -> None:
        """``for t: for c: body`` as ``for c: for t: body`` where that is the same computation and leaves an entry
        the passes over ``t`` carry (``state[c]``) in the inner loop (NOTE: [Loops interchanged for a carried
        entry])."""
        if not (isinstance(outer, ast.For) and not outer.orelse and len(outer.body) == 1
                and isinstance(outer.body[0], ast.For) and not self.static(outer.body[0])):
            return
        inner = outer.body[0]
        if inner.orelse or not all(isinstance(t, ast.Name) for t in (outer.target, inner.target)):
            return
        assert isinstance(outer.target, ast.Name) and isinstance(inner.target, ast.Name)
        t, c = outer.target.id, inner.target.id
        if any(isinstance(n, ast.Name) and n.id == t for n in ast.walk(inner.iter)) or any(
                isinstance(n, ast.Call) and not self.plain(n) for n in ast.walk(inner)):
            return  # bounds that depend on the outer counter, or a call that may reach fields
        if any(isinstance(n, (ast.Break, ast.Continue, ast.Return)) for n in ast.walk(inner)):
            return
        written = self.stored(inner)
        carried = False
        for root in written:
            positions = set()
            for n in ast.walk(inner):
                if isinstance(n, ast.Name) and n.id == root and not any(
                        isinstance(e, ast.Subscript) and e.value is n for e in ast.walk(inner)):
                    return  # the array reached otherwise than by an entry
                if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == root:
                    parts = n.slice.elts if isinstance(n.slice, ast.Tuple) else [n.slice]
                    at = [k for k, p in enumerate(parts) if isinstance(p, ast.Name) and p.id == c]
                    positions.add(at[0] if at else None)
                    carried |= not any(isinstance(p, ast.Name) and p.id == t for p in parts)
            if len(positions) != 1 or None in positions:
                return  # iterations over ``c`` may reach one entry
        if not carried or not self.private(inner):
            return
        outer.target, inner.target = inner.target, outer.target
        outer.iter, inner.iter = inner.iter, outer.iter
        self.changed = True

    def private(self, loop: ast.For) -> bool:
        """Whether every local the loop's body assigns is its iteration's own: first assigned at its top level,
        used nowhere outside it."""
        inside = {id(n) for s in loop.body for n in ast.walk(s)}
        assigned = {n.id for n in ast.walk(loop) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        assigned -= {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
        if any(isinstance(n, ast.Name) and n.id in assigned and id(n) not in inside for n in ast.walk(self.tree)):
            return False
        seen: set[str] = set()
        for stmt in loop.body:
            reads = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            if (reads & assigned) - seen:
                return False  # read before the iteration assigned it: carried from another pass
            if isinstance(stmt, ast.Assign) and all(_names_only(t) for t in stmt.targets):
                seen |= {n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            elif any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id in assigned
                     for n in ast.walk(stmt)):
                return False  # assigned in a branch or a loop first
        return True

    def summed_then_read(self, stmt: ast.AugAssign, later: list[ast.stmt]) -> bool:
        """``x[i] += e`` (or ``-=``) into an entry the iteration owns, which a later statement of the block reads
        (NOTE: [Sums into an owned entry, then read])."""
        target = stmt.target
        if not (isinstance(stmt.op, (ast.Add, ast.Sub)) and isinstance(target, ast.Subscript)
                and isinstance(target.value, ast.Name) and target.value.id not in self.bound):
            return False
        return self.owned(target.slice) and _read_in(later, target.value.id, target.slice)

    def component_updated(self, stmt: ast.AugAssign, later: list[ast.stmt]) -> tuple[str, ast.expr] | None:
        """``(root, index)`` where ``stmt`` updates a component of an entry the iteration owns (``v[i][1] -= g``,
        ``v[i].y *= e``) that a later statement of the block reads; else None."""
        target = stmt.target
        entry = target.value if isinstance(target, (ast.Subscript, ast.Attribute)) else None
        if not (isinstance(stmt.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)) and isinstance(entry, ast.Subscript)
                and isinstance(entry.value, ast.Name) and entry.value.id not in self.bound):
            return None
        if isinstance(target, ast.Attribute) and target.attr not in ("x", "y", "z", "w") or isinstance(
                target, ast.Subscript) and not all(isinstance(n, (ast.Constant, ast.Tuple, ast.Load))
                                                   for n in ast.walk(target.slice)):
            return None  # a component at a constant place only
        index = entry.slice
        return (entry.value.id, index) if self.owned(index) and _read_in(later, entry.value.id, index) else None

    def owned(self, index: ast.expr) -> bool:
        """Whether the iteration owns the entry at ``index``: no call in it, each parallel counter by itself."""
        return not any(isinstance(n, ast.Call) for n in ast.walk(index)) and holds_counters(index, self.counters)

    def whole_update(self, stmt: ast.AugAssign, root: str, index: ast.expr) -> list[ast.stmt]:
        """``v[i][1] -= g`` as ``v_entry = v[i]; v_entry[1] -= g; v[i] = v_entry``: the entry stored whole, so the
        reads after it see it (NOTE: [Sums into an owned entry, then read])."""
        local = self.namer.fresh(f"{root}_entry")
        read = ast.Subscript(ast.Name(root, ast.Load()), copy.deepcopy(index), ast.Load())
        target = copy.deepcopy(stmt.target)
        assert isinstance(target, (ast.Subscript, ast.Attribute))  # component_updated found a component
        target.value = ast.Name(local, ast.Load())
        self.changed = True
        return [ast.copy_location(ast.Assign([ast.Name(local, ast.Store())], read), stmt),
                ast.copy_location(ast.AugAssign(target, stmt.op, stmt.value), stmt),
                ast.copy_location(ast.Assign([ast.Subscript(ast.Name(root, ast.Load()), copy.deepcopy(index),
                                                            ast.Store())], ast.Name(local, ast.Load())), stmt)]

    def read_first(self, stmt: ast.stmt, root: str, index: ast.expr) -> bool:
        """Whether the read of ``root[index]`` before ``stmt`` is the kernel's first access of that entry, in an
        array holding zeros when the kernel starts (NOTE: [Entries read first from zeroed outputs])."""
        loops = [loop for loop in self.enclosing if isinstance(loop, ast.For)]
        if root not in self.zeroed or len(loops) < len(self.enclosing):
            return False  # a while loop around: its passes are told by no counter
        counters = {n.id for loop in loops for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
        if not holds_counters(index, counters):
            return False  # an entry an earlier pass of a loop around may have reached
        place = self.order.get(id(stmt))
        return place is not None and not any(at < place for at in self.names_at.get(root, ()))

    def zero(self, root: str) -> ast.expr:
        """``ti.cast(0, dtype)`` of the array's element type, its names bound in the namespace."""
        return ast.Call(bound(self.namespace, ti.cast, "_tidiff_zero_cast"),
                        [ast.Constant(0), bound(self.namespace, self.zeroed[root], "_tidiff_zero_dtype")], [])

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


def _names_only(target: ast.expr) -> bool:
    """An assignment target of names alone (``a``, ``a, b``): it assigns them whole."""
    if isinstance(target, ast.Tuple):
        return all(_names_only(e) for e in target.elts)
    return isinstance(target, ast.Name)


def _preorder(tree: ast.AST) -> tuple[dict[int, int], dict[str, list[int]]]:
    """Each statement's place in source order (a node before its children, children in order), by id; and the
    places of each name's uses."""
    order: dict[int, int] = {}
    names: dict[str, list[int]] = {}

    def visit(node: ast.AST, place: int) -> int:
        if isinstance(node, ast.stmt):
            order[id(node)] = place
        elif isinstance(node, ast.Name):
            names.setdefault(node.id, []).append(place)
        for child in ast.iter_child_nodes(node):
            place = visit(child, place + 1)
        return place

    visit(tree, 0)
    return order, names


def _scalar_arrays(tree: ast.FunctionDef, namespace: dict[str, Any], zeroed: dict[str, Any]) -> dict[str, Any]:
    """The arrays of ``zeroed`` the kernel's annotations give scalar entries (no vector or matrix ``dtype``)."""
    found = {}
    for arg in tree.args.args:
        if arg.arg not in zeroed or zeroed[arg.arg] is None:
            continue
        kind = annotation_value(arg.annotation, namespace)  # ti.types.ndarray(dtype=ti.f64, ndim=1)
        if kind is ti.types.ndarray or isinstance(kind, NdarrayType) and not isinstance(kind.dtype, MatrixType):
            found[arg.arg] = zeroed[arg.arg]
    return found


def _as_update(stmt: ast.AugAssign, held: ast.expr | None) -> ast.Assign:
    """``x[i] += e`` as ``x[i] = x[i] + e`` (``held``: what the entry holds, where known)."""
    read = copy.deepcopy(stmt.target)
    read.ctx = ast.Load()
    return ast.copy_location(ast.Assign([stmt.target], ast.BinOp(held or read, stmt.op, stmt.value)), stmt)


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
