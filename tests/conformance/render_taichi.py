"""Render a grammar tree as Taichi source and compile it into live ``@ti.func`` objects.

Taichi reads a function's source with ``inspect``; generated source is found
there when it is registered in ``linecache`` under a file name of its own
before ``ti.func`` wraps it (the way tidiff's own code generator does it).
"""
from __future__ import annotations

import hashlib
import itertools
import linecache

import taichi as ti

import tidiff as td

from . import library
from .grammar import Assign, AugAssign, EntryWrite, Expr, If, Loop, Unpack
from .ops import MATRIX_SHAPES, OPS, VECTOR_SIZES, taichi_annotation

_files = itertools.count()

# NOTE: [Unpacks as struct locals] Every other ``a, b = e0, e1`` of a program is rendered through a struct local,
# ``bundle0 = Bundle0(m0=e0, m1=e1)`` then ``a, b = bundle0.m0, bundle0.m1`` (issue 35, item 10): the same
# values, so the torch twin renders it as the plain unpack, and the transforms meet struct locals in every context
# the grammar draws (loops, branches, helpers, nested transforms). The struct types are module-level names.
_structs: list[str] = []
_unpacks = itertools.count()


def expr(e: Expr) -> str:
    """The Taichi spelling of one expression."""
    args = [expr(a) for a in e.args]
    p = dict(e.params)
    if e.op == "var":
        return p["name"]
    if e.op in ("call", "lib"):
        return f"{p['func']}({', '.join(args)})"
    if e.op == "tgrad":
        return f"td.grad({p['func']}, argnums={p['argnum']})({', '.join(args)})"
    if e.op == "tjvp":
        n = len(args) // 2
        return f"td.jvp({p['func']}, ({', '.join(args[:n])},), ({', '.join(args[n:])},))[1]"
    if e.op == "thvp":
        n = len(args) // 2
        return f"td.hvp({p['func']}, ({', '.join(args[:n])},), ({', '.join(args[n:])},))[1][{p['argnum']}]"
    if e.op == "loop_scale":
        return f"({args[0]} * ({p['var']} + 1.0))"
    if e.op == "dyn_entry":
        return f"{p['vector']}[{p['var']}]"
    op = OPS[e.op]
    if "{rows}" in op.taichi:
        m = p["m"]
        p["rows"] = ", ".join("[" + ", ".join(args[r * m:(r + 1) * m]) + "]" for r in range(p["n"]))
    p["args"] = ", ".join(args)
    return op.taichi.format(*args, **p)


def statements(block, indent):
    pad = "    " * indent
    lines = []
    for s in block:
        if isinstance(s, Assign):
            lines.append(f"{pad}{s.name} = {expr(s.expr)}")
        elif isinstance(s, Unpack) and len(s.values) == len(s.names) > 1 and next(_unpacks) % 2 == 0:
            lines.extend(_through_struct(s, pad))
        elif isinstance(s, Unpack):
            lines.append(f"{pad}{', '.join(s.names)} = {', '.join(expr(e) for e in s.values)}")
        elif isinstance(s, AugAssign):
            lines.append(f"{pad}{s.name} {s.op}= {expr(s.expr)}")
        elif isinstance(s, EntryWrite):
            target = s.name + s.index if s.index.startswith(".") else f"{s.name}[{s.index}]"
            op = "=" if s.op == "=" else s.op + "="
            lines.append(f"{pad}{target} {op} {expr(s.expr)}")
        elif isinstance(s, If):
            lines.append(f"{pad}if {expr(s.cond)} > {s.threshold}:")
            lines.extend(statements(s.body, indent + 1))
            if s.orelse:
                lines.append(f"{pad}else:")
                lines.extend(statements(s.orelse, indent + 1))
        elif isinstance(s, Loop):
            if s.kind == "while":
                lines.append(f"{pad}{s.var} = 0")
                lines.append(f"{pad}while {s.var} < {s.count}:")
                lines.extend(statements(s.body, indent + 1))
                lines.append(f"{pad}    {s.var} += 1")
            else:
                loop = f"ti.static(range({s.count}))" if s.kind == "static" else f"range({s.count})" \
                    if s.kind == "range" else f"range({s.count} + 0 * int({s.bound}))"
                lines.append(f"{pad}for {s.var} in {loop}:")
                lines.extend(statements(s.body, indent + 1))
        else:
            raise TypeError(f"unknown statement {s!r}")
    return lines


def _through_struct(s: Unpack, pad: str) -> list[str]:
    """``a, b = e0, e1`` through a struct local (NOTE: [Unpacks as struct locals])."""
    k = len(_structs)
    members = [f"m{j}" for j in range(len(s.names))]
    fields = ", ".join(f"{m}={taichi_annotation(v.shape)}" for m, v in zip(members, s.values, strict=True))
    _structs.append(f"Bundle{k} = ti.types.struct({fields})")
    built = ", ".join(f"{m}={expr(v)}" for m, v in zip(members, s.values, strict=True))
    return [f"{pad}bundle{k} = Bundle{k}({built})",
            f"{pad}{', '.join(s.names)} = {', '.join(f'bundle{k}.{m}' for m in members)}"]


def func(f) -> str:
    params = ", ".join(f"{name}: {taichi_annotation(shape)}" for name, shape in f.params)
    ret = f" -> {taichi_annotation(f.out_shapes[0])}" if f.annotate_return else ""
    lines = ["@ti.func", f"def {f.name}({params}){ret}:"]
    lines.extend(statements(f.body, 1))
    lines.append("    return " + ", ".join(expr(e) for e in f.returns))
    return "\n".join(lines) + "\n"


def source(program) -> str:
    """The Taichi module of a program: the struct types its functions name, its helpers, then ``f``."""
    global _unpacks
    _structs.clear()
    _unpacks = itertools.count()  # the same program renders the same text each time
    functions = "\n\n".join(func(f) for f in program.funcs)
    return "\n".join(_structs) + ("\n\n\n" if _structs else "") + functions


def namespace() -> dict:
    """What generated Taichi code may name: ti, td, float64 vector/matrix types, the library."""
    ns = {"ti": ti, "td": td}
    ns.update({f"vec{n}d": ti.types.vector(n, ti.f64) for n in VECTOR_SIZES})
    ns.update({f"mat{n}{m}d": ti.types.matrix(n, m, ti.f64) for n, m in MATRIX_SHAPES})
    ns.update({name: entry.func for name, entry in library.LIBRARY.items()})
    return ns


def compile_text(text: str, name: str, ns: dict, tag: str):
    """Execute generated ``text`` in ``ns`` under a linecache file of its own; return the object ``name``."""
    digest = hashlib.sha1(text.encode()).hexdigest()[:10]
    filename = f"<conformance-{tag}-{next(_files)}-{digest}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    exec(compile(text, filename, "exec", dont_inherit=True), ns)
    return ns[name]


def build(program):
    """The program's main ``@ti.func`` (its helpers live in the same namespace)."""
    return compile_text(source(program), program.main.name, namespace(), "func")
