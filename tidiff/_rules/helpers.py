"""``@ti.func`` helpers that derivative rules call (as ``_tidiff_rules.<name>`` in generated code).

Taichi's own ``inverse()`` of a 3x3 matrix inlines a ``@ti.func`` per entry
(36 calls); the textbook rule ``d det(a) = det(a) tr(a^-1 da)`` used it, and at
second order the Neo-Hookean Hessian inlined 180 of them and compiled for
seconds. The cofactors are written out instead; the rule's tangent-free part
``cofactors(a)`` is then computed once for every tangent lane (``lanes.py``).
"""
from typing import Any

import taichi as ti
from taichi.lang import impl, matrix_ops
from taichi.lang.exception import TaichiCompilationError
from taichi.lang.expr import Expr
from taichi.types import primitive_types

from .._errors import describe_shape
from .._lang.products import compile_time as compile_time
from .._lang.products import matmul as matmul
from .._lang.products import shape_of as shape_of

# rules reach every helper as _tidiff_rules.<name>: the cofactors' and decompositions' too
from .cofactors import cofactors as cofactors
from .decompositions import polar_decompose_jvp as polar_decompose_jvp
from .decompositions import polar_decompose_vjp as polar_decompose_vjp
from .decompositions import svd_jvp as svd_jvp
from .decompositions import svd_vjp as svd_vjp
from .decompositions import sym_eig_jvp as sym_eig_jvp
from .decompositions import sym_eig_vjp as sym_eig_vjp
from .kept import kept_polar_decompose as kept_polar_decompose
from .kept import kept_svd as kept_svd
from .kept import kept_sym_eig as kept_sym_eig


@ti.func
def stop_gradient(x):
    """``x`` itself, with zero tangent: blocks differentiation through it (``td.stop_gradient``; its rule,
    zero, is in ``ops.py``)."""
    return x


RULE_ATTRIBUTE = "_tidiff_derivative_rule"
"""The attribute naming the derivative rule an object stands for (NOTE: [Taichi's reverse mode not run] in
``_fields/hidden_rules``): a refusal of reverse mode names the rules the kernels it refuses reach."""
setattr(stop_gradient, RULE_ATTRIBUTE, "td.stop_gradient")


@ti.func
def inverse_by_cofactors(a):
    """``a^-1`` from the written-out cofactors: the derivative of ``ti.solve(a, b)`` applies it
    once per direction, and Taichi's own 3x3 ``inverse()`` compiles slowly (see above)."""
    return cofactors(a).transpose() / a.determinant()


# --- helpers of the reverse rules (``ops.py``) ------------------------------
# Source-level reverse mode cannot see shapes: ``x * y`` may be a scalar times
# a matrix. These helpers pick the right code when Taichi compiles them
# (``ti.static`` on the operands' shapes), once per shape.


class RuleError(TaichiCompilationError, TypeError):
    """A user's derivative rule returned the wrong kind of value. A ``TypeError``; being Taichi's compilation
    error too, Taichi raises it as it is (with the place) when a helper raises it while compiling."""


def jvp_pair_check(rule: str) -> Any:
    """A helper Taichi calls while compiling with what the jvp rule ``rule`` (its description) returned: None,
    or ``RuleError`` where it is no pair or the tangent's shape is not the output's (JAX: "Custom JVP rule must
    produce primal and tangent outputs with corresponding shapes"). Called in ``ti.static(...)``, which the
    transforms copy as written: the check holds no value to differentiate."""
    @compile_time
    def checked(pair):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise RuleError(f"{rule} must return a pair (out, tangent_out); it returned "
                            f"{'a tuple of ' + str(len(pair)) if isinstance(pair, (tuple, list)) else 'one value'}")
        out, tangent = pair
        outs, tangents = (out, tangent) if isinstance(out, (tuple, list)) else ((out,), (tangent,))
        if not isinstance(tangents, (tuple, list)) or len(tangents) != len(outs):
            raise RuleError(f"{rule} returned {len(outs)} outputs and a tangent that is no tuple of as many")
        for o, t in zip(outs, tangents, strict=True):
            if shape_of(o) != shape_of(t):
                raise RuleError(f"{rule} returned a tangent of {describe_shape(shape_of(t))} for an output of "
                                f"{describe_shape(shape_of(o))}: a tangent has its output's shape")
    return checked


