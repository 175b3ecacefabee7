"""An ndarray kernel whose loops overwrite what an earlier loop read, written with a fresh array per overwrite.

NOTE: [Arrays kept by version] An ndarray kernel's adjoint reads its outputs
as the kernel left them (NOTE: [Reverse of an ndarray kernel]). A softmax
written as one kernel (``y[i] = ti.exp(x[i])`` summed into ``total`` in one
loop, then ``y[i] = y[i] / total`` in the next) overwrites the values the
second loop read, so that read gets the result: the first call's check
found the adjoint wrong, warned, and the gradient came by forward pushes, one
kernel run per input entry. For its reverse mode such a kernel is written
again, with versions: where a top-level loop writes an output that a loop
before it read, or reads it itself before writing it, that loop writes a
new array (``y_v1``), first a copy of the current one (a loop of its own,
``y_v1[I] = y[I]``, left out where the current one is the zeros it starts
as); what the loop reads before its first write of that output, it reads
from the current version, and later loops read the new one. The last
version is the output itself, the others are arrays each launch allocates
zeroed (they are outputs of the kernel so written). Every value is then
written once before it is read, so its adjoint, after the kernel so written
has run, reads what each loop read: exact, without a check (NOTE: [Reverse
of an ndarray kernel]), and no forward pushes. Forward mode takes the kernel
as written. Not so written (checked as before): an output touched outside
loops, by a func it is given to, or read inside a loop nested in a loop that
also writes it (iterations of a runtime loop read what earlier ones wrote) but
as below (a loop only writing it there, an embedding bag summing rows in an
inner loop, reads nothing an earlier pass wrote: taken); atomic
max / min into it; ``ti.loop_config``. An update ``y[i] /= e`` (any but
``+=`` and ``-=``, whose adjoints need no old value) is written ``y[i] = y[i] /
e`` first: its read is of the current version, its write of the next (one
node for both named the next version, whose old value came from the copy,
and the adjoint read the result: a softmax written with ``/=`` was checked,
found wrong and pushed forward).

NOTE: [Versions by inner loop] A row-wise softmax, attention or normalization
writes its output in one runtime loop of each row's iteration and updates it
in place in the next (``out[i, j] = ti.exp(x[i, j])`` summed into ``s``, then
``out[i, j] /= s``): the same overwrite inside a parallel loop, where the
versions above are of top-level loops (a survey of kernels as users write
them found attention, in-place softmax and a matmul normalized by its row
norm all checked, found wrong and pushed forward: 1.2 s for attention at T =
64, no gradient at all past 20,000 input entries). Where every statement of
the iteration that writes the output is a runtime loop over one same range
(``for j in range(n)``) reaching it at one index made of that loop's counter
and the parallel loop's (each iteration of such a loop then owns one entry of
the iteration's own), those loops take versions as top-level loops do, each
new one starting with a copy of the entry (``out_v1[i, j] = out_v0[i, j]``) in
place of the copy loop; statements that only read the output (a loop
multiplying the attention weights into ``v``) read the current version. A
parallel loop whose iterations each reach one entry of their own, however
often (a matmul summed into ``out[i, j]`` in a runtime loop, then ``out[i,
j] = ti.tanh(out[i, j] + b[j])`` in a second parallel loop), takes versions
as a loop without inner loops does."""
from __future__ import annotations

import ast
import copy
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import taichi as ti

from .._lang.compile import kernel_like
from .._lang.naming import Namer, names_in, taichi_name
from .._lang.nodes import assign, name, own_index
from .._lang.parse import parse, resolve, without_docstring
from .._lang.sym import Sym

Event = tuple[str, ast.Subscript, bool]
"""``(kind, entry, nested)``: an entry of an array read or written (:func:`_events`)."""


@dataclasses.dataclass
class _Array:
    """An output's versions as the loops are walked: placeholders, and whether the current one was written
    (then a new one starts as its copy) and read by a loop since (then the next write needs a new one)."""

    versions: list[str]
    written: bool = False
    read: bool = False


