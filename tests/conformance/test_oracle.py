"""The torch oracle itself: where torch's own derivatives are wrong, the twin must not use them."""
import numpy as np
import taichi as ti
import torch

import tidiff as td

from .ops import OPS
from .render_torch import namespace


@ti.func
def det_of_a_singular_cube(x0: ti.types.vector(1, ti.f64)) -> ti.f64:
    m = ti.Matrix([[x0[0], x0[0], x0[0]], [x0[0], x0[0], x0[0]], [x0[0], x0[0], x0[0]]]) * 1.7
    return ti.math.determinant(ti.pow(m, 3))


def test_determinant_twin_has_finite_derivatives_at_singular_matrices():
    """Found by the long run: torch.linalg.det's fourth derivative of a determinant that is 0 for every x
    is NaN; the twin's cofactor polynomial gives the true 0 (tidiff's answer)."""
    det = eval("lambda m: " + OPS["determinant_fn"].torch.format("m"), namespace())

    def twin(x):
        return det((1.7 * x[0] * torch.ones(3, 3, dtype=torch.float64)) ** 3)

    x = torch.tensor([1.2695181265981104], dtype=torch.float64)
    d = twin
    for _ in range(4):
        d = (lambda g: lambda y: torch.autograd.functional.jacobian(g, y, create_graph=True))(d)
    fourth = d(x)
    np.testing.assert_array_equal(fourth.detach().numpy(), np.zeros((1, 1, 1, 1)))
    got = td.jacfwd(td.jacobian(td.hessian(det_of_a_singular_cube)))(x.numpy())
    np.testing.assert_array_equal(got, np.zeros((1, 1, 1, 1)))
