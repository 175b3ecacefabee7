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
import re

import numpy as np

from ._errors import NoForwardRule, TransformError
from ._signature import ArgSpec
from ._adjoint.transform import USES_BWD
from ._tangent.lanes import widened_name

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


_RESERVED = re.compile(r"^(p|q|e|f|t|r|value|ti|[JtgHr]_\d.*|ct_\d+)$")
"""Names generated bodies use for their own locals (and ``ti``)."""


def body_params(specs):
    """Parameter names for a generated body: the user's, unless one clashes with a local of the body."""
    return [f"arg{k}_{s.name}" if _RESERVED.match(s.name) else s.name for k, s in enumerate(specs)]


def jacobian_spec(out, arg, name):
    return ArgSpec(name, out.shape + arg.shape, out.dtype)


class BodyWriter:
    """Accumulates the lines of one generated ``@ti.func`` differentiating ``parent``."""

    def __init__(self, name, params, parent=None, active=None):
        self.name = name
        self.lines = ["@ti.func", f"def {name}({', '.join(params)}):"]
        self.widths = set()
        self.primal_value = None  # source of the parent's outputs as a widened push returned them
        self.parent, self.active = parent, active
        self.parent_wide = getattr(parent, WIDE, False)
        self.reverse = None  # (name, function): the parent's reverse function, once a body calls it

    def reverse_function(self, n_outputs):
        """The parent's reverse function, or None (see NOTE: [Reverse bodies])."""
        if self.parent is None:
            return None
        from ._adjoint import vjp_func

        return vjp_func(self.parent, self.active, n_outputs)

    def call_reverse(self, jvp_name, n_outputs):
        """The name the body calls the parent's reverse function by (kept for the namespace)."""
        self.reverse = (jvp_name.removesuffix("_jvp") + "_vjp", self.reverse_function(n_outputs))
        return self.reverse[0]

    def forward_possible(self):
        """Whether the parent has a tangent function: not when it reaches a custom_vjp function
        without a jvp rule (see NOTE: [Mode choice])."""
        return self.parent is not None and forward_possible(self.parent, self.active)

    def widens(self, size):
        """Whether pushing ``size`` basis tangents is one widened call (else a runtime loop)."""
        if self.parent_wide or size == 1:
            return size == 1
        from ._tangent import jvp_func

        return size * jvp_func(self.parent, self.active)._tidiff_lane_cost <= LANE_BUDGET

    def finish(self, body):
        """Mark the compiled ``body`` as holding vector-mode pushes (its own or its parent's)."""
        setattr(body, WIDE, self.parent_wide or max(self.widths, default=1) > 1)
        return body

    def tangent_function(self, jvp_name, width):
        """The name to call the parent's tangent function carrying ``width`` directions by."""
        self.widths.add(width)
        return widened_name(jvp_name, width)

    def line(self, text):
        self.lines.append("    " + text)

    def source(self, results, single):
        """The finished source; a single result is returned bare, else as a flat tuple."""
        self.line("return " + (results[0] if single else "(" + ", ".join(results) + ",)"))
        return "\n".join(self.lines) + "\n"


# NOTE: [Vector-mode pushes] A Jacobian by an argument of n components is
# best one call of the parent's tangent function widened to carry all n
# basis tangents (see ``_tangent/lanes.py``): the primal is computed once,
# each lane is straight-line code, and Taichi folds the basis constants.
# But Taichi's compile time grows with the square of a kernel's
# straight-line size, so a push is widened only while n times the size of
# one lane (``lane_cost``) stays within LANE_BUDGET; otherwise it pushes one
# component per iteration of a runtime loop, which keeps one inlined copy
# of the tangent function. Measured on this 2-core machine, B = 1e4:
#   W1, 4x8 tanh layer, 8 lanes of cost 33:  jacfwd 2.2 -> 1.7 ms (1e6: 160 -> 106 ms)
#   W2, 3x3 Neo-Hookean, 9 lanes of cost 143: grad 1.36 -> 1.02 ms, but its
#       first call 0.4 -> 6.2 s, and the Hessian's 1.8 -> 18 s (for 10 -> 4 ms)
# Widening is done once per chain of transforms, at the innermost one: a
# widened parent widened again would hold n**2 second-order lanes.
# (Unrolled pushes of whole calls, without lanes, are worse still: 248 s to
# compile a 2-D Neo-Hookean Hessian with 4 unrolled calls, against 1.9 s.)
LANE_BUDGET = 512
WIDE = "_tidiff_wide"


