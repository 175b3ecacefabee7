"""``break`` written as a flag the rest of the loop tests, so that the reverse transform takes loops that leave early.

NOTE: [Break as a flag] ``break`` ends the loop: what follows it in the
iteration does not run, nor do the iterations after it. So

    for i in range(n):         live = 1
        a = f(i)               for i in range(n):
        if a < 0:                  if live:
            break          is          a = f(i)
        h(a)                           if a < 0:
                                           live = 0
                                           continue
                                       h(a)

and ``while c: body`` is ``live = 1; while live: if c: body else: live = 0``
(no iteration runs after the one that broke, so the loop's trip count is the
one the reverse sweep counts). The ``continue`` left is then the branch it
stands for (NOTE: [Continue as a branch]), and the loop is a runtime loop
carrying one more integer, which the reverse transform takes where it
refused ``break``. Only the reverse transform rewrites (on its own copy):
forward code keeps the ``break``, which ends a ``for`` loop without running
its remaining iterations. A ``for`` loop over ``ti.static(...)`` is left as
written (Taichi unrolls it, and its ``break`` stands under a static
condition), as are loops with an ``else`` block and, in a kernel, the
top-level loops (Taichi runs those in parallel; it refuses ``break`` there).
"""
import ast
import copy
from collections.abc import Callable

from .continues import without_continue
from .naming import Namer, names_in


def without_break(tree: ast.FunctionDef, is_static: Callable[[ast.expr], bool],
                  keep_top_level: bool = False) -> ast.FunctionDef:
    """``tree`` with every loop's ``break`` written as a flag (see the NOTE): a rewritten copy, or ``tree``
    itself where no loop it would rewrite breaks. ``keep_top_level`` leaves the loops of the function's own
    body as written (a kernel's parallel loops)."""
    if not any(isinstance(node, (ast.For, ast.While)) and _rewritten(node, is_static) and _breaks(node.body)
               for node in ast.walk(tree)):
        return tree
    copied = copy.deepcopy(tree)
    namer = Namer(names_in(copied))
    copied.body = _block(copied.body, is_static, namer, rewrite=not keep_top_level)
    without_continue(copied)
    return ast.fix_missing_locations(copied)


def _rewritten(node: ast.AST, is_static: Callable[[ast.expr], bool]) -> bool:
    """Whether ``node`` is a loop whose breaks the NOTE rewrites."""
    if isinstance(node, ast.While):
        return not node.orelse
    return isinstance(node, ast.For) and not node.orelse and not is_static(node.iter)


def _breaks(stmts: list[ast.stmt]) -> bool:
    """Whether a ``break`` of the loop these statements stand in is among them (not in a nested loop)."""
    return any(isinstance(stmt, ast.Break)
               or isinstance(stmt, ast.If) and (_breaks(stmt.body) or _breaks(stmt.orelse))
               for stmt in stmts)


def _block(stmts: list[ast.stmt], is_static: Callable[[ast.expr], bool], namer: Namer,
           rewrite: bool = True) -> list[ast.stmt]:
    """``stmts`` with nested blocks rewritten first, then each loop among them that breaks."""
    out: list[ast.stmt] = []
    for stmt in stmts:
        if isinstance(stmt, (ast.For, ast.While, ast.If)):
            stmt.body = _block(stmt.body, is_static, namer)
            stmt.orelse = _block(stmt.orelse, is_static, namer)
        if isinstance(stmt, (ast.For, ast.While)) and rewrite and _rewritten(stmt, is_static) and _breaks(stmt.body):
            live = namer.fresh("live")
            out.append(ast.copy_location(_set(live, 1), stmt))
            body = _flagged(stmt.body, live)
            if isinstance(stmt, ast.While):
                stmt.body = [ast.If(stmt.test, body, [_set(live, 0)])]
                stmt.test = ast.Name(live, ast.Load())
            else:
                stmt.body = [ast.If(ast.Name(live, ast.Load()), body, [])]
        out.append(stmt)
    return out


def _flagged(stmts: list[ast.stmt], live: str) -> list[ast.stmt]:
    """``stmts`` with each ``break`` of their loop as ``live = 0; continue``."""
    out: list[ast.stmt] = []
    for stmt in stmts:
        if isinstance(stmt, ast.Break):
            out += [_set(live, 0), ast.Continue()]
        elif isinstance(stmt, ast.If):
            out.append(ast.If(stmt.test, _flagged(stmt.body, live), _flagged(stmt.orelse, live)))
        else:
            out.append(stmt)
    return out


def _set(variable: str, value: int) -> ast.Assign:
    return ast.Assign([ast.Name(variable, ast.Store())], ast.Constant(value))
