"""Source of the ``@ti.func`` bodies that transforms generate from a tangent function.

Every derivative body is built from one tangent (jvp) function of its parent:
a Jacobian pushes one basis tangent per input component and assembles the
results. LLVM shares the repeated primal work between the pushes once the
calls are inlined, so the generated code stays as fast as hand-written
derivatives. Results are returned as flat tuples; see ``_tree``.

Values of rank above 2 (a Jacobian of a matrix by a matrix) are carried as
flat vectors in row-major order, since Taichi matrices have at most 2 dims.
"""
import itertools

import numpy as np

from ._signature import ArgSpec

# NOTE: [Flat values] A spec with more than two dims is stored as a flat
# ti.Vector in row-major order, in kernels and in generated bodies alike;
# `entry` and `literal` below are the only places that know this.


def _taichi_scalar(dtype):
    return f"ti.{np.dtype(dtype).name.replace('float', 'f').replace('int', 'i')}"


def entry(expr, shape, index):
    """Source for element ``index`` of a value of logical ``shape`` held in ``expr``."""
    if len(shape) == 0:
        return expr
    if len(shape) == 1:
        return f"{expr}[{index[0]}]"
    if len(shape) == 2:
        return f"{expr}[{index[0]}, {index[1]}]"
    return f"{expr}[{int(np.ravel_multi_index(index, shape))}]"


def literal(entries, shape, dtype):
    """Source of a value of ``shape`` whose element ``index`` is ``entries[index]``."""
    scalar = _taichi_scalar(dtype)
    indices = list(itertools.product(*[range(n) for n in shape]))
    if len(shape) == 0:
        return f"ti.cast({entries[()]}, {scalar})"
    if len(shape) == 2:
        rows = ", ".join(
            "[" + ", ".join(entries[(i, j)] for j in range(shape[1])) + "]" for i in range(shape[0])
        )
        return f"ti.Matrix([{rows}], dt={scalar})"
    return f"ti.Vector([{', '.join(entries[i] for i in indices)}], dt={scalar})"


def basis(spec, hot):
    """Source of a tangent for ``spec``: one at flat position ``hot``, zeros elsewhere (hot=None: zero)."""
    indices = list(itertools.product(*[range(n) for n in spec.shape]))
    entries = {idx: ("1.0" if k == hot else "0.0") for k, idx in enumerate(indices)}
    return literal(entries, spec.shape, spec.dtype)


def jacobian_spec(out, arg, name):
    return ArgSpec(name, out.shape + arg.shape, out.dtype)


class BodyWriter:
    """Accumulates the lines of one generated ``@ti.func``."""

    def __init__(self, name, params):
        self.name = name
        self.lines = ["@ti.func", f"def {name}({', '.join(params)}):"]

    def line(self, text):
        self.lines.append("    " + text)

    def source(self, results, single):
        """The finished source; a single result is returned bare, else as a flat tuple."""
        self.line("return " + (results[0] if single else "(" + ", ".join(results) + ",)"))
        return "\n".join(self.lines) + "\n"


# NOTE: [Unrolled or looped pushes] Taichi inlines every @ti.func call at
# the Python level, so a Jacobian body that unrolls one call per input
# component, transformed again for a Hessian, grows as n**2 copies: for the
# 2-D Neo-Hookean energy of a vec4, unrolling 4 pushes made the Hessian
# compile in 248 s against 1.9 s with a runtime loop (measured on this
# 2-core machine). So only a single component is pushed unrolled; more are
# pushed in a runtime loop that writes one column per iteration (one inlined
# copy of the tangent function per body).
UNROLL = 1


def _dynamic_index(shape, p):
    """Index source for flat position ``p`` (a runtime name) of a value of ``shape`` (rank 1 or 2)."""
    if len(shape) == 1:
        return p
    return f"{p} // {shape[1]}, {p} % {shape[1]}"


def zero(shape, dtype):
    """Source of a zero value of logical ``shape`` (flat past rank 2)."""
    scalar = _taichi_scalar(dtype)
    if len(shape) == 0:
        return f"ti.cast(0.0, {scalar})"
    if len(shape) == 2:
        return f"ti.Matrix.zero({scalar}, {shape[0]}, {shape[1]})"
    return f"ti.Vector.zero({scalar}, {int(np.prod(shape))})"


