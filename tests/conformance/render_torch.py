"""Render a grammar tree as a torch twin: the same program on float64 tensors of the core shapes.

The twin never writes a tensor in place (``_set`` returns a new tensor), so
aliasing (Taichi copies values, torch shares them) cannot differ; calls of
transforms inside the program become torch autograd calls with
``create_graph=True``, so the twin can be differentiated again.
"""
from __future__ import annotations

import torch

from . import library
from .grammar import Assign, AugAssign, EntryWrite, Expr, If, Loop, Unpack
from .ops import OPS
from .render_taichi import compile_text

F64 = torch.float64


def _set(t, index, value):
    out = t.clone()
    out[index] = value
    return out


# Ties follow tidiff's documented convention (docs/limits.md, NOTE: [Ties]), which is torch's: a tie splits the
# derivative evenly. The grammar builds ties by construction (``max(x[0, 0], x[1, 1])`` of a matrix of one value),
# where the derivatives on both sides of a kink are equally right and only the convention decides.
def _maximum(a, b):
    """``max(a, b)``; a tie splits the derivative evenly."""
    return torch.maximum(torch.as_tensor(a, dtype=F64), torch.as_tensor(b, dtype=F64))


def _minimum(a, b):
    """``min(a, b)``; a tie splits the derivative evenly."""
    return torch.minimum(torch.as_tensor(a, dtype=F64), torch.as_tensor(b, dtype=F64))


def _extreme(v, largest):
    """``v.max()`` / ``v.min()``; a tie splits the derivative evenly among the equal entries (torch.amax)."""
    flat = v.reshape(-1)
    best = flat.max() if largest else flat.min()
    if not bool((flat == best).any()):  # a NaN (long run, seed 9506): no entry equals it, no derivative is defined
        return best
    return flat.amax() if largest else flat.amin()


def _max_of(v):
    return _extreme(v, True)


def _min_of(v):
    return _extreme(v, False)


def _clamp(x, lo, hi):
    """``min(hi, max(lo, x))``, as Taichi defines it (ties as above)."""
    return _minimum(hi, _maximum(lo, x))


def _smoothstep(e0, e1, x):
    t = torch.clamp((x - e0) / (e1 - e0), 0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def _mix(x, y, a):
    return x * (1.0 - a) + y * a


def _norm_sqr(v):
    return (v * v).sum()


def _norm(v):
    return torch.sqrt((v * v).sum())


def _normalized(v):
    return v / _norm(v)


def _cross2(a, b):
    return a[0] * b[1] - a[1] * b[0]


def _det(m):
    """The determinant as the cofactor polynomial Taichi computes: its derivatives of every order are
    polynomials too (torch.linalg.det's are NaN at singular matrices from the fourth order on)."""
    if m.shape[0] == 2:
        return m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0]
    return (m[0, 0] * (m[1, 1] * m[2, 2] - m[1, 2] * m[2, 1]) - m[0, 1] * (m[1, 0] * m[2, 2] - m[1, 2] * m[2, 0])
            + m[0, 2] * (m[1, 0] * m[2, 1] - m[1, 1] * m[2, 0]))


def _eye(n):
    return torch.eye(n, dtype=F64)


def _filled(shape, x):
    return x * torch.ones(shape, dtype=F64)


def _matrix(n, m, entries):
    return torch.stack(entries).reshape(n, m)


def _grad(fn, argnum):
    """``td.grad(fn, argnums=argnum)`` for a twin: differentiable again (create_graph)."""
    def g(*args):
        with torch.enable_grad():
            args = list(args)
            # a variable of its own: the argument may also reach other arguments (long run, seed 9803:
            # h(-x[1], x)), whose paths are not this argument's derivative; a clone stays on the graph
            arg = args[argnum]
            args[argnum] = arg.clone() if arg.requires_grad else arg.detach().requires_grad_()
            out = fn(*args)
            if not out.requires_grad:
                return torch.zeros_like(args[argnum])
            (d,) = torch.autograd.grad(out, args[argnum], create_graph=True, allow_unused=True)
            return torch.zeros_like(args[argnum]) if d is None else d
    return g


