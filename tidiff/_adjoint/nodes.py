"""The few AST builders the reverse transform writes its statements with."""
import ast

from .._tangent.sym import RULE_HELPERS, TAICHI


def name(identifier):
    return ast.Name(identifier, ast.Load())


def assign(target, value, annotation=None):
    if annotation is not None:
        return ast.AnnAssign(ast.Name(target, ast.Store()), annotation, value, 1)
    return ast.Assign([ast.Name(target, ast.Store())], value)


def zero_of(identifier):
    """``ti.zero(v)``: a zero shaped like the variable ``v``."""
    return ast.Call(ast.Attribute(name(TAICHI), "zero", ast.Load()), [name(identifier)], [])


def statements(text, **names):
    """Statements parsed from ``text`` with ``{ti}``, ``{rules}`` and the given names filled in."""
    return ast.parse(text.format(ti=TAICHI, rules=RULE_HELPERS, **names)).body
