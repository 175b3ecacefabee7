"""A transformer's function compiled into a live ``@ti.func``, kept with what it was generated from."""
import ast
import copy
from collections.abc import Callable
from typing import Any

import taichi as ti

from .activity import assignments
from .compile import compile_source, mark, wrap_long_lines
from .parse import Parsed, parse


def owned_cache(f: Any, name: str) -> dict[Any, Any]:
    """A dict stored on ``f`` itself: what is generated from ``f`` lives as long as ``f`` does."""
    cache = f.__dict__.get(name)
    if cache is None:
        cache = f.__dict__[name] = {}
    return cache


def generate(f: Any, active: tuple[bool, ...], make: Callable[[Parsed, tuple[bool, ...]], Any],
             tag: str, namespace: dict[str, Any]) -> Any:
    """Transform ``f`` with ``make(parsed, active)`` (the tangent transform's ``Transformer``, or the reverse
    transform's ``Reverser``) and compile it in ``f``'s namespace, with the transformer's helpers and
    ``namespace`` added; ``tag`` names the generator in the file name. The result's record
    (``compile.info``) holds what the transformer's ``generated()`` says of it."""
    parsed = parse(f)
    transformer = make(parsed, active)
    tree = transformer.run()
    if parsed.form == "helper":
        _by_reference(tree, transformer.taichi_name)
    text = wrap_long_lines(ast.unparse(ast.Module([tree], [])))
    scope = {**parsed.namespace, **transformer.helpers, **namespace, transformer.taichi_name: ti}
    g = compile_source(text + "\n", tree.name, scope, tag=tag)
    mark(g, **transformer.generated())
    return g


def _by_reference(tree: ast.FunctionDef, taichi: str) -> None:
    """Parameters the body never writes become ``ti.template()``, the rest plain (NOTE: [Python helpers])."""
    writes, loop_vars = assignments(tree.body)
    written = loop_vars | {name for names, _ in writes for name in names}
    template = ast.Call(ast.Attribute(ast.Name(taichi, ast.Load()), "template", ast.Load()), [], [])
    for arg in tree.args.args:
        arg.annotation = None if arg.arg in written else copy.deepcopy(template)
    ast.fix_missing_locations(tree)
