"""Which fields a kernel writes from which fields it reads: the data flow behind known-zero tangents.

NOTE: [Known-zero tangents] A field program pushes tangents only through
fields that depend on an input. Each kernel is summarized as *flows*: "these
fields are written from values computed from those fields" (through local
variables, the funcs it calls and the fields passed to them). The program is
active where a fixed point over every flow of every kernel says so
(:mod:`tidiff._fields.activity`); every other field, and every local that
does not depend on an active field, has no tangent at all. So a constant
``c`` costs no tangent work, and ``c.norm()`` at ``c == 0`` is never
differentiated: Taichi's ``FwdMode`` gave ``0/0 = NaN`` there (DiffTaichi's
rigid body), where reverse mode was finite.

Control flow carries no tangent (a branch on a field value does not make
what it writes depend on that field); index arithmetic does not either.
A kernel with ``ti.template()`` parameters reads and writes fields only known
at launch: it has no summary (``None``), and the program treats every float
field as active.
"""
import ast
import inspect
from collections.abc import Iterable
from typing import Any

from taichi.types.annotations import Template

from .._lang.activity import root_names
from .._lang.objects import Unbound, argcount, fields_of, is_method_func, method_parts, parsed_for
from .._lang.parse import MISSING, Parsed, resolve

_ATOMICS = {"atomic_add", "atomic_sub", "atomic_mul", "atomic_min", "atomic_max", "atomic_and", "atomic_or",
            "atomic_xor"}


Mark = int | tuple[str, int]
"""A field's id, or ``("p", k)``: whatever parameter ``k`` of a func holds."""


class _Summary:
    """Flows of one kernel or func: ``(written, read)`` sets of field ids and ``("p", k)`` parameter marks,
    and what its return value reads."""

    def __init__(self) -> None:
        self.flows: list[tuple[frozenset[Mark], frozenset[Mark]]] = []
        self.returns: set[Mark] = set()


_SUMMARIES: dict[tuple[Any, int], _Summary] = {}


def kernel_flows(kernel: Any, owner: object = None) -> list[tuple[frozenset[int], frozenset[int]]] | None:
    """``[(written field ids, read field ids), ...]`` of a kernel, or None when it takes ``ti.template()`` fields."""
    params = list(inspect.signature(kernel.__wrapped__).parameters.values())[owner is not None:]
    if any(isinstance(p.annotation, Template) for p in params):
        return None
    f = Unbound(kernel) if owner is not None else kernel
    summary = _summarize(f, owner)
    return [(frozenset(w for w in written if isinstance(w, int)), frozenset(r for r in read if isinstance(r, int)))
            for written, read in summary.flows]


def _summarize(f: Any, owner: object = None) -> _Summary:
    fn, bound = method_parts(f)
    owner = bound if bound is not None else owner
    key = (getattr(fn, "kernel", fn), id(owner))
    if key in _SUMMARIES:
        return _SUMMARIES[key]
    summary = _SUMMARIES[key] = _Summary()  # a recursive func sees itself as flowing nothing
    _Analysis(parsed_for(fn, owner), summary).run()
    return summary


