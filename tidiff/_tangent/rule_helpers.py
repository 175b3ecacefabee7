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
