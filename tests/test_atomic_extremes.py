"""``ti.atomic_max`` / ``ti.atomic_min`` in kernels: the derivative goes to the winner, ties split evenly
(NOTE: [Atomic extremes in reverse]).

The oracle is torch's ``amax`` / ``amin`` (which split a tie evenly) over the same candidates, float64;
central differences where no two candidates are within the stencil. Taichi's own ``kernel.grad`` gives
every iteration the whole gradient.
"""
import warnings

import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tidiff as td
from tidiff._adjoint.kernels import KernelAdjoint, vjp_kernel

N = 6
xs = ti.field(ti.f64, shape=N)
w = ti.field(ti.f64, shape=())
peak = ti.field(ti.f64, shape=())
lows = ti.field(ti.f64, shape=2)


@ti.kernel
def seed_extremes():
    peak[None] = 3.0 * w[None]  # the old value: it wins where every iteration is below it
    for j in lows:
        lows[j] = w[None] + 1.0


@ti.kernel
def extremes():
    for i in xs:
        ti.atomic_max(peak[None], ti.sin(xs[i]) * 2.0)
        if xs[i] > -1.0:
            ti.atomic_min(lows[i % 2], xs[i] * xs[i])


def program():
    seed_extremes()
    extremes()


F = td.function(program, inputs=[xs, w], outputs=[peak, lows])


def twin(x, wv):
    peak_ = torch.amax(torch.cat([(3.0 * wv).reshape(1), torch.sin(x) * 2.0]))
    lows_ = []
    for j in range(2):
        candidates = [wv + 1.0] + [x[i] * x[i] for i in range(j, N, 2) if x[i] > -1.0]
        lows_.append(torch.amin(torch.stack(candidates)))
    return peak_, torch.stack(lows_)


def torch_vjp(x, wv, ct_peak, ct_lows):
    x_ = torch.tensor(x, requires_grad=True)
    w_ = torch.tensor(wv, dtype=torch.float64, requires_grad=True)
    peak_, lows_ = twin(x_, w_)
    (peak_ * ct_peak + (lows_ * torch.tensor(ct_lows)).sum()).backward()
    return x_.grad.numpy(), w_.grad.numpy()


# a few values, so that iterations tie often; w away from them (a tie with the old value goes to the iteration)
VALUES = st.sampled_from([-1.3, -0.7, 0.3, 0.45, 1.1, 1.6])


@settings(max_examples=30)
@given(x=st.lists(VALUES, min_size=N, max_size=N).map(np.array), wv=st.floats(-0.9, 0.9),
       ct=st.tuples(st.floats(-2, 2), st.floats(-2, 2), st.floats(-2, 2)))
