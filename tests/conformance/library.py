"""A small fixed library of ``td.custom_jvp`` / ``td.custom_vjp`` functions, each with a correct rule and a torch twin.

Generated programs call these by name. Each rule is correct but computed by
a different formula than the primal's own derivative would be (the rule,
not a transform of the primal, must be what runs); the torch twin is the
plain function, whose autograd derivative the rule must match. Defined once
at import: their kernels compile once per process.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import taichi as ti
import torch

import tidiff as td

vec2 = ti.types.vector(2, ti.f64)
vec3 = ti.types.vector(3, ti.f64)
mat2 = ti.types.matrix(2, 2, ti.f64)


@dataclass(frozen=True)
class Entry:
    """One library function: its Taichi Function, its torch twin, and its signature."""

    func: Any
    twin: Callable
    param_shapes: tuple
    out_shape: tuple
    forward: bool  # has a jvp rule (a custom_vjp without one refuses forward mode, as in JAX)
    smooth: bool = True


# -- lib_softsign: custom_jvp, scalar -> scalar ---------------------------------------------------
@td.custom_jvp
@ti.func
def lib_softsign(x: ti.f64) -> ti.f64:
    return x / ti.sqrt(1.0 + x * x)


@lib_softsign.defjvp
@ti.func
def _softsign_jvp(x, dx):
    r = 1.0 / (1.0 + x * x)
    return x * ti.sqrt(r), dx * r * ti.sqrt(r)


def _softsign_twin(x):
    return x / torch.sqrt(1.0 + x * x)


# -- lib_swirl: custom_jvp, (vec3, scalar) -> vec3 ------------------------------------------------
@td.custom_jvp
@ti.func
def lib_swirl(v: vec3, s: ti.f64) -> vec3:
    return v * ti.sin(s) + ti.tanh(v)


@lib_swirl.defjvp
@ti.func
def _swirl_jvp(v, s, dv, ds):
    t = ti.tanh(v)
    return v * ti.sin(s) + t, dv * ti.sin(s) + v * (ti.cos(s) * ds) + (1.0 - t * t) * dv


def _swirl_twin(v, s):
    return v * torch.sin(s) + torch.tanh(v)


# -- lib_energy: custom_vjp without a jvp rule, (vec2, scalar) -> scalar ---------------------------
@td.custom_vjp
@ti.func
def lib_energy(x: vec2, k: ti.f64) -> ti.f64:
    return 0.5 * k * x.norm_sqr() + ti.sin(x[0])


@lib_energy.defvjp
@ti.func
def _energy_bwd(x, k, ct):
    gx = k * x + vec2(ti.cos(x[0]), 0.0)
    return ct * gx, ct * 0.5 * x.dot(x)


def _energy_twin(x, k):
    return 0.5 * k * (x * x).sum() + torch.sin(x[0])


# -- lib_squash: custom_vjp with a jvp rule too, (mat2, vec2) -> vec2 -------------------------------
@td.custom_vjp
@ti.func
def lib_squash(m: mat2, v: vec2) -> vec2:
    return ti.tanh(m @ v)


@lib_squash.defvjp
@ti.func
def _squash_bwd(m, v, ct):
    y = ti.tanh(m @ v)
    g = ct * (1.0 - y * y)
    return g.outer_product(v), m.transpose() @ g


@lib_squash.defjvp
@ti.func
def _squash_jvp(m, v, dm, dv):
    y = ti.tanh(m @ v)
    return y, (1.0 - y * y) * (dm @ v + m @ dv)


def _squash_twin(m, v):
    return torch.tanh(m @ v)


LIBRARY: dict[str, Entry] = {
    "lib_softsign": Entry(lib_softsign, _softsign_twin, ((),), (), forward=True),
    "lib_swirl": Entry(lib_swirl, _swirl_twin, ((3,), ()), (3,), forward=True),
    "lib_energy": Entry(lib_energy, _energy_twin, ((2,), ()), (), forward=False),
    "lib_squash": Entry(lib_squash, _squash_twin, ((2, 2), (2,)), (2,), forward=True),
}
"""name -> Entry; programs call ``name(...)`` in Taichi and in the torch twin."""
