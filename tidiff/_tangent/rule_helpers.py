"""``@ti.func`` helpers that derivative rules call (as ``_tidiff_rules.<name>`` in generated code).

Taichi's own ``inverse()`` of a 3x3 matrix inlines a ``@ti.func`` per entry
(36 calls); the textbook rule ``d det(a) = det(a) tr(a^-1 da)`` used it, and at
second order the Neo-Hookean Hessian inlined 180 of them and compiled for
seconds. These helpers write the cofactors out instead.
"""
import taichi as ti


@ti.func
def det_jvp(a, da):
    """``d det(a)`` along ``da``: the sum of cofactors times ``da``."""
    result = a[0, 0] * 0
    if ti.static(a.n == 1):
        result = da[0, 0]
    elif ti.static(a.n == 2):
        result = a[1, 1] * da[0, 0] - a[1, 0] * da[0, 1] - a[0, 1] * da[1, 0] + a[0, 0] * da[1, 1]
    elif ti.static(a.n == 3):
        for i, j in ti.static(ti.ndrange(3, 3)):
            i1, i2, j1, j2 = ti.static((i + 1) % 3, (i + 2) % 3, (j + 1) % 3, (j + 2) % 3)
            result += (a[i1, j1] * a[i2, j2] - a[i1, j2] * a[i2, j1]) * da[i, j]
    else:
        result = a.determinant() * (a.inverse() @ da).trace()
    return result


@ti.func
def inverse_jvp(a, da):
    """``d a^-1`` along ``da``: ``-a^-1 da a^-1``, with the inverse formed once."""
    inv = a.inverse()
    return -(inv @ da @ inv)