def _dynamic_index(shape, p):
    """Index source for flat position ``p`` (a runtime name) of a value of ``shape`` (rank 1 or 2)."""
    if len(shape) != 2:  # rank 1, or flat (NOTE: [Flat values])
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
    """Push the basis tangent of every component ``p`` of argument ``a`` through the parent.

    ``store(dout, p, index)`` gives the lines that consume the tangent output
    ``dout`` of one push: ``p`` is the flat position (an int, or the loop
    variable ``"p"``) and ``index`` its index source in the argument's shape.
    See NOTE: [Vector-mode pushes].
    """
    spec = in_specs[a]
    order = sorted(argnums)  # the tangent function takes its tangents in parameter order
    if writer.widens(spec.size):
        name = writer.tangent_function(jvp_name, spec.size)
        lanes = [basis(in_specs[b], p if b == a else None) for p in range(spec.size) for b in order]
        writer.line(f"t_{a} = {name}({', '.join(params + lanes)})")
        writer.primal_value = writer.primal_value or f"t_{a}[0]"
        for p in range(spec.size):
            for line in store(f"t_{a}[{p + 1}]", str(p), _static_index(spec.shape, p)):
                writer.line(line)
        return
    writer.line(f"for p in range({spec.size}):")
    writer.line(f"    e = {zero(spec.shape, spec.dtype)}")
    writer.line(f"    e[{_dynamic_index(spec.shape, 'p')}] = 1.0")
    tangents = ["e" if b == a else basis(in_specs[b], None) for b in order]
    writer.line(f"    t = {writer.tangent_function(jvp_name, 1)}({', '.join(params + tangents)})")
    for line in store("t[1]", "p", _dynamic_index(spec.shape, "p")):
        writer.line("    " + line)


def tangent_functions(writer, jvp_name, parent_body, active):
    """Namespace entries for the tangent (and reverse) functions ``writer``'s lines call."""
    from ._tangent import jvp_func

    entries = {writer.tangent_function(jvp_name, w): jvp_func(parent_body, active, w) for w in writer.widths}
    if writer.reverse is not None:
        entries[writer.reverse[0]] = writer.reverse[1]
    return entries


# NOTE: [Reverse bodies] A gradient by forward pushes costs one push per
# input component, and a Hessian built on it one second-order push per pair:
# 81 for a 3x3 argument. When the parent is straight-line code, its reverse
# function (``_adjoint``) gives all of a gradient in one call, and the
# Hessian becomes one forward push through that call per input component
# (forward over reverse, as JAX's ``hessian``). W2, the Neo-Hookean Hessian
# at B=1e5 on this 2-core machine: 69 -> 18-25 ms (1.5x the closed form with
# a fresh output, measured interleaved), first call 1.6 -> 1.9 s. Bodies use
# it when the parent has fewer output components than the arguments have
# input components; an explicit td.jacfwd does not, nor does a Jacobian
# whose forward pushes are widened into one call (W1: one widened push of 8
# lanes against four reverse calls).


def _block_target(out, spec, oidx, idx):
    """Index source of entry ``oidx + idx`` of a Jacobian block of shape ``out.shape + spec.shape``."""
    full = out.shape + spec.shape
    if len(full) <= 2:
        return ", ".join(str(i) for i in oidx + idx)
    return str(int(np.ravel_multi_index(oidx + idx, full)))


def reverse_jacobian_lines(writer, name, params, in_specs, argnums, out_specs, wanted):
    """Jacobian blocks as :func:`jacobian_lines` gives them, by one reverse call (of ``name``) per
    component of the outputs in ``wanted`` (the others get no block)."""
    order = sorted(argnums)
    blocks = {}
    for o in wanted:
        for a in argnums:
            blocks[o, a] = f"J_{o}_{a}"
            if out_specs[o].shape:
                writer.line(f"J_{o}_{a} = {zero(out_specs[o].shape + in_specs[a].shape, out_specs[o].dtype)}")
    for o in wanted:
        out = out_specs[o]
        for q, oidx in enumerate(itertools.product(*[range(n) for n in out.shape])):
            cts = [basis(c, q if k == o else None) for k, c in enumerate(out_specs)]
            result = f"r_{o}_{q}"
            writer.line(f"{result} = {name}({', '.join(params + cts)})")
            writer.primal_value = writer.primal_value or f"{result}[0]"
            for a in argnums:
                spec, ct = in_specs[a], f"{result}[{order.index(a) + 1}]"
                if not out.shape:
                    writer.line(f"J_{o}_{a} = {ct}")
                    continue
                for idx in itertools.product(*[range(n) for n in spec.shape]):
                    writer.line(f"J_{o}_{a}[{_block_target(out, spec, oidx, idx)}] = {entry(ct, spec.shape, idx)}")
    return blocks


# NOTE: [Mode choice] A Jacobian body pushes tangents forward unless reverse
# calls are fewer (NOTE: [Reverse bodies]) or forward mode is impossible: a
# td.custom_vjp function without a jvp rule has none, as in JAX, and its bwd
# must see the real cotangent. Reverse-flavoured transforms (grad, jacrev)
# reverse whenever a custom_vjp rule is reached, so a function with both a
# jvp and a vjp rule gets each in its own mode. A vjp body reverses whenever it can. When
# the parent can be taken neither way (a custom_vjp call inside code the
# reverse transform does not handle), the error says both reasons.


def forward_possible(parent, active):
    """Whether ``parent`` (a ``@ti.func``) has a tangent function for this activity pattern."""
    from ._tangent import jvp_func

    try:
        jvp_func(parent, active)
    except NoForwardRule:
        return False
    return True


