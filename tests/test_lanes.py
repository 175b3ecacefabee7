"""Vector-mode tangents: one widened call carries every basis tangent of an argument.

The op table covers widened straight-line code (every row with a vector argument); these
tests cover lanes through control flow, nested calls and custom rules, the widened tangent
against separate pushes, second order over a widened body, and the budget that falls back
to a runtime loop.
"""
import numpy as np
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td
from tidiff._lang.compile import info
from tidiff._modes import LANE_BUDGET
from tidiff._tangent import jvp_func

vec3 = ti.types.vector(3, ti.f64)


@td.custom_jvp
@ti.func
def squash(x):
    return ti.tanh(x)


@squash.defjvp
@ti.func
def squash_jvp(x, dx):
    return ti.tanh(x), 3.0 * dx  # deliberately not 1 - tanh^2: only the rule gives these numbers


@ti.func
def scale(v, s):
    return v * ti.exp(s)


@ti.func
def flow(x: vec3, s: ti.f64) -> vec3:
    acc = x * 0.0
    for i in range(3):
        if x[i] > 0.0:
            acc[i] += ti.sin(x[i]) * s
        else:
            acc[i] -= x[i] * x[i]
    k = 0
    while k < 2:
        acc = scale(acc, 0.1 * s) + x
        k += 1
    acc[0] += squash(x[1] * s)
    return acc


def torch_flow(x, s):
    acc = torch.where(x > 0, torch.sin(x) * s, -x * x)
    for _ in range(2):
        acc = acc * torch.exp(0.1 * s) + x
    rule = torch.zeros(3, dtype=x.dtype)
    rule[0] = 3.0 * x[1] * s  # the custom rule's tangent, through a value with that derivative
    return acc + rule - rule.detach() + torch.stack([torch.tanh(x[1] * s).detach(), x[1] * 0, x[1] * 0])


@given(seed=st.integers(0, 2**31 - 1))
def test_widened_jacobian_through_control_flow_calls_and_rules(seed):
    rng = np.random.default_rng(seed)
    x, s = rng.uniform(-1.5, 1.5, (4, 3)), rng.uniform(0.2, 1.5, 4)
    jac_x, jac_s = td.jacfwd(flow, argnums=(0, 1))(x, s)
    for b in range(4):
        xt, st_ = torch.tensor(x[b]), torch.tensor(s[b])
        want_x, want_s = torch.autograd.functional.jacobian(torch_flow, (xt, st_))
        np.testing.assert_allclose(jac_x[b], want_x.numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(jac_s[b], want_s.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(td.jacrev(flow, argnums=(0, 1))(x, s)[0], jac_x, rtol=1e-14)


def test_jacobian_of_a_small_argument_is_one_widened_call():
    text = td.source(td.jacfwd(flow), np.zeros(3), 1.0)
    assert "flow_jvp3(" in text and "for p in range" not in text
    assert "scale_jvp3(" in text  # the nested call is widened too
    assert text.count("squash_jvp(") >= 3  # a custom rule is called once per lane


_wide, _single = jvp_func(flow, (True, False), width=3), jvp_func(flow, (True, False))


@ti.kernel
def _wide_and_single(x: vec3, s: ti.f64, t: ti.types.matrix(3, 3, ti.f64)) -> ti.types.matrix(6, 3, ti.f64):
    w = _wide(x, s, t[0, :], t[1, :], t[2, :])
    r = ti.Matrix.zero(ti.f64, 6, 3)
    for k in ti.static(range(3)):
        one = _single(x, s, t[k, :])
        for j in ti.static(range(3)):
            r[k, j] = w[k + 1][j]
            r[k + 3, j] = one[1][j]
    return r


@given(seed=st.integers(0, 2**31 - 1))
def test_widened_tangent_equals_separate_pushes(seed):
    rng = np.random.default_rng(seed)
    x, s = rng.uniform(-1.5, 1.5, 3), rng.uniform(0.2, 1.5)
    tangents = rng.standard_normal((3, 3))
    # one kernel for every example (compiled once): the widened and the single tangent of the same body
    r = _wide_and_single(ti.Vector(x), s, ti.Matrix(tangents)).to_numpy()
    np.testing.assert_allclose(r[:3], r[3:], rtol=1e-14, atol=1e-15)


def test_hessian_over_a_widened_gradient_against_torch():
    rng = np.random.default_rng(3)
    x, s = rng.uniform(0.2, 1.5, (3, 3)), rng.uniform(0.2, 1.5, 3)

    @ti.func
    def energy(x: vec3, s: ti.f64) -> ti.f64:
        return s * ti.exp(-x.dot(x)) + ti.sin(x[0] * x[2])

    H = td.hessian(energy)(x, s)
    for b in range(3):
        want = torch.autograd.functional.hessian(
            lambda v, b=b: s[b] * torch.exp(-v.dot(v)) + torch.sin(v[0] * v[2]), torch.tensor(x[b]))
        np.testing.assert_allclose(H[b], want.numpy(), rtol=1e-12, atol=1e-14)


def test_a_push_over_the_lane_budget_runs_in_a_runtime_loop():
    # A lane's cost counts the tangent code's AST nodes, not the matrix's entries: 16 lanes of a 4x4
    # argument are already 2.7 times the budget (a 6x6 one only made Taichi's compile 6 times longer).
    mat4 = ti.types.matrix(4, 4, ti.f64)

    @ti.func
    def big(a: mat4) -> ti.f64:
        return (a @ a.transpose() @ a).trace()

    assert 16 * info(jvp_func(big)).lane_cost > LANE_BUDGET
    a = np.random.default_rng(0).standard_normal((2, 4, 4))
    assert "for p in range(16)" in td.source(td.jacfwd(big), a[0])
    g = td.jacfwd(big)(a)
    for b in range(2):
        want = torch.autograd.functional.jacobian(lambda m: (m @ m.T @ m).trace(), torch.tensor(a[b]))
        np.testing.assert_allclose(g[b], want.numpy(), rtol=1e-12, atol=1e-13)
