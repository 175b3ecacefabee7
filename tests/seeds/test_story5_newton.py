"""User story 5: per-element Newton with exact Hessians inside one kernel converges quadratically."""
import pathlib
import runpy

import numpy as np
import torch

import tidiff as td

example = runpy.run_path(
    str(pathlib.Path(__file__).parents[2] / "examples" / "newton_neo_hookean.py"), run_name="example"
)


def torch_energy(f, p):
    F = torch.stack([torch.stack([f[0], f[2]]), torch.stack([f[2], f[1]])])
    log_j = torch.log(torch.det(F))
    return example["MU"] / 2 * ((F.T @ F).trace() - 2) - example["MU"] * log_j + example["LAM"] / 2 * log_j**2 - f @ p


def test_hessian_matches_torch():
    rng = np.random.default_rng(0)
    f = np.array([1.0, 1.0, 0.0]) + rng.uniform(-0.2, 0.2, size=(5, 3))
    p = rng.uniform(-0.3, 0.3, size=(5, 3))
    H = td.hessian(example["neo_hookean"])(f, p)
    for i in range(5):
        expected = torch.autograd.functional.hessian(
            lambda f_, i=i: torch_energy(f_, torch.tensor(p[i])), torch.tensor(f[i])
        )
        np.testing.assert_allclose(H[i], expected.numpy(), rtol=1e-10, atol=1e-12)


def test_newton_converges_quadratically():
    loads = np.random.default_rng(1).uniform(-0.1, 0.1, size=(1000, 3))
    f, history = example["solve"](loads, steps=7)
    worst = history.max(axis=1)
    final = np.abs(td.grad(example["neo_hookean"])(f, loads)).max()
    assert final < 1e-12
    # quadratic: once in the basin, r_{k+1} <= C r_k^2 with a modest C
    k = int(np.argmax(worst < 1e-2))
    for a, b in zip(worst[k:-1], worst[k + 1:]):
        if a > 1e-7:
            assert b <= 10 * a**2, (a, b)
