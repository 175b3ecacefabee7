"""``continue`` written as the branch it stands for, so that every transform reverses loops that skip.

NOTE: [Continue as a branch] ``continue`` ends the iteration: what follows
it in the loop body runs only where it did not. So

    for i in ...:              for i in ...:
        a = f(i)                   a = f(i)
        if a < 0:          is      if a < 0:
            b = g(a)                   b = g(a)
            continue               else:
        h(a)                           h(a)

the same program without the jump, which the reverse transform takes (a
branch on a value) where it refuses ``continue``; kernels skip elements
this way. The statements after a branch holding a ``continue`` are copied
into each side that does not leave (twice at most per branch); a
``continue`` inside a nested loop belongs to that loop and is rewritten
there. Loops with an ``else`` block are left as written.
"""
import ast
import copy


def without_continue(tree: ast.FunctionDef) -> None:
    """Rewrite, in place, the body of every loop in ``tree`` that uses ``continue`` (see the NOTE)."""
    loops = [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While))]
    for node in reversed(loops):  # inner loops first: the copies an outer rewrite makes hold them rewritten
        if not node.orelse and _continues(node.body):
            node.body = _rest_unless_continued(node.body, []) or [ast.Pass()]
    ast.fix_missing_locations(tree)


def _continues(stmts: list[ast.stmt]) -> bool:
    """Whether a ``continue`` of the loop these statements stand in is among them (not in a nested loop)."""
    for stmt in stmts:
        if isinstance(stmt, ast.Continue):
            return True
        if isinstance(stmt, ast.If) and (_continues(stmt.body) or _continues(stmt.orelse)):
            return True
    return False


def _rest_unless_continued(stmts: list[ast.stmt], rest: list[ast.stmt]) -> list[ast.stmt]:
    """Statements doing ``stmts``, then ``rest`` unless ``stmts`` reached a ``continue``, without ``continue``."""
    out: list[ast.stmt] = []
    for k, stmt in enumerate(stmts):
        if isinstance(stmt, ast.Continue):
            return out
        if isinstance(stmt, ast.If) and (_continues(stmt.body) or _continues(stmt.orelse)):
            tail = stmts[k + 1:] + rest
            body = _rest_unless_continued(stmt.body, tail)
            orelse = _rest_unless_continued(stmt.orelse, copy.deepcopy(tail))
            out.append(ast.If(stmt.test, body or [ast.Pass()], orelse))
            return out
        out.append(stmt)
    return out + rest
