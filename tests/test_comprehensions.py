"""List comprehensions over a compile-time range are differentiated as the lists Taichi builds from them
(NOTE: [Unrolled comprehensions]); outside code found them refused in every mode of a @ti.func and in
forward mode of a kernel."""
import numpy as np
import pytest
import taichi as ti
import torch

import tidiff as td

N = 3


@ti.func
def weighted_sines(x: ti.types.vector(3, ti.f64)) -> ti.f64:
    y = ti.Vector([ti.sin(x[i]) * (i + 1) for i in ti.static(range(3))])
    return y.dot(x)


@ti.func
def outer_cosines(x: ti.types.vector(3, ti.f64)) -> ti.types.matrix(2, 3, ti.f64):
    return ti.Matrix([[ti.cos(x[i] * x[j]) + j for j in range(N)] for i in range(1, N)])


@ti.func
def filtered(x: ti.types.vector(3, ti.f64)) -> ti.f64:
    return ti.Vector([x[i] * x[i] for i in range(3) if i != 1]).sum()


def weighted_sines_twin(x):
    return (torch.sin(x) * torch.arange(1, 4, dtype=x.dtype) * x).sum()


def outer_cosines_twin(x):
    return torch.cos(x[1:, None] * x[None, :]) + torch.arange(3, dtype=x.dtype)[None, :]


@pytest.mark.parametrize("f, twin", [(weighted_sines, weighted_sines_twin), (outer_cosines, outer_cosines_twin)])
def test_a_comprehension_is_differentiated_as_its_list(f, twin):
    x = np.array([0.3, -0.7, 1.1])
    xt = torch.tensor(x)
    np.testing.assert_allclose(td.function(f)(x), twin(xt).numpy(), rtol=1e-14)
    want = torch.autograd.functional.jacobian(twin, xt).numpy()
    for jacobian in (td.jacfwd, td.jacrev):
        np.testing.assert_allclose(jacobian(f)(x), want, rtol=1e-12, atol=1e-15)
    if f is weighted_sines:
        np.testing.assert_allclose(td.hessian(f)(x), torch.autograd.functional.hessian(twin, xt).numpy(),
                                   rtol=1e-12, atol=1e-15)


def test_a_comprehension_with_a_condition_is_refused_by_name():
    with pytest.raises(td.TransformError, match=r"for i in range\(3\) if i != 1"):
        td.grad(filtered)(np.array([0.3, -0.7, 1.1]))
