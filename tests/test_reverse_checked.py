"""Reverse mode of field programs and ndarray kernels is checked against tidiff's forward mode before it is trusted.

Taichi 1.7.4's reverse mode gets an n-body force loop wrong (tests/test_taichi_pitfalls.py): kernels over
fields and ndarray kernels are now reversed by tidiff's own adjoint transform (NOTE: [Reverse of a kernel],
[Reverse of an ndarray kernel]) and are right without a warning or a check. A kernel reading again a value it
wrote is wrong under either adjoint (the adjoint reads the last value). tidiff checks the first vjp of such a
function with ``<J^T c, t> == <c, J t>`` and, where reverse mode is wrong, computes it by forward mode (NOTE:
[Checking Taichi's reverse mode] in tidiff/_reverse_check.py). Every derivative here is compared with torch's.
"""
import warnings

import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from test_taichi_pitfalls import cube_through_a_local_copy, loss_field, overwritten_in_a_loop, x_field

import tidiff as td
import tidiff._reverse_check as reverse_check

N = 4
positions = ti.Vector.field(2, ti.f64, shape=N)
stiffness = ti.field(ti.f64, shape=())
force = ti.Vector.field(2, ti.f64, shape=N)
energy = ti.field(ti.f64, shape=())


@ti.kernel
def pair_forces():
    for i in positions:
        f = ti.Vector([0.0, -9.8])
        for j in range(N):  # a runtime loop giving the vector local d a new value each iteration
            if i != j:
                d = positions[i] - positions[j]
                r = d.norm(1e-6)
                f += -stiffness[None] * (r - 0.5) * d / r
        force[i] = f


@ti.kernel
def weigh():
    for i in force:
        energy[None] += (force[i] * ti.Vector([1.0, 2.0])).sum() * (1.0 + i) + ti.sin(force[i][0])


def step():
    pair_forces()
    weigh()


def torch_forces(x, k):
    d = x[:, None, :] - x[None, :, :]
    r = torch.sqrt((d * d).sum(-1) + 1e-6)
    pull = -k * (r - 0.5)[..., None] * d / r[..., None]
    off = 1.0 - torch.eye(N, dtype=x.dtype)
    return torch.tensor([0.0, -9.8], dtype=x.dtype) + (pull * off[..., None]).sum(1)


def torch_energy(x, k):
    f = torch_forces(x, k)
    weights = torch.arange(1.0, N + 1, dtype=x.dtype)
    return ((f * torch.tensor([1.0, 2.0], dtype=x.dtype)).sum(-1) * weights).sum() + torch.sin(f[:, 0]).sum()


E = td.function(step, inputs=[positions, stiffness], outputs=[energy])
FORCES = td.function(pair_forces, inputs=[positions, stiffness], outputs=[force])
START = np.array([[0.1, -0.4], [0.9, 0.3], [-0.5, 0.2], [0.4, 1.1]])


def tensor(a):
    return torch.tensor(a, dtype=torch.float64)


def torch_grads(fn, *args):
    return [g.numpy() for g in torch.autograd.functional.jacobian(fn, tuple(tensor(a) for a in args))]


