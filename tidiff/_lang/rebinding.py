"""Generated tangent code rebinds no variable in straight-line code: each new value gets a new name.

NOTE: [Rebinding in straight-line code] Taichi 1.7.4's optimizer miscompiles
some straight-line code that gives a vector or matrix variable a new whole
value after matrix literals of its entries: later reads of its entries return
stale values (tests/test_taichi_pitfalls.py, found twice by the conformance
net in tidiff's tangent code: seeds 9123 and 9403, a jacfwd 50% off; the same
code with ``advanced_optimization=False`` is right). The reverse transform
writes SSA names and never met it. So the tangent transform's output, which
keeps the user's names, is renamed the same way: where a variable already
bound is given a new whole value by a statement of the block, ``t1 -= neg``
becomes ``t1_1 = _tidiff_rules.rebound(t1 - neg, t1)`` and later reads say
``t1_1``. ``rebound`` keeps Taichi's meaning of the assignment: the value is
cast to the old variable's element type (an ``i32`` variable stays ``i32``), a
no-op where the types agree. A branch or loop that binds the name binds it
under its own name (its value depends on the path taken), so the last renamed
value is written back just before it (``t1 = t1_1``); an unpacking binds it
anew. Renaming only after the last such statement was not enough (long run,
seed 11260: ``t0 = out[1]`` kept its name because a static loop rewrote ``t0``
later, and a jacfwd read stale entries of it, 6% off).

NOTE: [Rebinding in loops] Inside a runtime ``for`` loop the same miscompile
needs no literal at all: ``for i in range(2): t = t * (t[1] + 0.3); t = t -
t[1] * t[2]`` reads stale entries of ``t`` with the optimizer on (Taichi's
own value, not only tidiff's tangent: tests/test_taichi_pitfalls.py; long run,
seeds 9712, 9726, 9727: a jvp 2% off); the same body writing ``a = t * ...;
b = a - a[1] * a[2]; t = b`` is right. So every block nested in a function
(a loop's body, a branch) is renamed as the function's body is, and ends by
writing each variable it renamed and that lives on after it back to that
variable's own name (``t = t_2``). Reads of such a carried variable, stored
more than once, go through copies: one made where a block that rewrites it
starts (``t_1 = t``), and one made after the last loop or branch of a block
that binds it (seed 9712: a literal of ``t``'s entries after a static loop
rewriting ``t`` read stale ones; through the copy it is right). So every
entry read is of a variable stored once. A block that can leave early
(``break``, ``continue``, ``return``) would skip the write-back and keeps its
names.

NOTE: [Tests read renamed values] The write-back before a branch (``t0 =
t0_3``) is a whole write, and the branch's test read entries of ``t0`` right
after it: after a runtime loop rewriting ``t0``, Taichi's optimizer gave them
stale values from the loop, and the tangent code took the other branch than
the function (long run, seed 11591: a jacfwd 0.04 off, td.jvp's primal off the
function's value; right with ``advanced_optimization=False``). A branch's test
and a for loop's range are evaluated once, before any path runs, so they read
the renamed values (``t0_3``); a while loop's test reads its variables anew
after every iteration and keeps their names.
"""
from __future__ import annotations

import ast
import copy
from collections.abc import Iterable

from .naming import RULE_HELPERS, Namer


def bound_in(stmts: Iterable[ast.AST]) -> set[str]:
    """Names bound anywhere in ``stmts``, nested blocks included."""
    names: set[str] = set()
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names


def _bound_here(stmt: ast.stmt) -> set[str]:
    """Names ``stmt`` binds in its own block: Taichi scopes the names first bound in a nested block (a branch,
    a loop's body and counter) to that block."""
    targets = stmt.targets if isinstance(stmt, ast.Assign) else \
        [stmt.target] if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) else []
    return bound_in(targets)


