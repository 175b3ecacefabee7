"""``@ti.func`` helpers that derivative rules call (as ``_tidiff_rules.<name>`` in generated code).

Taichi's own ``inverse()`` of a 3x3 matrix inlines a ``@ti.func`` per entry
(36 calls); the textbook rule ``d det(a) = det(a) tr(a^-1 da)`` used it, and at
second order the Neo-Hookean Hessian inlined 180 of them and compiled for
seconds. The cofactors are written out instead; the rule's tangent-free part
``cofactors(a)`` is then computed once for every tangent lane (``lanes.py``).
"""
import taichi as ti


@ti.func
def cofactors(a):
    """The cofactor matrix of ``a``: ``d det(a) = (cofactors(a) * da).sum()``."""
    result = a * 0
    if ti.static(a.n == 1):
        result[0, 0] = 1.0
    elif ti.static(a.n == 2):
        result = ti.Matrix([[a[1, 1], -a[1, 0]], [-a[0, 1], a[0, 0]]])
    elif ti.static(a.n == 3):
        for i, j in ti.static(ti.ndrange(3, 3)):
            i1, i2, j1, j2 = ti.static((i + 1) % 3, (i + 2) % 3, (j + 1) % 3, (j + 2) % 3)
            result[i, j] = a[i1, j1] * a[i2, j2] - a[i1, j2] * a[i2, j1]
    else:
        result = a.determinant() * a.inverse().transpose()
    return result


# --- helpers of the reverse rules (``_adjoint/rules.py``) -------------------
# Source-level reverse mode cannot see shapes: ``x * y`` may be a scalar times
# a matrix. These helpers pick the right code when Taichi compiles them
# (``ti.static`` on the operands' shapes), once per shape.


def shape_of(value):
    """The shape of a Taichi value while a kernel compiles: ``()`` for scalars."""
    from taichi.lang.expr import Expr

    if isinstance(value, Expr):
        return tuple(value.get_shape()) if value.is_tensor() else ()
    if isinstance(value, ti.Matrix):
        return tuple(value.get_shape())
    return ()


@ti.func
def sum_to(v, like):
    """``v`` summed down to the shape of ``like``: the adjoint of broadcasting ``like`` up to ``v``."""
    if ti.static(shape_of(v) == shape_of(like)):
        return v
    else:
        return v.sum()


@ti.func
def broadcast_like(v, other):
    """``v`` broadcast to the shape of ``v + other``: the tangent of a sum with one active operand."""
    if ti.static(shape_of(v) == shape_of(other) or shape_of(other) == ()):
        return v
    else:
        return v + ti.zero(other)


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
    """The cotangent of ``x`` in ``x @ y`` (a matrix times a matrix or a vector)."""
    if ti.static(len(shape_of(y)) == 2):
        return ct @ y.transpose()
    else:
        return ct.outer_product(y)


@ti.func
def matmul_adjoint_right(ct, x, y):
    """The cotangent of ``y`` in ``x @ y``."""
    return x.transpose() @ ct


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
