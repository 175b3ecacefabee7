"""One small regression test per construct the net leaves out (``known.REVERSE_GAPS``, ``KNOWN_FAILING``).

Each gap is tested where it matters: in code that also calls ``lib_energy``,
a ``td.custom_vjp`` function without a jvp rule, so that only reverse mode
can differentiate it. A test that starts passing fails the suite (strict
xfail): then the construct's entry in ``known.py`` goes, and the net draws it.
"""
import numpy as np
import pytest
import taichi as ti
import torch

import tidiff as td

from . import known
from .library import LIBRARY, lib_energy, lib_softsign, lib_swirl

vec2, vec3 = ti.types.vector(2, ti.f64), ti.types.vector(3, ti.f64)
X = np.array([0.3, -0.7])


def energy_twin(x):
    return LIBRARY["lib_energy"].twin(x, torch.tensor(1.5, dtype=torch.float64))


def check(f, twin, x=X):
    """td.grad(f) at ``x`` against torch's gradient of ``twin``."""
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    (expected,) = torch.autograd.grad(twin(xt), xt)
    np.testing.assert_allclose(td.grad(f)(x), expected.numpy(), rtol=1e-10, atol=1e-12)


@ti.func
def with_clamp(x: vec2) -> ti.f64:
    return lib_energy(x, 1.5) + ti.math.clamp(x[0], -0.5, 0.5)


@ti.func
def with_smoothstep(x: vec2) -> ti.f64:
    return lib_energy(x, 1.5) + ti.math.smoothstep(-1.0, 1.0, x[1])


@ti.func
def with_vector_type(x: vec2) -> ti.f64:
    return lib_energy(x, 1.5) + ti.math.vec2(x[0], x[1]).norm_sqr()


@ti.func
def with_matrix_type(x: vec2) -> ti.f64:
    return lib_energy(x, 1.5) + ti.math.mat2([[x[0], x[1]], [x[1], x[0]]]).determinant()


@ti.func
def with_if(x: vec2) -> ti.f64:
    y = x[0]
    if x[1] < 0.0:
        y = x[0] * x[1]
    return lib_energy(x, 1.5) + y


@ti.func
def with_while(x: vec2) -> ti.f64:
    y = x[0]
    k = 0
    while k < 3:
        y = y * x[1]
        k += 1
    return lib_energy(x, 1.5) + y


@ti.func
def with_softsign(x: vec2) -> ti.f64:
    return lib_energy(x, 1.5) + lib_softsign(x[0])


@ti.func
def with_swirl(x: vec2) -> ti.f64:
    return lib_energy(x, 1.5) + lib_swirl(ti.Vector([x[0], x[1], 0.5]), 0.3).sum()


def _swirl_sum(x):
    v = torch.stack([x[0], x[1], torch.tensor(0.5, dtype=torch.float64)])
    return LIBRARY["lib_swirl"].twin(v, torch.tensor(0.3, dtype=torch.float64)).sum()


@ti.func
def scaled(x: vec2) -> ti.f64:
    return x[0] * x[1]


@ti.func
def with_jvp_call(x: vec2) -> ti.f64:
    return lib_energy(x, 1.5) + td.jvp(scaled, (x,), (x,))[1]


def _unannotated_scaled(x):
    return x[0] * x[1]


@ti.func
def with_jvp_call_unannotated(x: vec2) -> ti.f64:
    return lib_energy(x, 1.5) + td.jvp(ti.func(_unannotated_scaled), (x,), (x,))[1]


@ti.func
def with_hvp_call(x: vec2) -> ti.f64:
    return lib_energy(x, 1.5) + td.hvp(scaled, (x,), (x,))[1][0].sum()


CASES = {
    "clamp": (with_clamp, lambda x: energy_twin(x) + torch.clamp(x[0], -0.5, 0.5)),
    "smoothstep": (with_smoothstep, lambda x: energy_twin(x) + (lambda t: t * t * (3 - 2 * t))(
        torch.clamp((x[1] + 1.0) / 2.0, 0.0, 1.0))),
    "vector_type": (with_vector_type, lambda x: energy_twin(x) + (x**2).sum()),
    "matrix_type": (with_matrix_type, lambda x: energy_twin(x) + x[0] ** 2 - x[1] ** 2),
    "if": (with_if, lambda x: energy_twin(x) + (x[0] * x[1] if x[1] < 0 else x[0])),
    "while": (with_while, lambda x: energy_twin(x) + x[0] * x[1] ** 3),
    "lib_softsign": (with_softsign, lambda x: energy_twin(x) + LIBRARY["lib_softsign"].twin(x[0])),
    "lib_swirl": (with_swirl, lambda x: energy_twin(x) + _swirl_sum(x)),
    "tjvp": (with_jvp_call, lambda x: energy_twin(x) + 2 * x[0] * x[1]),  # jvp of x0 x1 along x: 2 x0 x1
    "tjvp_unannotated": (with_jvp_call_unannotated, lambda x: energy_twin(x) + 2 * x[0] * x[1]),
    "thvp": (with_hvp_call, lambda x: energy_twin(x) + x[0] + x[1]),  # H of x0 x1 along x: (x1, x0)
}


def test_every_gap_has_a_case():
    assert set(known.REVERSE_GAPS) <= set(CASES), "give every known gap a regression test here"


@pytest.mark.parametrize("construct", [
    pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=known.REVERSE_GAPS[c])) if c in known.REVERSE_GAPS
    else c for c in sorted(CASES)])
def test_reverse_gap(construct):
    check(*CASES[construct])


