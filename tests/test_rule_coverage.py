"""Every op of the rule table has both modes and an op-table row that exercises it in each.

A row covers the ops its function's source spells (operators, calls, methods; through the
source of the ``@ti.func`` s it calls, Taichi's own ``ti.math`` functions included, as the
transforms do), found by reading the source the way the transforms resolve names, not by
declaration. Forward rules count every row; reverse rules only rows the reverse transform
handles, since the others take their gradients from forward pushes. The rule helpers
(``_tidiff_rules.sum_to`` and kin) are no ops: rules call them, and the rows of those rules
check them at first and second order.
"""
import ast

import taichi as ti
from op_table import ROWS

from tidiff._adjoint import why_not
from tidiff._lang.activity import local_names
from tidiff._lang.parse import MISSING, hashable, parse, resolve
from tidiff._rules import decompositions
from tidiff._rules import helpers as rule_helpers
from tidiff._rules.ops import FORWARD_ONLY
from tidiff._rules.table import TABLE, lookup, unbound_method, zero

HELPERS = {obj for module in (rule_helpers, decompositions) for obj in vars(module).values()
           if getattr(obj, "_is_taichi_function", False)}


def registry_key(callee):
    """The key a rule table holds ``callee``'s rule under, or None."""
    if not hashable(callee):
        return None
    if callee in TABLE:
        return callee
    return unbound_method(callee)


def ops_of(func, seen=None):
    """Registry keys of the ops ``func``'s source uses, through the @ti.funcs it calls."""
    seen = set() if seen is None else seen
    if func in seen:
        return set()
    seen.add(func)
    parsed = parse(func)
    local = local_names(parsed.tree)
    keys = set()
    for node in ast.walk(parsed.tree):
        if isinstance(node, (ast.BinOp, ast.AugAssign, ast.UnaryOp)):
            keys.add(type(node.op))
        if not isinstance(node, ast.Call):
            continue
        root = node.func
        while isinstance(root, (ast.Attribute, ast.Subscript)):
            root = root.value
        if isinstance(node.func, ast.Attribute) and (not isinstance(root, ast.Name) or root.id in local):
            keys.add(("method", node.func.attr))
            continue
        callee = resolve(node.func, parsed.namespace)
        if callee is MISSING:
            continue
        key = registry_key(callee)
        if key is not None:
            keys.add(key)
        elif hashable(callee) and lookup(callee) is None and getattr(callee, "_is_taichi_function", False):
            keys |= ops_of(callee, seen)  # transformed through its source
    return keys


def uncovered(table, rows):
    covered = set().union(*(ops_of(row.func) for row in rows))
    return sorted((repr(key) for key in table if key not in covered and key not in HELPERS), key=str)


def test_every_op_has_both_modes():
    """Adding an op is one entry: its reverse rule is derived or written beside its forward rule. Only ops
    without derivative, constructors (reversed entry by entry) and FORWARD_ONLY (with a reason) have none."""
    missing = sorted(repr(key) for key, rule in TABLE.items() if rule.vjp is None and rule.jvp is not zero
                     and not rule.entrywise and key not in FORWARD_ONLY)
    assert not missing, f"ops of the rule table without a reverse rule: {missing}"


def test_every_forward_rule_has_a_row():
    missing = uncovered(TABLE, ROWS)
    assert not missing, f"ops with a forward rule but no op-table row (tests/op_table.py): {missing}"


def test_every_reverse_rule_has_a_reversible_row():
    reversible = [row for row in ROWS if why_not(row.func, (True,) * len(row.shapes)) is None]
    missing = uncovered({key: rule for key, rule in TABLE.items() if rule.vjp is not None}, reversible)
    assert not missing, (f"ops with a reverse rule but no op-table row the reverse transform handles "
                         f"(tests/op_table.py): {missing}")


def test_the_scan_sees_what_the_transforms_see():
    """The scan finds ops behind operators, methods, unbound methods, aliases and Taichi's own funcs."""

    @ti.func
    def f(v, A, x):
        w = ti.Vector.normalized(v, 0.1) + v.cross(v)
        return ti.math.fract(x) + (A @ w).sum() ** 2 - ti.math.clamp(x, 0.0, 1.0)

    found = ops_of(f)
    for key in [("method", "normalized"), ("method", "cross"), ("method", "sum"), ast.MatMult, ast.Pow, ast.Sub,
                ti.floor, ti.math.clamp]:
        assert key in found, key
    assert ti.math.fract not in found  # no rule: its source is transformed, and its ops counted


def test_an_op_without_a_row_is_named():
    assert uncovered({ti.frexp: None, ti.sin: None}, ROWS) == [repr(ti.frexp)]
