"""Wrong answers and lost work found in field programs (issue 10 items 5 and 6, issue 13 item 5).

Each test failed before its fix: forward mode through Taichi's FwdMode (an
overwritten output, ti.floor, a norm of a constant zero vector), tangents of
fields that do not depend on an input (NaN), ti.ad.grad_replaced kernels
running on the user's own fields, a failed transform throwing away every
compiled kernel of the process.
"""
import warnings

import numpy as np
import pytest
import taichi as ti
import torch
from taped import tape

import tidiff as td
from tidiff._adjoint.kernels import KernelAdjoint, vjp_kernel

RTOL = 1e-12


def central(f, x, eps=1e-6):
    steps = [e.reshape(x.shape) for e in np.eye(x.size)]
    columns = [(f(x + eps * e) - f(x - eps * e)) / (2 * eps) for e in steps]
    return np.moveaxis(np.array(columns), 0, -1).reshape(np.shape(f(x)) + x.shape)


# --- issue 10 item 6: forward mode is tidiff's tangent program, exact where FwdMode was not -------
a = ti.field(ti.f64, shape=())
b = ti.field(ti.f64, shape=())


@ti.kernel
def write_three():
    b[None] = 3 * a[None]


@ti.kernel
def write_four():
    b[None] = 4 * a[None]


def overwrite():
    write_three()
    write_four()


def test_an_output_overwritten_by_successive_kernels():
    """FwdMode accumulated the tangents of both writes: jvp 7, true 4."""
    F = td.function(overwrite, inputs=[a], outputs=[b])
    assert td.jvp(F, (2.0,), (1.0,)) == (8.0, 4.0)
    assert td.grad(F)(2.0) == 4.0


xf = ti.field(ti.f64, shape=4)
lf = ti.field(ti.f64, shape=())


@ti.kernel
def stairs():
    for i in xf:
        lf[None] += ti.floor(xf[i]) * xf[i] ** 2 + ti.ceil(xf[i]) * xf[i]


def test_floor_and_ceil_in_a_kernel():
    """FwdMode raised Taichi's bare 'Not supported'."""
    F = td.function(stairs, inputs=[xf], outputs=[lf])
    x = np.array([0.3, 1.7, -0.4, 2.5])
    expected = 2 * np.floor(x) * x + np.ceil(x)
    np.testing.assert_allclose(td.grad(F)(x), expected, rtol=RTOL)
    t = np.array([1.0, -2.0, 0.5, 0.25])
    _, tangent = td.jvp(F, (x,), (t,))
    assert tangent == pytest.approx(float(expected @ t), rel=RTOL)
    np.testing.assert_allclose(td.hessian(F)(x), np.diag(2 * np.floor(x)), rtol=RTOL)


n = 3
pos = ti.Vector.field(2, ti.f64, shape=n)
anchor = ti.Vector.field(2, ti.f64, shape=n)  # constant, all zero: its norm has no derivative
rest = ti.field(ti.f64, shape=n)  # computed from constants only: no tangent either
energy = ti.field(ti.f64, shape=())


@ti.kernel
def rest_lengths():
    for i in anchor:
        rest[i] = (anchor[i] - anchor[(i + 1) % n]).norm()


@ti.kernel
def springs():
    for i in pos:
        d = pos[i] - pos[(i + 1) % n]
        energy[None] += (d.norm() - rest[i]) ** 2 + anchor[i].norm() * pos[i].norm_sqr()


def rigid():
    rest_lengths()
    springs()


def test_norm_of_a_constant_zero_vector_gives_finite_tangents():
    """DiffTaichi's rigid body: jvp and hvp were NaN (0/0 in the tangent of |anchor|) where grad was finite."""
    F = td.function(rigid, inputs=[pos], outputs=[energy])
    p = np.array([[0.0, 0.0], [1.0, 0.2], [0.3, 1.1]])
    t = np.array([[0.5, -1.0], [0.25, 0.0], [1.0, 2.0]])
    grad = td.grad(F)(p)
    assert np.isfinite(grad).all()
    _, tangent = td.jvp(F, (p,), (t,))
    assert np.isfinite(tangent) and tangent == pytest.approx(float(np.vdot(grad, t)), rel=1e-10)
    _, (hv,) = td.hvp(F, (p,), (t,))
    assert np.isfinite(hv).all()
    np.testing.assert_allclose(hv, np.tensordot(central(td.grad(F), p), t, 2), rtol=1e-6, atol=1e-8)


def test_known_zero_tangents_allocate_no_tangent_field():
    """anchor and rest do not depend on pos: the tangent program pairs neither with a tangent field."""
    F = td.function(rigid, inputs=[pos], outputs=[energy])
    _, fields = F.program.tangent(), F.program._tangent[1]
    assert {id(f) for f in fields.fields} == {id(pos), id(energy)}


