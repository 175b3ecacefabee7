"""An ndarray kernel's adjoint that reads what the kernel stored instead of computing it again.

NOTE: [Outputs read back] The adjoint of a kernel computes each iteration's
values again before its reverse sweep (NOTE: [Values the adjoint uses]).
Where the kernel stores a value into an output, and the caller still holds
that output as the kernel left it, the adjoint may read it back instead:
the seeds' linear layer ``y[i, j] = ti.tanh(acc)`` has a reverse rule that
reads ``tanh``'s result (``1 - y * y``), so its adjoint then calls ``tanh``
no more. A hand-written backward does the same (torch keeps ``tanh``'s
result). Measured on 100,000 rows (8 -> 4, float64, 2 threads), the adjoint
kernel alone, by chunk: 20.5 ms computing ``tanh`` again, 5.5 ms reading it
back; the hand-derived backward kernel 9.3 ms in the same run.

A variable is read back where:

- the kernel stores it (``y[idx] = v``, the whole entry) as a statement of
  a top-level parallel loop's body itself, not inside a branch or a loop of
  that body, and binds it there too, before the store;
- ``idx`` is the loop's counters, each once (every iteration its own entry);
- that store is the kernel's only write of ``y`` and the kernel reads ``y``
  nowhere, so that ``y[idx]`` after the launch is the stored value;
- it is not integer, the adjoint binds it once, and the value keeps its
  bits through the store: ``y`` holds float64, or float32 where every float
  array and Taichi's default float are float32.

That form is a second adjoint (``KernelAdjoint.read_back``), launched only by
a caller that passes the outputs the forward launch left
(``NdarrayFunction.vjp_from_outputs``: a torch operator's first-order
backward, which keeps its outputs as torch's own ops keep theirs). Every
other vjp computes the values again, as before.
"""
from __future__ import annotations

import ast
import copy
import dataclasses
from collections.abc import Sequence

import taichi as ti
from taichi.lang import impl

from .accesses import Access


@dataclasses.dataclass
class Stored:
    """A variable an iteration stores whole into an entry of an array: ``array[index] = variable``."""

    variable: str
    array: str
    index: ast.expr


def stored(variable: ast.expr, array: str, index: ast.expr, counters: Sequence[str],
           iteration: Sequence[ast.stmt]) -> Stored | None:
    """The store ``array[index] = variable`` (the index as the adjoint computes it) if its value may be read back:
    a variable the iteration's own statements (``iteration``, so far) bind, at the loop's counters each once."""
    if not isinstance(variable, ast.Name):
        return None
    parts = index.elts if isinstance(index, ast.Tuple) else [index]
    names = [p.id for p in parts if isinstance(p, ast.Name)]
    if len(names) != len(parts) or sorted(names) != sorted(set(counters)) or len(set(names)) != len(names):
        return None
    bound = any(isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)
                and s.targets[0].id == variable.id for s in iteration)
    return Stored(variable.id, array, copy.deepcopy(index)) if bound else None


def readable(found: Sequence[Stored], accesses: Sequence[Access], positions: dict[str, int],
             dtypes: dict[str, object], integral: set[str]) -> list[Stored]:
    """Those stores whose array the kernel writes there only and never reads, whose value is not integer and
    keeps its bits through the store (NOTE: [Outputs read back])."""
    floats = {d for d in dtypes.values() if d is not None}
    keeps = {a for a, d in dtypes.items() if d == ti.f64 or (
        d == ti.f32 and floats == {ti.f32} and impl.get_runtime().default_fp == ti.f32)}
    taken = []
    for s in found:
        at = positions[s.array]
        touching = [a for a in accesses if a.field == at]
        if s.array in keeps and s.variable not in integral and len(touching) == 1 \
                and touching[0].kind == "store" and not touching[0].anywhere:
            taken.append(s)
    return taken


def read_back(tree: ast.FunctionDef, taken: Sequence[Stored]) -> tuple[ast.FunctionDef, list[str]] | None:
    """A copy of the adjoint ``tree`` whose binding of each taken variable reads the array instead, and the
    arrays so read; None where none is bound once there."""
    fn = copy.deepcopy(tree)
    bindings: dict[str, list[ast.AST]] = {}
    for node in ast.walk(fn):
        for bound in _bound(node):
            bindings.setdefault(bound, []).append(node)
    done = []
    for s in taken:
        nodes = bindings.get(s.variable, [])
        if len(nodes) == 1 and isinstance(nodes[0], ast.Assign) and isinstance(nodes[0].targets[0], ast.Name):
            nodes[0].value = ast.Subscript(ast.Name(s.array, ast.Load()), copy.deepcopy(s.index), ast.Load())
            done.append(s.array)
    fn.name += "_read_back"
    return (ast.fix_missing_locations(fn), done) if done else None


def _bound(node: ast.AST) -> list[str]:
    """The variables a statement binds or writes into (``v = e``, ``v[0] += e``, ``a, b = e``, a loop's
    counters)."""
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.NamedExpr)):
        targets = [node.target]
    else:
        return []
    return [n for t in targets for n in _roots(t)]


def _roots(target: ast.expr) -> list[str]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _roots(e)]
    while isinstance(target, (ast.Subscript, ast.Attribute, ast.Starred)):
        target = target.value
    return [target.id] if isinstance(target, ast.Name) else []
