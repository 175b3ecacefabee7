"""A kernel running stages in a top-level ``ti.static`` loop around parallel loops (NOTE: [Static loops around
parallel loops]): the adjoint transform did not take it, and where the stages update a field in place Taichi's
reverse mode was found wrong and replaced by forward pushes (a survey of kernels as users write them). Unrolled
when parsed, it is exact and unchecked."""
import ast
import warnings

import numpy as np
import taichi as ti
import torch
from exact_vjp import assert_exact_vjp
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td
from tidiff._lang.parse import parse

N = 4
STAGES = 3
x = ti.field(ti.f64, shape=N)
y = ti.field(ti.f64, shape=N)
loss = ti.field(ti.f64, shape=())


@ti.kernel
def staged():
    for i in x:
        y[i] = x[i]
    for s in ti.static(range(STAGES - 1)):
        for i in y:
            y[i] = ti.sin(y[i]) + 0.25 * s * x[i]
    for i in y:
        loss[None] += y[i] * (i + 1)


@ti.kernel
def staged_rows(x: ti.types.ndarray(), out: ti.types.ndarray()):
    for i in x:
        out[i] = x[i] ** 2
    for s in ti.static(range(2)):
        for i in x:
            out[i] = ti.tanh(out[i]) * (s + 1.0)


def torch_staged(t):
    v = t
    for s in range(STAGES - 1):
        v = torch.sin(v) + 0.25 * s * t
    return (v * torch.arange(1, N + 1, dtype=t.dtype)).sum()


PROGRAM = td.function(staged, inputs=[x], outputs=[loss])
ROWS = td.function(staged_rows, inputs=["x"], outputs={"out": lambda x: x.shape})


def test_the_stages_are_unrolled_when_parsed():
    source = ast.unparse(parse(staged).tree)
    assert "ti.static" not in source and "y[i] = ti.sin(y[i]) + 0.25 * 1 * x[i]" in source


@given(st.lists(st.floats(-1.5, 1.5), min_size=N, max_size=N))
def test_stages_updating_in_place_are_exact_and_unchecked(values):
    x0 = np.array(values)
    t = torch.tensor(x0, requires_grad=True)
    want = torch_staged(t)
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        value, grad = td.value_and_grad(PROGRAM)(x0)
        out, pull = td.vjp(ROWS, x0)
        (rows_grad,) = pull(np.ones(N))
    np.testing.assert_allclose(value, want.item(), rtol=1e-12)
    np.testing.assert_allclose(grad, torch.autograd.grad(want, t)[0].numpy(), rtol=1e-10, atol=1e-13)
    r = t ** 2
    for s in range(2):
        r = torch.tanh(r) * (s + 1.0)
    np.testing.assert_allclose(out, r.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(rows_grad, torch.autograd.grad(r.sum(), t)[0].numpy(), rtol=1e-10, atol=1e-13)
    assert PROGRAM.memo.peek("reverse verdict") is None and ROWS.memo.peek("reverse verdict") is None


nd = ti.types.ndarray(dtype=ti.f64)


@ti.kernel
def filled_by_components(a: nd, u: nd, out: nd):
    m = ti.math.mat3(0.0)
    for r, c in ti.static(ti.ndrange(3, 3)):  # statements alone: a top-level local filled entry by entry
        m[r, c] = a[r, c]
    for s in range(u.shape[0]):
        v = m @ ti.math.vec3(u[s, 0], u[s, 1], u[s, 2])
        for k in ti.static(range(3)):
            out[s, k] = ti.tanh(v[k])


def test_a_local_filled_in_a_static_loop_of_statements():
    """Taken for a parallel loop assigning ``m`` before, refused, and refused by Taichi's kernel.grad too."""
    f = td.function(filled_by_components, inputs=["a", "u"], outputs={"out": lambda a, u: u.shape})
    rng = np.random.default_rng(3)
    a, u, ct = rng.uniform(-1, 1, (3, 3)), rng.uniform(-1, 1, (4, 3)), rng.normal(size=(4, 3))
    assert f.adjoint_for(f.specs_for([a, u])) is not None
    assert_exact_vjp(f, [a, u], lambda a_, u_: torch.tanh(u_ @ a_.T), [ct])


@ti.kernel
def state_space_scan(a: nd, u: nd, out: nd):
    m = ti.math.mat3(0.0)
    for r, c in ti.static(ti.ndrange(3, 3)):
        m[r, c] = a[r, c]
    for s in range(u.shape[0]):
        state = ti.math.vec3(0.0)
        for t in range(u.shape[1]):  # the top-level matrix read in a runtime loop of the parallel loop
            state = m @ state + u[s, t]
            out[s, t] = state.sum()


def state_space_torch(a, u):
    state = torch.zeros(u.shape[0], 3, dtype=u.dtype)
    outs = []
    for t in range(u.shape[1]):
        state = state @ a.T + u[:, t:t + 1]
        outs.append(state.sum(dim=1))
    return torch.stack(outs, dim=1)


def test_a_top_level_matrix_read_in_a_runtime_loop_of_the_parallel_loop():
    """Its cotangent's zero was declared inside the parallel loop, and the sum after it added into that name,
    which Taichi did not know there: the adjoint did not compile."""
    f = td.function(state_space_scan, inputs=["a", "u"], outputs={"out": lambda a, u: u.shape})
    rng = np.random.default_rng(5)
    a, u, ct = 0.5 * rng.uniform(-1, 1, (3, 3)), rng.uniform(-1, 1, (2, 4)), rng.normal(size=(2, 4))
    assert_exact_vjp(f, [a, u], state_space_torch, [ct])