def versioned(kernel: Any, outputs: Sequence[str]) -> tuple[Any, list[tuple[str, str]]] | None:
    """The kernel written with versions (NOTE: [Arrays kept by version]) and ``(parameter, output)`` for each
    version it takes after its own parameters; None where it needs none, or cannot be so written."""
    try:
        parsed = parse(kernel)
    except Exception:  # noqa: BLE001 -- a kernel tidiff cannot read is left as it is
        return None
    tree, namespace = copy.deepcopy(parsed.tree), parsed.namespace
    outs = set(outputs)
    if not _used_by_entry(tree, outs, namespace):
        return None
    _UpdatesAsReads(outs).visit(tree)
    namer = Namer(names_in(tree) | set(namespace))
    taichi = taichi_name(namer, namespace)
    arrays = {a: _Array([namer.fresh(f"{a}_version")]) for a in outs}
    body: list[ast.stmt] = []
    for stmt in without_docstring(tree.body):
        touched = {_root(n) for n in ast.walk(stmt) if isinstance(n, ast.Subscript)} & outs
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
                and resolve(stmt.value.func, namespace) is ti.loop_config:
            return None
        if not isinstance(stmt, ast.For):
            if touched:
                return None
            body.append(stmt)
            continue
        loop = _loop(copy.deepcopy(stmt), arrays, namespace, namer, taichi)
        if loop is None or any(isinstance(n, ast.Subscript) and _root(n) in outs for s in loop for n in ast.walk(s)):
            return None  # (an entry not seen as read or written)
        body += loop
    if all(len(a.versions) == 1 for a in arrays.values()):
        return None
    names, extra = {}, []
    for a, found in arrays.items():
        for k, placeholder in enumerate(found.versions):
            names[placeholder] = a if k == len(found.versions) - 1 else namer.fresh(f"{a}_v{k}")
            if names[placeholder] != a:
                extra.append((names[placeholder], a))
    for node in ast.walk(ast.Module(body, [])):
        if isinstance(node, ast.Name) and node.id in names:
            node.id = names[node.id]
    used = {n.id for n in ast.walk(ast.Module(body, [])) if isinstance(n, ast.Name)}
    extra = [(p, a) for p, a in extra if p in used]
    annotations = {arg.arg: arg.annotation for arg in tree.args.args}
    params = [ast.arg(p, copy.deepcopy(annotations[a])) for p, a in extra]
    return kernel_like(tree, namer.fresh(f"{tree.name}_versioned"), body, {**namespace, taichi: ti}, taichi,
                       "versioned-kernel", params), extra


def _used_by_entry(tree: ast.FunctionDef, outs: set[str], namespace: dict[str, Any]) -> bool:
    """Whether every use of an output is an entry (``y[i]``), its shape (``y.shape``) or what a loop runs over
    (``for i in y``, ``ti.grouped(y)``): none is given to a func, which could write it unseen."""
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Name) and child.id in outs and not (
                    isinstance(node, ast.Subscript) and child is node.value
                    or isinstance(node, ast.Attribute) and node.attr == "shape"
                    or isinstance(node, ast.For) and child is node.iter
                    or isinstance(node, ast.Call) and resolve(node.func, namespace) is ti.grouped):
                return False
    return True


def _loop(loop: ast.For, arrays: dict[str, _Array], namespace: dict[str, Any], namer: Namer, taichi: str
          ) -> list[ast.stmt] | None:
    """A top-level loop with its outputs' entries named by version, after the copies it needs; None where it
    cannot be so written."""
    events = list(_events(loop.body, namespace, False))
    if any(kind == "extreme" for kind, node, _ in events if _root(node) in arrays):
        return None
    before: list[ast.stmt] = []
    for a, state in arrays.items():
        mine = [(kind, node, nested) for kind, node, nested in events if _root(node) == a]
        stores = [k for k, (kind, _, _) in enumerate(mine) if kind == "store"]
        if not stores:
            for _, node, _ in mine:
                _rename(node, state.versions[-1])
            state.read |= bool(mine)
            continue
        if any(nested for _, _, nested in mine) and not _owned_entry(loop, mine) \
                and any(kind == "load" for kind, _, _ in mine):  # stores alone read nothing an earlier pass wrote
            if not _by_inner_loop(loop, a, state, namespace, namer):
                return None
            continue
        current = state.versions[-1]
        if state.read or any(kind == "load" for kind, _, _ in mine[:stores[0]]):
            new = namer.fresh(f"{a}_version")
            if state.written:
                before.append(_copy(new, current, namer, taichi))
            state.versions.append(new)
            state.read = False
        for k, (_, node, _) in enumerate(mine):
            _rename(node, current if k < stores[0] else state.versions[-1])
        state.written = True
    return before + [loop]