# --- issue 10 item 5: ti.ad.grad_replaced, grad_for and no_grad are honoured ----------------------
xg = ti.field(ti.f64, shape=8)
yg = ti.field(ti.f64, shape=8)
out = ti.field(ti.f64, shape=())


@ti.kernel
def multiply(k: ti.f64):
    for i in xg:
        yg[i] = xg[i] * k


@ti.kernel
def multiply_grad(k: ti.f64):  # deliberately not the true gradient (k): the custom one must be used
    for i in xg:
        xg.grad[i] += yg.grad[i] / k


@ti.ad.grad_replaced
def scale(k):
    multiply(k)


@ti.ad.grad_for(scale)
def scale_grad(k):
    multiply_grad(k)


@ti.ad.no_grad
def scale_without_gradient(k):
    multiply(k)


@ti.kernel
def total():
    for i in yg:
        out[None] += yg[i] ** 2


def with_replaced_gradient():
    scale(2.0)
    total()


def with_no_gradient():
    scale_without_gradient(2.0)
    total()


def test_grad_replaced_is_the_gradient_as_with_tape():
    F = td.function(with_replaced_gradient, inputs=[xg], outputs=[out])
    x = np.arange(1.0, 9.0)
    value, grad = td.value_and_grad(F)(x)
    assert value == 4 * (x**2).sum()  # was 0: the kernels ran on the user's fields
    xt = ti.field(ti.f64, shape=8, needs_grad=True)
    yt = ti.field(ti.f64, shape=8, needs_grad=True)
    ot = ti.field(ti.f64, shape=(), needs_grad=True)
    # the same program over fields with gradients, through ti.ad.Tape
    import types

    def rebind(fn, **fields):
        g = dict(fn.__globals__, **fields)
        copy = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
        copy.__annotations__ = fn.__annotations__  # Taichi reads the parameters' types from here
        return copy

    m, mg, tot = (ti.kernel(rebind(k.__wrapped__, xg=xt, yg=yt, out=ot)) for k in (multiply, multiply_grad, total))
    tape_scale = ti.ad.grad_replaced(lambda k: m(k))
    ti.ad.grad_for(tape_scale)(lambda k: mg(k))
    xt.from_numpy(x)
    with tape(ot, xt, yt):
        tape_scale(2.0)
        tot()
    assert value == ot[None]
    np.testing.assert_array_equal(grad, xt.grad.to_numpy())
    np.testing.assert_allclose(grad, 2 * x, rtol=RTOL)  # 2 y / k with y = 2 x: the custom rule
    assert not xg.to_numpy().any() and not yg.to_numpy().any() and out[None] == 0.0


def test_no_grad_stops_the_gradient_and_forward_mode_of_replaced_gradients_is_refused():
    F = td.function(with_no_gradient, inputs=[xg], outputs=[out])
    x = np.arange(1.0, 9.0)
    value, grad = td.value_and_grad(F)(x)
    assert value == 4 * (x**2).sum() and not grad.any()
    for program, name in ((with_replaced_gradient, "scale"), (with_no_gradient, "scale_without_gradient")):
        G = td.function(program, inputs=[xg], outputs=[out])
        with pytest.raises(td.TransformError, match=rf"`{name}` in forward mode: .*grad_replaced.*reverse mode only"):
            td.jvp(G, (x,), (x,))
        with pytest.raises(td.TransformError, match=rf"`{name}` in forward mode"):
            td.hessian(G)(x)
    assert not xg.to_numpy().any() and not yg.to_numpy().any()


# --- issue 13 item 5 ------------------------------------------------------------------------------
xc = ti.field(ti.f64, shape=4)
lc = ti.field(ti.f64, shape=())


@ti.kernel
def with_atomic_max():
    for i in xc:
        lc[None] += xc[i] ** 2
        ti.atomic_max(lc[None], xc[i])


def test_a_failed_transform_keeps_the_compiled_kernels_of_its_siblings():
    """The tangent program used to free its tangent fields on failure, and Taichi then recompiled every kernel."""
    F = td.function(with_atomic_max, inputs=[xc], outputs=[lc])
    F(np.ones(4))
    before = td.cache_info()[F.name]
    with pytest.raises(td.TransformError, match="ti.atomic_max"):
        td.hessian(F)(np.ones(4))
    with pytest.raises(td.TransformError, match="ti.atomic_max"):
        td.jvp(F, (np.ones(4),), (np.ones(4),))  # the same error again, nothing rebuilt
    with pytest.raises(td.TransformError, match="ti.atomic_max"):
        td.value_and_grad(F)(np.ones(4))  # Taichi's kernel.grad gave every entry the winner's gradient
    F(np.ones(4))
    after = td.cache_info()[F.name]
    assert after.compiles == before.compiles and after.hits == before.hits + 1