def _simple(stmt: ast.stmt) -> str | None:
    """The name a ``x = ...`` or ``x op= ...`` statement binds, else None."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
        return stmt.target.id
    return None


def _last_bound_otherwise(block: list[ast.stmt]) -> dict[str, int]:
    """For each name, the position of the last statement binding it other than as ``x = ...`` or
    ``x op= ...``: a branch or loop (whose value depends on the path), an unpacking, an annotation."""
    last: dict[str, int] = {}
    for k, stmt in enumerate(block):
        if _simple(stmt) is None:
            for name in bound_in([stmt]):
                last[name] = k
    return last


class _Reads(ast.NodeTransformer):
    def __init__(self, current: dict[str, str]) -> None:
        self.current = current

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if isinstance(node.ctx, ast.Load) and node.id in self.current:
            return ast.copy_location(ast.Name(self.current[node.id], ast.Load()), node)
        return node


def rebound_call(value: ast.expr, old: str) -> ast.expr:
    """``_tidiff_rules.rebound(value, old)``: ``value`` as Taichi would store it in the variable ``old``."""
    func = ast.Attribute(ast.Name(RULE_HELPERS, ast.Load()), "rebound", ast.Load())
    return ast.Call(func, [value, ast.Name(old, ast.Load())], [])


def rename_rebindings(block: list[ast.stmt], params: Iterable[str], namer: Namer,
                      keep: frozenset[str] = frozenset()) -> list[ast.stmt]:
    """``block`` with every new whole value of a variable under a fresh name, from the point where no
    branch, loop or unpacking binds it any more, in nested blocks too (see the NOTEs). The renaming edits
    nodes in place, so it works on a copy: ``block`` may share nodes with a parsed function. Names in
    ``keep`` keep their updates as written: a kernel's sums into top-level locals from its parallel loops
    (``total += e``), which Taichi makes atomic adds, and which a copy and a write-back would race."""
    return _renamed(copy.deepcopy(block), set(params), namer, write_back=False, keep=keep)


def _leaves_early(block: list[ast.stmt]) -> bool:
    """Whether ``block`` holds a ``break``, ``continue`` or ``return`` (in nested loops too: a cautious answer)."""
    return any(isinstance(node, (ast.Break, ast.Continue, ast.Return)) for stmt in block for node in ast.walk(stmt))


def _nested_renamed(stmt: ast.stmt, bound: set[str], namer: Namer, keep: frozenset[str]) -> ast.stmt:
    """A loop or branch whose blocks are renamed (NOTE: [Rebinding in loops]); other statements as they are."""
    if isinstance(stmt, (ast.For, ast.While, ast.If)):
        inner = bound | bound_in([stmt.target]) if isinstance(stmt, ast.For) else bound
        body = stmt.body if _leaves_early(stmt.body) else _renamed(stmt.body, inner, namer, True, keep)
        orelse = stmt.orelse if _leaves_early(stmt.orelse) else _renamed(stmt.orelse, inner, namer, True, keep)
        renamed = type(stmt)(**{**{f: getattr(stmt, f) for f in stmt._fields}, "body": body, "orelse": orelse})
        return ast.copy_location(renamed, stmt)
    return stmt


def _read_once_before(stmt: ast.For | ast.While | ast.If, reads: _Reads) -> None:
    """A branch's test and a for loop's range, evaluated once before any path runs, read the renamed values
    (NOTE: [Tests read renamed values]); a while loop's test reads its variables anew each time."""
    if isinstance(stmt, ast.If):
        stmt.test = reads.visit(stmt.test)
    elif isinstance(stmt, ast.For):
        stmt.iter = reads.visit(stmt.iter)


def _copies(names: list[str], current: dict[str, str], namer: Namer) -> list[ast.stmt]:
    """``name_1 = name`` for each name, read as ``name_1`` from here on."""
    stmts: list[ast.stmt] = []
    for name in names:
        current[name] = copy_name = namer.fresh(name)
        stmts.append(ast.Assign([ast.Name(copy_name, ast.Store())], ast.Name(name, ast.Load())))
    return stmts


def _renamed(block: list[ast.stmt], outer: set[str], namer: Namer, write_back: bool,
             keep: frozenset[str] = frozenset()) -> list[ast.stmt]:
    """``block`` renamed, where ``outer`` are the names bound before it; ``write_back``: end by giving each
    renamed one of those its last value under its own name; names in ``keep`` are not renamed."""
    last_other = _last_bound_otherwise(block)
    bound = set(outer) - keep
    current: dict[str, str] = {}
    out: list[ast.stmt] = []
    if write_back:  # read carried values through a copy made on entry (NOTE: [Rebinding in loops])
        rebound_here = {name for stmt in block if (name := _simple(stmt)) is not None} - keep
        out += _copies(sorted((rebound_here & outer) - set(last_other)), current, namer)
    for k, stmt in enumerate(block):
        reads = _Reads(current)
        name = _simple(stmt)
        if name is None or name not in bound:
            if name is None:  # a loop, branch or unpacking binds these by their own names from here on
                rebinds = sorted(bound_in([stmt]) & set(current))
                if isinstance(stmt, (ast.For, ast.While, ast.If)):  # each path starts from the last value
                    _read_once_before(stmt, reads)
                    out += [ast.Assign([ast.Name(n, ast.Store())], ast.Name(current.pop(n), ast.Load()))
                            for n in rebinds]
                    reads = _Reads(current)
                else:
                    stmt = reads.visit(stmt)
                    for n in rebinds:
                        current.pop(n)
            out.append(reads.visit(_nested_renamed(stmt, bound, namer, keep)))
            if isinstance(stmt, (ast.For, ast.While, ast.If)) and not (write_back and k == len(block) - 1):
                # after the last loop or branch binding them (not where the block ends: written back at once)
                out += _copies(sorted(n for n in bound_in(stmt.body + stmt.orelse) & bound if last_other[n] == k),
                               current, namer)
            bound |= _bound_here(stmt) - keep
            continue
        old = current.get(name, name)
        if isinstance(stmt, ast.AugAssign):
            value: ast.expr = ast.BinOp(ast.Name(old, ast.Load()), stmt.op, reads.visit(stmt.value))
        else:
            assert isinstance(stmt, ast.Assign)
            value = reads.visit(stmt.value)
        current[name] = new = namer.fresh(name)
        out.append(ast.copy_location(ast.Assign([ast.Name(new, ast.Store())], rebound_call(value, old)), stmt))
    if write_back:
        out += [ast.Assign([ast.Name(name, ast.Store())], ast.Name(new, ast.Load()))
                for name, new in current.items() if name in outer]
    return out
