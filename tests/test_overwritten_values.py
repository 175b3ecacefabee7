"""Programs whose launches overwrite values an earlier launch (or the launch itself) read: tidiff keeps them for
the replay (NOTE: [Overwritten values kept] in tidiff/_fields/kept.py) and its reverse mode is exact with no
check against forward mode, where Taichi's reverse mode (ti.ad.Tape) is silently wrong. Every gradient is
compared with torch's (float64) and with central differences."""
import warnings

import numpy as np
import pytest
import taichi as ti
import torch
from electric import Electric

import tidiff as td
from tidiff._adjoint.kernels import KernelAdjoint, vjp_kernel

ELECTRIC = Electric(steps=10, n_hidden=6, strength=0.05)
ELECTRIC.fill(seed=3)
LOSS = td.function(ELECTRIC.run, inputs=ELECTRIC.parameters, outputs=[ELECTRIC.loss])


def torch_gradients(program, arrays):
    tensors = tuple(torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays)
    loss = program.torch_loss(*tensors)
    return loss.item(), [g.numpy() for g in torch.autograd.grad(loss, tensors)]


def central_difference(f, arrays, direction, h=1e-6):
    up = f(*(a + h * d for a, d in zip(arrays, direction)))
    down = f(*(a - h * d for a, d in zip(arrays, direction)))
    return (up - down) / (2 * h)


def test_electric_as_published_has_the_gradient_of_the_program_as_run():
    """nn1(t) reads x[t] and v[t] before advance(t) writes them: tidiff keeps the old entries; its gradient is
    torch's and central differences', with no warning, where ti.ad.Tape's is off."""
    arrays = ELECTRIC.arrays()
    want_value, want = torch_gradients(ELECTRIC, arrays)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value, grads = td.value_and_grad(LOSS, argnums=(0, 1, 2, 3))(*arrays)
    np.testing.assert_allclose(value, want_value, rtol=1e-12)
    for got, expected in zip(grads, want):
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-15)
    direction = [np.cos(np.arange(a.size) + k).reshape(a.shape) for k, a in enumerate(arrays)]
    along = sum(float((g * d).sum()) for g, d in zip(grads, direction))
    np.testing.assert_allclose(along, central_difference(LOSS, arrays, direction), rtol=1e-7)
    tape = ELECTRIC.tape_gradients()
    np.testing.assert_allclose(tape[0], want_value, rtol=1e-12)  # the same program: the same loss
    assert not np.allclose(tape[1], want[0], rtol=1e-3)  # Taichi's reverse mode sees the values advance wrote
    # every kernel, of the program and of its tangent program, is reversed by tidiff's adjoint (advance's loop
    # of one iteration, reading v[t] where it wrote it, chains no iterations), with no check
    for program in (LOSS.program, LOSS.program.tangent()):
        for kernel in program._kernels:
            assert isinstance(vjp_kernel(kernel), KernelAdjoint), (kernel, vjp_kernel(kernel))
    assert LOSS.memo.peek("reverse verdict") is None


def test_electric_forward_mode_and_the_hessian_vector_product_agree_with_torch():
    """td.jvp is tidiff's tangent program; td.hvp reverses the tangent program, keeping the overwritten tangents
    too."""
    arrays = ELECTRIC.arrays()
    tensors = tuple(torch.tensor(a, dtype=torch.float64) for a in arrays)
    direction = tuple(np.sin(np.arange(a.size) + 2.0 * k).reshape(a.shape) for k, a in enumerate(arrays))
    _, tangent = td.jvp(LOSS, tuple(arrays), direction)
    _, want_tangent = torch.autograd.functional.jvp(ELECTRIC.torch_loss, tensors,
                                                     tuple(torch.tensor(d) for d in direction))
    np.testing.assert_allclose(tangent, want_tangent.item(), rtol=1e-10)
    _, want_hvp = torch.autograd.functional.hvp(ELECTRIC.torch_loss, tensors,
                                                 tuple(torch.tensor(d) for d in direction))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, got = td.hvp(LOSS, tuple(arrays), direction)
    for g, w in zip(got, want_hvp):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-8, atol=1e-13)


n = 5
position = ti.field(ti.f64, n)
velocity = ti.field(ti.f64, n)
spring = ti.field(ti.f64, ())
gathered = ti.field(ti.f64, n)
energy = ti.field(ti.f64, ())