def test_grad_with_a_batch_dim_says_field_programs_take_none():
    F = td.function(with_atomic_max, inputs=[xc], outputs=[lc])
    with pytest.raises(ValueError, match=r"grad\(with_atomic_max\): argument 'xc' \(a field\): expected shape "
                                         r"\(4,\), got shape \(2, 4\) \(a field program takes no batch dims\)"):
        td.grad(F)(np.ones((2, 4)))


def test_cache_info_entries_unpack():
    F = td.function(with_tan, inputs=[xr], outputs=[yr])
    td.grad(F)(np.full(4, 0.5))
    compiles, calls, hits = td.cache_info()["grad(with_tan)"]
    assert calls >= 1 and 0 <= hits <= calls and compiles >= 0
    assert list(td.cache_info()["grad(with_tan)"]) == [compiles, calls, hits]


# --- ops Taichi's reverse mode has no rule for (found by the conformance net) ---------------------
xr = ti.field(ti.f64, shape=4)
yr = ti.field(ti.f64, shape=())


@ti.kernel
def with_tan():
    for i in xr:
        yr[None] += xr[i] ** 2 + ti.tan(xr[i])


@ti.kernel
def with_tan_break():
    for i in xr:
        s = xr[i]
        for _ in range(3):
            if s > 100.0:
                break  # a flag to tidiff's transform (NOTE: [Break as a flag]), which has a rule for ti.tan
            s = s * 0.5 + xr[i]
        yr[None] += xr[i] ** 2 + ti.tan(xr[i]) + s


def test_tidiff_reverses_a_kernel_taichi_cannot_and_both_modes_agree():
    F = td.function(with_tan, inputs=[xr], outputs=[yr])
    x = np.array([0.3, -0.7, 1.1, 0.45])
    exact = 2 * x + 1 / np.cos(x) ** 2
    np.testing.assert_allclose(td.grad(F)(x), exact, rtol=1e-13)
    _, dy = td.jvp(F, (x,), (np.ones(4),))
    assert dy == pytest.approx(exact.sum(), rel=1e-12)
    assert not xr.to_numpy().any() and yr[None] == 0.0


def test_a_kernel_breaking_out_of_an_inner_loop_is_reversed_by_tidiff():
    """s = x, then up to 3 times s = s / 2 + x unless s > 100: ds/dx is 1.875 where no step breaks, 1 where
    the first does (x = 120), 1.5 where the second does (x = 90); both modes agree."""
    F = td.function(with_tan_break, inputs=[xr], outputs=[yr])
    x = np.array([0.3, -0.7, 120.0, 90.0])
    exact = 2 * x + 1 / np.cos(x) ** 2 + [1.875, 1.875, 1.0, 1.5]
    np.testing.assert_allclose(td.grad(F)(x), exact, rtol=1e-13)
    _, dy = td.jvp(F, (x,), (np.ones(4),))
    assert dy == pytest.approx(exact.sum(), rel=1e-12)
    assert not xr.to_numpy().any() and yr[None] == 0.0


@ti.kernel
def seed_product():
    yr[None] = 2.0


@ti.kernel
def with_tan_product():
    ti.loop_config(serialize=True)
    for i in range(4):
        yr[None] *= 1.0 + ti.tan(xr[i])  # a product into a field: Taichi's reverse mode, which refuses ti.tan


@ti.kernel
def seeded_tan_product():
    seed = 1.0
    seed += 1.0  # a local assigned twice beside the loops: the kernel runs whole (NOTE: [Top-level statements of a
    # kernel run loop by loop])
    for _ in range(1):  # a parallel loop beside the serialized one: the kernel is not taken as one iteration
        yr[None] = seed
    ti.loop_config(serialize=True)
    for i in range(4):
        yr[None] *= 1.0 + ti.tan(xr[i])


@ti.kernel
def seeded_tan_product_in_loops():
    for _ in range(1):
        yr[None] = 2.0
    ti.loop_config(serialize=True)
    for i in range(4):
        yr[None] *= 1.0 + ti.tan(xr[i])


def tan_product():
    seed_product()
    with_tan_product()


