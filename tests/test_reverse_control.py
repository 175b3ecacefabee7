"""Reverse mode through control flow: branches on values, runtime loops, while loops, custom_jvp calls.

Each function here has a torch twin written with Python control flow on the
same values, so the oracle is ``torch.autograd.functional`` per batch element
(float64); central differences check the same gradients where no branch
decision or trip count changes within the stencil (the twins report their
decisions). Every function is checked to go through the reverse transform
(``why_not`` is None and the generated code calls its ``_vjp``), not through
forward pushes.
"""
import numpy as np
import pytest
import taichi as ti
import torch
from custom_functions import swirl, swirl_twin  # a td.custom_jvp function
from hypothesis import given, settings
from hypothesis import strategies as st

import tidiff as td
from tidiff._adjoint import control, why_not

vec2, vec3 = ti.types.vector(2, ti.f64), ti.types.vector(3, ti.f64)
T = torch.float64


# --- the functions and their twins: twin(x, ...) -> (value, decisions) -------------------------------------
@ti.func
def piecewise(x: vec3) -> ti.f64:
    y = x[0] * x[1]
    z = ti.sin(x[2])
    if x[0] > 0.0:
        y = y * x[2]
        if x[1] > x[2]:
            z = z + x[0] ** 2
        else:
            z = z * x[1]
    else:
        z = ti.exp(z)
    if y < 0.1:
        y = y + z * z
    return y + 2.0 * z


def piecewise_twin(x):
    y, z, path = x[0] * x[1], torch.sin(x[2]), []
    path.append(bool(x[0] > 0))
    if path[-1]:
        y = y * x[2]
        path.append(bool(x[1] > x[2]))
        z = z + x[0] ** 2 if path[-1] else z * x[1]
    else:
        z = torch.exp(z)
    path.append(bool(y < 0.1))
    if path[-1]:
        y = y + z * z
    return y + 2.0 * z, path


@ti.func
def stepped(x: vec3, n: ti.i32) -> ti.f64:
    acc = 0.0
    v = x
    for i in range(n):
        v = ti.sin(v) * x + 0.1 * i
        v[i % 3] = v[i % 3] * x[(i + 1) % 3]
        acc += v.dot(x)
    return acc + v.norm()


def stepped_twin(x, n):
    acc, v = torch.zeros((), dtype=T), x
    for i in range(n):
        v = torch.sin(v) * x + 0.1 * i
        v = torch.cat([v[: i % 3], v[i % 3: i % 3 + 1] * x[(i + 1) % 3], v[i % 3 + 1:]])
        acc = acc + v.dot(x)
    return acc + v.norm(), []


@ti.func
def until(x: vec2) -> ti.f64:
    y = x[0]
    s = 0.0
    k = 0
    while ti.abs(y) < 4.0 and k < 200:
        y = y * 1.25 + x[1]
        s += y * y * x[0]
        k += 1
    return s + y


def until_twin(x):
    y, s, k = x[0], torch.zeros((), dtype=T), 0
    while abs(float(y.detach())) < 4.0 and k < 200:
        y = y * 1.25 + x[1]
        s = s + y * y * x[0]
        k += 1
    return s + y, [k]


@ti.func
def nested(x: vec2, n: ti.i32) -> ti.f64:
    s = x[0]
    for i in range(n):
        if s > 1.0:
            s = s * 0.5
        for _ in range(i):
            s = s * x[1] + ti.cos(s * x[0]) * 0.25
    return s


def nested_twin(x, n):
    s, path = x[0], []
    for i in range(n):
        path.append(bool(s > 1.0))
        if path[-1]:
            s = s * 0.5
        for _ in range(i):
            s = s * x[1] + torch.cos(s * x[0]) * 0.25
    return s, path


# Functions with runtime loops are differentiated by forward pushes where forward mode is possible
# (NOTE: [Loops in reverse cost their square] in tidiff/_modes.py). Reached through a custom_vjp
# rule without a jvp rule, forward mode is impossible: the *_r twins take the reverse function.
@td.custom_vjp
@ti.func
def reverse_only3(x: vec3) -> vec3:
    return x


@reverse_only3.defvjp
@ti.func
def reverse_only3_bwd(x, ct):
    return (ct,)


@td.custom_vjp
@ti.func
def reverse_only2(x: vec2) -> vec2:
    return x


@reverse_only2.defvjp
@ti.func
def reverse_only2_bwd(x, ct):
    return (ct,)