def test_the_winner_gets_the_derivative_and_ties_split_as_torch(x, wv, ct):
    ct_peak, ct_lows = np.float64(ct[0]), np.array(ct[1:])
    values, vjp_fn = td.vjp(F, x, np.float64(wv))
    want = twin(torch.tensor(x), torch.tensor(wv, dtype=torch.float64))
    np.testing.assert_allclose(values[0], want[0].item(), rtol=1e-15)
    np.testing.assert_allclose(values[1], want[1].numpy(), rtol=1e-15)
    gx, gw = vjp_fn((ct_peak, ct_lows))
    tx, tw = torch_vjp(x, wv, ct_peak, ct_lows)
    np.testing.assert_allclose(gx, tx, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(gw, tw, rtol=1e-13, atol=1e-15)


def test_against_central_differences_where_nothing_ties():
    x, wv = np.array([0.2, -0.5, 1.2, 0.6, -1.4, 0.9]), 0.1
    ct = (np.float64(0.7), np.array([1.3, -0.4]))

    def pairing(z, v):
        p, lo = F(z, v)
        return ct[0] * p + ct[1] @ lo

    gx, gw = td.vjp(F, x, np.float64(wv))[1](ct)
    eps = 1e-6
    central = [(pairing(x + eps * e, wv) - pairing(x - eps * e, wv)) / (2 * eps) for e in np.eye(N)]
    np.testing.assert_allclose(gx, central, rtol=1e-8, atol=1e-9)
    assert gw == pytest.approx((pairing(x, wv + eps) - pairing(x, wv - eps)) / (2 * eps), rel=1e-8, abs=1e-9)


def test_the_old_value_keeps_the_derivative_where_no_iteration_wins():
    """peak starts at 3w = 2.7 > 2 sin(x) for every x; lows start at w + 1 = 1.9 < every x^2 = 4: dw = 3 + 1 + 1."""
    x = np.full(N, 2.0)
    gx, gw = td.vjp(F, x, np.float64(0.9))[1]((np.float64(1.0), np.ones(2)))
    np.testing.assert_array_equal(gx, np.zeros(N))
    assert gw == 5.0


def test_the_transform_takes_the_kernel_and_leaves_no_counts_behind():
    assert isinstance(vjp_kernel(extremes), KernelAdjoint)
    x = np.array([0.3, 0.3, 0.3, 0.3, 0.3, 0.3])  # six-way tie for the peak, three-way for each low
    first = td.vjp(F, x, np.float64(0.0))[1]((np.float64(1.0), np.ones(2)))
    again = td.vjp(F, x, np.float64(0.0))[1]((np.float64(1.0), np.ones(2)))
    np.testing.assert_allclose(first[0], 2 * np.cos(0.3) / 6 + 2 * 0.3 / 3, rtol=1e-14)
    np.testing.assert_array_equal(first[0], again[0])


@ti.kernel
def max_and_add():
    for i in xs:
        peak[None] += xs[i]
        ti.atomic_max(peak[None], xs[i])  # the order of the two is a race: no derivative to give


def test_a_field_also_written_otherwise_is_refused_in_both_modes():
    assert "besides ti.atomic_max" in str(vjp_kernel(max_and_add))
    G = td.function(max_and_add, inputs=[xs], outputs=[peak])
    with pytest.raises(td.TransformError, match="ti.atomic_max"):
        td.grad(G)(np.ones(N))  # Taichi's kernel.grad would give every iteration the whole gradient
    with pytest.raises(td.TransformError, match=r"does not take `max_and_add` \(.*besides ti.atomic_max"):
        td.vjp(G, np.ones(N))[1](np.array(1.0))  # reverse mode says why tidiff's transform does not take it
    with pytest.raises(td.TransformError, match=r"the field `peak`, read or written besides ti.atomic_max"):
        td.jvp(G, (np.ones(N),), (np.ones(N),))


@ti.kernel
def seeded_in_one_kernel():
    peak[None] = 3.0 * w[None]  # statements and loops before the atomics' loop give the old values
    for j in lows:
        lows[j] = w[None] + 1.0
    for i in xs:
        ti.atomic_max(peak[None], ti.sin(xs[i]) * 2.0)
        if xs[i] > -1.0:
            ti.atomic_min(lows[i % 2], xs[i] * xs[i])


ONE_KERNEL = td.function(seeded_in_one_kernel, inputs=[xs, w], outputs=[peak, lows])


@settings(max_examples=30)
@given(x=st.lists(VALUES, min_size=N, max_size=N).map(np.array), wv=st.floats(-0.9, 0.9),
       t=st.lists(st.floats(-2, 2), min_size=N + 1, max_size=N + 1).map(np.array),
       F=st.sampled_from([F, ONE_KERNEL]))
def test_forward_mode_gives_the_winners_tangent_as_torch_and_transposes_reverse_mode(x, wv, t, F):
    tx, tw = t[:N], np.float64(t[N])
    values, tangents = td.jvp(F, (x, np.float64(wv)), (tx, tw))
    _, want = torch.func.jvp(twin, (torch.tensor(x), torch.tensor(wv, dtype=torch.float64)),
                             (torch.tensor(tx), torch.tensor(tw, dtype=torch.float64)))
    np.testing.assert_allclose(tangents[0], want[0].item(), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(tangents[1], want[1].numpy(), rtol=1e-13, atol=1e-15)
    ct = (np.float64(0.7), np.array([1.3, -0.4]))
    gx, gw = td.vjp(F, x, np.float64(wv))[1](ct)
    assert gx @ tx + gw * tw == pytest.approx(ct[0] * tangents[0] + ct[1] @ tangents[1], rel=1e-12, abs=1e-14)


@settings(max_examples=20)
@given(x=st.lists(VALUES, min_size=N, max_size=N).map(np.array), wv=st.floats(-0.9, 0.9))
def test_old_values_set_in_the_atomics_kernel(x, wv):
    """The way a reduction is usually written: the old value set in the kernel itself, then the atomics (was
    refused: the field written besides the atomics). Forward mode: the test below."""
    assert isinstance(vjp_kernel(seeded_in_one_kernel), KernelAdjoint)
    ct = (np.float64(0.7), np.array([1.3, -0.4]))
    gx, gw = td.vjp(ONE_KERNEL, x, np.float64(wv))[1](ct)
    tx_, tw_ = torch_vjp(x, wv, *ct)
    np.testing.assert_allclose(gx, tx_, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(gw, tw_, rtol=1e-13, atol=1e-15)


@ti.kernel
def overwritten_after_the_atomics():
    for i in xs:
        ti.atomic_max(peak[None], xs[i])
    peak[None] = peak[None] * 2.0  # the adjoint would read this, not what won


def test_a_write_after_the_atomics_loop_is_refused_in_both_modes():
    assert "besides ti.atomic_max" in str(vjp_kernel(overwritten_after_the_atomics))
    G = td.function(overwritten_after_the_atomics, inputs=[xs], outputs=[peak])
    with pytest.raises(td.TransformError, match="ti.atomic_max"):
        td.grad(G)(np.ones(N))
    with pytest.raises(td.TransformError, match=r"the field `peak`, read or written besides ti.atomic_max"):
        td.jvp(G, (np.ones(N),), (np.ones(N),))


energy = ti.field(ti.f64, shape=())


@ti.kernel
def combine():
    energy[None] = peak[None] + 2.0 * lows[0] + 3.0 * lows[1]  # a later kernel reads what won


def energy_program():
    program()
    combine()


def energy_in_one_kernel():
    seeded_in_one_kernel()
    combine()


E = td.function(energy_program, inputs=[xs, w], outputs=[energy])
E_ONE_KERNEL = td.function(energy_in_one_kernel, inputs=[xs, w], outputs=[energy])


@settings(max_examples=10)
@given(x=st.lists(VALUES, min_size=N, max_size=N).map(np.array), wv=st.floats(-0.9, 0.9),
       E=st.sampled_from([E, E_ONE_KERNEL]))
def test_hessian_is_the_winners_split_as_torch(x, wv, E):
    def energy_twin(xt):
        p, lo = twin(xt, torch.tensor(wv, dtype=torch.float64))
        return p + 2.0 * lo[0] + 3.0 * lo[1]

    want = torch.autograd.functional.hessian(energy_twin, torch.tensor(x)).numpy()
    np.testing.assert_allclose(td.hessian(E)(x, np.float64(wv)), want, rtol=1e-13, atol=1e-15)
    v = np.linspace(-1.0, 1.0, N)
    np.testing.assert_allclose(td.hvp(E, (x, np.float64(wv)), (v, np.float64(0.0)))[1][0], want @ v,
                               rtol=1e-13, atol=1e-14)


side = ti.field(ti.f64, shape=N)
top = ti.field(ti.f64, shape=())


@ti.kernel
def extreme_beside_writes():
    for i in xs:
        v = ti.Vector([xs[i], 2.0 * xs[i]])
        ti.atomic_sub(side[i], v[1] * v[0])  # a write the loops settling the extreme must not do again
        ti.atomic_max(top[None], v.sum())


def test_forward_mode_does_the_loops_other_writes_once():
    G = td.function(extreme_beside_writes, inputs=[xs], outputs=[side, top])
    x, t = np.array([0.2, -0.5, 1.2, 0.6, -1.4, 0.9]), np.linspace(1.0, 2.0, N)
    (s, m), (ds, dm) = td.jvp(G, (x,), (t,))
    np.testing.assert_allclose(s, -2 * x * x, rtol=1e-15)
    np.testing.assert_allclose(ds, -4 * x * t, rtol=1e-14)
    assert m == 3 * 1.2 and dm == pytest.approx(3 * t[2], rel=1e-14)


pair_top = ti.field(ti.f64, shape=2)


@ti.kernel
def two_sites():
    for i in xs:
        ti.atomic_max(pair_top[i % 2], xs[i])  # two atomics into one field: the winners of both are counted
        ti.atomic_max(pair_top[(i + 1) % 2], 0.5 * xs[i])  # together


def test_two_atomics_into_one_field_share_their_winners():
    G = td.function(two_sites, inputs=[xs], outputs=[pair_top])
    # first: entry 0 is 1.0 three ways, x[0] and x[2] at one site, 0.5 * x[1] at the other; second: entry 1 is
    # 1.0 two ways, x[1] and 0.5 * x[0] (which also wins entry 0 alone)
    x = np.array([1.0, 2.0, 1.0, 0.5, 0.4, 1.6])
    assert sorted(np.concatenate([x[0::2], 0.5 * x[1::2]]))[-3:] == [1.0, 1.0, 1.0]

    def twin(xt):
        return torch.stack([torch.amax(torch.stack([torch.zeros((), dtype=torch.float64)]
                                                   + [xt[i] for i in range(N) if i % 2 == j]
                                                   + [0.5 * xt[i] for i in range(N) if (i + 1) % 2 == j]))
                            for j in range(2)])

    for a in (x, np.array([2.0, 1.0, 0.3, 0.2, 1.0, 0.7])):
        np.testing.assert_allclose(G(a), twin(torch.tensor(a)).numpy(), rtol=1e-15)
        c, t = np.array([1.0, -2.0]), np.linspace(1.0, 2.0, N)
        xt = torch.tensor(a, requires_grad=True)
        (twin(xt) * torch.tensor(c)).sum().backward()
        np.testing.assert_allclose(td.vjp(G, a)[1](c)[0], xt.grad.numpy(), rtol=1e-14)
        _, want = torch.func.jvp(twin, (torch.tensor(a),), (torch.tensor(t),))
        np.testing.assert_allclose(td.jvp(G, (a,), (t,))[1], want.numpy(), rtol=1e-14)


# --- winners found by kept values (NOTE: [Winners by kept values]) ------------------------------------------------
# The element function of conformance-net seed 23 (generated code): under Taichi's default fast_math, its value
# computed again in a later loop differed in its last bits from the value the atomic compared, no iteration
# seemed to win, and both modes gave the derivative to the old value.
@ti.func
def generated(x0: ti.f64, x1: ti.f64):
    t0 = ti.cast(ti.sqrt(ti.exp(ti.tanh(ti.Matrix([[x1, x0, x0], [x0, x1, x1]])) * 2.0) ** 2 + 0.5), ti.f64)
    t1 = (ti.pow(ti.pow(ti.Vector([x1]), 2), 3) / (abs(ti.Vector([x1]) * 0.4) ** 2 + 1.0))
    t0[0, 0] = ti.f64(ti.abs(x0))
    t1 += ((ti.asin(ti.tanh(x0) * 0.9) ** 2 + 0.5) ** 0.5)
    return ti.select(ti.log((-x0) ** 2 + 1.0) > 0.3,
                     ti.math.dot(ti.math.mix(x1, x0, ti.Vector([x0, x1, x0, x1])),
                                 td.stop_gradient(ti.Vector([x1, x1, x0, x1]))),
                     ti.asin(ti.tanh((x1**2 + 0.5) ** 2.5) * 0.9))


M = 4
gx, gw, gy = (ti.field(ti.f64, shape=M) for _ in range(3))


@ti.kernel
def generated_maxima():
    for i in gx:
        v = generated(gx[i], gw[i])
        ti.atomic_max(gy[i], v)
        ti.atomic_max(gy[(i + 1) % M], v - 0.5)


def torch_generated(x0, x1):
    mixed = x1 * (1 - torch.stack([x0, x1, x0, x1])) + x0 * torch.stack([x0, x1, x0, x1])
    first = torch.dot(mixed, torch.stack([x1, x1, x0, x1]).detach())
    second = torch.asin(torch.tanh((x1**2 + 0.5) ** 2.5) * 0.9)
    return torch.where(torch.log(x0**2 + 1.0) > 0.3, first, second)


def torch_generated_maxima(x, wv):
    f = torch.stack([torch_generated(x[i], wv[i]) for i in range(M)])
    return torch.amax(torch.stack([torch.zeros_like(f), f, torch.roll(f, 1) - 0.5]), dim=0)


def test_winners_are_found_by_the_values_the_atomic_compared():
    G = td.function(generated_maxima, inputs=[gx, gw], outputs=[gy])
    x = np.array([-0.4892357, 0.30257083, -0.6065061, -0.78728267])
    wv = np.array([0.89930957, -0.49486453, -0.28267983, -0.43069295])
    dx, dw = np.cos(np.arange(M)), np.sin(np.arange(M) + 1.0)
    tensors = (torch.tensor(x), torch.tensor(wv))
    want = torch.autograd.functional.jacobian(torch_generated_maxima, tensors)
    np.testing.assert_allclose(td.jvp(G, (x, wv), (dx, dw))[1], want[0].numpy() @ dx + want[1].numpy() @ dw,
                               rtol=1e-10)
    for got, expected in zip(td.jacrev(G, argnums=(0, 1))(x, wv), want):
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-10, atol=1e-14)



# The element function of conformance-net seed 8206: the adjoint's counting loop computed f(x[1], w[1]) one unit
# in the last place above the value the atomic left, and reverse mode gave the whole derivative to the bound set
# before the loop (NOTE: [Winners by kept values]: a value that close counts as the winner).
@ti.func
def generated_norm(x0: ti.f64, x1: ti.f64) -> ti.f64:
    t0 = (ti.tanh(ti.acos(ti.tanh(ti.Matrix([[x1, x1], [x1, x0], [x1, x1]])) * 0.9)) * 2.3)
    for i1 in ti.static(range(1)):
        j2 = 0
        while j2 < 1:
            t0 *= (((x1 ** 2 + 0.5) ** 0.5) * (i1 + 1.0))
            j2 += 1
    return (ti.rsqrt(((t0 ** 2 + 0.5) ** 0.5) ** 2 + 0.5) + 0.7391).norm()


@ti.kernel
def bounded_norm_maxima():
    for i in gx:
        gy[i] = 0.25 * ti.sin(gw[i]) - 0.5
    for j in gx:
        v = generated_norm(gx[j], gw[j])
        ti.atomic_max(gy[j], v)
        ti.atomic_max(gy[(j + 1) % M], v - 0.5)


def torch_bounded_norm_maxima(x, wv):
    f = []
    for x0, x1 in zip(x, wv):
        t0 = torch.tanh(torch.acos(torch.tanh(torch.stack([x1, x1, x1, x0, x1, x1])) * 0.9)) * 2.3
        t0 = t0 * (x1 ** 2 + 0.5) ** 0.5
        f.append(torch.linalg.norm(torch.rsqrt(((t0 ** 2 + 0.5) ** 0.5) ** 2 + 0.5) + 0.7391))
    f = torch.stack(f)
    return torch.amax(torch.stack([0.25 * torch.sin(wv) - 0.5, f, torch.roll(f, 1) - 0.5]), dim=0)


def test_a_winner_computed_again_a_bit_off_still_wins_in_reverse_mode():
    G = td.function(bounded_norm_maxima, inputs=[gx, gw], outputs=[gy])
    x = np.array([0.58179924, 0.42437466, -1.11406733, -1.15887585])
    wv = np.array([0.46003656, 1.06037132, -0.8946626, -0.84594409])
    want = torch.autograd.functional.jacobian(torch_bounded_norm_maxima, (torch.tensor(x), torch.tensor(wv)))
    for got, expected in zip(td.jacrev(G, argnums=(0, 1))(x, wv), want):
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-10, atol=1e-14)
    for got, expected in zip(td.jacfwd(G, argnums=(0, 1))(x, wv), want):
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-10, atol=1e-14)

