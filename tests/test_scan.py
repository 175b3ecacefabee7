"""td.scan: a checkpointed time loop against the stored trajectory (ti.ad.Tape and tidiff's own
program over a (T+1, n) field), central differences, forward against reverse, every checkpoint count."""
import math

import hypothesis.strategies as st
import numpy as np
import pytest
import taichi as ti
from hypothesis import given, settings
from taichi.lang import impl

if impl.get_runtime().prog is None:
    ti.init(arch=ti.cpu, default_fp=ti.f64)

from mass_spring import MassSpring, Trajectory  # noqa: E402

import tidiff as td  # noqa: E402

N, T = 6, 12
RTOL = 1e-10


@pytest.fixture(scope="module")
def system():
    return MassSpring(N)


@pytest.fixture(scope="module")
def trajectory():
    return Trajectory(N, T)


@pytest.fixture(scope="module")
def step(system):
    return system.step_function(td)


@pytest.fixture(scope="module")
def loss(system):
    return system.loss_function(td)


def loops(step, loss, checkpoints):
    return td.compose(loss, td.scan(step, T, checkpoints=checkpoints))


@pytest.mark.parametrize("checkpoints", [1, T, math.isqrt(T), 5, None], ids=lambda k: f"K={k}")
def test_gradient_equals_the_stored_trajectory(system, trajectory, step, loss, checkpoints):
    args = system.arguments()
    value, *tape_grads = trajectory.tape_gradients(*args)
    F = loops(step, loss, checkpoints)
    got_value, got = td.value_and_grad(F, argnums=(0, 1, 2))(*args)
    np.testing.assert_allclose(got_value, value, rtol=RTOL)
    for g, r in zip(got, tape_grads, strict=True):
        np.testing.assert_allclose(g, r, rtol=RTOL, atol=1e-12)
    program_grads = td.grad(trajectory.program(td), argnums=(0, 1, 2))(*args)
    for g, r in zip(got, program_grads, strict=True):
        np.testing.assert_allclose(g, r, rtol=RTOL, atol=1e-12)


@settings(max_examples=12)  # each new (length, segment) pair compiles the step over buffers of its own
@given(st.integers(1, 9), st.data())
def test_any_length_and_checkpoint_count_give_the_same_vjp(system, step, length, data):
    checkpoints = data.draw(st.integers(1, length), label="checkpoints")
    args = system.arguments(seed=length)
    cts = (np.linspace(-1, 1, 2 * N).reshape(N, 2), np.full((N, 2), 0.3))
    full = td.vjp(td.scan(step, length, checkpoints=length), *args)[1](cts)
    got = td.vjp(td.scan(step, length, checkpoints=checkpoints), *args)[1](cts)
    for g, r in zip(got, full, strict=True):
        np.testing.assert_allclose(g, r, rtol=RTOL, atol=1e-13)


def test_central_differences(system, step, loss):
    F = loops(step, loss, 3)
    args = system.arguments(seed=1)
    grads = td.grad(F, argnums=(0, 1, 2))(*args)
    eps = 1e-6
    for a, g in enumerate(grads):
        flat = np.zeros(np.size(args[a]))
        for p in range(flat.size):
            e = np.zeros(flat.size)
            e[p] = eps
            plus = [np.array(x, copy=True) for x in args]
            minus = [np.array(x, copy=True) for x in args]
            plus[a] = plus[a] + e.reshape(np.shape(args[a]))
            minus[a] = minus[a] - e.reshape(np.shape(args[a]))
            flat[p] = (F(*plus) - F(*minus)) / (2 * eps)
        np.testing.assert_allclose(g, flat.reshape(np.shape(g)), rtol=1e-6, atol=1e-8)


def test_forward_mode_agrees_with_reverse_mode(system, step):
    """The dot-product test: <jvp(t), c> == <t, vjp(c)>, tangents on every input."""
    sim = td.scan(step, T, checkpoints=4)
    args = system.arguments(seed=2)
    rng = np.random.default_rng(3)
    tangents = tuple(rng.normal(size=np.shape(a)) for a in args)
    cts = (rng.normal(size=(N, 2)), rng.normal(size=(N, 2)))
    outs, touts = td.jvp(sim, args, tangents)
    outs_r, vjp_fn = td.vjp(sim, *args)
    grads = vjp_fn(cts)
    for o, r in zip(outs, outs_r, strict=True):
        np.testing.assert_array_equal(o, r)
    lhs = sum(np.vdot(t, c) for t, c in zip(touts, cts, strict=True))
    rhs = sum(np.vdot(t, g) for t, g in zip(tangents, grads, strict=True))
    np.testing.assert_allclose(lhs, rhs, rtol=RTOL)


