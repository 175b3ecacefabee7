"""What a survey of 91 kernels and programs written as users write them found wrong (2026-11-30), each now right or
refused by name: struct fields (a gradient of zeros, without a word), ``ti.random`` (a reverse pass drawing another
mask), an integer output beside a float one (``vjp_fn`` and the torch backward crashed)."""
import numpy as np
import pytest
import taichi as ti
import torch

import tidiff as td

N = 3
Particle = ti.types.struct(pos=ti.math.vec2, m=ti.f64)
particles = Particle.field(shape=N)
positions = ti.Vector.field(2, ti.f64, shape=N)
energy = ti.field(ti.f64, shape=())


@ti.kernel
def place():
    for i in particles:
        particles[i].pos = positions[i]
        particles[i].m = 1.0


@ti.kernel
def kinetic():
    for i in particles:
        energy[None] += particles[i].m * particles[i].pos.norm_sqr()


def through_structs():
    place()
    kinetic()


def test_a_program_through_a_struct_field_runs_and_its_derivatives_are_refused_by_name():
    f = td.function(through_structs, inputs=[positions], outputs=[energy])
    x = np.arange(6.0).reshape(N, 2)
    np.testing.assert_allclose(f(x), (x ** 2).sum())
    for call in (lambda: td.grad(f)(x), lambda: td.jvp(f, (x,), (np.ones_like(x),))):
        with pytest.raises(td.TransformError, match="struct field `particles`"):
            call()


@ti.kernel
def dropout(x: ti.types.ndarray(), out: ti.types.ndarray()):
    for i in range(x.shape[0]):
        out[i] = ti.select(ti.random(ti.f64) > 0.5, 2.0 * x[i], 0.0)


@ti.func
def kept(p):
    return ti.random(ti.f64) > p


weights = ti.field(ti.f64, shape=16)
dropped_loss = ti.field(ti.f64, shape=())


@ti.kernel
def dropped_sum():
    for i in weights:
        if kept(0.5):  # drawn in a func the kernel calls
            dropped_loss[None] += 2.0 * weights[i] ** 2


def test_reverse_mode_of_a_kernel_drawing_random_numbers_is_refused_by_name():
    """Its adjoint computed the kernel's values again with a new draw: the gradient of another mask."""
    kernel = td.function(dropout, inputs=["x"], outputs={"out": lambda x: x.shape})
    program = td.function(dropped_sum, inputs=[weights], outputs=[dropped_loss])
    x = np.ones(16)
    for call in (lambda: td.vjp(kernel, x)[1](np.ones(16)), lambda: td.jacrev(kernel)(x),
                 lambda: td.grad(program)(x), lambda: td.vjp(program, x)[1](1.0)):
        with pytest.raises(td.TransformError, match="ti.random"):
            call()
    out, tangent = td.jvp(kernel, (x,), (np.ones(16),))  # one run: the tangent's mask is the value's
    np.testing.assert_array_equal(tangent, out)
    value, tangent = td.jvp(program, (x,), (np.ones(16),))
    np.testing.assert_allclose(tangent, 2.0 * value)


@ti.kernel
def sums_and_counts(x: ti.types.ndarray(), segment: ti.types.ndarray(), total: ti.types.ndarray(),
                    count: ti.types.ndarray(dtype=ti.i32, ndim=1)):
    for i in range(x.shape[0]):
        total[segment[i]] += x[i] ** 2
        count[segment[i]] += 1


SEGMENT = np.array([0, 1, 1, 0, 1], dtype=np.int32)


def test_an_integer_output_beside_a_float_one_carries_no_cotangent():
    f = td.function(sums_and_counts, inputs=["x", "segment"], outputs={"total": (2,), "count": (2,)})
    x = np.linspace(-1.0, 1.0, 5)
    (total, count), vjp_fn = td.vjp(f, x, SEGMENT)
    np.testing.assert_array_equal(count, [2, 3])
    grad_x, grad_segment = vjp_fn((np.array([1.0, 2.0]), np.zeros(2, np.int32)))
    np.testing.assert_allclose(grad_x, 2.0 * x * np.where(SEGMENT == 0, 1.0, 2.0), rtol=1e-15)
    assert grad_segment is None
    op = td.torch.function(sums_and_counts, inputs=["x", "segment"], outputs={"total": (2,), "count": (2,)})
    for _ in range(2):  # the first backward, then the launch plan's
        xt = torch.tensor(x, requires_grad=True)
        total_t, count_t = op(xt, torch.tensor(SEGMENT))
        assert not count_t.requires_grad
        (total_t * torch.tensor([1.0, 2.0], dtype=torch.float64)).sum().backward()
        np.testing.assert_allclose(xt.grad.numpy(), grad_x, rtol=1e-15)


@ti.kernel
def compacted(x: ti.types.ndarray(), count: ti.types.ndarray(dtype=ti.i32, ndim=0), out: ti.types.ndarray()):
    for i in range(x.shape[0]):
        if x[i] > 0.0:
            k = ti.atomic_add(count[None], 1)  # a slot of its own, in the order the iterations ran in
            out[k] = x[i] ** 2


def test_reverse_mode_of_a_kernel_using_an_atomic_s_result_is_refused_by_name():
    """Its adjoint ran the atomic again on the counter the kernel left and read past the output's end (NOTE:
    [Atomic results]); the first vjp, once the integer output took no cotangent, corrupted memory."""
    f = td.function(compacted, inputs=["x"], outputs={"count": (), "out": lambda x: x.shape})
    x = np.array([0.3, -1.0, 0.7, 1.2, -0.2, 0.9])
    count, out = f(x)
    assert count == 4 and sorted(out[:4]) == sorted(x[x > 0] ** 2)
    with pytest.raises(td.TransformError, match="atomic returns"):
        td.vjp(f, x)[1]((np.zeros((), np.int32), np.ones(6)))
    with pytest.raises(td.TransformError, match="ti.atomic_add"):  # forward mode has no rule for the result
        td.jvp(f, (x,), (np.ones(6),))


@ti.kernel
def log_sum_exp(x: ti.types.ndarray(dtype=ti.f64, ndim=1), out: ti.types.ndarray(dtype=ti.f64, ndim=0)):
    m = -1e30
    for i in range(x.shape[0]):
        ti.atomic_max(m, x[i])  # into a local of the kernel's top level
    s = 0.0
    for i in range(x.shape[0]):
        s += ti.exp(x[i] - m)
    out[None] = m + ti.log(s)


def test_an_atomic_max_into_a_top_level_local_is_refused_saying_why():
    """The survey's log-sum-exp: the refusal blamed Taichi's reverse mode alone and sent the user to forward mode,
    which refuses the kernel too; it now says what tidiff's transform does not take."""
    f = td.function(log_sum_exp, inputs=["x"], outputs={"out": lambda x: ()})
    x = np.array([0.3, -1.2, 2.0])
    np.testing.assert_allclose(f(x), np.log(np.exp(x).sum()), rtol=1e-12)
    with pytest.raises(td.TransformError, match=r"does not take `log_sum_exp` \(the parallel loop assigning `m`"):
        td.vjp(f, x)[1](np.array(1.0))  # reverse mode (td.grad of few inputs takes forward mode, which names the
        # atomic: NOTE: [Mode choice])