def _neither_way(writer, n_outputs):
    """The error for a parent that has no reverse function and reaches a custom_vjp function."""
    from ._adjoint import why_not
    from ._tangent import jvp_func

    try:
        jvp_func(writer.parent, writer.active)
    except NoForwardRule as raised:
        error = raised
    name = getattr(writer.parent, "__name__", "the function")
    return TransformError(
        f"`{name}`: reverse mode cannot handle {why_not(writer.parent, writer.active, n_outputs)}, "
        f"and forward mode reaches `{error.function}`, a td.custom_vjp function without a jvp rule",
        error.filename, error.lineno,
        f"give {error.function} a jvp rule with {error.function}.defjvp(...), or write the code around "
        "the call without runtime loops and branches",
    )


def _reverse_chosen(writer, in_specs, argnums, out_specs, wanted, reverse_flavoured):
    """Whether a Jacobian body takes reverse calls rather than forward pushes (NOTE: [Mode choice])."""
    reverse = writer.reverse_function(len(out_specs))
    if not writer.forward_possible():
        if reverse is None:
            raise _neither_way(writer, len(out_specs))
        return True
    if reverse is None:
        return False
    if reverse_flavoured and getattr(reverse, USES_BWD, False):
        return True
    n_in = sum(in_specs[a].size for a in argnums)
    n_out = sum(out_specs[o].size for o in wanted)
    # one reverse call per output component, unless the forward pushes are fewer or one widened call
    return n_out < n_in and (n_out <= 1 or not all(writer.widens(in_specs[a].size) for a in argnums))


def _tangent_out(dout, o, single_out):
    return dout if single_out else f"{dout}[{o}]"


def jacobian_lines(writer, jvp_name, params, in_specs, argnums, out_specs, single_out, forward_only=False,
                   wanted=None, reverse_flavoured=False):
    """Jacobian blocks, one per (output, argnum), of shape ``out.shape + arg.shape``.

    ``wanted`` are the outputs whose blocks are needed (default: all; forward
    pushes give every output's block anyway). ``reverse_flavoured`` transforms
    (grad, jacrev) take a custom_vjp rule when one is reached, even where its
    function has a jvp rule too (NOTE: [Mode choice]). Returns ``{(o, a): name}``;
    the names hold the blocks after the lines.
    """
    wanted = sorted(range(len(out_specs)) if wanted is None else wanted)
    if not forward_only and _reverse_chosen(writer, in_specs, argnums, out_specs, wanted, reverse_flavoured):
        return reverse_jacobian_lines(writer, writer.call_reverse(jvp_name, len(out_specs)), params, in_specs,
                                      argnums, out_specs, wanted)
    blocks = {}
    for a in argnums:
        spec = in_specs[a]
        for o, out in enumerate(out_specs):
            blocks[o, a] = f"J_{o}_{a}"
            if out.shape + spec.shape:  # a scalar block is assigned whole by its one push
                writer.line(f"J_{o}_{a} = {zero(out.shape + spec.shape, out.dtype)}")

        def store(dout, p, index):
            lines = []
            for o, out in enumerate(out_specs):
                full = out.shape + spec.shape
                for oidx in itertools.product(*[range(n) for n in out.shape]):
                    if len(full) <= 2:
                        target = ", ".join([str(i) for i in oidx] + ([index] if index else []))
                    else:
                        target = f"{int(np.ravel_multi_index(oidx, out.shape)) if oidx else 0} * {spec.size} + {p}"
                    value = entry(_tangent_out(dout, o, single_out), out.shape, oidx)
                    lines.append(f"J_{o}_{a}[{target}] = {value}" if target else f"J_{o}_{a} = {value}")
            return lines

        push_each(writer, jvp_name, params, in_specs, argnums, a, store)
    return blocks


def vjp_lines(writer, jvp_name, params, in_specs, argnums, out_specs, single_out, cotangents):
    """Per-element ``J^T c``: one cotangent per argnum, each in its argument's shape.

    ``cotangents`` are the parameter names holding one cotangent per output.
    Returns ``{a: name}``.
    """
    if writer.reverse_function(len(out_specs)) is not None:  # one reverse call, whatever the sizes
        writer.line(f"r = {writer.call_reverse(jvp_name, len(out_specs))}({', '.join(params + cotangents)})")
        return {a: f"r[{k + 1}]" for k, a in enumerate(sorted(argnums))}
    if not writer.forward_possible():
        raise _neither_way(writer, len(out_specs))
    grads = {}
    for a in argnums:
        spec = in_specs[a]
        grads[a] = f"g_{a}"
        if spec.shape:
            writer.line(f"g_{a} = {zero(spec.shape, spec.dtype)}")

        def store(dout, p, index):
            terms = []
            for o, (out, c) in enumerate(zip(out_specs, cotangents)):
                d = _tangent_out(dout, o, single_out)
                terms.append(f"{d} * {c}" if out.shape == () else f"({d} * {c}).sum()")
            target = f"g_{a}[{index}]" if index else f"g_{a}"
            return [f"{target} = {' + '.join(terms)}"]

        push_each(writer, jvp_name, params, in_specs, argnums, a, store)
    return grads
