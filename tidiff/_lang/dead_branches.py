"""Branches a reverse function computes again only for values nothing reads: left out.

NOTE: [Branches computed again for nothing] The reverse of ``if c: body`` runs the body's forward
statements again inside ``if c:`` (what the body computes is local to it in Taichi) and then the
body's reverse; the forward sweep before it runs the whole ``if`` once more for the variables it
assigns. A branch nested k deep is so written k + 1 times, most of them computing values nothing
reads: a DiffTaichi collision kernel's adjoint (three nested branches) had 1,141 lines and compiled
in 4.3 s. An ``if`` whose statements only assign variables, through Taichi's functions, the rule
helpers and value methods (no field or array written, no func called: a reverse function adds into
gradients), and none of whose variables is read after it (in its block, the blocks around it, or
anywhere in a loop around it, whose next iteration may read them) is left out. Taichi compiles
each statement of a function in Python, so what is left out is compile time; LLVM would have
removed the code itself.
"""
import ast
import types
from collections.abc import Iterable
from typing import Any

from .activity import root_names
from .naming import RULE_HELPERS, TAICHI

#: Methods of Taichi's vectors and matrices that compute a value and change nothing.
_VALUE_METHODS = frozenset({
    "sum", "norm", "norm_sqr", "norm_inv", "normalized", "dot", "cross", "outer_product", "transpose", "trace",
    "determinant", "inverse", "max", "min", "any", "all", "cast", "get_shape",
})
_PURE_BUILTINS = frozenset({"abs", "max", "min", "int", "float", "bool", "len", "range"})


def without_dead_branches(fn: ast.FunctionDef, body: list[ast.stmt], namespace: dict[str, Any]) -> list[ast.stmt]:
    """``body`` (of the reverse function ``fn``) without the branches NOTE: [Branches computed again for nothing]
    leaves out; ``namespace`` resolves the names the code calls."""
    return _block(body, set(), {a.arg for a in fn.args.args}, namespace)[0]


def _block(stmts: list[ast.stmt], live: set[str], declared: set[str], namespace: dict[str, Any]
           ) -> tuple[list[ast.stmt], set[str]]:
    """The statements kept and the variables live before them, walked backwards from the variables ``live``
    after them; ``declared``: the variables of the blocks around them (a variable first assigned in a block is
    the block's own, made again each time the block runs: a loop's iteration reads none of the previous
    iteration's)."""
    before = []  # per statement, the variables declared before it
    for stmt in stmts:
        before.append(declared)
        if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            declared = declared | _assigned(stmt)
    live = set(live)
    kept: list[ast.stmt] = []
    for stmt, outer in zip(reversed(stmts), reversed(before), strict=True):
        if isinstance(stmt, ast.If):
            if _only_assigns(stmt, namespace) and not (_assigned(stmt) & live):
                continue
            body, live_body = _block(stmt.body, live, outer, namespace)
            stmt.orelse, live_orelse = _block(stmt.orelse, live, outer, namespace)
            stmt.body = body or [ast.Pass()]
            live = live_body | live_orelse | _reads([stmt.test])
        elif isinstance(stmt, (ast.For, ast.While)):
            carried = _reads([stmt]) & outer  # the next iteration may read what this one left in them
            inner = outer | (set(root_names(stmt.target)) if isinstance(stmt, ast.For) else set())
            body, live_body = _block(stmt.body, live | carried, inner, namespace)
            stmt.body = body or [ast.Pass()]
            live |= live_body | _reads([stmt.iter if isinstance(stmt, ast.For) else stmt.test])
        else:
            if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
                live -= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
            live |= _reads([stmt])
        kept.append(stmt)
    return kept[::-1], live


def _reads(nodes: Iterable[ast.AST]) -> set[str]:
    """Every variable read anywhere in ``nodes`` (an update ``x += e`` reads ``x``)."""
    found = set()
    for node in nodes:
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                found.add(n.id)
            elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
                found.add(n.target.id)
    return found


def _assigned(stmt: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}



def _only_assigns(stmt: ast.If, namespace: dict[str, Any]) -> bool:
    """Whether the branch only assigns variables by calls that change nothing."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.If, ast.Assign, ast.AugAssign, ast.Pass)):
            return False
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if not all(isinstance(t, ast.Name) or isinstance(t, ast.Tuple) and
                       all(isinstance(e, ast.Name) for e in t.elts) for t in targets):
                return False
        if isinstance(node, ast.Call) and not _changes_nothing(node.func, namespace):
            return False
    return True


def _changes_nothing(func: ast.expr, namespace: dict[str, Any]) -> bool:
    """A call of a Taichi function (not an atomic, not ``ti.random``), a rule helper, a pure builtin, or a value
    method (``v.norm()``)."""
    if isinstance(func, ast.Name):
        return func.id in _PURE_BUILTINS and func.id not in namespace
    if not isinstance(func, ast.Attribute):
        return False
    root: ast.expr = func
    while isinstance(root, ast.Attribute):
        root = root.value
    if not isinstance(root, ast.Name):
        return False
    if root.id in (TAICHI, RULE_HELPERS) or _is_taichi(namespace.get(root.id)):
        return not func.attr.startswith("atomic") and func.attr not in ("random", "sync", "deactivate")
    return func.attr in _VALUE_METHODS and root.id not in namespace  # a local value's method


def _is_taichi(obj: object) -> bool:
    """Whether ``obj`` is Taichi's module or one of its submodules (``ti``, ``ti.math`` as ``tm``)."""
    return isinstance(obj, types.ModuleType) and obj.__name__.split(".")[0] == "taichi"