sx, sw, sy, sz = (ti.field(ti.f64, shape=4) for _ in range(4))
s_loss = ti.field(ti.f64, shape=())


@ti.kernel
def shifted_maxima():
    for i in sx:
        ti.atomic_max(sy[i], sx[i])
        ti.atomic_max(sy[(i + 1) % 4], sx[i] - 0.5)


@ti.kernel
def scale_in_place():
    for i in sy:
        sy[i] = sy[i] * 0.75 + 0.25 * ti.sin(sw[i])


@ti.kernel
def squares_of_neighbours():
    for i in sy:
        sz[i] = sy[i] * ti.cos(sy[(i + 1) % 4])
        s_loss[None] += sz[i] * sz[i]


def maxima_then_in_place():
    shifted_maxima()
    scale_in_place()
    squares_of_neighbours()


def torch_maxima_then_in_place(x, wv):
    y = torch.amax(torch.stack([torch.zeros_like(x), x, torch.roll(x, 1) - 0.5]), dim=0) * 0.75 + 0.25 * torch.sin(wv)
    return ((y * torch.cos(torch.roll(y, -1))) ** 2).sum()


def test_second_order_through_kept_values_and_a_later_in_place_update():
    """Conformance net seed 52: the bits kept in the atomic's loop must not name the target there (the tangent
    program's own tangent refused the loop, and its check then passed a wrong Hessian-vector product). And the
    tangent program's adjoint is exact, with no check (NOTE: [Counts read after the kernel]): its counts, read
    anywhere in the launch, made the access log stop keeping entries, so the in-place update's overwritten
    maxima were lost, the check warned and the product came by forward pushes."""
    H = td.function(maxima_then_in_place, inputs=[sx, sw], outputs=[s_loss])
    rng = np.random.default_rng(0)
    x, wv, dx, dw = (rng.uniform(-1.5, 1.5, 4) for _ in range(4))
    tensors = (torch.tensor(x), torch.tensor(wv))
    _, want = torch.autograd.functional.hvp(torch_maxima_then_in_place, tensors, (torch.tensor(dx), torch.tensor(dw)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        _, got_hv = td.hvp(H, (x, wv), (dx, dw))
    for got, expected in zip(got_hv, want):
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-10, atol=1e-14)