def bwd_check(rule: str) -> Any:
    """A helper Taichi calls while compiling with what the bwd rule ``rule`` (its description) returned, the
    positions where it returns None (``nones``, a tuple of ints) and the primals: None, or ``RuleError`` where it is
    no tuple with one cotangent per primal in its shape. For functions without annotations, whose shapes tidiff
    learns only as Taichi compiles (``td.custom_vjp``)."""
    @compile_time
    def checked(returned, nones, *primals):
        if not isinstance(returned, (tuple, list)) or len(returned) != len(primals):
            got = f"a tuple of {len(returned)}" if isinstance(returned, (tuple, list)) else "one value"
            raise RuleError(f"{rule} must return a tuple with one cotangent per primal ({len(primals)}; None for a "
                            f"zero one); it returned {got}")
        for k, (c, p) in enumerate(zip(returned, primals, strict=True)):
            if k not in nones and shape_of(c) != shape_of(p) and not is_integral(dtype_of(p)):
                raise RuleError(f"{rule} returned a cotangent of {describe_shape(shape_of(c))} for primal {k}, "
                                f"of {describe_shape(shape_of(p))}: a cotangent has its primal's shape")
    return checked


@compile_time
def zeros_like(x):
    """An exact zero of ``x``'s shape and element type (``ti.zero(x)`` is ``x * 0``, NaN where ``x`` is inf): the
    cotangent a bwd rule's None stands for."""
    shape, dtype = shape_of(x), dtype_of(x)
    if not shape:
        return ti.cast(0, dtype)
    return ti.Vector.zero(dtype, shape[0]) if len(shape) == 1 else ti.Matrix.zero(dtype, *shape)


@compile_time
def sum_to(v, like):
    """``v`` summed down to the shape of ``like``: the adjoint of broadcasting ``like`` up to ``v``."""
    return v if shape_of(v) == shape_of(like) else matrix_ops.sum(v)


@compile_time
def broadcast_like(v, other):
    """``v`` broadcast to the shape of ``v + other``: the tangent of a sum with one active operand."""
    return v if shape_of(v) == shape_of(other) or shape_of(other) == () else v + impl.zero(other)


@ti.func
def scatter(like, v, i):
    """A zero shaped like the vector ``like`` with ``v`` at ``[i]``: the adjoint of ``like[i]``."""
    result = ti.zero(like)
    result[i] = v
    return result


@ti.func
def scatter2(like, v, i, j):
    """A zero shaped like the matrix ``like`` with ``v`` at ``[i, j]``: the adjoint of ``like[i, j]``."""
    result = ti.zero(like)
    result[i, j] = v
    return result


# NOTE: [Slices] A slice read (``m[i, :]``, ``v[1:3]``) is a gather of entries known when the code is
# transformed: each sliced dim is the tuple of indices it takes (``slice.indices`` of the base's known shape),
# each other dim its index. Its adjoint writes the cotangent back at those entries of a zero like the base.
@ti.func
def scatter_picks(like, v, picks: ti.template()):  # type: ignore[valid-type]
    """A zero shaped like the vector ``like`` with ``v``'s entries added at ``picks``: the adjoint of a slice read,
    or of a swizzle (``like.yx``, ``like.xx``)."""
    result = ti.zero(like)
    for a in ti.static(range(len(picks))):
        result[picks[a]] += v[a]
    return result


