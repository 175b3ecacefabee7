"""Taichi's own ``@ti.func`` math functions, differentiated through their source as user code.

``ti.math.fract``, ``reflect``, the complex ``cmul`` ... ``csqrt``, the rotation matrices and
kin have no rule: the transforms read Taichi's source (``taichi/math/*.py``), built from ops
that have rules. Both modes against central differences (``check_grads``); ``refract``,
``cpow`` and ``csqrt`` branch on values, so their reverse derivatives come from forward pushes.
"""
import numpy as np
import pytest
import taichi as ti

import tidiff.testing as tt
from tidiff._adjoint import why_not

vec2 = ti.types.vector(2, ti.f64)
vec3 = ti.types.vector(3, ti.f64)


@ti.func
def scalar_functions(x: ti.f64, y: ti.f64) -> ti.f64:
    return ti.math.fract(x) * y + ti.math.log2(y) + ti.math.degrees(x) + ti.math.radians(y) + ti.math.mod(x, y)


@ti.func
def reflect_refract(v: vec3, n: vec3) -> vec3:
    return ti.math.reflect(v, n) + ti.math.refract(v.normalized(), n.normalized(), 0.5)


@ti.func
def complex_functions(z: vec2, w: vec2) -> vec2:
    return (ti.math.cmul(z, w) + ti.math.cdiv(z, w) + ti.math.cconj(z) + ti.math.cinv(w) + ti.math.cexp(z)
            + ti.math.clog(w) + ti.math.cpow(z, 2.5) + ti.math.csqrt(w))


@ti.func
def rotations(a: ti.f64, axis: vec3) -> ti.f64:
    return (ti.math.rotation2d(a).sum() + ti.math.rot_by_axis(axis, a).sum()
            + ti.math.rot_yaw_pitch_roll(a, 2 * a, axis[0]).sum() + ti.math.rotation3d(a, axis[1], axis[2]).sum()
            + ti.math.translate(a, axis[0], 1.0).sum() + ti.math.scale(a, axis[1], 2.0).sum()
            + ti.math.vdir(a).sum() + ti.math.eye(3).sum() * a)


CASES = [  # function, argument shapes, domain, reversible
    (scalar_functions, [(), ()], (0.3, 2.0), True),
    (reflect_refract, [(3,), (3,)], (0.3, 1.0), True),  # refract branches on a value
    (complex_functions, [(2,), (2,)], (0.3, 1.0), True),
    (rotations, [(), (3,)], (0.3, 1.0), True),
]


@pytest.mark.parametrize("f, shapes, domain, reversible", CASES, ids=[c[0].__name__ for c in CASES])
def test_taichi_math_functions_through_their_source(f, shapes, domain, reversible):
    assert (why_not(f, (True,) * len(shapes)) is None) == reversible
    rng = np.random.default_rng(0)
    args = tuple(rng.uniform(*domain, size=(3,) + s) for s in shapes)
    tt.check_grads(f, args, order=1)
