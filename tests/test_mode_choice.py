"""Modes are chosen by reading the code, not by generating what will not be used (NOTE: [Modes chosen
without transforming] in tidiff/_tangent/fence.py)."""
import functools

import numpy as np
import taichi as ti

import tidiff as td
from tidiff._tangent.fence import may_refuse

vec3 = ti.types.vector(3, ti.f64)


def made(f, cache):
    """The activity patterns ``f``'s cache of generated tangent ("_tidiff_jvps") or reverse ("_tidiff_vjps")
    functions holds."""
    return list(f.__dict__.get(cache, {}))


def test_a_gradient_makes_no_tangent_function():
    @ti.func
    def f(x: vec3, s: ti.f64) -> ti.f64:
        return s * x.dot(x) + ti.sin(x[0])

    x = np.random.default_rng(0).random((4, 3))
    np.testing.assert_allclose(td.grad(f)(x, 2.0), 4 * x + np.outer(np.cos(x[:, 0]), [1, 0, 0]), rtol=1e-12)
    assert made(f, "_tidiff_vjps") and not made(f, "_tidiff_jvps")


def test_a_square_jacobian_makes_no_reverse_function():
    @ti.func
    def g(x: vec3) -> vec3:
        return ti.sin(x) * x.sum()

    x = np.random.default_rng(1).random(3)
    expected = np.diag(np.cos(x) * x.sum()) + np.outer(np.sin(x), np.ones(3))
    np.testing.assert_allclose(td.jacobian(g)(x), expected, rtol=1e-12)
    assert made(g, "_tidiff_jvps") and not made(g, "_tidiff_vjps")


@td.custom_vjp
@ti.func
def doubled(x: ti.f64) -> ti.f64:
    return 2.0 * x


@doubled.defvjp
@ti.func
def doubled_bwd(x, ct):
    return (2.0 * ct,)


def scaled(k, x):  # a plain helper, reached through a partial
    return k * doubled(x)


tripled = functools.partial(scaled, 3.0)


@ti.func
def reaches_through_a_partial(x: vec3) -> ti.f64:
    return tripled(x[0]) + x[1]


@ti.func
def plain_code(x: vec3) -> ti.f64:
    return x.dot(x)


def test_forward_mode_is_asked_only_of_functions_that_reach_a_vjp_only_rule():
    assert may_refuse(reaches_through_a_partial) and not may_refuse(plain_code)
    x = np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(td.grad(reaches_through_a_partial)(x), [6.0, 1.0, 0.0], rtol=1e-12)
    np.testing.assert_allclose(td.grad(plain_code)(x), 2 * x, rtol=1e-12)