class _Analysis:
    """Flow-insensitive, to a fixed point: locals collect what they were computed from."""

    def __init__(self, parsed: Parsed, summary: _Summary) -> None:
        self.parsed = parsed
        self.summary = summary
        tree = parsed.tree
        self.params = [a.arg for a in tree.args.args]
        self.locals = {a.arg for a in tree.args.args}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.locals.add(node.id)
        self.deps: dict[str, set[Mark]] = {name: set() for name in self.locals}
        for k, name in enumerate(self.params):
            self.deps[name] = {("p", k)}
        self.aliases: dict[str, set[Mark]] = {}  # loop variables over a list of fields: the list's fields
        self.changed = False

    def fields(self, name: str) -> set[Mark]:
        """Field ids (or parameter marks) a name holding fields stands for."""
        if name in self.aliases:
            return self.aliases[name]
        if name in self.locals:
            return set(self.deps.get(name, ())) if name in self.params else set()
        value = resolve(ast.Name(name, ast.Load()), self.parsed.namespace)
        return {id(f) for f in fields_of(value)} if value is not MISSING else set()

    def reads(self, node: ast.AST) -> set[Mark]:
        found: set[Mark] = set()
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                if sub.id in self.aliases:
                    found |= self.aliases[sub.id]
                elif sub.id in self.locals:
                    found |= self.deps.get(sub.id, set())
                else:
                    found |= self.fields(sub.id)
            elif isinstance(sub, ast.Call):
                found |= self.call(sub)
        return found

    def callee(self, node: ast.Call) -> Any:
        if not isinstance(node.func, (ast.Name, ast.Attribute)):
            return MISSING
        root: ast.expr = node.func
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in self.locals:
            return MISSING
        return resolve(node.func, self.parsed.namespace)

    def call(self, node: ast.Call) -> set[Mark]:
        """What a call of a ``@ti.func`` reads beyond its arguments; records the flows inside it."""
        callee = self.callee(node)
        if callee is MISSING or not (getattr(callee, "_is_taichi_function", False) or is_method_func(callee)):
            return set()
        if not hasattr(callee, "__wrapped__") or argcount(callee) != len(node.args):
            return set()
        inner = _summarize(callee)

        def substitute(marks: Iterable[Mark], written: bool = False) -> set[Mark]:
            out: set[Mark] = set()
            for m in marks:
                if isinstance(m, tuple):
                    arg = node.args[m[1]]
                    out |= self.written_fields(arg) if written else self.reads(arg)
                else:
                    out.add(m)
            return out

        for written, read in inner.flows:
            self.record(substitute(written, written=True), substitute(read))
        return substitute(inner.returns)

    def written_fields(self, target: ast.expr) -> set[Mark]:
        roots = root_names(target)
        found: set[Mark] = set()
        for root in roots:
            found |= self.fields(root)
        return found

    def record(self, written: set[Mark], read: set[Mark]) -> None:
        if written and read:
            self.summary.flows.append((frozenset(written), frozenset(read)))

    def store(self, target: ast.expr, read: set[Mark]) -> None:
        for root in root_names(target):
            if root in self.aliases or (root not in self.locals) or root in self.params:
                self.record(self.fields(root), read)
            elif not read <= self.deps.setdefault(root, set()):
                self.deps[root] |= read
                self.changed = True

    def run(self) -> None:
        body = self.parsed.tree.body
        for node in (n for stmt in body for n in ast.walk(stmt)):
            if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
                aliased: set[Mark] = set()
                for sub in ast.walk(node.iter):
                    if isinstance(sub, ast.Name) and sub.id not in self.locals:
                        value = resolve(sub, self.parsed.namespace)
                        if isinstance(value, (list, tuple)):  # ti.static(fields): each f is a field
                            aliased |= {id(f) for f in fields_of(value)}
                if aliased:
                    self.aliases[node.target.id] = aliased
        self.changed = True
        while self.changed:
            self.changed = False
            self.summary.flows.clear()
            for node in (n for stmt in body for n in ast.walk(stmt)):
                if isinstance(node, ast.Assign):
                    value = self.reads(node.value)
                    for target in node.targets:
                        self.store(target, value)
                elif isinstance(node, ast.AugAssign):
                    self.store(node.target, self.reads(node.value) | self.reads(node.target))
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    self.store(node.target, self.reads(node.value))
                elif isinstance(node, ast.Return) and node.value is not None:
                    self.summary.returns |= self.reads(node.value)
                elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                    self.expression_call(node.value)

    def expression_call(self, node: ast.Call) -> None:
        callee = self.callee(node)
        name = getattr(callee, "__name__", "")
        if name in _ATOMICS and (getattr(callee, "__module__", "") or "").startswith("taichi") and node.args:
            read: set[Mark] = set()
            for arg in node.args:
                read |= self.reads(arg)
            self.store(node.args[0], read)
        else:
            self.reads(node)  # records the flows of a func called for what it writes
