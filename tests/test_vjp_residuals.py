"""vjp_fn computes at the primals td.vjp was given, whatever the caller does to them afterwards.

Regression for issue 10, item 4: ``vjp_fn`` read its residuals late, so a
caller overwriting the input array after ``td.vjp`` got the cotangents at the
new values (JAX captures everything ``vjp_fn`` needs when ``vjp`` returns).
"""
import numpy as np
import pytest
import taichi as ti
import torch

import tidiff as td

N = 16
x_field = ti.field(ti.f64, shape=N)
w_field = ti.field(ti.f64, shape=())
squares = ti.field(ti.f64, shape=N)


@ti.kernel
def weighted_squares():
    for i in x_field:
        squares[i] = w_field[None] * x_field[i] ** 2


@ti.func
def repeated_product(x: ti.f64, y: ti.f64) -> ti.f64:
    out = x
    i = 0
    while i < 2:  # not straight-line: no linearized vjp, vjp_fn runs again at the primals
        out = out * y + ti.sin(x)
        i += 1
    return out


@ti.kernel
def cube(x: ti.types.ndarray(), out: ti.types.ndarray()):
    for i in x:
        out[i] = x[i] ** 3


FIELDS = td.function(weighted_squares, inputs=[x_field, w_field], outputs=[squares])
NDARRAY = td.function(cube, inputs=["x"], outputs={"out": lambda x: x.shape})


def overwrite(arrays):
    for a in arrays:
        a[...] = 5.0


@pytest.mark.parametrize("kind", ["fields", "func", "ndarray", "func-torch", "ndarray-torch"])
def test_overwriting_the_primals_after_vjp_changes_nothing(kind):
    rng = np.random.default_rng(0)
    xs, ys, c = rng.uniform(0.1, 1.0, N), rng.uniform(0.5, 1.5, N), rng.standard_normal(N)
    if kind == "fields":
        fn, primals = FIELDS, (xs, np.array(2.0))
    elif kind.startswith("func"):
        fn, primals = repeated_product, (xs, ys)
    else:
        fn, primals = NDARRAY, (xs,)
    if kind.endswith("torch"):
        primals = tuple(torch.tensor(p) for p in primals)
        c = torch.tensor(c)
    _, vjp_fn = td.vjp(fn, *primals)
    before = [np.asarray(g).copy() for g in vjp_fn(c)]
    overwrite(primals)
    after = vjp_fn(c)
    for b, a in zip(before, after):
        np.testing.assert_array_equal(np.asarray(a), b)


# Fields a program reads besides its inputs are kept too (NOTE: [Field values of a call]): found on outside
# code, a torch loop setting a per-sample target before each forward and calling backward once for all.
p_field = ti.field(ti.f64, shape=2)
target = ti.field(ti.f64, shape=2)
loss = ti.field(ti.f64, shape=())


@ti.kernel
def distance_to_target():
    for i in p_field:
        loss[None] += (p_field[i] - target[i]) ** 2


DISTANCE = td.function(distance_to_target, inputs=[p_field], outputs=[loss])
TARGETS = [np.array([1.0, 0.0]), np.array([0.0, 3.0])]


def test_a_field_read_besides_the_inputs_changed_after_vjp_changes_nothing():
    p = np.array([0.5, -0.25])
    target.from_numpy(TARGETS[0])
    value, vjp_fn = td.vjp(DISTANCE, p)
    target.from_numpy(TARGETS[1])
    (grad,) = vjp_fn(np.array(3.0))
    np.testing.assert_allclose(value, np.sum((p - TARGETS[0]) ** 2), rtol=1e-15)
    np.testing.assert_allclose(grad, 3.0 * 2 * (p - TARGETS[0]), rtol=1e-15)  # at the target of the call
    np.testing.assert_allclose(td.grad(DISTANCE)(p), 2 * (p - TARGETS[1]), rtol=1e-15)  # a new call: the new one


def test_each_torch_forward_keeps_the_fields_it_read_for_its_backward():
    op = td.torch.function(DISTANCE)
    p = torch.tensor([0.5, -0.25], dtype=torch.float64, requires_grad=True)
    total = 0
    for t in TARGETS:
        target.from_numpy(t)
        total = total + op(p)
    total.backward()
    want = sum(2 * (p.detach().numpy() - t) for t in TARGETS)
    np.testing.assert_allclose(p.grad.numpy(), want, rtol=1e-15)


scale = ti.field(ti.f64, shape=())


@ti.kernel
def scaled_cube(x: ti.types.ndarray(), out: ti.types.ndarray()):
    for i in x:
        out[i] = scale[None] * x[i] ** 3


SCALED_CUBE = td.function(scaled_cube, inputs=["x"], outputs={"out": lambda x: x.shape})


@pytest.mark.parametrize("torch_backward", [False, True])
def test_an_ndarray_kernel_refuses_a_derivative_after_a_field_it_reads_changed(torch_backward):
    """An ndarray kernel reads global fields itself: no kept value can be loaded, so a change is refused by
    name (as torch refuses a saved tensor modified in place), never differentiated at the new value."""
    x = np.array([0.5, 1.5])
    scale[None] = 2.0
    if torch_backward:
        xt = torch.tensor(x, requires_grad=True)
        out = td.torch.function(SCALED_CUBE)(xt)
        scale[None] = 5.0
        with pytest.raises(ValueError, match="the field `scale`, which the kernel reads, changed"):
            out.sum().backward()
        assert xt.grad is None
    else:
        _, vjp_fn = td.vjp(SCALED_CUBE, x)
        np.testing.assert_allclose(vjp_fn(np.ones(2))[0], 2.0 * 3 * x**2, rtol=1e-15)  # unchanged: right
        scale[None] = 5.0
        with pytest.raises(ValueError, match="the field `scale`, which the kernel reads, changed"):
            vjp_fn(np.ones(2))
    np.testing.assert_allclose(td.vjp(SCALED_CUBE, x)[1](np.ones(2))[0], 5.0 * 3 * x**2, rtol=1e-15)
