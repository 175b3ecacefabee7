"""User story 2 (forum thread): batched J^T v of y = tanh(W x + b), one reverse pass for the batch.

The user looped over output components in Python, one Taichi reverse pass
each; with tidiff it is one ``td.vjp`` over the whole batch.
"""
import numpy as np
import taichi as ti
import torch

import tidiff as td

N, M = 8, 4


@ti.func
def layer(x: ti.types.vector(N, ti.f64), W: ti.types.matrix(M, N, ti.f64), b: ti.types.vector(M, ti.f64)):
    return ti.tanh(W @ x + b)


def test_batched_jtv_matches_torch_full_jacobian():
    rng = np.random.default_rng(42)
    B = 64
    W, b = rng.standard_normal((M, N)), rng.standard_normal(M)
    x, v = rng.standard_normal((B, N)), rng.standard_normal((B, M))

    y, vjp_fn = td.vjp(layer, x, W, b)
    jtv, _, _ = vjp_fn(v)

    Wt, bt = torch.tensor(W), torch.tensor(b)
    jac = torch.autograd.functional.jacobian(lambda x_: torch.tanh(x_ @ Wt.T + bt), torch.tensor(x))
    per_sample = jac.diagonal(dim1=0, dim2=2).permute(2, 0, 1)  # (B, M, N)
    expected = torch.einsum("bmn,bm->bn", per_sample, torch.tensor(v)).numpy()
    np.testing.assert_allclose(jtv, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(y, np.tanh(x @ W.T + b), rtol=1e-12)


def test_one_reverse_pass_for_the_batch():
    """The vjp compiles its kernels once; a new batch size adds no compile."""
    rng = np.random.default_rng(0)
    W, b = rng.standard_normal((M, N)), rng.standard_normal(M)
    for B in (16, 1000):
        _, vjp_fn = td.vjp(layer, rng.standard_normal((B, N)), W, b)
        vjp_fn(rng.standard_normal((B, M)))
        if B == 16:
            first = td.cache_info()["vjp(layer)"].compiles
    assert td.cache_info()["vjp(layer)"].compiles == first


def test_per_sample_jacobians_forward_equals_reverse():
    rng = np.random.default_rng(1)
    W, b = rng.standard_normal((M, N)), rng.standard_normal(M)
    x = rng.standard_normal((32, N))
    jf = td.jacfwd(layer)(x, W, b)
    jr = td.jacrev(layer)(x, W, b)
    assert jf.shape == (32, M, N)
    np.testing.assert_allclose(jf, jr, rtol=1e-12, atol=1e-14)
    expected = (1 - np.tanh(x @ W.T + b) ** 2)[:, :, None] * W[None]
    np.testing.assert_allclose(jf, expected, rtol=1e-12, atol=1e-14)
