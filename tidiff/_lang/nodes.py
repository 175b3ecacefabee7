"""The few AST builders the reverse transform writes its statements with."""
import ast
from typing import Any

from .naming import RULE_HELPERS, TAICHI


def name(identifier: str) -> ast.Name:
    return ast.Name(identifier, ast.Load())


def assign(target: str, value: ast.expr, annotation: ast.expr | None = None) -> ast.stmt:
    if annotation is not None:
        return ast.AnnAssign(ast.Name(target, ast.Store()), annotation, value, 1)
    return ast.Assign([ast.Name(target, ast.Store())], value)


def zero_of(identifier: str) -> ast.Call:
    """``ti.zero(v)``: a zero shaped like the variable ``v``."""
    return ast.Call(ast.Attribute(name(TAICHI), "zero", ast.Load()), [name(identifier)], [])


def statements(text: str, **names: Any) -> list[ast.stmt]:
    """Statements parsed from ``text`` with ``{ti}``, ``{rules}`` and the given names filled in."""
    return ast.parse(text.format(ti=TAICHI, rules=RULE_HELPERS, **names)).body


def for_loop(header: str, body: list[ast.stmt], **names: Any) -> ast.For:
    """``for ...:`` from ``header`` (filled in as by :func:`statements`) around ``body``."""
    loop = statements(header + "\n    pass\n", **names)[0]
    assert isinstance(loop, ast.For)
    loop.body = body
    return loop