def test_a_field_program_taichi_gets_wrong_is_right_by_tidiffs_adjoints_without_a_warning():
    """Taichi's kernel.grad of pair_forces is wrong (a vector local given a new value in each iteration of a
    runtime loop); tidiff's adjoint kernel is right, so nothing warns and Jacobians may use reverse mode."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value, (dx, dk) = td.value_and_grad(E, argnums=(0, 1))(START, 3.0)
        want = torch_grads(torch_energy, START, 3.0)
        np.testing.assert_allclose(value, torch_energy(tensor(START), tensor(3.0)).item(), rtol=1e-13)
        np.testing.assert_allclose(dx, want[0], rtol=1e-10)
        np.testing.assert_allclose(dk, want[1], rtol=1e-10)
        np.testing.assert_allclose(td.grad(E)(START, 3.0), want[0], rtol=1e-10)
    assert E.reverse_refused() is None


@pytest.mark.filterwarnings("ignore::tidiff.TaichiReverseWarning")  # each function's first vjp warns
@given(arrays(np.float64, (N, 2), elements=st.floats(-2.0, 2.0)), st.floats(0.5, 4.0))
def test_every_transform_of_the_n_body_program_agrees_with_torch(x, k):
    want = torch_grads(torch_energy, x, k)
    dx, dk = td.grad(E, argnums=(0, 1))(x, k)
    np.testing.assert_allclose(dx, want[0], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dk, want[1], rtol=1e-9, atol=1e-12)
    jacobian = torch.autograd.functional.jacobian(lambda a: torch_forces(a, tensor(k)), tensor(x))
    np.testing.assert_allclose(td.jacrev(FORCES)(x, k), jacobian.numpy(), rtol=1e-9, atol=1e-12)
    c = np.cos(np.arange(2 * N)).reshape(N, 2)
    _, vjp_fn = td.vjp(FORCES, x, k)
    np.testing.assert_allclose(vjp_fn(c)[0], np.einsum("ij,ijkl->kl", c, jacobian.numpy()), rtol=1e-9, atol=1e-12)
    t = np.sin(np.arange(2 * N)).reshape(N, 2)
    _, (hx, hk) = td.hvp(E, (x, k), (t, 0.5))
    H = torch.autograd.functional.hessian(torch_energy, (tensor(x), tensor(k)))
    np.testing.assert_allclose(hx, np.einsum("ijkl,kl->ij", H[0][0].numpy(), t) + H[0][1].numpy() * 0.5,
                               rtol=1e-8, atol=1e-10)


def test_a_local_copy_cubed_in_a_runtime_loop_is_right():
    """tests/test_taichi_pitfalls.py's first reverse-mode pitfall (Taichi gives 2 a**2 for d(a**3)/da)."""
    cube = td.function(cube_through_a_local_copy, inputs=[x_field], outputs=[loss_field])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # tidiff's adjoint: right, nothing to warn of
        np.testing.assert_allclose(td.grad(cube)(np.array([0.7])), [3 * 0.7**2], rtol=1e-12)


@ti.kernel
def pair_products(x: ti.types.ndarray(dtype=ti.math.vec2, ndim=1), out: ti.types.ndarray(dtype=ti.math.vec2, ndim=1)):
    for i in range(x.shape[0]):
        f = ti.Vector([0.0, 0.0])
        for j in range(x.shape[0]):
            d = x[i] - x[j] + 0.3
            f += d * d[0]
        out[i] = f


def torch_pair_products(x):
    d = x[:, None, :] - x[None, :, :] + 0.3
    return (d * d[..., :1]).sum(1)


PAIRS = td.function(pair_products, inputs=["x"], outputs={"out": lambda x: x.shape})


def test_an_ndarray_kernel_and_its_torch_op_are_right_where_taichi_reverse_is_not():
    """Taichi's kernel.grad gets this kernel wrong (it was checked, found wrong and pushed forward, with a warning);
    tidiff's adjoint is right, at first and second order, with nothing to warn of."""
    x = tensor(START).requires_grad_(True)
    c = torch.cos(torch.arange(8.0, dtype=torch.float64)).reshape(4, 2)
    _, want = torch.autograd.functional.vjp(torch_pair_products, x.detach(), c)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, vjp_fn = td.vjp(PAIRS, START)
        np.testing.assert_allclose(vjp_fn(c.numpy())[0], want.numpy(), rtol=1e-12)
        (td.torch.function(PAIRS)(x) * c).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), want.numpy(), rtol=1e-12)
        assert torch.autograd.gradgradcheck(td.torch.function(PAIRS), (x,))
    assert PAIRS.memo.peek("reverse verdict") is None  # exact: never checked


