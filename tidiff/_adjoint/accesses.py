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
from types import CodeType
from typing import Any

from taichi.lang.field import Field

Where = tuple[int | None, ...] | None
"""The entries one access touches: per index position a value (the same for the whole launch) or None (any);
None as a whole: any entry of the field."""


class Access:
    """One field access of a kernel's code: a "load" or a "store" of a global field or of the template parameter
    at a position, at an index given per position as code of the launch's parameters (None: any)."""

    def __init__(self, kind: str, field: Field | int, index: ast.expr | None, params: Sequence[str]) -> None:
        self.kind, self.field = kind, field
        self.index: tuple[CodeType | None, ...] | None = None
        if index is None:
            return
        if isinstance(index, ast.Constant) and index.value is None:  # x[None]: the one entry of a 0-d field
            self.index = ()
            return
        parts = index.elts if isinstance(index, ast.Tuple) else [index]
        self.index = tuple(_uniform(p, params) for p in parts)

    def where(self, values: dict[str, Any], field: Field) -> Where:
        """The entries this access touches in a launch with these parameter values."""
        if self.index is None or len(self.index) != len(field.shape):
            return None  # a vector index (ti.grouped) or a 0-d field read as x[0]: any entry
        return tuple(None if code is None else int(eval(code, {"__builtins__": {}}, values)) for code in self.index)


def _uniform(node: ast.expr, params: Sequence[str]) -> CodeType | None:
    """The compiled expression where ``node`` is made of the parameters, integers and arithmetic, else None."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            if sub.id not in params:
                return None
        elif isinstance(sub, ast.Constant):
            if type(sub.value) is not int:
                return None
        elif not isinstance(sub, (ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.expr_context)):
            return None
    return compile(ast.fix_missing_locations(ast.Expression(node)), "<index>", "eval")


def _overlap(a: Where, b: Where) -> bool:
    if a is None or b is None:
        return True
    return all(x is None or y is None or x == y for x, y in zip(a, b, strict=True))


class AccessLog:
    """The entries the launches of one tape read so far; ``safe`` until a launch may write one of them (or an
    access cannot be known: a launch reversed by Taichi, one of Taichi's own kernels)."""

    def __init__(self) -> None:
        self.safe = True
        self._reads: dict[int, list[Where]] = {}

    def launch(self, accesses: Iterable[Access], params: Sequence[str], args: Sequence[Any]) -> None:
        """Record one launch of a kernel with these accesses (in code order) and arguments."""
        if not self.safe:
            return
        values = {p: a for p, a in zip(params, args, strict=True)}
        touched: list[tuple[str, Field, Where]] = []
        for access in accesses:
            field = args[access.field] if isinstance(access.field, int) else access.field
            touched.append((access.kind, field, access.where(values, field)))
        for k, (kind, field, where) in enumerate(touched):
            if kind != "store":
                continue
            earlier = self._reads.get(id(field), [])
            before = [w for kd, f, w in touched[:k] if kd == "load" and f is field]  # read, then written here
            if any(_overlap(where, w) for w in earlier + before):
                self.safe = False
                return
        for kind, field, where in touched:
            if kind == "load":
                self._reads.setdefault(id(field), []).append(where)

    def overwrite(self, field: Field) -> None:
        """One of Taichi's own kernels writes every entry of ``field`` (``fill``, ``from_numpy``)."""
        if id(field) in self._reads:
            self.safe = False

    def unknown(self) -> None:
        """A launch whose accesses are not known."""
        self.safe = False