def _by_inner_loop(loop: ast.For, a: str, state: _Array, namespace: dict[str, Any], namer: Namer) -> bool:
    """Versions of ``a`` for the runtime loops of a parallel loop's iteration (NOTE: [Versions by inner loop]),
    named in place; False where the iteration reaches ``a`` otherwise."""
    counters = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    units: list[tuple[ast.stmt, list[Event]]] = []
    for stmt in loop.body:
        events = [e for e in _statement(stmt, namespace, False) if _root(e[1]) == a]
        if any(kind == "store" for kind, _, _ in events) and not (
                isinstance(stmt, ast.For) and not stmt.orelse and isinstance(stmt.target, ast.Name)
                and _one_entry_each(stmt, [node for _, node, _ in events], counters)):
            return False
        units += [(stmt, events)] if events else []
    if len({ast.dump(unit.iter) for unit, events in units if isinstance(unit, ast.For)
            and any(kind == "store" for kind, _, _ in events)}) != 1:
        return False  # (loops over other ranges would leave entries of a version unwritten)
    for unit, events in units:
        stores = [k for k, (kind, _, _) in enumerate(events) if kind == "store"]
        if not stores:  # read only, in any way
            for _, node, _ in events:
                _rename(node, state.versions[-1])
            state.read = True
            continue
        assert isinstance(unit, ast.For)
        current = state.versions[-1]
        if state.read or any(kind == "load" for kind, _, _ in events[:stores[0]]):
            new = namer.fresh(f"{a}_version")
            if state.written:  # the entry's old value, for what the loop does not write
                entry = copy.deepcopy(events[0][1])
                unit.body.insert(0, assign(Sym(name(new))[entry.slice], Sym(name(current))[copy.deepcopy(
                    entry.slice)]))
            state.versions.append(new)
            state.read = False
        for k, (_, node, _) in enumerate(events):
            _rename(node, current if k < stores[0] else state.versions[-1])
        state.written = True
    return True


def _owned_entry(loop: ast.For, events: list[Event]) -> bool:
    """Whether every iteration of the parallel ``loop`` reaches one entry of its own, however often in its runtime
    loops (summed into: ``out[i, j] += a[i, k] * b[k, j]``), reading it there only after the iteration's first
    write (a read before it stands for the version before the loop, which a later pass must not read: it reads
    what the pass before wrote): every entry at one index holding each of the loop's counters as a name of its
    own, made of nothing the loop assigns. Such a loop takes versions as one without inner loops does (NOTE:
    [Arrays kept by version])."""
    first = next((k for k, (kind, _, _) in enumerate(events) if kind == "store"), len(events))
    if any(kind == "load" and nested for kind, _, nested in events[:first]):
        return False
    entries = [node for _, node, _ in events]
    counters = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    assigned = {n.id for stmt in loop.body for n in ast.walk(stmt) if isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Store)}
    return own_index(entries, counters, assigned)


