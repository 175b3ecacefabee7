"""Batch dims: broadcasting across arguments, per-element transforms, whole-batch jvp/vjp."""
import numpy as np
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st
from op_table import ROW_BY_NAME

import tidiff as td

vector = ROW_BY_NAME["vector"].func  # s * x.dot(x) + sin(x[0]), x: vec3, s: scalar


@ti.func
def affine(x: ti.math.vec3, W: ti.types.matrix(2, 3, ti.f64), b: ti.math.vec2) -> ti.math.vec2:
    return ti.tanh(W @ x + b)


def expected_grad_x(x, s):
    g = 2 * s[..., None] * x
    g[..., 0] += np.cos(x[..., 0])
    return g


@given(seed=st.integers(0, 2**31), batch=st.sampled_from([(4,), (2, 3), (1,), (0,)]))
def test_batched_matches_per_element(seed, batch):
    rng = np.random.default_rng(seed)
    x, s = rng.standard_normal(batch + (3,)), rng.standard_normal(batch)
    np.testing.assert_allclose(td.function(vector)(x, s), s * (x * x).sum(-1) + np.sin(x[..., 0]), rtol=1e-12)
    np.testing.assert_allclose(td.grad(vector)(x, s), expected_grad_x(x, s), rtol=1e-12, atol=1e-14)
    for idx in np.ndindex(*batch):
        np.testing.assert_allclose(td.grad(vector)(x[idx], s[idx]), expected_grad_x(x[idx], s[idx]), rtol=1e-12)


def test_broadcast_argument_gets_per_element_gradient():
    """grad with respect to an unbatched argument comes back once per element, as vmap(grad)."""
    x = np.random.default_rng(0).standard_normal((5, 3))
    ds = td.grad(vector, argnums=1)(x, 2.0)
    assert ds.shape == (5,)
    np.testing.assert_allclose(ds, (x * x).sum(-1), rtol=1e-12)
    jw = td.jacrev(affine, argnums=1)(x, np.ones((2, 3)), np.zeros(2))
    assert jw.shape == (5, 2, 2, 3)


def test_partly_broadcast_batch_dims():
    rng = np.random.default_rng(1)
    x, s = rng.standard_normal((2, 1, 3)), rng.standard_normal((1, 4))
    out = td.function(vector)(x, s)
    assert out.shape == (2, 4)
    np.testing.assert_allclose(out, s * (x * x).sum(-1) + np.sin(x[..., 0]), rtol=1e-12)
    g = td.grad(vector, argnums=(0, 1))(x, s)
    assert g[0].shape == (2, 4, 3) and g[1].shape == (2, 4)


def test_vjp_sums_cotangent_of_broadcast_argument():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 3))
    W, b = rng.standard_normal((2, 3)), rng.standard_normal(2)
    y, vjp_fn = td.vjp(affine, x, W, b)
    c = rng.standard_normal(y.shape)
    dx, dW, db = vjp_fn(c)
    assert dx.shape == x.shape and dW.shape == W.shape and db.shape == b.shape
    xt, Wt, bt = (torch.tensor(a) for a in (x, W, b))
    _, (ex, eW, eb) = torch.autograd.functional.vjp(
        lambda x_, W_, b_: torch.tanh(x_ @ W_.T + b_), (xt, Wt, bt), torch.tensor(c)
    )
    for got, want in ((dx, ex), (dW, eW), (db, eb)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-12)


def test_jvp_applies_broadcast_tangent_to_every_element():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 3))
    W, b = rng.standard_normal((2, 3)), rng.standard_normal(2)
    tx, tW, tb = rng.standard_normal(x.shape), rng.standard_normal(W.shape), rng.standard_normal(b.shape)
    y, ty = td.jvp(affine, (x, W, b), (tx, tW, tb))
    _, expected = torch.autograd.functional.jvp(
        lambda x_, W_, b_: torch.tanh(x_ @ W_.T + b_),
        tuple(map(torch.tensor, (x, W, b))),
        tuple(map(torch.tensor, (tx, tW, tb))),
    )
    np.testing.assert_allclose(ty, expected.numpy(), rtol=1e-10, atol=1e-12)


def test_torch_in_torch_out():
    x = torch.randn(4, 3, dtype=torch.float64)
    y = td.function(vector)(x, 2.0)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float64 and y.device == x.device
    g = td.grad(vector)(x, torch.tensor(2.0, dtype=torch.float64))
    assert isinstance(g, torch.Tensor)
    np.testing.assert_allclose(g.numpy(), expected_grad_x(x.numpy(), np.full(4, 2.0)), rtol=1e-12)


def test_python_number_gives_zero_dim_array():
    out = td.grad(ROW_BY_NAME["int_pow"].func)(1.0)
    assert isinstance(out, np.ndarray) and out.shape == () and out == 4.0


def test_inputs_are_not_mutated():
    x = np.random.default_rng(4).standard_normal((5, 3))
    before = x.copy()
    td.grad(vector)(x, 2.0)
    td.jacfwd(vector)(x, 2.0)
    td.vjp(vector, x, 2.0)[1](np.ones(5))
    np.testing.assert_array_equal(x, before)
