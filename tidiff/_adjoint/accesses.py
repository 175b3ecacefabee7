"""Which entries of which fields a kernel launch reads and writes, and whether a tape keeps the access rules.

NOTE: [Launches that keep the access rules] A kernel's adjoint runs after
every later launch of the program, reading the fields as the program left
them (NOTE: [Reverse of a kernel]). That is right when no entry a launch read
is written afterwards, by a later launch or, after the read, by the same
one: Taichi's global data access rules. A tape of launches that provably
keeps them needs no run-time check of its reverse mode; nor does one where a
later launch writes entries an earlier one read, once the recorder keeps
those entries (NOTE: [Overwritten values kept]). One that may not keep them
(a launch reading, then writing, the same entries; accesses not known) is
checked against forward mode as before (NOTE: [Checking Taichi's reverse
mode]).

What a launch touches is known per index position: an index made of the
kernel's scalar parameters and constants (``x[t, i]``: ``t``) is the same in
every iteration, so it is evaluated at launch; any other (a loop index, a
local) stands for every entry. So ``x[t + 1, i] = x[t, i] + ...`` launched for
``t = 0, 1, ...`` reads row ``t`` and writes row ``t + 1``: a trajectory keeps
the rules. A func called in the kernel reads the fields it reaches anywhere.
"""
from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from typing import Any

from taichi.lang.field import Field

Where = tuple[int | None, ...] | None
"""The entries one access touches: per index position a value (the same for the whole launch) or None (any);
None as a whole: any entry of the field."""
Write = tuple[Field, Where]
"""Entries of a field a launch overwrites, to be kept for the replay (NOTE: [Overwritten values kept])."""


class Access:
    """One field access of a kernel's code: a "load" or a "store" of a global field or of the template parameter
    at a position, at an index given per position as an expression of the launch's parameters (None: any)."""

    def __init__(self, kind: str, field: Field | int, index: ast.expr | None, params: Sequence[str],
                 anywhere: bool = False) -> None:
        self.kind, self.field = kind, field
        self.anywhere = anywhere  # it may happen anywhere in the launch's order (in a runtime loop, repeatedly)
        self.reread = False  # set by KernelAccesses: the field may be read after the kernel wrote it
        self.won = False  # the read of what an atomic max / min left, after the kernel (NOTE: [Atomic extremes in
        # reverse])
        self.value: ast.Name | None = None  # a load's: the variable the adjoint reads it into (NOTE: [Values the
        # adjoint uses])
        self.index: tuple[ast.expr | None, ...] | None = None
        if index is None:
            return
        if isinstance(index, ast.Constant) and index.value is None:  # x[None]: the one entry of a 0-d field
            self.index = ()
            return
        parts = index.elts if isinstance(index, ast.Tuple) else [index]
        self.index = tuple(p if _uniform(p, params) else None for p in parts)

    def field_key(self) -> tuple[str, int]:
        return ("parameter", self.field) if isinstance(self.field, int) else ("field", id(self.field))

    def key(self) -> tuple[Any, ...]:
        index = None if self.index is None else tuple(None if e is None else ast.dump(e) for e in self.index)
        return (self.kind, self.field_key(), index)


class KernelAccesses:
    """A kernel's field accesses in code order (an access like the one before it on its field dropped), with one
    compiled function giving the entries
    each touches in a launch: ``(t + 1, None)`` for ``x[t + 1, i]`` launched with ``t``. An access is marked
    ``reread`` where its field may be read after the kernel wrote it (a read following a write in the code, or
    a field both read and written with an access that may happen anywhere)."""

    def __init__(self, accesses: Iterable[Access], params: Sequence[str]) -> None:
        accesses = list(accesses)
        unique: list[Access] = []  # an access like the last one of its field dropped: a store after a load of the
        last: dict[tuple[str, int], tuple[Any, ...]] = {}  # same entry stays after it, however often both repeat
        for a in accesses:
            if last.get(a.field_key()) != a.key():
                unique.append(a)
                last[a.field_key()] = a.key()
        self.accesses = unique
        reread = _reread(accesses)
        for a in unique:
            a.reread = a.field_key() in reread
        self.params = list(params)

        def entry(e: ast.expr | None) -> ast.expr:
            return ast.Constant(None) if e is None else e

        wheres: list[ast.expr] = [
            ast.Constant(None) if a.index is None else ast.Tuple([entry(e) for e in a.index], ast.Load())
            for a in unique]
        lam = ast.Lambda(ast.arguments([], [ast.arg(p) for p in self.params], None, [], [], None, []),
                         ast.Tuple(wheres, ast.Load()))
        code = compile(ast.fix_missing_locations(ast.Expression(lam)), "<accesses>", "eval")
        self._wheres = eval(code, {"__builtins__": {}})  # integer arithmetic on parameters only (_uniform)

    def touched(self, args: Sequence[Any]) -> list[tuple[Access, Field, Where]]:
        """``(access, field, entries)`` of each access in a launch with ``args``."""
        wheres = self._wheres(*args)
        return [(a, args[a.field] if isinstance(a.field, int) else a.field, w)
                for a, w in zip(self.accesses, wheres, strict=True)]


