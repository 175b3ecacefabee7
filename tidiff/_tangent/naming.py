"""Readable, collision-free names for generated code: the tangent of ``x`` is ``dx``."""
import ast
from collections.abc import Iterable
from typing import Any


def names_in(node: ast.AST) -> set[str]:
    """Every identifier a function's AST mentions (variables, parameters, globals)."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.arg):
            found.add(sub.arg)
    return found


class Namer:
    """Hands out names no other name in the function uses, remembering tangents."""

    def __init__(self, taken: Iterable[str]) -> None:
        self.taken = set(taken)
        self.tangents: dict[str, str] = {}

    def fresh(self, hint: str) -> str:
        """``hint`` itself when free, else ``hint_1``, ``hint_2``, ..."""
        hint = hint if hint.isidentifier() else "t"
        name, n = hint, 0
        while name in self.taken:
            n += 1
            name = f"{hint}_{n}"
        self.taken.add(name)
        return name

    def tangent(self, name: str) -> str:
        """The tangent variable of ``name``: ``dname`` unless that is taken."""
        if name not in self.tangents:
            self.tangents[name] = self.fresh("d" + name)
        return self.tangents[name]


def helper_name(helpers: dict[str, Any], namer: Namer, obj: Any, hint: str) -> str:
    """The namespace name of a generated function in ``helpers`` (name -> object), one per object."""
    for name, existing in helpers.items():
        if existing is obj:
            return name
    name = namer.fresh(hint)
    helpers[name] = obj
    return name
