"""Which entries of which fields a kernel launch reads and writes, and whether a tape keeps the access rules.

NOTE: [Launches that keep the access rules] A kernel's adjoint runs after
every later launch of the program, reading the fields as the program left
them (NOTE: [Reverse of a kernel]). That is right when no entry a launch read
is written afterwards, by a later launch or, after the read, by the same
one: Taichi's global data access rules. A tape of launches that provably
keeps them needs no run-time check of its reverse mode; one that may not is
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


class Access:
    """One field access of a kernel's code: a "load" or a "store" of a global field or of the template parameter
    at a position, at an index given per position as an expression of the launch's parameters (None: any)."""

    def __init__(self, kind: str, field: Field | int, index: ast.expr | None, params: Sequence[str]) -> None:
        self.kind, self.field = kind, field
        self.index: tuple[ast.expr | None, ...] | None = None
        if index is None:
            return
        if isinstance(index, ast.Constant) and index.value is None:  # x[None]: the one entry of a 0-d field
            self.index = ()
            return
        parts = index.elts if isinstance(index, ast.Tuple) else [index]
        self.index = tuple(p if _uniform(p, params) else None for p in parts)

    def key(self) -> tuple[Any, ...]:
        field = ("parameter", self.field) if isinstance(self.field, int) else ("field", id(self.field))
        index = None if self.index is None else tuple(None if e is None else ast.dump(e) for e in self.index)
        return (self.kind, field, index)


class KernelAccesses:
    """A kernel's field accesses in code order (repeats dropped), with one compiled function giving the entries
    each touches in a launch: ``(t + 1, None)`` for ``x[t + 1, i]`` launched with ``t``."""

    def __init__(self, accesses: Iterable[Access], params: Sequence[str]) -> None:
        unique = list({a.key(): a for a in reversed(list(accesses))}.values())[::-1]  # the first of each kept
        self.accesses = unique
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

    def touched(self, args: Sequence[Any]) -> list[tuple[str, Field, Where]]:
        """``(kind, field, entries)`` of each access in a launch with ``args``."""
        wheres = self._wheres(*args)
        return [(a.kind, args[a.field] if isinstance(a.field, int) else a.field, w)
                for a, w in zip(self.accesses, wheres, strict=True)]


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
    against each group by one lookup (a trajectory's steps read thousands of rows)."""

    def __init__(self) -> None:
        self.groups: dict[tuple[int, ...] | None, set[tuple[int, ...]]] = {}

    def add(self, where: Where) -> None:
        if where is None:
            self.groups.setdefault(None, set()).add(())
            return
        known = tuple(k for k, v in enumerate(where) if v is not None)
        self.groups.setdefault(known, set()).add(tuple(where[k] for k in known))  # type: ignore[misc]

    def overlaps(self, where: Where) -> bool:
        if not self.groups:
            return False
        if where is None or None in self.groups:
            return True
        for known, values in self.groups.items():
            assert known is not None  # handled above
            if all(where[k] is not None for k in known):
                if tuple(where[k] for k in known) in values:
                    return True
            elif any(_overlap(where, _spread(known, v, len(where))) for v in values):
                return True
        return False


def _spread(known: tuple[int, ...], values: tuple[int, ...], size: int) -> Where:
    entry: list[int | None] = [None] * size
    for k, v in zip(known, values, strict=True):
        entry[k] = v
    return tuple(entry)


class AccessLog:
    """The entries the launches of one tape read so far; ``safe`` until a launch may write one of them (or an
    access cannot be known: a launch reversed by Taichi, one of Taichi's own kernels)."""

    def __init__(self) -> None:
        self.safe = True
        self._reads: dict[int, _Reads] = {}
        self._ndim: dict[int, int] = {}

    def launch(self, accesses: KernelAccesses, args: Sequence[Any]) -> None:
        """Record one launch of a kernel with these accesses and arguments."""
        if not self.safe:
            return
        touched = []
        for kind, field, where in accesses.touched(args):
            ndim = self._ndim.get(id(field))
            if ndim is None:
                ndim = self._ndim[id(field)] = len(field.shape)
            touched.append((kind, field, where if where is None or len(where) == ndim else None))  # a vector
            # index (ti.grouped), or a 0-d field read as x[0]: any entry
        for k, (kind, field, where) in enumerate(touched):
            if kind != "store":
                continue
            earlier = self._reads.get(id(field))
            before = [w for kd, f, w in touched[:k] if kd == "load" and f is field]  # read, then written here
            if (earlier is not None and earlier.overlaps(where)) or any(_overlap(where, w) for w in before):
                self.safe = False
                return
        for kind, field, where in touched:
            if kind == "load":
                self._reads.setdefault(id(field), _Reads()).add(where)

    def overwrite(self, field: Field) -> None:
        """One of Taichi's own kernels writes every entry of ``field`` (``fill``, ``from_numpy``)."""
        reads = self._reads.get(id(field))
        if reads is not None and reads.overlaps(None):
            self.safe = False

    def unknown(self) -> None:
        """A launch whose accesses are not known."""
        self.safe = False