def _static_index(shape, p):
    """Index source for flat position ``p`` (an int) of a value of ``shape``."""
    return ", ".join(str(i) for i in np.unravel_index(p, shape)) if shape else ""


def push_each(writer, jvp_name, params, in_specs, argnums, a, store):
    """Call the tangent function once per component ``p`` of argument ``a``.

    ``store(t, p, index)`` gives the lines that consume one call's result
    ``t``: ``p`` is the flat position (an int, or the loop variable ``"p"``)
    and ``index`` its index source in the argument's shape. See
    NOTE: [Unrolled or looped pushes].
    """
    spec = in_specs[a]
    if spec.size <= UNROLL:
        for p in range(spec.size):
            tangents = [basis(in_specs[b], p if b == a else None) for b in argnums]
            writer.line(f"t_{a}_{p} = {jvp_name}({', '.join(params + tangents)})")
            for line in store(f"t_{a}_{p}", str(p), _static_index(spec.shape, p)):
                writer.line(line)
        return
    writer.line(f"for p in range({spec.size}):")
    writer.line(f"    e = {zero(spec.shape, spec.dtype)}")
    writer.line(f"    e[{_dynamic_index(spec.shape, 'p')}] = 1.0")
    tangents = ["e" if b == a else basis(in_specs[b], None) for b in argnums]
    writer.line(f"    t = {jvp_name}({', '.join(params + tangents)})")
    for line in store("t", "p", _dynamic_index(spec.shape, "p")):
        writer.line("    " + line)


def _tangent_out(t, o, single_out):
    return f"{t}[1]" if single_out else f"{t}[1][{o}]"


def jacobian_lines(writer, jvp_name, params, in_specs, argnums, out_specs, single_out):
    """Jacobian blocks, one per (output, argnum), of shape ``out.shape + arg.shape``.

    Returns ``{(o, a): name}``; the names hold the blocks after the lines.
    """
    blocks = {}
    for a in argnums:
        spec = in_specs[a]
        for o, out in enumerate(out_specs):
            blocks[o, a] = f"J_{o}_{a}"
            if out.shape + spec.shape:  # a scalar block is assigned whole by its one push
                writer.line(f"J_{o}_{a} = {zero(out.shape + spec.shape, out.dtype)}")

        def store(t, p, index):
            lines = []
            for o, out in enumerate(out_specs):
                full = out.shape + spec.shape
                for oidx in itertools.product(*[range(n) for n in out.shape]):
                    if len(full) <= 2:
                        target = ", ".join([str(i) for i in oidx] + ([index] if index else []))
                    else:
                        target = f"{int(np.ravel_multi_index(oidx, out.shape)) if oidx else 0} * {spec.size} + {p}"
                    value = entry(_tangent_out(t, o, single_out), out.shape, oidx)
                    lines.append(f"J_{o}_{a}[{target}] = {value}" if target else f"J_{o}_{a} = {value}")
            return lines

        push_each(writer, jvp_name, params, in_specs, argnums, a, store)
    return blocks


def vjp_lines(writer, jvp_name, params, in_specs, argnums, out_specs, single_out, cotangents):
    """Per-element ``J^T c``: one cotangent per argnum, each in its argument's shape.

    ``cotangents`` are the parameter names holding one cotangent per output.
    Returns ``{a: name}``.
    """
    grads = {}
    for a in argnums:
        spec = in_specs[a]
        grads[a] = f"g_{a}"
        if spec.shape:
            writer.line(f"g_{a} = {zero(spec.shape, spec.dtype)}")

        def store(t, p, index):
            terms = []
            for o, (out, c) in enumerate(zip(out_specs, cotangents)):
                dout = _tangent_out(t, o, single_out)
                terms.append(f"{dout} * {c}" if out.shape == () else f"({dout} * {c}).sum()")
            target = f"g_{a}[{index}]" if index else f"g_{a}"
            return [f"{target} = {' + '.join(terms)}"]

        push_each(writer, jvp_name, params, in_specs, argnums, a, store)
    return grads