def _jvp(fn, primals, tangents):
    """``td.jvp(fn, primals, tangents)[1]`` for a twin."""
    with torch.enable_grad():
        return torch.autograd.functional.jvp(fn, primals, tangents, create_graph=True)[1]


def _hvp(fn, argnum, primals, tangents):
    """``td.hvp(fn, primals, tangents)[1][argnum]`` for a twin."""
    with torch.enable_grad():
        return torch.autograd.functional.hvp(fn, primals, tangents, create_graph=True)[1][argnum]


HELPERS = {f.__name__: f for f in (_set, _maximum, _minimum, _max_of, _min_of, _clamp, _smoothstep, _mix, _norm_sqr,
                                   _norm, _normalized, _cross2, _det, _eye, _filled, _matrix, _grad,
                                   _jvp, _hvp)}
"""What twin source may call besides torch and the library."""


def expr(e: Expr) -> str:
    args = [expr(a) for a in e.args]
    p = dict(e.params)
    if e.op == "var":
        return p["name"]
    if e.op in ("call", "lib"):
        return f"{p['func']}({', '.join(args)})"
    if e.op == "tgrad":
        return f"_grad({p['func']}, {p['argnum']})({', '.join(args)})"
    if e.op == "tjvp":
        n = len(args) // 2
        return f"_jvp({p['func']}, ({', '.join(args[:n])},), ({', '.join(args[n:])},))"
    if e.op == "thvp":
        n = len(args) // 2
        return f"_hvp({p['func']}, {p['argnum']}, ({', '.join(args[:n])},), ({', '.join(args[n:])},))"
    if e.op == "loop_scale":
        return f"({args[0]} * ({p['var']} + 1.0))"
    if e.op == "dyn_entry":
        return f"{p['vector']}[{p['var']}]"
    p["args"] = ", ".join(args)
    return OPS[e.op].torch.format(*args, **p)


def _index(index: str) -> str:
    if index.startswith("."):
        return f"({'xyzw'.index(index[1])},)"
    return f"({index},)"


def statements(block, indent):
    pad = "    " * indent
    lines = []
    for s in block:
        if isinstance(s, Assign):
            lines.append(f"{pad}{s.name} = {expr(s.expr)}")
        elif isinstance(s, Unpack):
            lines.append(f"{pad}{', '.join(s.names)} = {', '.join(expr(e) for e in s.values)}")
        elif isinstance(s, AugAssign):
            lines.append(f"{pad}{s.name} = {s.name} {s.op} {expr(s.expr)}")
        elif isinstance(s, EntryWrite):
            index = _index(s.index)
            value = expr(s.expr) if s.op == "=" else f"{s.name}[{index}] {s.op} {expr(s.expr)}"
            lines.append(f"{pad}{s.name} = _set({s.name}, {index}, {value})")
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
                lines.append(f"{pad}for {s.var} in range({s.count}):")
                lines.extend(statements(s.body, indent + 1))
        else:
            raise TypeError(f"unknown statement {s!r}")
    return lines


def func(f) -> str:
    lines = [f"def {f.name}({', '.join(name for name, _ in f.params)}):"]
    lines.extend(statements(f.body, 1))
    returns = [expr(e) for e in f.returns]
    lines.append("    return " + (returns[0] if len(returns) == 1 else "(" + ", ".join(returns) + ")"))
    return "\n".join(lines) + "\n"


def source(program) -> str:
    return "\n\n".join(func(f) for f in program.funcs)


def namespace() -> dict:
    ns = {"torch": torch}
    ns.update(HELPERS)
    ns.update({name: entry.twin for name, entry in library.LIBRARY.items()})
    return ns


def build(program):
    """The twin of the program's main function: core-shaped float64 tensors in, tensors (or a tuple) out."""
    return compile_text(source(program), program.main.name, namespace(), "twin")
