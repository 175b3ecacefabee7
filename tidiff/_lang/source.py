"""The AST of a Python function's source, lambdas included (one of several on a line, or in a page that
is not all Python).

Below :mod:`.parse` and :mod:`.callees`, which both read sources: it imports neither.
"""
import ast
import copy
import inspect
import linecache
import textwrap
import types
from collections.abc import Sequence

LAMBDA_MARK = "is_lambda"
"""Attribute set on the FunctionDef made of a lambda: messages do not suggest decorating a lambda."""


def source_tree(fn: types.FunctionType) -> tuple[ast.FunctionDef, str, int]:
    """``(FunctionDef, file name, first line)`` of a Python function; a lambda becomes ``def lambda_(...): return ...``.

    Raises OSError (or TypeError) when the source cannot be read.
    """
    filename = inspect.getsourcefile(fn) or fn.__code__.co_filename
    if fn.__name__ == "<lambda>":
        return _lambda_tree(fn, filename), filename, 1
    lines, first_line = inspect.getsourcelines(fn)
    module = ast.parse(textwrap.dedent("".join(lines)))
    tree = next(node for node in module.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
    if isinstance(tree, ast.AsyncFunctionDef):
        raise TypeError(f"{fn.__qualname__} is an async function")
    tree.decorator_list = []
    return tree, filename, first_line


_MODULES: dict[str, tuple[list[str], ast.Module, range]] = {}
"""file name -> (its lines, their AST): a file with many lambdas is parsed once."""


def _lambda_tree(fn: types.FunctionType, filename: str) -> ast.FunctionDef:
    """The ``ast.Lambda`` that made ``fn``, as a function with a ``return`` (its line numbers are the file's).

    ``inspect.getsource`` of a lambda gives whole lines, which may hold several
    lambdas (a dict of them) or only part of a statement, so the file is parsed
    and the lambda picked by line, parameters and (Python 3.11+) the columns
    its code comes from.
    """
    lines = linecache.getlines(filename, fn.__globals__)
    if not lines:
        raise OSError(f"no source for {filename}")
    code = fn.__code__
    cached = _MODULES.get(filename)
    if cached is None or cached[0] is not lines or code.co_firstlineno not in cached[2]:
        cached = _MODULES[filename] = (lines, *_parse_around(lines, filename, code.co_firstlineno))
    params = list(code.co_varnames[:code.co_argcount])
    found = [node for node in ast.walk(cached[1]) if isinstance(node, ast.Lambda)
             and node.lineno == code.co_firstlineno and [a.arg for a in node.args.args] == params]
    if len(found) > 1 and hasattr(code, "co_positions"):
        spots = [(line, col, end_line, end_col) for line, end_line, col, end_col in code.co_positions()
                 if line is not None and col is not None and end_line is not None and end_col is not None
                 and (col, end_col) != (0, 0)]
        found = [node for node in found if all(_within(node.body, spot) for spot in spots)]
        found = sorted(found, key=lambda node: _extent(node.body))[:1]  # the innermost lambda
    if len(found) != 1:
        raise OSError(f"{len(found)} lambdas with parameters {params} on line {code.co_firstlineno} of {filename}")
    node = copy.deepcopy(found[0])
    name = _lambda_name(cached[1], found[0])
    tree = ast.FunctionDef(name, node.args, [ast.copy_location(ast.Return(node.body), node.body)], [], None)
    setattr(tree, LAMBDA_MARK, True)
    return ast.copy_location(tree, node)


def _extent(node: ast.expr) -> tuple[int, int]:
    """How many lines, then columns, a parsed node spans (parsing gives every node its end)."""
    assert node.end_lineno is not None and node.end_col_offset is not None
    return node.end_lineno - node.lineno, node.end_col_offset - node.col_offset


def _parse_around(lines: Sequence[str], filename: str, line: int, reach: int = 40) -> tuple[ast.Module, range]:
    """The AST of a file, with the lines it covers; for a file that is not all Python
    (a page of documentation with code blocks), of the smallest run of lines around ``line`` that parses."""
    try:
        return ast.parse("".join(lines), filename), range(1, len(lines) + 1)
    except SyntaxError:
        for start in range(line, max(line - reach, 0), -1):
            for end in range(line, min(line + reach, len(lines)) + 1):
                try:
                    tree = ast.parse("".join(lines[start - 1:end]), filename)
                except SyntaxError:
                    continue
                return ast.increment_lineno(tree, start - 1), range(start, end + 1)
        raise


def _lambda_name(module: ast.Module, lam: ast.Lambda) -> str:
    """What the source calls a lambda: ``op`` of ``op = lambda ...``, ``sin`` of ``{"sin": lambda ...}``,
    ``f`` of ``f=lambda ...``; else ``lambda_``."""
    for node in ast.walk(module):
        if isinstance(node, ast.Assign) and node.value is lam and isinstance(node.targets[0], ast.Name):
            return node.targets[0].id
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if value is lam and isinstance(key, ast.Constant) and str(key.value).isidentifier():
                    return str(key.value)
        if isinstance(node, ast.keyword) and node.value is lam and node.arg:
            return node.arg
    return "lambda_"


def _within(node: ast.expr, spot: tuple[int, int, int, int]) -> bool:
    """Whether the source span ``spot`` (line, col, end line, end col) lies inside ``node``'s."""
    line, col, end_line, end_col = spot
    start, end = (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)
    return start <= (line, col) and (end_line, end_col) <= end
