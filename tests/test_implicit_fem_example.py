"""examples/implicit_fem.py: the Newton steps of a falling Neo-Hookean cube, written as its energy alone."""
import importlib.util
import pathlib

import numpy as np
import pytest

import tidiff as td

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


def test_the_newton_step_equals_the_dense_one(body):
    x_hat = body.x + body.h * body.v
    x = body.x + 0.01 * np.random.default_rng(0).standard_normal(body.x.shape)
    n = x.size
    dense = (td.hessian(body.elastic)(x, body.B, body.vol).reshape(n, n)
             + td.hessian(body.nodal)(x, x_hat, body.mass, body.h).reshape(n, n))
    step = np.linalg.solve(dense, -body.gradient(x, x_hat).ravel())
    sparse_step = body.newton_direction(x, x_hat, project=None).ravel()
    np.testing.assert_allclose(sparse_step, step, rtol=1e-10, atol=1e-10 * np.abs(step).max())
    np.testing.assert_allclose(body.hessian(x, x_hat, None).toarray(), dense, rtol=1e-10, atol=1e-8)
