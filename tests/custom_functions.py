"""Custom-rule functions shared by the tests, each rule correct but not the primal's own derivative formula.

JAX's clip_gradient (a rule nonlinear in its cotangent), and the four functions
the conformance net's library, the call-position tests and the regression
tests call: softsign, swirl (custom_jvp), energy (custom_vjp without a jvp
rule: only reverse mode reaches it) and squash (custom_vjp with a jvp rule).
A rule computed by another formula than the primal's derivative shows that the
rule, not a transform of the primal, is what runs. Each ``*_twin`` is the plain
function in torch, whose autograd derivative the rule must match. Defined once
at import: their kernels compile once per process.
"""
import taichi as ti
import torch

import tidiff as td

vec2 = ti.types.vector(2, ti.f64)
vec3 = ti.types.vector(3, ti.f64)
mat2 = ti.types.matrix(2, 2, ti.f64)


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


# -- softsign: custom_jvp, scalar -> scalar ----------------------------------------------------------
@td.custom_jvp
@ti.func
def softsign(x: ti.f64) -> ti.f64:
    return x / ti.sqrt(1.0 + x * x)


@softsign.defjvp
@ti.func
def _softsign_jvp(x, dx):
    r = 1.0 / (1.0 + x * x)
    return x * ti.sqrt(r), dx * r * ti.sqrt(r)


def softsign_twin(x):
    return x / torch.sqrt(1.0 + x * x)


# -- swirl: custom_jvp, (vec3, scalar) -> vec3 ---------------------------------------------------------
@td.custom_jvp
@ti.func
def swirl(v: vec3, s: ti.f64) -> vec3:
    return v * ti.sin(s) + ti.tanh(v)


@swirl.defjvp
@ti.func
def _swirl_jvp(v, s, dv, ds):
    t = ti.tanh(v)
    return v * ti.sin(s) + t, dv * ti.sin(s) + v * (ti.cos(s) * ds) + (1.0 - t * t) * dv


def swirl_twin(v, s):
    return v * torch.sin(s) + torch.tanh(v)


# -- energy: custom_vjp without a jvp rule, (vec2, scalar) -> scalar -----------------------------------
@td.custom_vjp
@ti.func
def energy(x: vec2, k: ti.f64) -> ti.f64:
    return 0.5 * k * x.norm_sqr() + ti.sin(x[0])


@energy.defvjp
@ti.func
def _energy_bwd(x, k, ct):
    return ct * (k * x + vec2(ti.cos(x[0]), 0.0)), ct * 0.5 * x.dot(x)


def energy_twin(x, k):
    return 0.5 * k * (x * x).sum() + torch.sin(x[0])


# -- squash: custom_vjp with a jvp rule too, (mat2, vec2) -> vec2 --------------------------------------
@td.custom_vjp
@ti.func
def squash(m: mat2, v: vec2) -> vec2:
    return ti.tanh(m @ v)


@squash.defvjp
@ti.func
def _squash_bwd(m, v, ct):
    y = ti.tanh(m @ v)
    g = ct * (1.0 - y * y)
    return g.outer_product(v), m.transpose() @ g


@squash.defjvp
@ti.func
def _squash_jvp(m, v, dm, dv):
    y = ti.tanh(m @ v)
    return y, (1.0 - y * y) * (dm @ v + m @ dv)


def squash_twin(m, v):
    return torch.tanh(m @ v)
