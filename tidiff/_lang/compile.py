"""Turn generated source into live Python/Taichi objects.

Taichi reads a function's source with ``inspect``; source made at run time is
found there only if it is registered in ``linecache`` under a file name of its
own, which is what :func:`compile_source` does. The entry lives as long as the
object it defines (Taichi reads it again whenever it compiles a new
instance), and is dropped with it.
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import itertools
import linecache
import weakref
from collections.abc import Sequence
from typing import Any

from .products import products_entry_by_entry

_counter = itertools.count()


@dataclasses.dataclass(frozen=True)
class Generated:
    """What tidiff knows of an object it generated: one record, kept on the object (:func:`info`)."""

    source: str | None = None  # the generated source (``td.source``)
    reverse: bool = False  # a reverse function, or a tangent made from one (NOTE: [Forward mode of a gradient's code])
    lane_cost: int | None = None  # the size of one tangent lane (NOTE: [Vector-mode pushes])
    uses_bwd: bool = False  # calls a td.custom_vjp rule, itself or in a callee (NOTE: [Mode choice])
    recomputes: bool = False  # reverses a runtime loop by recomputing it (NOTE: [Loops in reverse cost their square])
    wide: bool = False  # holds vector-mode pushes, its own or its parent's
    looped: bool = False  # pushes in a runtime loop: its Jacobian blocks are written to the output on the host


_RECORD = "_tidiff"
_NOTHING = Generated()


def info(obj: object) -> Generated:
    """The record of an object tidiff generated; an empty one for anything else (the user's code)."""
    found = getattr(obj, _RECORD, None)
    return found if isinstance(found, Generated) else _NOTHING


def mark(obj: object, **fields: Any) -> None:
    """Set fields of the record of an object tidiff generated."""
    setattr(obj, _RECORD, dataclasses.replace(info(obj), **fields))


def compile_source(source: str | ast.Module | ast.stmt, name: str, namespace: dict[str, Any], tag: str = "gen") -> Any:
    """Execute ``source`` (text, a module or a statement such as a function) in ``namespace``; return the object
    named ``name``.

    The text is registered in ``linecache`` so that Taichi (and tracebacks)
    can read it back; the file name says which generator made it. The object's
    record (:func:`info`) holds the source (for ``td.source``).
    """
    module = ast.parse(source) if isinstance(source, str) else \
        source if isinstance(source, ast.Module) else ast.Module([source], [])
    if products_entry_by_entry(module, namespace) or not isinstance(source, str):  # NOTE: [Products entry by
        # entry] in products.py
        source = wrap_long_lines(ast.unparse(ast.fix_missing_locations(module))) + "\n"
    filename = f"<tidiff-{tag}-{next(_counter)}:{name}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    exec(compile(source, filename, "exec", dont_inherit=True), namespace)  # no __future__ from here
    obj = namespace[name]
    mark(obj, source=source)
    try:
        weakref.finalize(obj, linecache.cache.pop, filename, None)
    except TypeError:  # an object that cannot be weakly referenced keeps its entry
        pass
    return obj


def generated_sources(obj: object) -> list[str]:
    """The generated source of ``obj``, then of every generated function it names, depth first (``td.source``);
    empty for the user's own code."""
    texts: list[str] = []
    _collect(obj, texts, set())
    return texts


def _collect(obj: object, texts: list[str], seen: set[int]) -> None:
    text = info(obj).source
    if text is None or id(obj) in seen:
        return
    seen.add(id(obj))
    texts.append(text)
    namespace = getattr(getattr(obj, "__wrapped__", None), "__globals__", {})
    for value in list(namespace.values()):
        _collect(value, texts, seen)


def kernel_like(tree: ast.FunctionDef, name: str, body: list[ast.stmt], namespace: dict[str, Any], taichi: str,
                tag: str, params: Sequence[ast.arg] = ()) -> Any:
    """A ``@ti.kernel`` named ``name`` with the parameters (then ``params``) and return type of the kernel ``tree``
    and the statements ``body``, compiled in ``namespace``, where ``taichi`` names the taichi module."""
    decorator = ast.Attribute(ast.Name(taichi, ast.Load()), "kernel", ast.Load())
    fn = ast.FunctionDef(name, copy.deepcopy(tree.args), body, [decorator], copy.deepcopy(tree.returns))
    fn.args.args += list(params)
    return compile_source(ast.fix_missing_locations(fn), name, namespace, tag=tag)


# NOTE: [Where compile time goes] A first call compiles one Taichi kernel;
# for generated derivative code its time splits three ways (cProfile and
# ti.profiler.print_scoped_profiler_info, 2-core CPU, offline cache off):
# - Taichi's Python frontend visits every AST node of the inlined code at a
#   few µs each, plus a message it formats for every node from the node's
#   whole source line (textwrap): linear in nodes, times the line length.
#   Generated lines are therefore wrapped (``wrap_long_lines``).
# - Its IR passes, mostly ``full_simplify``: ``cfg_optimization``
#   (store-to-load forwarding, reaching definitions) and ``whole_kernel_cse``
#   grow faster than linearly with the statements of one basic block and
#   with the stores into one local value (a local matrix is one alloca per
#   entry); stores at run-time positions into a local value are the worst,
#   about the square of its size. Hence: Jacobian blocks written straight
#   into output arrays on the host (NOTE: [Blocks written to the output]),
#   blocks of constant positions built as one literal, pushes beyond the
#   lane budget in a run-time loop (NOTE: [Vector-mode pushes]).
# - LLVM: about 0.1 s, nearly constant.
# Measured for ``jacfwd(jacrev(tanh(W x + b), 0), 0)`` by a 4x8 W (a
# 4x4x8x4x8 block): frontend 1.1 s over 13,000 nodes (1.6 s before lines were
# wrapped), IR passes 2.0 s (CSE 0.6 s, store-to-load 0.5 s) over four
# copies of the reverse function's tangent, one per output component;
# LLVM 0.1 s. ``td.hessian`` of a 64-vector function: 0.7 s in all. The
# copies are gone (NOTE: [Nested blocks] in ``nested``): 0.5-0.7 s.
# bench/compile_scaling.py measures tidiff against JAX and hand-written Taichi.


def wrap_long_lines(source: str, longest: int = 300, width: int = 100) -> str:
    """Break lines longer than ``longest`` after commas inside brackets, about every ``width`` characters.

    Taichi's frontend formats a message (the node's whole line, wrapped to 80
    columns) for every AST node it visits, so a generated line of thousands of
    characters (a literal Jacobian of 128 entries) costs about the square of
    its length: 1.5 s of the 4.5 s first call of an mlp Hessian.
    """
    wrapped = []
    for line in source.splitlines():
        if len(line) <= longest:
            wrapped.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip()) + 8)
        depth, quote, start, escaped = 0, "", 0, False
        for i, c in enumerate(line):
            if quote:
                if escaped:
                    escaped = False
                elif c == "\\":
                    escaped = True
                elif c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
            elif c == "," and depth > 0 and i - start >= width:
                wrapped.append(line[start:i + 1] if start == 0 else indent + line[start:i + 1].lstrip())
                start = i + 1
        wrapped.append(line[start:] if start == 0 else indent + line[start:].lstrip())
    return "\n".join(wrapped)
