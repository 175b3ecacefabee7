"""Custom-rule functions shared by the tests: JAX's clip_gradient, a rule nonlinear in its cotangent."""
import taichi as ti

import tidiff as td


@td.custom_vjp
@ti.func
def clip_gradient(x: ti.f64) -> ti.f64:
    return x


@clip_gradient.defvjp
@ti.func
def clip_gradient_bwd(x, ct):
    return (ti.math.clamp(ct, -1.0, 1.0),)  # nonlinear in the cotangent


@ti.func
def ten_clipped(x: ti.f64) -> ti.f64:
    return 10.0 * clip_gradient(x)