@ti.kernel
def kick():
    for i in position:
        velocity[i] = velocity[i] * 0.9 - spring[None] * ti.sin(position[i])  # reads, then writes, its entry


@ti.kernel
def drift():
    for i in position:
        position[i] = position[i] + 0.1 * velocity[i]


@ti.kernel
def gather():
    for i in position:
        gathered[i] += position[i] * position[(i + 1) % n]


@ti.kernel
def measure():
    for i in position:
        energy[None] += gathered[i] ** 2 + ti.cos(velocity[i])


def steps_in_place():
    for _ in range(4):
        gathered.fill(0)  # after measure read it in the step before
        kick()
        drift()
        gather()
        measure()


def torch_steps(x, v, k):
    total = torch.zeros((), dtype=x.dtype)
    for _ in range(4):
        v = v * 0.9 - k * torch.sin(x)
        x = x + 0.1 * v
        g = x * torch.roll(x, -1)
        total = total + (g**2 + torch.cos(v)).sum()
    return total


IN_PLACE = td.function(steps_in_place, inputs=[position, velocity, spring], outputs=[energy])
START = (np.linspace(-1.0, 1.0, n), np.cos(np.arange(n)), 0.7)


def test_fields_updated_in_place_and_cleared_by_fill_every_step():
    """kick and drift read and then write their own entries (kept before their launch, put back before their
    adjoint); fill clears what measure read (kept, put back after fill's adjoint)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grads = td.grad(IN_PLACE, argnums=(0, 1, 2))(*START)
        jacobian = td.jacrev(IN_PLACE, argnums=(0, 1, 2))(*START)
    tensors = tuple(torch.tensor(a, dtype=torch.float64) for a in START)
    want = torch.autograd.functional.jacobian(torch_steps, tensors)
    for g, j, w in zip(grads, jacobian, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-11)
        np.testing.assert_allclose(j, w.numpy(), rtol=1e-11)
    direction = (np.ones(n), np.zeros(n), 1.0)  # fill zeroes the tangent of gathered too
    _, tangent = td.jvp(IN_PLACE, START, direction)
    np.testing.assert_allclose(tangent, grads[0].sum() + grads[2], rtol=1e-11)
    _, want_hvp = torch.autograd.functional.hvp(torch_steps, tensors, tuple(torch.tensor(d) for d in direction))
    for g, w in zip(td.hvp(IN_PLACE, START, direction)[1], want_hvp):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-10)


@pytest.mark.parametrize("calls", [1, 3])
def test_a_pullback_called_again_replays_the_same_recording(calls):
    """The replay swaps kept values back; a second replay swaps them forward first, then back again."""
    _, pullback = td.vjp(IN_PLACE, *START)
    tensors = tuple(torch.tensor(a, dtype=torch.float64) for a in START)
    want = torch.autograd.functional.jacobian(torch_steps, tensors)
    for k in range(calls):
        for got, w in zip(pullback(1.0 + k), want):
            np.testing.assert_allclose(got, (1.0 + k) * w.numpy(), rtol=1e-11)


shifted = ti.field(ti.f64, shape=5, offset=-2)  # indices -2..2
shifted_scale = ti.field(ti.f64, shape=())
shifted_total = ti.field(ti.f64, shape=())


@ti.kernel
def weigh_shifted():
    for i in shifted:
        shifted_total[None] += ti.sin(shifted[i]) * shifted_scale[None] * (i + 3)


@ti.kernel
def overwrite_shifted():
    for i in shifted:
        shifted[i] = shifted_scale[None] * i  # every entry, after weigh_shifted read it


def shifted_program():
    weigh_shifted()
    overwrite_shifted()
    weigh_shifted()


def test_a_field_with_an_offset_is_kept_at_its_own_indices():
    program = td.function(shifted_program, inputs=[shifted, shifted_scale], outputs=[shifted_total])
    x, s = np.linspace(-1.0, 1.0, 5), 0.7

    def twin(xt, st):
        k = torch.arange(-2.0, 3.0, dtype=xt.dtype)
        return (torch.sin(xt) * st * (k + 3)).sum() + (torch.sin(st * k) * st * (k + 3)).sum()

    want = torch.autograd.functional.jacobian(twin, (torch.tensor(x), torch.tensor(s, dtype=torch.float64)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = td.grad(program, argnums=(0, 1))(x, s)
    np.testing.assert_allclose(got[0], want[0].numpy(), rtol=1e-12)
    np.testing.assert_allclose(got[1], want[1].numpy(), rtol=1e-12)
