"""Readable, collision-free names for generated code: the tangent of ``x`` is ``dx``."""
import ast
from collections.abc import Iterable
from typing import Any, TypeVar

ASTNode = TypeVar("ASTNode", bound=ast.AST)


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


# Rules spell Taichi as ``ti``; the placeholder name becomes whatever name the
# generated namespace gives the taichi module (``ti`` unless f uses it otherwise).
TAICHI = "__taichi__"

# Rules call the @ti.func helpers of ``_rules/helpers.py`` by this name; every
# generated namespace binds it to that module.
RULE_HELPERS = "_tidiff_rules"


def taichi_name(namer: Namer, namespace: dict[str, Any]) -> str:
    """The name a generated function sees the taichi module by: ``ti``, unless the
    function uses ``ti`` for something else."""
    referenced = namespace.get("ti", None)
    if "ti" in namer.taken and getattr(referenced, "__name__", "") != "taichi":
        return namer.fresh("taichi")
    return "ti"


def spell_taichi(tree: ASTNode, name: str) -> ASTNode:
    """Replace the rules' placeholder for the taichi module by ``name`` throughout ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == TAICHI:
            node.id = name
    return tree


def bound(namespace: dict[str, Any], value: object, name: str) -> ast.Name:
    """A name of ``value`` in ``namespace`` for generated code: ``name``, bound there, or a variant of it where
    ``name`` stands for something else."""
    while name in namespace and namespace[name] is not value:
        name += "_"
    namespace[name] = value
    return ast.Name(name, ast.Load())
