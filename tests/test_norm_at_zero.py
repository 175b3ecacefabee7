"""The norm of a zero vector (NOTE: [Norm at zero] in tidiff/_rules/ops.py): derivatives through it are 0.

A state at rest (DiffTaichi's rigid_body: a joint closed at t = 0) is a zero vector whose tangent is 0;
``x.dot(dx) / |x|`` was 0 / 0 = NaN there and made every forward-mode derivative NaN where the gradient
was finite (long run of DiffTaichi programs, stop 22). Both rule tables take the norm's derivative at
zero as 0, as torch does.
"""
import numpy as np
import taichi as ti
import torch

import tidiff as td

# --- a field program: the state at t = 0 is at rest, the program writes the same field later ---------
v = ti.Vector.field(2, ti.f64, shape=(2, 2))  # v[t, body]; v[0] = 0
w = ti.field(ti.f64, shape=())
loss = ti.field(ti.f64, shape=())


@ti.kernel
def step(t: ti.i32):
    for i in range(2):
        relative = v[t, 0] - v[t, 1]
        v[t + 1, i] = v[t, i] + w[None] * (relative.norm() + 0.1) * ti.Vector([1.0, i])


@ti.kernel
def compute_loss():
    loss[None] = v[1, 1].sum() + ti.math.distance(v[0, 0], v[0, 1]) * w[None]


def program():
    step(0)
    compute_loss()


def test_forward_mode_through_the_norm_of_a_state_at_rest_is_finite():
    F = td.function(program, inputs=[w], outputs=[loss])
    assert F(2.0) == 0.4
    assert td.grad(F)(2.0) == 0.2
    assert td.jvp(F, (2.0,), (1.0,))[1] == 0.2
    assert td.jvp(F, (2.0,), (0.0,))[1] == 0.0
    assert td.jacfwd(F)(2.0) == 0.2
    assert td.hessian(F)(2.0) == 0.0
    assert td.hvp(F, (2.0,), (1.0,))[1] == (0.0,)


# --- a @ti.func: a zero vector whose tangent is zero in every lane --------------------------------
@ti.func
def at_rest(x: ti.types.vector(2, ti.f64), s: ti.f64) -> ti.f64:
    rest = x * 0.0
    return (rest.norm() + 0.1) * s + ti.math.distance(rest, rest * 2.0) * s + rest.norm(0.0) * x[0]


def twin(x, s):
    rest = x * 0.0
    return (torch.linalg.vector_norm(rest) + 0.1) * s + torch.linalg.vector_norm(rest - rest * 2.0) * s \
        + torch.linalg.vector_norm(rest) * x[0]


def test_every_transform_through_the_norm_of_a_zero_vector_is_finite():
    """``rest`` is 0 for every ``x``, so ``at_rest(x, s) = 0.1 s``: first order as torch's, second order 0 (torch's
    own double backward gives NaN there)."""
    x, s = np.array([0.3, -0.4]), 1.5
    want = torch.autograd.functional.jacobian(twin, (torch.tensor(x), torch.tensor(s, dtype=torch.float64)))
    assert [t.tolist() for t in want] == [[0.0, 0.0], 0.1]
    for transform in (td.grad, td.jacfwd, td.jacrev):
        got = transform(at_rest, argnums=(0, 1))(x, s)
        for g, t in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, t.numpy())
    hessian = td.hessian(at_rest, argnums=(0, 1))(x, s)
    for row, shapes in zip(hessian, [((2, 2), (2,)), ((2,), ())], strict=True):
        for block, shape in zip(row, shapes, strict=True):
            np.testing.assert_array_equal(block, np.zeros(shape))
    _, (hx, hs) = td.hvp(at_rest, (x, s), (np.array([1.0, 2.0]), 1.0))
    np.testing.assert_array_equal(hx, [0.0, 0.0])
    assert hs == 0.0


@ti.func
def angle(y: ti.f64, x: ti.f64) -> ti.f64:
    return ti.atan2(y, x)


def test_atan2_at_the_origin_has_torch_derivatives():
    """Issue 35, item 3: NaN at (0, 0) where torch gives 0; elsewhere unchanged, in both modes."""
    points = np.array([[0.0, 0.0], [0.3, -1.2], [-2.0, 0.5], [1e-3, 0.0]])
    got_rev = td.grad(angle, argnums=(0, 1))(points[:, 0], points[:, 1])
    got_fwd = td.jacfwd(angle, argnums=(0, 1))(points[:, 0], points[:, 1])
    for k, (y, x) in enumerate(points):
        yt = torch.tensor(y, requires_grad=True)
        xt = torch.tensor(x, requires_grad=True)
        torch.atan2(yt, xt).backward()
        want = (yt.grad.item(), xt.grad.item())
        np.testing.assert_allclose([got_rev[0][k], got_rev[1][k]], want, rtol=1e-14)
        np.testing.assert_allclose([got_fwd[0][k], got_fwd[1][k]], want, rtol=1e-14)
    assert np.all(np.isfinite(td.hessian(angle, argnums=(0, 1))(0.0, 0.0)))
