"""Turn generated source into live Python/Taichi objects.

Taichi reads a function's source with ``inspect``; source made at run time is
found there only if it is registered in ``linecache`` under a file name of its
own, which is what :func:`compile_source` does. The entry lives as long as the
object it defines (Taichi reads it again whenever it compiles a new
instance), and is dropped with it.
"""
from __future__ import annotations

import ast
import itertools
import linecache
import weakref
from typing import Any

_counter = itertools.count()


def compile_source(source: str | ast.AST, name: str, namespace: dict[str, Any], tag: str = "gen") -> Any:
    """Execute ``source`` (text or a module/function AST) in ``namespace``; return the object named ``name``.

    The text is registered in ``linecache`` so that Taichi (and tracebacks)
    can read it back; the file name says which generator made it. The object
    gets ``_tidiff_source`` (for ``td.source``).
    """
    if isinstance(source, ast.AST):
        module = source if isinstance(source, ast.Module) else ast.Module([source], [])
        source = ast.unparse(ast.fix_missing_locations(module)) + "\n"
    filename = f"<tidiff-{tag}-{next(_counter)}:{name}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    exec(compile(source, filename, "exec", dont_inherit=True), namespace)  # no __future__ from here
    obj = namespace[name]
    obj._tidiff_source = source
    try:
        weakref.finalize(obj, linecache.cache.pop, filename, None)
    except TypeError:  # an object that cannot be weakly referenced keeps its entry
        pass
    return obj