@ti.func
def stepped_r(x: vec3, n: ti.i32) -> ti.f64:
    return stepped(reverse_only3(x), n)


@ti.func
def until_r(x: vec2) -> ti.f64:
    return until(reverse_only2(x))


@ti.func
def nested_r(x: vec2, n: ti.i32) -> ti.f64:
    return nested(reverse_only2(x), n)


def draw_vec3(rng, batch):
    x = rng.uniform(-1.5, 1.5, (batch, 3))
    x[0, 0], x[1, 0] = abs(x[0, 0]) + 0.1, -abs(x[1, 0]) - 0.1  # the first branch flips across the batch
    return x


# --- oracles ----------------------------------------------------------------------------------------------
def torch_grad(twin, x, *static):
    return torch.autograd.functional.jacobian(lambda t: twin(t, *static)[0], torch.tensor(x, dtype=T)).numpy()


def torch_hessian(twin, x, *static):
    return torch.autograd.functional.hessian(lambda t: twin(t, *static)[0], torch.tensor(x, dtype=T)).numpy()


def central_differences(twin, x, *static, h=1e-6):
    """Central differences of the twin's value, or None where a decision changes within the stencil."""
    x = np.asarray(x, dtype=np.float64)
    value = lambda y: twin(torch.tensor(y, dtype=T), *static)  # noqa: E731
    path = value(x)[1]
    grad = np.zeros_like(x)
    for j in range(x.size):
        e = np.zeros_like(x)
        e.flat[j] = h
        (up, up_path), (down, down_path) = value(x + e), value(x - e)
        if up_path != path or down_path != path:
            return None
        grad.flat[j] = (float(up) - float(down)) / (2 * h)
    return grad


def assert_reversed(f, active, *args):
    assert why_not(f, active) is None
    assert f"{f.__name__}_vjp(" in td.source(td.grad(f), *args)


# --- gradients against torch and central differences ------------------------------------------------------
def test_these_functions_are_reversed():
    x = np.array([0.4, -0.8, 1.5])
    assert_reversed(piecewise, (True,), x)
    for f, f_r, args in [(stepped, stepped_r, (x, 3)), (until, until_r, (x[:2],)), (nested, nested_r, (x[:2], 3))]:
        assert why_not(f, (True,) + (False,) * (len(args) - 1)) is None
        assert f"{f.__name__}_vjp(" not in td.source(td.grad(f), *args)  # forward pushes: linear in the loop
        assert f"{f.__name__}_vjp(" in td.source(td.grad(f_r), *args)  # forward mode impossible: reverse


@given(st.integers(0, 2**31))
def test_branches_flipping_across_the_batch(seed):
    x = draw_vec3(np.random.default_rng(seed), 6)
    got = td.grad(piecewise)(x)
    for b in range(len(x)):
        np.testing.assert_allclose(got[b], torch_grad(piecewise_twin, x[b]), rtol=1e-12, atol=1e-12)
        fd = central_differences(piecewise_twin, x[b])
        if fd is not None:
            np.testing.assert_allclose(got[b], fd, rtol=1e-6, atol=1e-6)


@given(st.integers(0, 2**31))
def test_runtime_loops_with_trip_counts_varying_per_element(seed):
    rng = np.random.default_rng(seed)
    x, n = draw_vec3(rng, 5), np.array([0, 1, 3, 7, 12], dtype=np.int32)
    got = td.grad(stepped)(x, n)
    np.testing.assert_allclose(td.grad(stepped_r)(x, n), got, rtol=1e-12, atol=1e-13)
    for b in range(len(x)):
        np.testing.assert_allclose(got[b], torch_grad(stepped_twin, x[b], int(n[b])), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got[b], central_differences(stepped_twin, x[b], int(n[b])), rtol=1e-5, atol=1e-6)


@given(st.integers(0, 2**31))
def test_while_loops_stopping_on_a_value(seed):
    x = np.random.default_rng(seed).uniform(-1.0, 1.0, (6, 2))
    x[0] = [0.0, 0.0]  # never stops on the value: 200 iterations, past the tape (checkpoints recompute)
    got = td.grad(until)(x)
    np.testing.assert_allclose(td.grad(until_r)(x), got, rtol=1e-12, atol=1e-13)
    for b in range(len(x)):
        np.testing.assert_allclose(got[b], torch_grad(until_twin, x[b]), rtol=1e-10, atol=1e-10)
        fd = central_differences(until_twin, x[b])
        if fd is not None and until_twin(torch.tensor(x[b]))[1][0] < 200:
            np.testing.assert_allclose(got[b], fd, rtol=1e-5, atol=1e-5)


