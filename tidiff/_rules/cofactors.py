"""The cofactor matrix as a ``@ti.func``: the determinant's derivative and the decompositions' rules use it."""
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
    else:  # 4x4 (Taichi's determinant stops there): signed 3x3 minors, defined for singular a too
        for i, j in ti.static(ti.ndrange(4, 4)):
            r0, r1, r2 = ti.static(_OTHERS4[i])
            c0, c1, c2 = ti.static(_OTHERS4[j])
            minor = (a[r0, c0] * (a[r1, c1] * a[r2, c2] - a[r1, c2] * a[r2, c1])
                     - a[r0, c1] * (a[r1, c0] * a[r2, c2] - a[r1, c2] * a[r2, c0])
                     + a[r0, c2] * (a[r1, c0] * a[r2, c1] - a[r1, c1] * a[r2, c0]))
            result[i, j] = ti.static(1 - 2 * ((i + j) % 2)) * minor
    return result


_OTHERS4 = [(1, 2, 3), (0, 2, 3), (0, 1, 3), (0, 1, 2)]
"""The rows (columns) of a 4x4 matrix other than row (column) k."""
