"""Taichi's ``kernel.grad`` no longer runs (NOTE: [Taichi's reverse mode not run] in tidiff/_fields/hidden_rules.py).

Reverse mode of code holding a kernel tidiff's transform does not take is a ``td.TransformError`` naming the kernel,
the construct and its line, where Taichi's reverse mode ran, checked; ``td.grad`` and the Jacobians choose forward
mode. A kernel generic over ``ti.template()`` fields launched on integer fields too (``clear(count)`` beside
``clear(y)``) has an adjoint of tidiff's for each: Taichi's reversed the integer launches before."""
import inspect
import re
import warnings

import numpy as np
import pytest
import taichi as ti
import torch
from exact_vjp import assert_exact_vjp
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td

N = 4
x = ti.field(ti.f64, shape=N)
y = ti.field(ti.f64, shape=N)
z = ti.field(ti.f64, shape=N)
count = ti.field(ti.i32, shape=N)
doubled = ti.field(ti.i32, shape=N)
loss = ti.field(ti.f64, shape=())


@ti.kernel
def clear(f: ti.template()):
    for i in f:
        f[i] = 0


@ti.kernel
def twice(src: ti.template(), dst: ti.template()):
    for i in src:
        dst[i] = 2 * src[i]


@ti.kernel
def number():
    for i in count:
        count[i] = i + 1


@ti.kernel
def weigh(c: ti.template()):
    for i in x:
        y[i] += x[i] ** 2 * c[i]


@ti.kernel
def total():
    for i in z:
        loss[None] += ti.sin(z[i])


def counted():
    clear(count)  # an integer field, then a float one, at the same template parameter
    clear(y)
    number()
    twice(count, doubled)  # integer fields: no derivative
    weigh(doubled)
    twice(y, z)  # float fields
    total()


def counted_twin(x):
    c = torch.arange(1.0, N + 1.0, dtype=torch.float64)
    return torch.sin(2 * (x**2 * 2 * c)).sum()


@given(st.lists(st.floats(-1.5, 1.5), min_size=N, max_size=N))
def test_a_template_kernel_launched_on_integer_fields_too_is_exact(values):
    F = td.function(counted, inputs=[x], outputs=[loss])
    assert_exact_vjp(F, [np.array(values)], counted_twin, [np.array(1.0)])


@ti.kernel
def racy_product():
    for i in x:
        loss[None] = loss[None] * (1.0 + 0.1 * x[i])  # each iteration reads what another wrote


def chained():
    loss[None] = 2.0
    racy_product()


def test_reverse_mode_of_a_kernel_not_taken_names_kernel_construct_and_line_and_grad_goes_forward():
    source, first = inspect.getsourcelines(racy_product.__wrapped__)
    line = first + next(k for k, text in enumerate(source) if "for i in x" in text)
    F = td.function(chained, inputs=[x], outputs=[loss])
    values = np.linspace(0.2, 1.2, N)
    with pytest.raises(td.TransformError, match=re.escape("does not take `racy_product` (a parallel loop") +
                       rf".*, line {line} of .*test_taichi_reverse_not_run.py\)"):
        td.vjp(F, values)[1](np.array(1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no check, no warning: forward mode, chosen at once
        grad = td.grad(F)(values)
    product = 2.0 * np.prod(1.0 + 0.1 * values)
    np.testing.assert_allclose(grad, product * 0.1 / (1.0 + 0.1 * values), rtol=1e-12)


def test_a_torch_backward_through_a_kernel_not_taken_is_refused_by_name():
    F = td.function(chained, inputs=[x], outputs=[loss])
    op = td.torch.function(F)
    values = torch.linspace(0.2, 1.2, N, dtype=torch.float64, requires_grad=True)
    out = op(values)  # the value runs
    np.testing.assert_allclose(out.detach().numpy(), 2.0 * np.prod(1.0 + 0.1 * values.detach().numpy()), rtol=1e-12)
    with pytest.raises(td.TransformError, match=r"does not take `racy_product`.*kernel.grad\) does not run"):
        out.backward()
    assert values.grad is None  # nothing written