@given(st.integers(0, 2**31))
def test_nested_loops_and_a_branch_inside_a_loop(seed):
    x = np.random.default_rng(seed).uniform(0.2, 1.8, (4, 2))
    n = np.array([0, 2, 4, 6], dtype=np.int32)
    got = td.grad(nested)(x, n)
    np.testing.assert_allclose(td.grad(nested_r)(x, n), got, rtol=1e-12, atol=1e-13)
    for b in range(len(x)):
        np.testing.assert_allclose(got[b], torch_grad(nested_twin, x[b], int(n[b])), rtol=1e-10, atol=1e-12)


ROWS = 16  # a tape's rows in the tests of taped loops (TAPE_ROWS is 0 by default: no tape)


@ti.func
def long_loop(x: vec2, n: ti.i32) -> ti.f64:
    s = x[0]
    for _ in range(n):
        s = ti.sin(s) * x[1] + x[0]
    return s


@ti.func
def long_loop_r(x: vec2, n: ti.i32) -> ti.f64:
    return long_loop(reverse_only2(x), n)


def long_loop_twin(x, n):
    s = x[0]
    for _ in range(n):
        s = torch.sin(s) * x[1] + x[0]
    return s, []


def taped_functions():
    """``long_loop`` as a for loop and as a while loop, made while TAPE_ROWS is ROWS: their reverse
    functions keep a tape."""

    @ti.func
    def taped_for(x: vec2, n: ti.i32) -> ti.f64:
        s = x[0]
        for _ in range(n):
            s = ti.sin(s) * x[1] + x[0]
        return s

    @ti.func
    def taped_while(x: vec2, n: ti.i32) -> ti.f64:
        s = x[0]
        k = 0
        while k < n:
            s = ti.sin(s) * x[1] + x[0]
            k += 1
        return s

    return taped_for, taped_while


@pytest.mark.parametrize("n", [0, 3, ROWS - 1, ROWS, ROWS + 1, 3 * ROWS + 5])
def test_taped_loops_shorter_and_longer_than_the_tape(monkeypatch, n):
    """Past the tape a for loop saves every stride-th iteration and a while loop thins its full tape;
    either way the reverse sweep recomputes from the nearest saved iteration."""
    monkeypatch.setattr(control, "TAPE_ROWS", ROWS)
    x = np.array([[0.3, -0.2], [0.1, 0.05]])
    for f in taped_functions():
        assert why_not(f, (True, False)) is None and "tape_of" in td.source(td.grad(f), x, n)
        got = td.grad(f)(x, n)
        for b in range(len(x)):
            np.testing.assert_allclose(got[b], torch_grad(long_loop_twin, x[b], n), rtol=1e-11, atol=1e-13)


def test_without_a_tape_the_reverse_sweep_recomputes_from_the_start_of_the_loop():
    assert control.TAPE_ROWS == 0  # the default (NOTE: [Reverse control flow])
    x, n = np.array([[0.3, -0.2], [0.1, 0.05], [0.7, 0.4]]), np.array([0, 3, 40], dtype=np.int32)
    source = td.source(td.grad(long_loop_r), x, n)
    assert "long_loop_vjp(" in source and "tape_of" not in source
    got = td.grad(long_loop_r)(x, n)
    for b in range(len(x)):
        np.testing.assert_allclose(got[b], torch_grad(long_loop_twin, x[b], int(n[b])), rtol=1e-11, atol=1e-13)


# --- other transforms: vjp, jacrev, hessian, in a kernel --------------------------------------------------
@ti.func
def flow(x: vec3, n: ti.i32) -> vec2:
    a = x[0]
    b = x[1] * x[2]
    for i in range(n):
        if a > b:
            a, b = b, a * x[2]
        else:
            b = b + ti.tanh(a * x[i % 3])
    return ti.Vector([a * b, a - b])


def flow_twin(x, n):
    a, b = x[0], x[1] * x[2]
    for i in range(n):
        if a > b:
            a, b = b, a * x[2]
        else:
            b = b + torch.tanh(a * x[i % 3])
    return torch.stack([a * b, a - b]), []


