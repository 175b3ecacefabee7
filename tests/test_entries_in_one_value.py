"""Entry reads in straight-line code give one cotangent value, not one per entry (NOTE: [Entries in one
value] in tidiff/_rules/helpers.py): the reverse code of a function reading each of a vector's n entries
grows with n, not n * n, and its derivatives are those of torch at every order."""
import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td

N = 8
vec = ti.types.vector(N, ti.f64)
mat3 = ti.types.matrix(3, 3, ti.f64)


@ti.func
def logsumexp_entries(x: vec) -> ti.f64:
    s = 0.0
    for i in ti.static(range(N)):
        s += ti.exp(x[i])
    return ti.log(s) + x.dot(x) ** 2


def logsumexp_twin(x):
    return torch.log(torch.exp(x).sum()) + (x @ x) ** 2


@ti.func
def weighted_entries(m: mat3) -> ti.f64:
    s = 0.0
    for i in ti.static(range(3)):
        for j in ti.static(range(3)):
            s += ti.sin(m[i, j]) * (i + 2 * j + 1)
    return s * m[0, 0] + m[1, 2] ** 3  # m[0, 0] and m[1, 2] read twice


def weighted_twin(m):
    w = torch.tensor([[i + 2 * j + 1.0 for j in range(3)] for i in range(3)], dtype=torch.float64)
    return (torch.sin(m) * w).sum() * m[0, 0] + m[1, 2] ** 3


@ti.func
def ring(x: vec, w: ti.f64) -> ti.f64:
    total = 0.0
    for i in range(N):  # a loop over constants, unrolled: x[(i + 1) % N] reads a constant entry
        total += ti.sin(w * x[i]) * x[(i + 1) % N] - x[N - 1 - i] * x[i // 2]
    return total


def ring_twin(x, w):
    i = torch.arange(N)
    return (torch.sin(w * x) * x[(i + 1) % N] - x[N - 1 - i] * x[i // 2]).sum()


CASES = [(logsumexp_entries, logsumexp_twin, (N,)), (weighted_entries, weighted_twin, (3, 3))]
ids = ["vector", "matrix"]


def test_entries_at_constant_expressions_are_constant_entries():
    """NOTE: [Constant indices] in tidiff/_adjoint/transform.py."""
    x = np.linspace(-1.0, 1.0, N)
    source = td.source(td.grad(ring), x, 0.7)
    assert source.count("scattered(x,") == 1 and "scatter(" not in source and "% 8" not in source, source
    xt = torch.tensor(x, requires_grad=True)
    ring_twin(xt, 0.7).backward()
    np.testing.assert_allclose(td.grad(ring)(x, 0.7), xt.grad.numpy(), rtol=1e-12, atol=1e-14)
    hessian = torch.autograd.functional.hessian(lambda v: ring_twin(v, 0.7), torch.tensor(x))
    np.testing.assert_allclose(td.hessian(ring)(x, 0.7), hessian.numpy(), rtol=1e-10, atol=1e-12)


def test_the_reverse_code_adds_the_entries_once():
    x = np.linspace(-1.0, 1.0, N)
    source = td.source(td.grad(logsumexp_entries), x)
    assert source.count("scattered(x,") == 1 and "scatter(" not in source, source
    source = td.source(td.grad(weighted_entries), np.eye(3))
    assert source.count("scattered2(m,") == 1 and "scatter2(" not in source, source


@pytest.mark.parametrize("case", CASES, ids=ids)
@given(seed=st.integers(0, 2**32 - 1))
def test_gradient_and_hessian_against_torch(case, seed):
    f, twin, shape = case
    x = np.random.default_rng(seed).uniform(-1.0, 1.0, size=(2,) + shape)
    for b in range(2):
        t = torch.tensor(x[b])
        want_g = torch.autograd.functional.jacobian(twin, t).numpy()
        want_h = torch.autograd.functional.hessian(twin, t).numpy()
        np.testing.assert_allclose(td.grad(f)(x)[b], want_g, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(td.hessian(f)(x)[b], want_h.reshape(td.hessian(f)(x)[b].shape), rtol=1e-9,
                                   atol=1e-12)
