"""Gradient entries each iteration of an adjoint loop owns: adds into them written without an atomic.

NOTE: [Owned gradient entries] Inside a parallel loop Taichi makes ``g[i] += c`` on a global an
atomic add, as it must where two iterations may add into one entry. On the CPU a float64 atomic add
is a compare-and-swap loop: a 32x32 loop of two such adds ran in 57 us, written ``g[i, j] = g[i, j] +
c`` in 40 us, and at 256x256 in 520 us against 90 us (2-core CPU, 2026-11-30). The adjoint of every
field read is such an add, in Taichi's ``kernel.grad`` as in tidiff's adjoint. Where every access of a
gradient field in an adjoint loop puts each of the loop's counters, alone, at the same position of the
index, and elsewhere only values the loop does not change (``u_grad[t, i, j]`` in ``for i, j in
ti.ndrange(n, n)``), no two iterations reach one entry, and its adds are written plain. Not taken: a
gradient any func the loop calls reaches (its reverse function adds atomically), one named twice (two
names of one field), a loop naming a gradient otherwise (``x.grad`` in the user's code, a template
parameter's ``p.grad``: another name of a field, maybe), or reaching one in any other way.
"""
from __future__ import annotations

import ast
import copy
from collections.abc import Mapping

from .._lang.activity import root_names


def plain_adds(loop: ast.For, gradients: Mapping[str, int], shared: set[int]) -> None:
    """Write ``g[idx] += c`` as ``g[idx] = g[idx] + c`` in the adjoint loop ``loop`` (changed in place) for
    each gradient whose entries its iterations own (NOTE: [Owned gradient entries]). ``gradients`` maps the
    names the adjoint gives gradient fields to the fields (by id); ``shared`` holds the fields (by id) a
    callee also reaches."""
    counters = _counters(loop.target)
    if counters is None or any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in ast.walk(loop)):
        return
    changed = {n.id for n in ast.walk(ast.Module(loop.body, [])) if isinstance(n, ast.Name)
               and not isinstance(n.ctx, ast.Load)}
    if changed & set(counters):
        return
    patterns: dict[str, set[tuple[str | None, ...] | None]] = {}
    parents = {id(child): node for node in ast.walk(loop) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(loop):
        if isinstance(node, ast.Name) and node.id in gradients:
            parent = parents.get(id(node))
            at = _pattern(parent.slice, counters, changed) \
                if isinstance(parent, ast.Subscript) and parent.value is node else None
            patterns.setdefault(node.id, set()).add(at)
    fields = [gradients[g] for g in patterns]
    owned = {g for g, found in patterns.items() if fields.count(gradients[g]) == 1 and gradients[g] not in shared
             and _injective(found, counters)}
    _Plain(owned).visit(loop)


def _injective(patterns: set[tuple[str | None, ...] | None], counters: list[str]) -> bool:
    """Whether one pattern of indices (:func:`_pattern`) holds every access, each counter in it once."""
    if len(patterns) != 1:
        return False
    (pattern,) = patterns
    return pattern is not None and sorted(c for c in pattern if c) == sorted(counters)


def _counters(target: ast.expr) -> list[str] | None:
    """The names a parallel loop's header binds, one per counter (``I`` of ``ti.grouped`` is one)."""
    elts = target.elts if isinstance(target, ast.Tuple) else [target]
    names = [e.id for e in elts if isinstance(e, ast.Name)]
    return names if len(names) == len(elts) else None


def _pattern(index: ast.expr, counters: list[str], changed: set[str]) -> tuple[str | None, ...] | None:
    """Which counter stands alone at each position of ``index`` (None: a value the loop does not change), or
    None where a position is anything else."""
    found: list[str | None] = []
    for part in index.elts if isinstance(index, ast.Tuple) else [index]:
        if isinstance(part, ast.Name) and part.id in counters:
            found.append(part.id)
        elif _uniform(part, counters, changed):
            found.append(None)
        else:
            return None
    return tuple(found)


def _uniform(node: ast.expr, counters: list[str], changed: set[str]) -> bool:
    """Whether ``node`` is a value every iteration sees the same: constants and names the loop does not bind,
    under arithmetic."""
    for part in ast.walk(node):
        if isinstance(part, ast.Name):
            if part.id in counters or part.id in changed:
                return False
        elif not isinstance(part, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop,
                                   ast.expr_context)):
            return False
    return True


class _Plain(ast.NodeTransformer):
    """``g[idx] += c`` -> ``g[idx] = g[idx] + c`` for the gradients ``owned`` names (``-=`` likewise)."""

    def __init__(self, owned: set[str]) -> None:
        self.owned = owned

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.stmt:
        target = node.target
        if not (isinstance(target, ast.Subscript) and isinstance(node.op, (ast.Add, ast.Sub))
                and set(root_names(target)) <= self.owned):
            return node
        read = copy.deepcopy(target)
        for part in ast.walk(read):
            if isinstance(part, (ast.Subscript, ast.Name)):
                part.ctx = ast.Load()
        return ast.copy_location(ast.Assign([target], ast.BinOp(read, node.op, node.value)), node)
