"""Chained assignments (``s = c = 0.0``) written as one assignment per target.

NOTE: [Chained assignments] ``s = c = 0.0`` computes the value once and assigns it to each target, left to right.
The reverse transform takes one target per assignment, so it refused such a kernel, and Taichi's ``kernel.grad``
reversed it instead (a survey of kernels as users write them). Where every target is a name, the statement is
written as the value bound to a fresh local, then one assignment of that local per target (each target keeps its
own type, as Taichi casts the value to each), which every transform takes.
"""
import ast

from .naming import Namer, names_in


def without_chained_assignments(tree: ast.AST) -> None:
    """Write, in place, each ``a = b = value`` whose targets are names as ``t = value; a = t; b = t``."""
    namer: Namer | None = None
    for node in ast.walk(tree):
        for field in ("body", "orelse"):
            block = getattr(node, field, None)
            if not isinstance(block, list) or not any(_chained(s) for s in block):
                continue
            namer = namer or Namer(names_in(tree))
            written: list[ast.stmt] = []
            for stmt in block:
                if not _chained(stmt):
                    written.append(stmt)
                    continue
                assert isinstance(stmt, ast.Assign)
                value = namer.fresh("chained")
                written += [ast.copy_location(ast.Assign([ast.Name(value, ast.Store())], stmt.value), stmt)]
                written += [ast.copy_location(ast.Assign([target], ast.Name(value, ast.Load())), stmt)
                            for target in stmt.targets]
            setattr(node, field, written)


def _chained(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Assign) and len(stmt.targets) > 1 \
        and all(isinstance(t, ast.Name) for t in stmt.targets)
