"""``s = c = 0.0`` in Taichi code: one value for each name (NOTE: [Chained assignments]). The reverse transform
refused such a kernel, which Taichi's ``kernel.grad`` then reversed, checked (a survey of kernels as users write
them); now every transform takes it."""
import numpy as np
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import tidiff as td
from tidiff._adjoint.kernels import KernelAdjoint, vjp_ndarray_kernel


@ti.kernel
def row_variance(x: ti.types.ndarray(), out: ti.types.ndarray()):
    for i in range(x.shape[0]):
        s = c = 0.0
        for j in range(x.shape[1]):
            s += x[i, j]
            c += x[i, j] ** 2
        out[i] = c / x.shape[1] - (s / x.shape[1]) ** 2


VARIANCE = td.function(row_variance, inputs=["x"], outputs={"out": lambda x: x.shape[:1]})


@ti.func
def shared(a: ti.f64) -> ti.f64:
    u = v = a * a
    v = v + 1.0  # the second name is a local of its own
    return u * ti.sin(v)


def test_the_kernel_is_the_transform_s():
    assert isinstance(vjp_ndarray_kernel(row_variance, {"x": ti.f64, "out": ti.f64}), KernelAdjoint)


@given(arrays(np.float64, (3, 4), elements=st.floats(-2, 2)), arrays(np.float64, (3,), elements=st.floats(-2, 2)))
def test_a_chained_assignment_in_a_kernel_and_a_func_as_torch(x, c):
    (got,) = td.vjp(VARIANCE, x)[1](c)
    t = torch.tensor(x, requires_grad=True)
    want = torch.autograd.grad(t.var(1, unbiased=False), t, torch.tensor(c))[0]
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-12)
    a = torch.tensor(float(x[0, 0]), dtype=torch.float64, requires_grad=True)
    value = a * a * torch.sin(a * a + 1.0)
    np.testing.assert_allclose(td.grad(shared)(float(x[0, 0])), torch.autograd.grad(value, a)[0].item(),
                               rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(td.jvp(shared, (float(x[0, 0]),), (1.0,))[1], td.grad(shared)(float(x[0, 0])),
                               rtol=1e-12, atol=1e-14)