@ti.func
def scatter_picks2(like, v, rows: ti.template(), cols: ti.template()):  # type: ignore[valid-type]
    """A zero shaped like the matrix ``like`` with ``v`` at ``[rows, cols]`` (each a tuple of indices, or one
    index whose dim the slice drops): the adjoint of a slice read."""
    result = ti.zero(like)
    if ti.static(isinstance(rows, tuple) and isinstance(cols, tuple)):
        for a in ti.static(range(len(rows))):
            for b in ti.static(range(len(cols))):
                result[rows[a], cols[b]] = v[a, b]
    elif ti.static(isinstance(rows, tuple)):
        for a in ti.static(range(len(rows))):
            result[rows[a], cols] = v[a]
    else:
        for b in ti.static(range(len(cols))):
            result[rows, cols[b]] = v[b]
    return result


@ti.func
def without(v, i):
    """``v`` with entry ``[i]`` zeroed: the adjoint of overwriting that entry."""
    result = v
    result[i] = 0.0
    return result


@ti.func
def without2(v, i, j):
    """``v`` with entry ``[i, j]`` zeroed: the adjoint of overwriting that entry."""
    result = v
    result[i, j] = 0.0
    return result


@ti.func
def trace_adjoint(like, v):
    """``v`` times the identity shaped like ``like``: the adjoint of ``like.trace()``."""
    result = ti.zero(like)
    for i in ti.static(range(like.n)):
        result[i, i] = v
    return result


@ti.func
def matmul_adjoint_left(ct, x, y):
    """The cotangent of ``x`` in ``x @ y``: ``x`` a matrix or a vector, ``y`` a matrix or a vector.

    Taichi reads ``v @ M`` (vector on the left) as ``M^T v`` and ``v @ w`` as ``v.dot(w)``.
    """
    if ti.static(len(shape_of(x)) == 1 and len(shape_of(y)) == 1):
        return ct * y
    elif ti.static(len(shape_of(x)) == 1):
        return matmul(y, ct)
    elif ti.static(len(shape_of(y)) == 2):
        return matmul(ct, y.transpose())
    else:
        return ct.outer_product(y)


@ti.func
def matmul_adjoint_right(ct, x, y):
    """The cotangent of ``y`` in ``x @ y``."""
    if ti.static(len(shape_of(x)) == 1 and len(shape_of(y)) == 1):
        return ct * x
    elif ti.static(len(shape_of(x)) == 1):
        return x.outer_product(ct)
    else:
        return matmul(x.transpose(), ct)


@ti.func
def cross_adjoint_left(ct, x, y):
    """The cotangent of ``x`` in ``x.cross(y)`` (3-vectors, or 2-vectors with a scalar cross)."""
    if ti.static(shape_of(x) == (3,)):
        return y.cross(ct)
    else:
        return ti.Vector([ct * y[1], -ct * y[0]])


@ti.func
def cross_adjoint_right(ct, x, y):
    """The cotangent of ``y`` in ``x.cross(y)``."""
    if ti.static(shape_of(x) == (3,)):
        return ct.cross(x)
    else:
        return ti.Vector([-ct * x[1], ct * x[0]])


# --- casts whose type is only known when Taichi compiles (``ti.cast(x, dt)``, ``dt`` a parameter) ---
def is_integral(dtype: Any) -> bool:
    """Whether ``dtype`` (a Taichi type or ``int``) is an integer type, whose values carry no derivative."""
    return dtype is int or any(dtype == t for t in primitive_types.integer_types if t not in (int, bool))


@ti.func
def cast_tangent(t, dtype: ti.template()):  # type: ignore[valid-type]
    """The tangent of ``ti.cast(x, dtype)``: ``t`` cast alike, or zero for an integer type."""
    if ti.static(is_integral(dtype)):
        return ti.cast(t, dtype) * 0
    else:
        return ti.cast(t, dtype)


@ti.func
def cast_adjoint(g, dtype: ti.template()):  # type: ignore[valid-type]
    """The cotangent of ``x`` in ``ti.cast(x, dtype)``: ``g``, or zero for an integer type."""
    if ti.static(is_integral(dtype)):
        return g * 0
    else:
        return g