def test_an_ndarray_kernel_tidiff_reverses_is_not_checked_and_warns_nothing():
    @ti.kernel
    def plain(x: ti.types.ndarray(dtype=ti.f64, ndim=1), out: ti.types.ndarray(dtype=ti.f64, ndim=1)):
        for i in range(x.shape[0]):
            out[i] = ti.sin(x[i]) * x[(i + 1) % x.shape[0]]

    op = td.function(plain, inputs=["x"], outputs={"out": lambda x: x.shape})
    x = np.linspace(-1.0, 1.0, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = td.vjp(op, x)[1](np.ones(5))[0]
    np.testing.assert_allclose(g, np.cos(x) * np.roll(x, -1) + np.roll(np.sin(x), 1), rtol=1e-14)
    assert op.reverse_refused() is None and op.memo.peek("reverse verdict") is None


@ti.kernel
def squared_again(x: ti.types.ndarray(dtype=ti.math.vec2, ndim=1), out: ti.types.ndarray(dtype=ti.math.vec2, ndim=1)):
    for i in range(x.shape[0]):
        out[i] = x[i] * 2.0
        out[i] = out[i] * out[i]  # reads its own write: 2 x, not the 4 x**2 the kernel leaves


def test_an_ndarray_kernel_reading_what_it_stored_is_exact():
    """NOTE: [Reads of what the iteration wrote]: the stored value is read; no check, no warning."""
    op = td.function(squared_again, inputs=["x"], outputs={"out": lambda x: x.shape})
    c = np.cos(np.arange(8.0)).reshape(4, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(td.vjp(op, START)[1](c)[0], 8 * START * c, rtol=1e-12)
    assert op.reverse_refused() is None and op.memo.peek("reverse verdict") is None


@ti.kernel
def squared_in_a_loop(x: ti.types.ndarray(dtype=ti.math.vec2, ndim=1),
                      out: ti.types.ndarray(dtype=ti.math.vec2, ndim=1)):
    for i in range(x.shape[0]):
        out[i] = x[i]
        j = i
        for _ in range(2):  # each time round reads what the time before wrote: the adjoint reads x**4 every time
            out[i] = out[j] * out[i]  # the entry reached by two names: not kept in a local (NOTE: [Entries
            # updated in a loop, as locals])


def test_an_ndarray_kernel_reading_its_own_write_is_checked_and_pushed_forward():
    op = td.function(squared_in_a_loop, inputs=["x"], outputs={"out": lambda x: x.shape})
    c = np.cos(np.arange(8.0)).reshape(4, 2)
    with pytest.warns(td.TaichiReverseWarning, match="ndarray kernel `squared_in_a_loop`"):
        np.testing.assert_allclose(td.vjp(op, START)[1](c)[0], 4 * START ** 3 * c, rtol=1e-12)
    assert op.reverse_refused() is not None  # Jacobians choose forward mode
    np.testing.assert_allclose(td.jacobian(op)(START),
                               np.einsum("ij,ik,jl->ijkl", 4 * START ** 3, np.eye(4), np.eye(2)), rtol=1e-12)


def test_a_disagreement_differences_cannot_settle_is_pushed_forward(monkeypatch):
    """Central differences that side with neither mode (a kink between the points; here none at all) used to
    leave the call to the reverse mode forward mode disagreed with: a net program's gradient 294 off, silently."""
    monkeypatch.setattr(reverse_check, "_differences", lambda *args: None)
    op = td.function(squared_in_a_loop, inputs=["x"], outputs={"out": lambda x: x.shape})
    c = np.cos(np.arange(8.0)).reshape(4, 2)
    with pytest.warns(td.TaichiReverseWarning, match="central differences not finite"):
        np.testing.assert_allclose(td.vjp(op, START)[1](c)[0], 4 * START ** 3 * c, rtol=1e-12)


def test_differences_siding_with_reverse_mode_keep_it_and_check_again(monkeypatch):
    """Where central differences side with reverse mode, forward mode is in doubt: the call keeps reverse mode
    (here Taichi's wrong one, the differences made up to side with it) and the next call checks again."""
    calls = []

    def siding_with_reverse(fn, batch, cotangents, directions, single):
        calls.append(1)
        grads = fn.unchecked_vjp(batch, list(cotangents))
        return sum(float(np.sum(np.asarray(g) * directions[k])) for k, g in enumerate(grads) if k in directions)

    monkeypatch.setattr(reverse_check, "_differences", siding_with_reverse)
    op = td.function(squared_in_a_loop, inputs=["x"], outputs={"out": lambda x: x.shape})
    c = np.cos(np.arange(8.0)).reshape(4, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        td.vjp(op, START)[1](c)
        td.vjp(op, START)[1](c)
    assert len(calls) == 2 and op.memo.peek("reverse verdict").wrong is None


def test_too_many_components_to_push_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(reverse_check, "MOST_PUSHES", 4)
    op = td.function(squared_in_a_loop, inputs=["x"], outputs={"out": lambda x: x.shape})
    with pytest.warns(td.TaichiReverseWarning), pytest.raises(td.TransformError, match="8 tangent runs"):
        td.vjp(op, START)[1](np.ones((4, 2)))


moving = ti.Vector.field(2, ti.f64, shape=N)
moved = ti.Vector.field(2, ti.f64, shape=N)


@ti.kernel
def drift():
    for i in moving:
        f = ti.Vector([0.0, 0.0])
        for j in range(N):
            d = moving[i] - moving[j] + 0.3
            f += d * d[0]
        moved[i] = moving[i] + 0.01 * f


def torch_drift(x, steps):
    for _ in range(steps):
        d = x[:, None, :] - x[None, :, :] + 0.3
        x = x + 0.01 * (d * d[..., :1]).sum(1)
    return x


def test_a_time_loop_over_a_step_taichi_gets_wrong_is_right():
    """td.scan replays the step's adjoints itself (a field stepper): tidiff's adjoint of drift is right."""
    sim = td.scan(td.function(drift, inputs=[moving], outputs=[moved]), length=5)
    c = np.cos(np.arange(2.0 * N)).reshape(N, 2)
    _, want = torch.autograd.functional.vjp(lambda x: torch_drift(x, 5), tensor(START), tensor(c))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, vjp_fn = td.vjp(sim, START)
        np.testing.assert_allclose(vjp_fn(c)[0], want.numpy(), rtol=1e-12)
    jacobian = torch.autograd.functional.jacobian(lambda x: torch_drift(x, 5), tensor(START))
    np.testing.assert_allclose(td.jacrev(sim)(START), jacobian.numpy(), rtol=1e-12)


scratch = ti.Vector.field(2, ti.f64, shape=N)  # a field each step reads, then overwrites
scratch.from_numpy(np.ones((N, 2)))


@ti.kernel
def scale_by_scratch():
    for i in moving:
        moved[i] = moving[i] * scratch[i]


@ti.kernel
def overwrite_scratch():
    for i in moving:
        scratch[i] = moving[i] ** 2  # after scale_by_scratch read it: the replay sees this value


def step_reading_then_overwriting():
    scale_by_scratch()
    overwrite_scratch()


def test_a_time_loop_over_a_step_breaking_the_access_rules_is_right():
    """scratch holds ones when the step reads it (each step copies the user's field), so the step is x -> x and
    the loop the identity; the step's replay swaps back the ones overwrite_scratch overwrote (NOTE: [Overwritten
    values kept]), so its adjoint is right and the check of the step's reverse mode passes."""
    sim = td.scan(td.function(step_reading_then_overwriting, inputs=[moving], outputs=[moved]), length=3)
    c = np.cos(np.arange(2.0 * N)).reshape(N, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, vjp_fn = td.vjp(sim, START)
        np.testing.assert_allclose(vjp_fn(c)[0], c, rtol=1e-12)


held = ti.field(ti.f64, shape=())
weight = ti.field(ti.f64, shape=())
product = ti.field(ti.f64, shape=())


@ti.kernel
def accumulate():
    product[None] += held[None] * weight[None]


@ti.kernel
def overwrite():
    held[None] = weight[None] ** 2  # a later kernel overwrites what an earlier one read (taichi #3885)


def read_then_overwritten():
    accumulate()
    overwrite()


def test_a_field_read_then_overwritten_by_a_later_kernel_has_the_gradient_of_the_program_as_run():
    """Taichi's reverse mode gives d/dw 9 at y = 5, w = 2 (it sees y = w**2 = 4, not the y = 5 the first kernel
    read); the program's loss is y * w, so the gradient is (w, y) = (2, 5), as td.jvp says. tidiff keeps the 5
    overwrite() overwrites (NOTE: [Overwritten values kept]): no check, no warning, twice in a row."""
    program = td.function(read_then_overwritten, inputs=[held, weight], outputs=[product])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            dy, dw = td.grad(program, argnums=(0, 1))(5.0, 2.0)
            np.testing.assert_allclose((dy, dw), (2.0, 5.0), rtol=1e-12)
        _, pullback = td.vjp(program, 5.0, 2.0)
        for _ in range(2):  # a second replay of one recording swaps the kept values forward first
            np.testing.assert_allclose(pullback(3.0), (6.0, 15.0), rtol=1e-12)
    np.testing.assert_allclose(td.jvp(program, (5.0, 2.0), (0.0, 1.0))[1], 5.0, rtol=1e-12)


single_points = ti.Vector.field(2, ti.f32, shape=N)
single_held = ti.field(ti.f32, shape=N)
single_loss = ti.field(ti.f32, shape=())


@ti.kernel
def single_accumulate():
    for i in single_points:
        single_loss[None] += single_points[i][0] * single_held[i]


@ti.kernel
def single_scale_twice():
    for i in single_points:
        for _ in ti.static(range(2)):
            single_held[i] = single_held[i] * single_points[i][1]  # read again after its own write


def single_rereading():
    single_scale_twice()
    single_accumulate()


@ti.kernel
def single_squares():
    for i in single_points:
        single_loss[None] += ti.sin(single_points[i][0]) * single_points[i][1] ** 2


def test_float32_programs_are_checked_in_their_precision():
    """A float32 program whose reverse mode is wrong (a kernel reading an entry after its own write: the adjoint
    has only the last value) is found and right to float32 precision; one whose reverse mode is right is not
    flagged (the check's tolerance is float32's there)."""
    x = START.astype(np.float32)
    held = np.linspace(0.5, 2.0, N)
    single_held.from_numpy(held.astype(np.float32))
    wrong = td.function(single_rereading, inputs=[single_points], outputs=[single_loss])
    with pytest.warns(td.TaichiReverseWarning):
        got = td.grad(wrong)(x)
    assert got.dtype == np.float32
    want = np.stack([held * START[:, 1] ** 2, 2 * held * START[:, 0] * START[:, 1]], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    right = td.function(single_squares, inputs=[single_points], outputs=[single_loss])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = td.grad(right)(x)
    want = np.stack([np.cos(START[:, 0]) * START[:, 1] ** 2, 2 * np.sin(START[:, 0]) * START[:, 1]], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@ti.kernel
def cosine_in_a_loop(a: ti.types.ndarray(dtype=ti.f64, ndim=1), out: ti.types.ndarray(dtype=ti.f64, ndim=1)):
    for i in range(a.shape[0]):
        out[i] = overwritten_in_a_loop(a[i])


def test_a_value_overwritten_in_a_runtime_loop_has_its_derivative():
    """tests/test_taichi_pitfalls.py: Taichi's kernel.grad gives 0 for d cos(a)/da when cos(a) is assigned in
    each iteration of a runtime loop; tidiff's vjp of the kernel (its own adjoint, nothing to warn of) is -sin(a),
    and so is the torch backward."""
    op = td.function(cosine_in_a_loop, inputs=["a"], outputs={"out": lambda a: a.shape})
    a = np.array([0.3, -0.6, 1.2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(td.vjp(op, a)[1](np.ones(3))[0], -np.sin(a), rtol=1e-14)
    t = tensor(a).requires_grad_(True)
    td.torch.function(op)(t).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), -np.sin(a), rtol=1e-14)