def _one_entry_each(unit: ast.For, entries: list[ast.Subscript], counters: set[str]) -> bool:
    """Whether each iteration of the runtime loop ``unit`` reaches one entry of its own: every entry at one index,
    made of the loop's counter and the parallel loop's (each a name of its own) and of nothing the loop assigns (a
    loop inside it may update that entry again, reading it only after the pass's first write: NOTE: [Entries
    updated in a loop, as locals])."""
    assert isinstance(unit.target, ast.Name)
    first = next((k for k, e in enumerate(entries) if isinstance(e.ctx, ast.Store)), len(entries))
    deeper = {id(n) for stmt in unit.body for loop in ast.walk(stmt) if isinstance(loop, (ast.For, ast.While))
              for n in ast.walk(loop)}
    if any(id(e) in deeper for e in entries[:first]):  # a read in a loop inside, before the first write: a later
        return False  # pass reads what the pass before wrote, which the version before does not hold
    assigned = {n.id for n in ast.walk(unit) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return own_index(entries, {unit.target.id} | counters, assigned - {unit.target.id})


class _UpdatesAsReads(ast.NodeTransformer):
    """``y[i] *= e`` (any update but ``+=`` and ``-=``, whose adjoints need no old value) of an output written as
    ``y[i] = y[i] * e``: the read and the write are two entries, each named by its version."""

    def __init__(self, outs: set[str]) -> None:
        self.outs = outs

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.stmt:
        root: ast.expr = node.target
        while isinstance(root, (ast.Subscript, ast.Attribute)):
            root = root.value
        if isinstance(node.op, (ast.Add, ast.Sub)) or not (isinstance(root, ast.Name) and root.id in self.outs):
            return node
        read = copy.deepcopy(node.target)
        for sub in ast.walk(read):
            if hasattr(sub, "ctx"):
                sub.ctx = ast.Load()
        target = copy.deepcopy(node.target)
        return ast.copy_location(ast.Assign([target], ast.BinOp(read, node.op, node.value)), node)


def _root(node: ast.Subscript) -> str | None:
    return node.value.id if isinstance(node.value, ast.Name) else None


def _rename(node: ast.Subscript, version: str) -> None:
    assert isinstance(node.value, ast.Name)
    node.value = ast.Name(version, ast.Load())


def _copy(new: str, current: str, namer: Namer, taichi: str) -> ast.For:
    """``for I in ti.grouped(new): new[I] = current[I]``."""
    index = namer.fresh("I")
    grouped = Sym(name(taichi)).grouped(name(new))
    return ast.For(ast.Name(index, ast.Store()), grouped.node,
                   [assign(Sym(name(new))[name(index)], Sym(name(current))[name(index)])], [])


def _events(stmts: Sequence[ast.AST], namespace: dict[str, Any], nested: bool) -> Iterator[Event]:
    """``(kind, entry, nested)`` for each entry of an array the statements read ("load") or write ("store";
    ``+=`` and atomic adds too, whose old value the copy gives; "extreme" for atomic max / min), in the order
    they run; ``nested``: inside a loop of the loop."""
    for stmt in stmts:
        yield from _statement(stmt, namespace, nested)


def _statement(node: ast.AST, namespace: dict[str, Any], nested: bool) -> Iterator[Event]:
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        if node.value is not None:
            yield from _statement(node.value, namespace, nested)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            yield from _target(target, namespace, nested)
    elif isinstance(node, (ast.For, ast.While)):
        yield from _statement(node.iter if isinstance(node, ast.For) else node.test, namespace, nested)
        yield from _events(node.body, namespace, True)
        yield from _events(node.orelse, namespace, True)
    elif isinstance(node, ast.If):
        yield from _statement(node.test, namespace, nested)
        yield from _events(node.body, namespace, nested)
        yield from _events(node.orelse, namespace, nested)
    elif isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute) \
            and node.func.attr.startswith("atomic_"):
        for arg in node.args[1:]:
            yield from _statement(arg, namespace, nested)
        kind = "store" if node.func.attr in ("atomic_add", "atomic_sub") else "extreme"
        yield from ((kind if k == "store" else k, n, d) for k, n, d in _target(node.args[0], namespace, nested))
    elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        yield from _statement(node.slice, namespace, nested)
        yield "load", node, nested
    else:
        for child in ast.iter_child_nodes(node):
            yield from _statement(child, namespace, nested)


def _target(target: ast.expr, namespace: dict[str, Any], nested: bool) -> Iterator[Event]:
    """The entry an assignment writes (``y[i]``; ``y[i][0]`` and ``y[i].x`` write ``y[i]``), after what its
    index reads."""
    while isinstance(target, ast.Attribute) or isinstance(target, ast.Subscript) and isinstance(
            target.value, (ast.Subscript, ast.Attribute)):
        if isinstance(target, ast.Subscript):
            yield from _statement(target.slice, namespace, nested)
        target = target.value
    if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
        yield from _statement(target.slice, namespace, nested)
        yield "store", target, nested
    elif isinstance(target, ast.Tuple):
        for elt in target.elts:
            yield from _target(elt, namespace, nested)