@given(st.integers(0, 2**31))
@settings(max_examples=10)
def test_vjp_and_jacrev_through_a_loop_with_a_branch(seed):
    rng = np.random.default_rng(seed)
    x, n = rng.uniform(-1.0, 1.0, (4, 3)), np.array([1, 2, 5, 8], dtype=np.int32)
    assert why_not(flow, (True, False), 1) is None
    J = td.jacrev(flow)(x, n)
    ct = rng.standard_normal((4, 2))
    out, vjp_fn = td.vjp(flow, x, n)
    ct_x = vjp_fn(ct)[0]
    for b in range(len(x)):
        want = torch.autograd.functional.jacobian(lambda t, b=b: flow_twin(t, int(n[b]))[0], torch.tensor(x[b]))
        np.testing.assert_allclose(J[b], want.numpy(), rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(ct_x[b], ct[b] @ want.numpy(), rtol=1e-11, atol=1e-12)


@given(st.integers(0, 2**31))
@settings(max_examples=8)
def test_hessians_forward_over_reverse_through_control_flow(seed):
    rng = np.random.default_rng(seed)
    x = draw_vec3(rng, 3)
    H = td.hessian(piecewise)(x)
    for b in range(len(x)):
        np.testing.assert_allclose(H[b], torch_hessian(piecewise_twin, x[b]), rtol=1e-10, atol=1e-10)
    n = np.array([0, 2, 5], dtype=np.int32)
    H = td.hessian(stepped)(x, n)
    for b in range(len(x)):
        np.testing.assert_allclose(H[b], torch_hessian(stepped_twin, x[b], int(n[b])), rtol=1e-9, atol=1e-10)
    y = rng.uniform(-1.0, 1.0, (3, 2))
    H = td.hessian(until)(y)
    for b in range(len(y)):
        np.testing.assert_allclose(H[b], torch_hessian(until_twin, y[b]), rtol=1e-9, atol=1e-9)


@ti.kernel
def gradients_in_a_kernel(x: ti.types.ndarray(dtype=vec3, ndim=1), n: ti.types.ndarray(dtype=ti.i32, ndim=1),
                          g: ti.types.ndarray(dtype=vec3, ndim=1), h: ti.types.ndarray(dtype=vec3, ndim=1),
                          H: ti.types.ndarray(dtype=ti.types.matrix(3, 3, ti.f64), ndim=1)):
    for b in range(x.shape[0]):
        g[b] = td.grad(stepped)(x[b], n[b])
        h[b] = td.grad(piecewise)(x[b])
        H[b] = td.hessian(stepped)(x[b], n[b])


def test_gradients_and_hessians_through_control_flow_inside_a_kernel():
    x = draw_vec3(np.random.default_rng(5), 4)
    n = np.array([0, 1, 4, 9], dtype=np.int32)
    g, h, H = np.zeros((4, 3)), np.zeros((4, 3)), np.zeros((4, 3, 3))
    gradients_in_a_kernel(x, n, g, h, H)
    for b in range(4):
        np.testing.assert_allclose(g[b], torch_grad(stepped_twin, x[b], int(n[b])), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(h[b], torch_grad(piecewise_twin, x[b]), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(H[b], torch_hessian(stepped_twin, x[b], int(n[b])), rtol=1e-9, atol=1e-10)


# --- td.custom_jvp calls ------------------------------------------------------------------------------------
@td.custom_jvp
@ti.func
def softplus(x: ti.f64) -> ti.f64:
    return ti.log(1.0 + ti.exp(x))


@softplus.defjvp
@ti.func
def _softplus_jvp(x, dx):
    return ti.log(1.0 + ti.exp(x)), dx / (1.0 + ti.exp(-x))


@ti.func
def calls_rules(x: vec3, n: ti.i32) -> ti.f64:
    w = swirl(x, x[0])
    for i in range(n):
        w = swirl(w, softplus(w[i % 3]))
    return softplus(w.sum()) + w.norm_sqr()


@ti.func
def calls_rules_r(x: vec3, n: ti.i32) -> ti.f64:
    return calls_rules(reverse_only3(x), n)


def calls_rules_twin(x, n):
    w = swirl_twin(x, x[0])
    for i in range(n):
        w = swirl_twin(w, torch.nn.functional.softplus(w[i % 3]))
    return torch.nn.functional.softplus(w.sum()) + (w * w).sum(), []


@given(st.integers(0, 2**31))
@settings(max_examples=10)
def test_custom_jvp_calls_are_reversed_through_their_rules(seed):
    x = np.random.default_rng(seed).uniform(-1.0, 1.0, (3, 3))
    n = np.array([0, 1, 4], dtype=np.int32)
    assert why_not(calls_rules, (True, False)) is None
    source = td.source(td.grad(calls_rules_r), x, n)
    assert "swirl_linear_vjp(" in source and "softplus_linear_vjp(" in source
    got = td.grad(calls_rules_r)(x, n)
    np.testing.assert_allclose(td.grad(calls_rules)(x, n), got, rtol=1e-12, atol=1e-13)
    H = td.hessian(calls_rules)(x, n)
    for b in range(len(x)):
        np.testing.assert_allclose(got[b], torch_grad(calls_rules_twin, x[b], int(n[b])), rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(H[b], torch_hessian(calls_rules_twin, x[b], int(n[b])), rtol=1e-9, atol=1e-10)


@td.custom_jvp
@ti.func
def wrong_on_purpose(x: ti.f64) -> ti.f64:
    return x * x


@wrong_on_purpose.defjvp
@ti.func
def _wrong_jvp(x, dx):
    return x * x, 3.0 * x * dx  # not 2x: the rule, not the primal's code, must be what runs


@ti.func
def calls_wrong(x: ti.f64) -> ti.f64:
    return wrong_on_purpose(x) + x


def test_reverse_mode_runs_the_rule_not_the_primal():
    assert why_not(calls_wrong, (True,)) is None
    np.testing.assert_allclose(td.grad(calls_wrong)(np.array([0.5, 2.0])), [2.5, 7.0], rtol=1e-15)
    np.testing.assert_allclose(td.grad(calls_wrong)(np.array([0.5, 2.0])), td.jacfwd(calls_wrong)(np.array([0.5, 2.0])))


# --- break: a flag the rest of the loop tests (NOTE: [Break as a flag]) ------------------------------------
@ti.func
def breaks(x: vec2) -> ti.f64:
    s = x[0]
    for _ in range(10):
        s = s * x[1] + 0.5
        if s > 2.0:
            break
    return s


def breaks_twin(x):
    s, path = x[0], []
    for _ in range(10):
        s = s * x[1] + 0.5
        path.append(bool(s > 2.0))
        if path[-1]:
            break
    return s, path


@ti.func
def breaks_at_run_time(x: vec2, n: ti.i32) -> ti.f64:
    s = x[0]
    for i in range(n):
        if s * x[1] < -3.0:
            s = s - 1.0
            break
        s = ti.sin(s) * x[1] + 0.3 * i
    return s


def breaks_at_run_time_twin(x, n):
    s, path = x[0], []
    for i in range(n):
        path.append(bool(s * x[1] < -3.0))
        if path[-1]:
            s = s - 1.0
            break
        s = torch.sin(s) * x[1] + 0.3 * i
    return s, path


@ti.func
def while_breaking(x: vec2) -> ti.f64:
    s, k = x[0], 0
    while k < 40:
        s = s * 0.5 + x[1] * x[1]
        if ti.abs(s - x[1] * x[1] * 2.0) < 1e-3:
            break
        k += 1
    return s * x[0]


def while_breaking_twin(x):
    s, k, path = x[0], 0, []
    while k < 40:
        s = s * 0.5 + x[1] * x[1]
        path.append(bool(abs(s - x[1] * x[1] * 2.0) < 1e-3))
        if path[-1]:
            break
        k += 1
    return s * x[0], path


@ti.func
def inner_breaks(x: vec2, n: ti.i32) -> ti.f64:
    s = x[0]
    for i in range(n):
        for j in range(n):
            if j > i:
                break
            s = ti.sin(s) * x[1] + ti.cos(s) * 0.25
        if s > 1.5:
            break
    return s


def inner_breaks_twin(x, n):
    s, path = x[0], []
    for i in range(n):
        for j in range(n):
            if j > i:
                break
            s = torch.sin(s) * x[1] + torch.cos(s) * 0.25
        path.append(bool(s > 1.5))
        if path[-1]:
            break
    return s, path


@ti.func
def breaks_r(x: vec2) -> ti.f64:
    return breaks(reverse_only2(x))


@ti.func
def breaks_at_run_time_r(x: vec2, n: ti.i32) -> ti.f64:
    return breaks_at_run_time(reverse_only2(x), n)


@ti.func
def while_breaking_r(x: vec2) -> ti.f64:
    return while_breaking(reverse_only2(x))


@ti.func
def inner_breaks_r(x: vec2, n: ti.i32) -> ti.f64:
    return inner_breaks(reverse_only2(x), n)


BREAKING = [(breaks, breaks_r, breaks_twin, False), (breaks_at_run_time, breaks_at_run_time_r,
            breaks_at_run_time_twin, True), (while_breaking, while_breaking_r, while_breaking_twin, False),
            (inner_breaks, inner_breaks_r, inner_breaks_twin, True)]


@pytest.mark.parametrize("f, f_r, twin, counted", BREAKING, ids=lambda v: getattr(v, "__name__", ""))
@settings(max_examples=8)
@given(seed=st.integers(0, 2**31))
def test_loops_that_break_are_reversed(f, f_r, twin, counted, seed):
    """Reversed (through the rule without a jvp rule) and pushed forward (the plain function) agree with torch
    per element, where the loops break at different iterations across the batch, and with central
    differences where no decision changes within the stencil."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2.0, 2.0, (6, 2))
    x[0] = [0.5, 1.5]  # breaks early
    n = np.array([0, 1, 3, 5, 8, 12], dtype=np.int32)
    args = (x, n) if counted else (x,)
    assert why_not(f, (True,) + (False,) * (len(args) - 1)) is None
    assert f"{f.__name__}_vjp(" in td.source(td.grad(f_r), *args)
    got = td.grad(f_r)(*args)
    np.testing.assert_allclose(got, td.grad(f)(*args), rtol=1e-12, atol=1e-13)
    for b in range(len(x)):
        static = (int(n[b]),) if counted else ()
        np.testing.assert_allclose(got[b], torch_grad(twin, x[b], *static), rtol=1e-10, atol=1e-12)
        fd = central_differences(twin, x[b], *static)
        if fd is not None:
            np.testing.assert_allclose(got[b], fd, rtol=1e-5, atol=1e-6)


@ti.func
def counter_reused(x):
    y = x
    i = 2.0 * x
    if x > 0.0:
        i = x * 3.0
        y = y * i
        for i in ti.static(range(3)):
            y = y * x + 0.1 * i
    return y


@ti.func
def counter_reused_r(x: vec2) -> ti.f64:
    y = reverse_only2(x)
    return counter_reused(y[0]) + y[1]


def test_a_variable_assigned_then_an_unrolled_counter_inside_a_branch_is_reversed():
    """Taichi scopes a static loop's counter to the loop (the outer `i` is itself again after it): the reverse
    transform restores it after the unrolled copies, so this is reversed, and right on both sides of the
    branch: 3x^5 + 0.1x + 0.2 for x > 0 (derivative 15x^4 + 0.1), x otherwise."""
    assert why_not(counter_reused, (True,)) is None
    x = np.array([[0.5, 2.0], [-0.7, 1.0], [1.3, -0.5]])
    want = np.stack([np.where(x[:, 0] > 0, 15 * x[:, 0] ** 4 + 0.1, 1.0), np.ones(3)], axis=-1)
    np.testing.assert_allclose(td.grad(counter_reused_r)(x), want, rtol=1e-13)


def test_a_loop_without_derivatives_keeps_no_tape(monkeypatch):
    monkeypatch.setattr(control, "TAPE_ROWS", ROWS)

    @ti.func
    def counted_here(x: vec2, n: ti.i32) -> ti.f64:  # made while loops keep tapes
        c = 0.0
        for _ in range(n):
            c += 1.0  # carries no derivative: the loop needs no tape
        return x[0] * c + x[1]

    x, n = np.array([[0.3, -0.2], [0.1, 0.05]]), np.array([2, 5], dtype=np.int32)
    assert why_not(counted_here, (True, False)) is None
    assert "tape_of" not in td.source(td.grad(counted_here), x, n)
    np.testing.assert_array_equal(td.grad(counted_here)(x, n), [[2.0, 1.0], [5.0, 1.0]])


def test_torch_gradcheck_and_gradgradcheck_through_a_loop_and_branches():
    op = td.torch.function(stepped)
    x = torch.tensor(draw_vec3(np.random.default_rng(7), 3), requires_grad=True)
    n = torch.tensor([0, 2, 5], dtype=torch.int32)
    assert torch.autograd.gradcheck(lambda t: op(t, n), (x,))
    assert torch.autograd.gradgradcheck(lambda t: op(t, n), (x,))
    pw = td.torch.function(piecewise)
    assert torch.autograd.gradcheck(pw, (x,))
    assert torch.autograd.gradgradcheck(pw, (x,))


@ti.func
def picked(x: vec2) -> ti.f64:
    a = ti.sin(x[0]) * x[1] if x[0] > 0.0 else x[0] ** 2  # a conditional expression: the side the test takes
    return a * (x[1] ** 3 if x[1] < 0.5 else ti.exp(x[1]))


def _picked_twin(x):
    a = torch.sin(x[0]) * x[1] if x[0] > 0.0 else x[0] ** 2
    return a * (x[1] ** 3 if x[1] < 0.5 else torch.exp(x[1]))


@pytest.mark.parametrize("x", [[0.4, -0.3], [-0.6, 0.9], [1.1, 0.2], [-0.2, -1.3]])
def test_a_conditional_expression_is_reversed_as_a_branch(x):
    assert why_not(picked, (True,)) is None
    x = np.array(x)
    xt = torch.tensor(x)
    np.testing.assert_allclose(td.grad(picked)(x), torch.autograd.functional.jacobian(_picked_twin, xt).numpy(),
                               rtol=1e-13)
    np.testing.assert_allclose(td.hessian(picked)(x), torch.autograd.functional.hessian(_picked_twin, xt).numpy(),
                               rtol=1e-12, atol=1e-14)


@ti.func
def carried_products(x: vec3, n: ti.i32) -> ti.f64:
    h = 0.0
    s = 0.0
    for i in range(n):
        h = h + ti.sin(x[i % 3]) * x[(i + 1) % 3]
        s += h * h * x[i % 3]
    return s


def carried_products_twin(x, n):
    h, s = torch.zeros((), dtype=T), torch.zeros((), dtype=T)
    for i in range(n):
        h = h + torch.sin(x[i % 3]) * x[(i + 1) % 3]
        s = s + h * h * x[i % 3]
    return s, []


@ti.func
def carried_products_r(x: vec3, n: ti.i32) -> ti.f64:
    return carried_products(reverse_only3(x), n)


@given(st.integers(0, 2**31))
def test_an_accumulating_loop_whose_adjoint_reads_a_carried_value_through_a_product(seed):
    """The adjoint of ``h * h`` is ``sum_to(ct * h, h)`` with both ``h`` one node object of the generated code:
    the check for loops whose adjoint reads no carried value (NOTE: [Loops whose adjoint reads no carried
    value]) skipped both as the type-only argument, and the reverse sweep read the final ``h`` in every
    iteration (td.grad 2.64 where torch gives 1.32)."""
    rng = np.random.default_rng(seed)
    x, n = rng.uniform(-1.5, 1.5, (5, 3)), np.array([0, 1, 2, 5, 9], dtype=np.int32)
    got = td.grad(carried_products_r)(x, n)
    assert "carried_products_vjp(" in td.source(td.grad(carried_products_r), x, n)  # reverse mode, no pushes
    np.testing.assert_allclose(td.grad(carried_products)(x, n), got, rtol=1e-12, atol=1e-13)  # forward pushes
    for b in range(len(x)):
        np.testing.assert_allclose(got[b], torch_grad(carried_products_twin, x[b], int(n[b])), rtol=1e-10,
                                   atol=1e-12)


SCALES = (0.5, 2.0, -1.5)


@ti.func
def over_static_tuples(x: ti.types.vector(3, ti.f64)) -> ti.f64:
    s = 0.0
    for c in ti.static(SCALES):  # static loops over Python tuples of numbers: unrolled, the entry a constant
        s += ti.sin(c * x[0]) * x[1] + c * x[2] ** 2
    for k in ti.static((0, 2)):
        s += x[k] * x[1]
    return s


def torch_over_static_tuples(x):
    s = sum(torch.sin(c * x[0]) * x[1] + c * x[2] ** 2 for c in SCALES)
    return s + sum(x[k] * x[1] for k in (0, 2))


def test_static_loops_over_tuples_are_reversed():
    """They were refused by the reverse transform (a `For` over a non-range), so grad pushed tangents forward."""
    assert why_not(over_static_tuples, (True,)) is None
    x = np.array([0.3, -0.7, 1.1])
    want = torch.autograd.functional.jacobian(torch_over_static_tuples, torch.tensor(x)).numpy()
    np.testing.assert_allclose(td.jacrev(over_static_tuples)(x), want, rtol=1e-13)
