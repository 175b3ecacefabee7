"""An entry a runtime loop of a kernel iteration updates again and again is reversed as a local of the iteration
(NOTE: [Entries updated in a loop, as locals]): exact, no check of reverse mode and no warning, where the adjoint
reading the field as the kernel left it was checked, found wrong and replaced by forward pushes.
"""
import ast
import warnings

import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td
from tidiff._adjoint.entry_locals import entries_as_locals
from tidiff._adjoint.kernels import _touches_fields
from tidiff._lang.objects import bind
from tidiff._lang.parse import parse

N = 5
h = ti.field(ti.f64, shape=N)
p = ti.field(ti.f64, shape=N)
v = ti.Vector.field(2, ti.f64, shape=N)
loss = ti.field(ti.f64, shape=())


@ti.kernel
def compound(n: ti.i32):
    for i in h:
        for _ in range(n):
            h[i] = h[i] * p[i] + 0.1 * ti.sin(h[i])


@ti.kernel
def until(n: ti.i32):
    for i in h:
        k = 0
        while k < n:
            h[i] += p[i] * h[i] * 0.5
            k += 1


@ti.kernel
def components(n: ti.i32):
    for i in v:
        for _ in range(n):
            v[i][0] = v[i][0] * p[i] + v[i][1]
            v[i].y = v[i].y * 0.5


@ti.kernel
def total():
    for i in h:
        loss[None] += h[i] ** 2 + v[i].dot(v[i])


@ti.func
def damped(x, q):
    return x * q + 0.1 * ti.sin(x)


@ti.kernel
def through_a_func(n: ti.i32):
    for i in h:
        for _ in range(n):
            h[i] = damped(h[i], p[i])  # a func reaching no field


@ti.kernel
def scaled(n: ti.i32):
    for i in h:
        for _ in range(n):
            h[i] *= p[i]  # an update reading the entry: taken as written only, it was checked and pushed forward


def run(kernel, n):
    def program():
        kernel(n)
        total()
    return td.function(program, inputs=[h, p, v], outputs=[loss])


def torch_run(name, n, h0, p0, v0):
    x, q, w = h0.clone(), p0, v0.clone()
    for _ in range(n):
        if name in ("compound", "through a func"):
            x = x * q + 0.1 * torch.sin(x)
        elif name == "scaled":
            x = x * q
        elif name == "until":
            x = x + q * x * 0.5
        else:
            w = torch.stack([w[:, 0] * q + w[:, 1], w[:, 1] * 0.5], 1)
    return (x ** 2).sum() + (w * w).sum()


PROGRAMS = {(name, n): run(kernel, n) for name, kernel in (("compound", compound), ("until", until),
                                                            ("components", components), ("scaled", scaled),
                                                            ("through a func", through_a_func)) for n in (0, 1, 3)}


@given(st.sampled_from(sorted(PROGRAMS)), st.integers(0, 2**32 - 1))
def test_updates_in_a_loop_are_exact_and_not_checked(key, seed):
    rng = np.random.default_rng(seed)
    h0, p0, v0 = rng.uniform(-1, 1, N), rng.uniform(-1.2, 1.2, N), rng.uniform(-1, 1, (N, 2))
    fn = PROGRAMS[key]
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        value, grads = td.value_and_grad(fn, argnums=(0, 1, 2))(h0, p0, v0)
    args = [torch.tensor(a, requires_grad=True) for a in (h0, p0, v0)]
    want = torch_run(key[0], key[1], *args)
    np.testing.assert_allclose(value, want.item(), rtol=1e-12)
    for got, w, a in zip(grads, torch.autograd.grad(want, args, allow_unused=True), args, strict=True):
        np.testing.assert_allclose(got, (torch.zeros_like(a) if w is None else w).numpy(), rtol=1e-10, atol=1e-12)
    assert fn.memo.peek("reverse verdict") is None


@ti.func
def weight(i):
    return p[i]  # reads a field


@ti.kernel
def through_a_func_reading_a_field(n: ti.i32):
    for i in h:
        for _ in range(n):
            h[i] = h[i] * weight(i)


@ti.kernel
def two_indices(n: ti.i32):
    for i in range(N - 1):
        for _ in range(n):
            h[i] = h[i] * p[i] + h[i + 1]


@ti.kernel
def moving_index(n: ti.i32):
    for i in h:
        j = i
        for _ in range(n):
            h[j] = h[j] * p[i]
            j = (j + 1) % N


@pytest.mark.parametrize("kernel", [through_a_func_reading_a_field, two_indices, moving_index])
def test_loops_reaching_the_field_otherwise_are_left_as_written(kernel):
    parsed = bind(parse(kernel), None)
    assert entries_as_locals(parsed, _touches_fields) is parsed


def test_the_kernel_as_written_for_its_adjoint():
    parsed = entries_as_locals(bind(parse(compound), None), _touches_fields)
    assert ast.unparse(parsed.tree).splitlines()[2:6] == [
        "        h_entry = h[i]",
        "        for _ in range(n):",
        "            h_entry = h_entry * p[i] + 0.1 * ti.sin(h_entry)",
        "        h[i] = h_entry",
    ]


@ti.kernel
def ndarray_updates(x: ti.types.ndarray(), w: ti.types.ndarray(), y: ti.types.ndarray(), n: ti.i32):
    for i in x:
        y[i] = x[i]
        for _ in range(n):
            y[i] = y[i] * w[i] + 0.1 * ti.sin(y[i])


NDARRAY = {n: td.function(ndarray_updates, inputs=["x", "w"], outputs={"y": lambda x, w: x.shape},
                          constants={"n": n}) for n in (0, 2, 3)}


@given(st.sampled_from(sorted(NDARRAY)), st.integers(0, 2**32 - 1))
def test_an_ndarray_kernel_updating_its_output_in_a_loop(n, seed):
    rng = np.random.default_rng(seed)
    x, w, c = rng.uniform(-1, 1, N), rng.uniform(-1.2, 1.2, N), rng.uniform(-1, 1, N)
    fn = NDARRAY[n]
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        _, vjp_fn = td.vjp(fn, x, w)
        got = vjp_fn(c)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    y = xt
    for _ in range(n):
        y = y * wt + 0.1 * torch.sin(y)
    for g, want in zip(got, torch.autograd.grad(y, (xt, wt), torch.tensor(c), allow_unused=True), strict=True):
        np.testing.assert_allclose(g, np.zeros(N) if want is None else want.numpy(), rtol=1e-12, atol=1e-14)
    assert fn.memo.peek("reverse verdict") is None
