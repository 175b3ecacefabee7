"""examples/implicit_fem.py: the Newton steps of a falling Neo-Hookean cube, written as its energy alone."""
import importlib.util
import pathlib

import numpy as np
import pytest
import torch

spec = importlib.util.spec_from_file_location(
    "implicit_fem", pathlib.Path(__file__).parents[1] / "examples" / "implicit_fem.py")
implicit_fem = importlib.util.module_from_spec(spec)
spec.loader.exec_module(implicit_fem)


@pytest.fixture(scope="module")
def body():
    b = implicit_fem.FallingBody(2, h=2e-2)
    b.x[:, 2] -= 0.45  # starts 5 cm above the ground: it lands within the steps below
    return b


def test_the_energy_falls_at_every_newton_iteration_and_the_cube_lands(body):
    for _ in range(12):
        energies = body.step()
        assert all(b < a for a, b in zip(energies, energies[1:], strict=False)), energies
    assert body.x[:, 2].min() < 0.0  # pressed into the ground's penalty
    assert np.abs(body.v).max() < 5.0


def incremental_potential(body, x_hat):
    """The example's energy in torch: the independent oracle of its gradient and Hessian."""
    tets, B, vol = torch.tensor(body.tets), torch.tensor(body.B), torch.tensor(body.vol)
    m, h, x_hat = torch.tensor(body.mass), body.h, torch.tensor(x_hat)
    mu, lam = implicit_fem.MU, implicit_fem.LAM

    def energy(x):
        xe = x.reshape(-1, 3)[tets]
        F = torch.stack([xe[:, 1] - xe[:, 0], xe[:, 2] - xe[:, 0], xe[:, 3] - xe[:, 0]], dim=2) @ B
        log_j = torch.log(torch.linalg.det(F))
        elastic = (vol * (mu / 2 * ((F * F).sum((1, 2)) - 3) - mu * log_j + lam / 2 * log_j**2)).sum()
        y = x.reshape(-1, 3)
        below = torch.clamp(y[:, 2], max=0.0)
        nodal = (m / (2 * h * h) * ((y - x_hat) ** 2).sum(1) + m * implicit_fem.GRAVITY * y[:, 2]
                 + implicit_fem.GROUND_STIFFNESS / 2 * below**2).sum()
        return elastic + nodal

    return energy


def test_the_newton_step_equals_the_dense_one(body):
    x_hat = body.x + body.h * body.v
    x = body.x + 0.01 * np.random.default_rng(0).standard_normal(body.x.shape)
    x[:, 2] -= x[:, 2].min() + 0.01  # the lowest nodes in the ground: the penalty's curvature too
    energy = incremental_potential(body, x_hat)
    dense = torch.autograd.functional.hessian(energy, torch.tensor(x.ravel())).numpy()
    gradient = torch.func.grad(energy)(torch.tensor(x.ravel())).numpy()
    np.testing.assert_allclose(body.gradient(x, x_hat).ravel(), gradient, rtol=1e-10, atol=1e-8)
    step = np.linalg.solve(dense, -gradient)
    sparse_step = body.newton_direction(x, x_hat, project=None).ravel()
    np.testing.assert_allclose(sparse_step, step, rtol=1e-10, atol=1e-10 * np.abs(step).max())
    np.testing.assert_allclose(body.hessian(x, x_hat, None).toarray(), dense, rtol=1e-10, atol=1e-8)