def test_hvp_is_the_derivative_of_the_gradient(system, step, loss):
    F = loops(step, loss, 3)
    x0, v0, k0 = system.arguments(seed=4)
    direction = np.random.default_rng(5).normal(size=k0.shape)
    _, hv = td.hvp(F, (x0, v0, k0), (np.zeros_like(x0), np.zeros_like(v0), direction))
    eps = 1e-5
    g = td.grad(F, argnums=2)
    central = (g(x0, v0, k0 + eps * direction) - g(x0, v0, k0 - eps * direction)) / (2 * eps)
    np.testing.assert_allclose(hv[2], central, rtol=1e-6, atol=1e-9)
    H = td.hessian(F, argnums=2)(x0, v0, k0)
    np.testing.assert_allclose(H, H.T, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(H @ direction, hv[2], rtol=1e-9, atol=1e-12)


def test_an_integer_carry_indexes_a_parameter_table():
    """A step index as an integer carry: each step reads its row of a (T, n) control table."""
    n, steps = 3, 5
    x, x_next = ti.field(ti.f64, n), ti.field(ti.f64, n)
    t, t_next = ti.field(ti.i32, ()), ti.field(ti.i32, ())
    control = ti.field(ti.f64, (steps, n))

    @ti.kernel
    def move():
        for i in x:
            x_next[i] = x[i] + ti.sin(x[i]) * control[t[None], i]

    @ti.kernel
    def tick():
        t_next[None] = t[None] + 1

    def step():
        move()
        tick()

    sim = td.scan(td.function(step, inputs=[x, t, control], outputs=[x_next, t_next]), steps, checkpoints=2)
    x0, table = np.linspace(0.1, 0.9, n), np.random.default_rng(0).normal(size=(steps, n))

    def reference(x0, table):
        for s in range(steps):
            x0 = x0 + np.sin(x0) * table[s]
        return x0

    xT, tT = sim(x0, 0, table)
    np.testing.assert_allclose(xT, reference(x0, table), rtol=1e-14)
    assert tT == steps
    g_x, g_t, g_table = td.vjp(sim, x0, 0, table)[1]((np.ones(n), 0))
    assert g_t is None
    eps = 1e-6
    central = np.zeros((steps, n))
    for s in range(steps):
        for i in range(n):
            e = np.zeros((steps, n))
            e[s, i] = eps
            central[s, i] = (reference(x0, table + e).sum() - reference(x0, table - e).sum()) / (2 * eps)
    np.testing.assert_allclose(g_table, central, rtol=1e-7)
    _, (dxT, dtT) = td.jvp(sim, (x0, 0, table), (np.zeros(n), None, np.ones((steps, n))))
    np.testing.assert_allclose(dxT.sum(), g_table.sum(), rtol=RTOL)
    assert not np.any(dtT)


def test_a_ti_func_step_runs_on_the_host():
    @ti.func
    def pendulum(q: ti.math.vec2, g: ti.f64) -> ti.math.vec2:
        return ti.Vector([q[0] + 0.1 * q[1], q[1] - 0.1 * g * ti.sin(q[0] + 0.1 * q[1])])

    sim = td.scan(pendulum, 20, checkpoints=6)

    def reference(q, g):
        for _ in range(20):
            a = q[0] + 0.1 * q[1]
            q = np.array([a, q[1] - 0.1 * g * np.sin(a)])
        return q

    q0 = np.array([0.3, -0.2])
    np.testing.assert_allclose(sim(q0, 9.8), reference(q0, 9.8), rtol=1e-14)
    J = td.jacrev(sim, argnums=(0, 1))(q0, 9.8)
    eps = 1e-6
    central_q = np.stack([(reference(q0 + eps * e, 9.8) - reference(q0 - eps * e, 9.8)) / (2 * eps)
                          for e in np.eye(2)], 1)
    np.testing.assert_allclose(J[0], central_q, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(J[1], (reference(q0, 9.8 + eps) - reference(q0, 9.8 - eps)) / (2 * eps), rtol=1e-7)
    np.testing.assert_allclose(td.jacfwd(sim, argnums=(0, 1))(q0, 9.8)[0], J[0], rtol=1e-12)
    _, vjp_fn = td.vjp(sim, q0, 9.8)
    dq0, dg = vjp_fn(np.array([1.0, 0.0]))
    # every cotangent an array of its argument's shape, the parameter's (summed over steps) too
    assert [(type(c), c.shape, c.dtype) for c in (dq0, dg)] == [(np.ndarray, (2,), np.float64),
                                                              (np.ndarray, (), np.float64)]
    np.testing.assert_allclose(dg, J[1][0], rtol=1e-12)


def test_user_fields_untouched_and_no_state_between_calls(system, step, loss):
    F = loops(step, loss, None)
    args = system.arguments(seed=6)
    before = [f.to_numpy() for f in (system.x, system.v, system.k, system.force, system.x_next)]
    first = td.value_and_grad(F, argnums=2)(*args)
    system.force.fill(123.0)  # a stale accumulator: declared state, so it does not matter
    second = td.value_and_grad(F, argnums=2)(*args)
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
    system.force.fill(0.0)
    after = [f.to_numpy() for f in (system.x, system.v, system.k, system.force, system.x_next)]
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_second_call_compiles_nothing(system, step):
    sim = td.scan(step, 7, checkpoints=3, name="scan_cache_probe")
    args = system.arguments(seed=7)
    vjp_fn = td.vjp(sim, *args)[1]
    vjp_fn((np.ones((N, 2)), np.ones((N, 2))))
    compiles = td.cache_info()["vjp(scan_cache_probe)"].compiles
    args = system.arguments(seed=8)
    td.vjp(sim, *args)[1]((np.ones((N, 2)), np.zeros((N, 2))))
    info = td.cache_info()["vjp(scan_cache_probe)"]
    assert info.compiles == compiles and info.hits >= 2


def test_written_fields_are_reset_before_each_step():
    """A field the step writes but does not declare is put back before every step: each step is one call."""
    x, x_next, scratch = ti.field(ti.f64, 2), ti.field(ti.f64, 2), ti.field(ti.f64, 2)
    scratch.from_numpy(np.array([1.0, 2.0]))

    @ti.kernel
    def step():
        for i in x:
            scratch[i] += x[i]
            x_next[i] = scratch[i] * x[i]

    one = td.function(step, inputs=[x], outputs=[x_next])
    sim = td.scan(one, 4, checkpoints=2)
    x0 = np.array([0.5, -0.3])
    expected = x0
    for _ in range(4):
        expected = one(expected)
    np.testing.assert_allclose(sim(x0), expected, rtol=1e-14)
    eps = 1e-6
    central = [(sim(x0 + eps * e).sum() - sim(x0 - eps * e).sum()) / (2 * eps) for e in np.eye(2)]
    np.testing.assert_allclose(td.vjp(sim, x0)[1](np.ones(2))[0], central, rtol=1e-7)


# --- errors -------------------------------------------------------------------------------------
def test_bad_arguments_name_what_was_wrong(step, system):
    with pytest.raises(ValueError, match="length must be a positive integer, got 0"):
        td.scan(step, 0)
    with pytest.raises(TypeError, match="length must be a positive integer, got 2.5"):
        td.scan(step, 2.5)
    with pytest.raises(ValueError, match="checkpoints must be at most length \\(4\\), got 5"):
        td.scan(step, 4, checkpoints=5)
    with pytest.raises(ValueError, match="checkpoints must be a positive integer or None, got 0"):
        td.scan(step, 4, checkpoints=0)
    with pytest.raises(TypeError, match="td.scan.*expected a td.Function or a @ti.func"):
        td.scan(system.step, 4)
    sim = td.scan(step, 3)
    with pytest.raises(ValueError, match="takes no batch dims"):
        sim(np.ones((2, N, 2)), np.zeros((N, 2)), np.ones(system.n_springs))


def test_a_step_whose_outputs_are_not_its_carry_is_refused(system):
    scalar = td.function(system.final_loss, inputs=[system.x, system.v], outputs=[system.loss])
    with pytest.raises(ValueError, match=r"output 0 \('loss'.*input 0 \('x'.*must have its shape"):
        td.scan(scalar, 3)

    @ti.func
    def widen(a: ti.f64) -> ti.math.vec2:
        return ti.Vector([a, a])

    with pytest.raises(ValueError, match="output 0"):
        td.scan(widen, 3)


def test_compose_checks_the_wiring(system, step, loss):
    with pytest.raises(ValueError, match="f has 1 outputs but g takes 2 arguments"):
        td.compose(loss, loss)
    with pytest.raises(TypeError, match="td.compose"):
        td.compose(loss, system.step)


def test_a_loop_composed_with_itself():
    """compose(sim, sim): the outer pullback finds its checkpoints overwritten by the inner one's and takes them
    again; the result is the loop of twice the length."""
    q, p, q_next, p_next = (ti.field(ti.f64, 3) for _ in range(4))

    @ti.kernel
    def leapfrog():
        for i in q:
            p_next[i] = p[i] - 0.1 * ti.sin(q[i])
            q_next[i] = q[i] + 0.1 * p_next[i]

    step = td.function(leapfrog, inputs=[q, p], outputs=[q_next, p_next])
    sim = td.scan(step, 4, checkpoints=2)
    twice, longer = td.compose(sim, sim), td.scan(step, 8, checkpoints=3)
    args = (np.array([0.3, -1.0, 2.0]), np.array([0.1, 0.0, -0.4]))
    np.testing.assert_array_equal(twice(*args)[0], longer(*args)[0])
    cts = (np.ones(3), np.array([0.5, -1.0, 2.0]))
    for g, r in zip(td.vjp(twice, *args)[1](cts), td.vjp(longer, *args)[1](cts), strict=True):
        np.testing.assert_allclose(g, r, rtol=RTOL, atol=1e-13)