def test_a_serialized_loop_beside_a_parallel_one_and_a_local_assigned_twice_in_both_modes():
    """Taichi's reverse mode refuses the kernel (``ti.tan``; the statements beside the loops), and it was refused
    by name; with the serialized loop it is now taken as one iteration in order (NOTE: [Serialized kernels as one
    iteration]). The product reads what the loop before it set, which that form reads as the kernel left it: its
    reverse mode is checked, found wrong and pushed forward (docs/limits.md), right."""
    F = td.function(seeded_tan_product, inputs=[xr], outputs=[yr])
    x = np.array([0.3, -0.7, 1.1, 0.45])
    _, dy = td.jvp(F, (x,), (np.ones(4),))
    product = 2.0 * np.prod(1.0 + np.tan(x))
    exact = product / np.cos(x) ** 2 / (1.0 + np.tan(x))
    with pytest.warns(td.TaichiReverseWarning, match="seeded_tan_product"):
        np.testing.assert_allclose(td.grad(F)(x), exact, rtol=1e-12)
    assert dy == pytest.approx(exact.sum(), rel=1e-12)
    assert not xr.to_numpy().any() and yr[None] == 0.0
    # every loop serialized: one iteration around a runtime loop (NOTE: [Serialized kernels as one iteration])
    np.testing.assert_allclose(td.grad(td.function(tan_product, inputs=[xr], outputs=[yr]))(x), exact, rtol=1e-12)
    # the same kernel without the local assigned twice runs loop by loop, the serialized loop a kernel of its own
    in_loops = td.function(seeded_tan_product_in_loops, inputs=[xr], outputs=[yr])
    np.testing.assert_allclose(td.grad(in_loops)(x), exact, rtol=1e-12)


# --- a kernel given a NumPy array of weights: its gradient was silently 0 ----------------------------------
xw = ti.field(ti.f64, shape=6)
yw = ti.field(ti.f64, shape=6)
lw_loss = ti.field(ti.f64, shape=())
WEIGHTS = np.linspace(0.5, 1.0, 6)


@ti.kernel
def weighted(weights: ti.types.ndarray()):
    for i in xw:
        lw_loss[None] += ti.sin(weights[i]) * ti.exp(xw[i]) + weights[(i + 1) % 6] * xw[i] ** 3


@ti.kernel
def squares():
    for i in xw:
        yw[i] = xw[i] ** 2


@ti.kernel
def copy_out(out: ti.types.ndarray()):
    for i in yw:
        out[i] = yw[i]


@ti.kernel
def sum_of_y():
    for i in yw:
        lw_loss[None] += yw[i]


def torch_weighted(x, w):
    return (torch.sin(w) * torch.exp(x) + torch.roll(w, -1) * x ** 3).sum()


@pytest.mark.parametrize("as_tensor", [False, True])
def test_a_kernel_given_an_array_reads_it_as_a_constant_in_every_mode(as_tensor):
    """The replay left out every launch given an external array, as it leaves out Taichi's ``to_numpy``: the
    gradient was 0, without a word (NOTE: [Arrays given to a kernel over fields]). Forward mode refused the
    parameter."""
    weights = torch.tensor(WEIGHTS) if as_tensor else WEIGHTS
    program = td.function(lambda: weighted(weights), inputs=[xw], outputs=[lw_loss])
    x, t = np.linspace(-1.0, 1.2, 6), np.cos(np.arange(6.0))
    tx, tw, tt = torch.tensor(x), torch.tensor(WEIGHTS), torch.tensor(t)
    loss = lambda x_: torch_weighted(x_, tw)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # tidiff's own adjoint: nothing to check
        np.testing.assert_allclose(td.grad(program)(x), torch.autograd.functional.jacobian(loss, tx).numpy(),
                                   rtol=RTOL)
        np.testing.assert_allclose(td.jvp(program, (x,), (t,))[1],
                                   torch.autograd.functional.jvp(loss, tx, tt)[1].item(), rtol=RTOL)
        np.testing.assert_allclose(td.hvp(program, (x,), (t,))[1][0],
                                   torch.autograd.functional.hvp(loss, tx, tt)[1].numpy(), rtol=RTOL, atol=1e-14)
    assert program.memo.peek("reverse verdict") is None


def test_a_kernel_copying_out_into_an_array_keeps_its_gradient():
    """The copy out is left out of the adjoint (it was Taichi's ``kernel.grad``, checked); the array holds the
    copy after each call."""
    assert isinstance(vjp_kernel(copy_out), KernelAdjoint)
    out = np.zeros(6)
    program = td.function(lambda: (squares(), copy_out(out), sum_of_y()), inputs=[xw], outputs=[lw_loss])
    x = np.linspace(-1.0, 1.2, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        np.testing.assert_allclose(td.grad(program)(x), 2.0 * x, rtol=RTOL)
        np.testing.assert_allclose(td.hessian(program)(x), 2.0 * np.eye(6), rtol=RTOL)
    assert program.memo.peek("reverse verdict") is None
    np.testing.assert_allclose(out, x ** 2, rtol=RTOL)
    np.testing.assert_allclose(td.jvp(program, (x,), (np.ones(6),))[1], 2.0 * x.sum(), rtol=RTOL)