def _reread(accesses: Sequence[Access]) -> set[tuple[str, int]]:
    """The fields (keys) a kernel may read after writing them."""
    stored: set[tuple[str, int]] = set()
    loaded: set[tuple[str, int]] = set()
    found = set()
    for a in accesses:
        key = a.field_key()
        if a.kind == "load" and key in stored:
            found.add(key)
        (stored if a.kind == "store" else loaded).add(key)
    return found | {a.field_key() for a in accesses if a.anywhere} & stored & loaded


def _uniform(node: ast.expr, params: Sequence[str]) -> bool:
    """Whether ``node`` is made of the parameters, integers and arithmetic (the same in the whole launch)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            if sub.id not in params:
                return False
        elif isinstance(sub, ast.Constant):
            if type(sub.value) is not int:
                return False
        elif not isinstance(sub, (ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.expr_context)):
            return False
    return True


def _overlap(a: Where, b: Where) -> bool:
    if a is None or b is None:
        return True
    return all(x is None or y is None or x == y for x, y in zip(a, b, strict=True))


class _Reads:
    """The entries of one field read so far, grouped by which index positions were known: a write is checked
    against each group by one lookup (a trajectory's steps read thousands of rows). A write knowing fewer
    positions than a group looks its values up in the group's projection onto the positions both know (kept
    up to date once made)."""

    def __init__(self) -> None:
        self.groups: dict[tuple[int, ...] | None, set[tuple[int, ...]]] = {}
        self._projections: dict[tuple[tuple[int, ...], tuple[int, ...]], set[tuple[int, ...]]] = {}

    def add(self, where: Where) -> None:
        if where is None:
            self.groups.setdefault(None, set()).add(())
            return
        known = tuple(k for k, v in enumerate(where) if v is not None)
        values = tuple(where[k] for k in known)
        self.groups.setdefault(known, set()).add(values)  # type: ignore[arg-type]
        for (group, shared), projected in self._projections.items():
            if group == known:
                projected.add(tuple(where[k] for k in shared))  # type: ignore[misc]

    def overlaps(self, where: Where) -> bool:
        if not self.groups:
            return False
        if where is None or None in self.groups:
            return True
        for known, values in self.groups.items():
            assert known is not None  # handled above
            shared = tuple(k for k in known if where[k] is not None)
            if shared == known:
                if tuple(where[k] for k in known) in values:
                    return True
                continue
            projected = self._projections.get((known, shared))
            if projected is None:
                at = [known.index(k) for k in shared]
                projected = self._projections[(known, shared)] = {tuple(v[j] for j in at) for v in values}
            if tuple(where[k] for k in shared) in projected:
                return True
        return False


class AccessLog:
    """The entries the launches of one tape read so far. ``safe`` until a launch's accesses cannot be known (one
    reversed by Taichi, a helper of Taichi's) or a launch may read entries after writing them; a write of
    entries read before is returned, to be kept (NOTE: [Overwritten values kept])."""

    def __init__(self) -> None:
        self.safe = True
        self.kept = False  # whether a launch overwrote entries an earlier one read
        self._reads: dict[int, _Reads] = {}
        self._ndim: dict[int, int] = {}

    def launch(self, accesses: KernelAccesses, args: Sequence[Any]) -> tuple[list[Write], list[Write]]:
        """Record one launch of a kernel with these accesses and arguments; return the writes (field and entries)
        to keep: those of entries the launch read first (its own adjoint needs the old values), and those of
        entries only earlier launches read (their adjoints do)."""
        if not self.safe:
            return [], []
        touched = []
        for access, field, where in accesses.touched(args):
            ndim = self._ndim.get(id(field))
            if ndim is None:
                ndim = self._ndim[id(field)] = len(field.shape)
            touched.append((access, field, where if where is None or len(where) == ndim else None))  # a vector
            # index (ti.grouped), or a 0-d field read as x[0]: any entry
        first: dict[tuple[int, Where], Write] = {}
        later: dict[tuple[int, Where], Write] = {}
        for k, (access, field, where) in enumerate(touched):
            if access.kind != "store":
                continue
            if any(a.kind == "load" and f is field and _overlap(where, w) for a, f, w in touched[:k]):
                if access.reread:
                    self.safe = False  # read, written, and maybe read again here: both values needed
                    return [], []
                first[(id(field), where)] = (field, where)
            elif (earlier := self._reads.get(id(field))) is not None and earlier.overlaps(where):
                later[(id(field), where)] = (field, where)
        for access, field, where in touched:
            if access.kind == "load":
                self._reads.setdefault(id(field), _Reads()).add(where)
        self.kept = self.kept or bool(first) or bool(later)
        return list(first.values()), [w for key, w in later.items() if key not in first]

    def overwrite(self, field: Field) -> bool:
        """One of Taichi's own kernels writes every entry of ``field`` (``fill``, ``from_numpy``): whether an
        earlier launch read any (the field is then kept)."""
        reads = self._reads.get(id(field))
        found = self.safe and reads is not None and reads.overlaps(None)
        self.kept = self.kept or found
        return found

    def unknown(self) -> None:
        """A launch whose accesses are not known."""
        self.safe = False