# --- reductions: ``v.max()`` and ``v.min()`` split a tie evenly (NOTE: [Ties] in ``ops.py``) --------
@ti.func
def flat(x):
    """The entries of a vector or matrix as a vector, matrices row by row (as Taichi reduces them)."""
    if ti.static(len(shape_of(x)) == 1):
        return x
    else:
        return ti.Vector([x[k // x.m, k % x.m] for k in ti.static(range(x.n * x.m))])


@ti.func
def unflat(v, like):
    """The vector ``v`` of entries back in the shape of ``like`` (the inverse of :func:`flat`)."""
    if ti.static(len(shape_of(like)) == 1):
        return v
    else:
        return ti.Matrix([[v[i * like.m + j] for j in ti.static(range(like.m))] for i in ti.static(range(like.n))])


@ti.func
def extreme_of(xs, largest: ti.template()):  # type: ignore[valid-type]
    """``xs.max()`` (``largest``) or ``xs.min()`` of a flat vector, and how many entries equal it."""
    best = xs.min()
    if ti.static(largest):
        best = xs.max()
    return best, ti.select(xs == best, 1, 0).sum()


@ti.func
def pick_extreme(x, t, largest: ti.template()):  # type: ignore[valid-type]
    """The tangent of ``x.max()`` (``largest``) or ``x.min()``: the mean of ``t`` over the entries equal to it."""
    xs, ts = flat(x), flat(t)
    best, count = extreme_of(xs, largest)
    picked = ti.select(xs[0] == best, ts[0], 0)
    for k in ti.static(range(1, xs.n)):
        picked += ti.select(xs[k] == best, ts[k], 0)
    return picked / count


@ti.func
def extreme_adjoint(x, g, largest: ti.template()):  # type: ignore[valid-type]
    """The cotangent of ``x`` in ``x.max()`` (``largest``) or ``x.min()``: ``g`` shared evenly among the
    entries equal to it, zero elsewhere."""
    xs = flat(x)
    best, count = extreme_of(xs, largest)
    share = g / count
    result = ti.zero(xs)
    for k in ti.static(range(xs.n)):
        result[k] = ti.select(xs[k] == best, share, 0)
    return unflat(result, x)


# --- constructors from rows and columns --------------------------------------
@ti.func
def row_of(m, i: ti.template()):  # type: ignore[valid-type]
    """Row ``i`` of the matrix ``m`` as a vector: the cotangent of ``rows[i]`` in ``ti.Matrix.rows(rows)``."""
    return ti.Vector([m[i, j] for j in ti.static(range(m.m))])


@ti.func
def col_of(m, j: ti.template()):  # type: ignore[valid-type]
    """Column ``j`` of the matrix ``m`` as a vector: the cotangent of ``cols[j]`` in ``ti.Matrix.cols(cols)``."""
    return ti.Vector([m[i, j] for i in ti.static(range(m.n))])


@ti.func
def row_into(like, v, i: ti.template()):  # type: ignore[valid-type]
    """A zero shaped like the matrix ``like`` with the vector ``v`` as row ``i``: the adjoint of ``row_of``."""
    result = ti.zero(like)
    for j in ti.static(range(like.m)):
        result[i, j] = v[j]
    return result


@ti.func
def col_into(like, v, j: ti.template()):  # type: ignore[valid-type]
    """A zero shaped like the matrix ``like`` with the vector ``v`` as column ``j``: the adjoint of ``col_of``."""
    result = ti.zero(like)
    for i in ti.static(range(like.n)):
        result[i, j] = v[i]
    return result



# --- constructors from parts: ``ti.math.vec4(v.xyz, 1.0)`` -----------------
# NOTE: [Constructors from parts] Taichi fills a vector or matrix type called with several values, scalars,
# vectors and matrices alike, with their entries in order (matrices row by row; GLSL's ``vec4(v.xyz, 1.0)``).
# Which entries a part filled is known only when Taichi compiles, from the parts' shapes: these helpers cut a
# cotangent into parts, and put a part back, while it compiles.
def _entries_of(x: Any) -> list[Any]:
    """The entries of a Taichi value while a kernel compiles, row by row (a scalar: itself)."""
    shape = shape_of(x)
    if not shape:
        return [x]
    builder = impl.get_runtime().compiling_callable.ast_builder()
    index = [(k,) for k in range(shape[0])] if len(shape) == 1 else \
        [(i, j) for i in range(shape[0]) for j in range(shape[1])]
    return [impl.subscript(builder, x, *at) for at in index]


def _shaped(entries: list[Any], like: Any) -> Any:
    """``entries`` (row by row) in the shape of ``like``."""
    shape = shape_of(like)
    if not shape:
        return entries[0]
    if len(shape) == 1:
        return ti.Vector(entries)
    return ti.Matrix([entries[i * shape[1]:(i + 1) * shape[1]] for i in range(shape[0])])


def _span(k: int, parts: tuple[Any, ...]) -> slice:
    start = sum(size_of(p) for p in parts[:k])
    return slice(start, start + size_of(parts[k]))


@compile_time
def part_of(g, k, *parts):
    """The entries of ``g`` that part ``k`` of ``parts`` filled, in that part's shape: the cotangent of the part
    in a constructor called with ``parts`` (NOTE: [Constructors from parts])."""
    return _shaped(_entries_of(g)[_span(k, parts)], parts[k])


@compile_time
def part_into(like, v, k, *parts):
    """A zero shaped like ``like`` with the entries of ``v`` where part ``k`` of ``parts`` is: the adjoint of
    :func:`part_of`."""
    entries = [ti.cast(0, dtype_of(like))] * size_of(like)
    entries[_span(k, parts)] = _entries_of(v)
    return _shaped(entries, like)

# --- tapes of loop-carried values (``_adjoint/control.py``) ------------------
# A reverse sweep through a runtime loop needs the values its iterations started
# from. NOTE: [Tapes] Taichi lowers a runtime index into a local matrix to code
# whose size grows with the whole matrix (a 64 x 32 tape written and read once
# per entry compiled for 7 s), so a tape is one local vector of rows per entry
# of the value (0.8 s): a Python list of Taichi variables (``impl.expr_init``)
# that Taichi holds while it compiles, indexed ``tape[j][row]`` with ``j``
# static, in the generated code itself (a list passed to a ``@ti.func`` is
# copied entry by entry, slowly, and writes to the copy are lost). Shapes are
# known only when Taichi compiles. What is left of the cost is Taichi's
# store-to-load forwarding over the tape's entries, which grows with their
# number times the reverse code's blocks (NOTE: [Reverse control flow]).
@compile_time
def dtype_of(x):
    """The element type of a Taichi value while a kernel compiles."""
    if isinstance(x, Expr):
        kind = x.ptr.get_rvalue_type()
        return kind.element_type() if x.is_tensor() else kind
    if isinstance(x, ti.Matrix):
        return x.entries[0].ptr.get_rvalue_type() if isinstance(x.entries[0], Expr) else ti.f64
    return ti.f64 if isinstance(x, float) else ti.i32


#: How far, relative to the larger, a value computed again may be from the one an atomic max / min kept and
#: still count as that value (NOTE: [Winners by kept values]): 4,096 units in the last place of an f64, 32 of an
#: f32, 2 of an f16.
WINNER_TOLERANCE = {"f64": 2.0 ** -40, "f32": 2.0 ** -18, "f16": 2.0 ** -9}


@compile_time
def wins(value, held):
    """Whether ``value`` is what an atomic max / min left in ``held``: equal, or within the type's
    ``WINNER_TOLERANCE`` of it (NOTE: [Winners by kept values])."""
    tolerance = WINNER_TOLERANCE.get(str(dtype_of(held)), 0.0)
    return (value == held) | (ti.abs(value - held) <= tolerance * ti.max(ti.abs(value), ti.abs(held)))


@compile_time
def rebound(value, old):
    """``old = value`` as a new variable, as Taichi would store it in ``old``: cast to ``old``'s element
    type where the two differ (NOTE: [Rebinding in straight-line code] in ``_lang/rebinding.py``)."""
    dtype = dtype_of(old)
    return value if dtype_of(value) == dtype else ti.cast(value, dtype)


@compile_time
def rebound_tangent(t, old):
    """The tangent of ``rebound(value, old)`` from the value's tangent ``t``: cast alike, zero where
    ``old`` is an integer (Taichi's assignment truncates: no derivative)."""
    dtype = dtype_of(old)
    if is_integral(dtype):
        return ti.cast(t, dtype) * 0
    return t if dtype_of(t) == dtype else ti.cast(t, dtype)


@compile_time
def rebound_adjoint(g, value, old):
    """The cotangent of ``value`` in ``rebound(value, old)`` from the result's cotangent ``g``."""
    dtype = dtype_of(value)
    cast = g if dtype_of(g) == dtype else ti.cast(g, dtype)
    return cast * 0 if is_integral(dtype_of(old)) else cast


# NOTE: [Entries in one value] The reverse rule of an entry read ``x[i]`` sends its cotangent to a zero shaped
# like ``x`` with one entry set (``scatter``). A function reading each of a vector's n entries (``s +=
# ti.exp(x[i])`` in a static loop) then added n vectors of n entries into ``ct_x``: code of n * n scalar
# statements, whose compile time grew with its square (td.grad at n = 64: 4.1 s against 0.19 s at n = 4;
# td.hessian 11.5 s, the tangent of that code). The reverse transform keeps such contributions apart, entry by
# entry, until ``ct_x`` is read, and adds them in one value built here while Taichi compiles (its shape is
# known only then): n statements.
@compile_time
def scattered(like, *pairs):
    """A zero shaped like the vector ``like`` with ``pairs`` (``i0, v0, i1, v1, ...``) at its entries: the
    adjoint of reading those entries (NOTE: [Entries in one value])."""
    at = dict(zip(pairs[0::2], pairs[1::2], strict=True))
    return ti.Vector([at.get(k, 0.0) for k in range(shape_of(like)[0])]).cast(dtype_of(like))


@compile_time
def scattered2(like, *triples):
    """A zero shaped like the matrix ``like`` with ``triples`` (``i0, j0, v0, ...``) at its entries."""
    at = {(i, j): v for i, j, v in zip(triples[0::3], triples[1::3], triples[2::3], strict=True)}
    rows, cols = shape_of(like)
    return ti.Matrix([[at.get((i, j), 0.0) for j in range(cols)] for i in range(rows)]).cast(dtype_of(like))


@compile_time
def size_of(x):
    """How many entries a Taichi value has: 1 for scalars."""
    size = 1
    for n in shape_of(x):
        size *= n
    return size


@compile_time
def tape_of(x, rows):
    """A zero tape for ``x``: one local vector of ``rows`` entries per entry of ``x`` (NOTE: [Tapes])."""
    return [impl.expr_init(ti.Vector.zero(dtype_of(x), rows)) for _ in range(size_of(x))]


@ti.func
def entries(x):
    """The entries of a scalar, vector or matrix as a vector (matrices row by row)."""
    if ti.static(len(shape_of(x)) == 0):
        return ti.Vector([x])
    else:
        return flat(x)


@ti.func
def unflat_any(v, like):
    """The vector ``v`` of entries back in the shape of ``like`` (the inverse of :func:`entries`)."""
    if ti.static(len(shape_of(like)) == 0):
        return v[0]
    else:
        return unflat(v, like)


# --- linearizing a td.custom_jvp rule for the reverse sweep -------------------
@ti.func
def basis(like, k: ti.template()):  # type: ignore[valid-type]
    """The ``k``-th unit value shaped like ``like`` (entries counted row by row)."""
    if ti.static(len(shape_of(like)) == 0):
        return ti.cast(1, dtype_of(like))
    else:
        e = entries(like) * 0
        e[k] = 1
        return unflat(e, like)


@ti.func
def inner(a, b):
    """The sum of the entrywise products of two values of one shape."""
    if ti.static(len(shape_of(a)) == 0):
        return a * b
    else:
        return (entries(a) * entries(b)).sum()
