"""Nesting and aux outputs as JAX has them: has_aux, several outputs, tuple argnums, hvp."""
import numpy as np
import pytest
import taichi as ti
import torch

import tidiff as td


@ti.func
def with_aux(x: ti.math.vec3, s: ti.f64):
    return s * x.norm_sqr(), x * 2.0  # (scalar loss, aux)


@ti.func
def two_outputs(x: ti.math.vec2, s: ti.f64):
    return ti.sin(x) * s, x.dot(x) + s * s


def test_grad_and_value_and_grad_with_aux():
    x = np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 0.0]])
    g, aux = td.grad(with_aux, has_aux=True)(x, 2.0)
    np.testing.assert_allclose(g, 4.0 * x)
    np.testing.assert_allclose(aux, 2.0 * x)
    (value, aux2), (gx, gs) = td.value_and_grad(with_aux, argnums=(0, 1), has_aux=True)(x, 2.0)
    np.testing.assert_allclose(value, 2.0 * (x * x).sum(-1))
    np.testing.assert_allclose(aux2, 2.0 * x)
    np.testing.assert_allclose(gx, 4.0 * x)
    np.testing.assert_allclose(gs, (x * x).sum(-1))


def test_vjp_with_aux():
    x = np.array([1.0, 2.0, 3.0])
    out, vjp_fn, aux = td.vjp(with_aux, x, 2.0, has_aux=True)
    assert out == 28.0
    np.testing.assert_allclose(aux, 2.0 * x)
    gx, gs = vjp_fn(np.array(1.5))
    np.testing.assert_allclose(gx, 1.5 * 4.0 * x)
    assert gs == 1.5 * 14.0


def test_has_aux_needs_a_pair():
    @ti.func
    def single(x: ti.f64) -> ti.f64:
        return x * x

    with pytest.raises(TypeError, match="pair"):
        td.grad(single, has_aux=True)(1.0)


def _torch_two(x, s):
    return torch.sin(x) * s, x.dot(x) + s * s


def test_jacobian_of_several_outputs_nests_outputs_outer_arguments_inner():
    x, s = np.array([0.3, -0.4]), 1.5
    jac = td.jacobian(two_outputs, argnums=(0, 1))(x, s)
    expected = torch.autograd.functional.jacobian(_torch_two, (torch.tensor(x), torch.tensor(s, dtype=torch.float64)))
    assert len(jac) == 2 and all(len(row) == 2 for row in jac)
    for got_row, want_row in zip(jac, expected):
        for got, want in zip(got_row, want_row):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-15)
    assert jac[0][0].shape == (2, 2) and jac[0][1].shape == (2,) and jac[1][0].shape == (2,) and jac[1][1].shape == ()
    # a single argnum: one block per output
    j0 = td.jacfwd(two_outputs)(x, s)
    assert isinstance(j0, tuple) and j0[0].shape == (2, 2) and j0[1].shape == (2,)


def test_jvp_and_vjp_of_several_outputs():
    x, s = np.array([0.3, -0.4]), 1.5
    (y0, y1), (t0, t1) = td.jvp(two_outputs, (x, s), (np.array([1.0, 0.0]), 0.5))
    _, (e0, e1) = torch.autograd.functional.jvp(
        _torch_two,
        (torch.tensor(x), torch.tensor(s, dtype=torch.float64)),
        (torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor(0.5, dtype=torch.float64)),
    )
    np.testing.assert_allclose(t0, e0.numpy(), rtol=1e-12)
    np.testing.assert_allclose(t1, e1.numpy(), rtol=1e-12)
    _, vjp_fn = td.vjp(two_outputs, x, s)
    gx, gs = vjp_fn((np.array([1.0, 2.0]), np.array(0.5)))
    _, (ex, es) = torch.autograd.functional.vjp(
        _torch_two,
        (torch.tensor(x), torch.tensor(s, dtype=torch.float64)),
        (torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor(0.5, dtype=torch.float64)),
    )
    np.testing.assert_allclose(gx, ex.numpy(), rtol=1e-12)
    np.testing.assert_allclose(gs, es.numpy(), rtol=1e-12)
    with pytest.raises(TypeError, match="tuple of 2"):
        vjp_fn(np.array([1.0, 2.0]))


@ti.func
def scaled(x: ti.math.vec2, n: ti.i32, s: ti.f64) -> ti.f64:
    return s * x.norm_sqr() * n + ti.sin(s * x[0])


def test_hvp_over_every_float_argument_in_the_structure_of_tangents():
    x, s = np.array([[0.3, -0.4], [1.0, 0.5]]), 0.7
    v = (np.array([1.0, 2.0]), None, 0.5)
    value, hv = td.hvp(scaled, (x, 3, s), (np.broadcast_to(v[0], x.shape), None, 0.5))
    assert value.shape == (2,) and hv[1] is None
    assert hv[0].shape == (2, 2) and hv[2].shape == (2,)
    for i in range(2):
        H = torch.autograd.functional.hessian(
            lambda x_, s_: s_ * (x_ * x_).sum() * 3 + torch.sin(s_ * x_[0]),
            (torch.tensor(x[i]), torch.tensor(s, dtype=torch.float64)),
        )
        vx, vs = torch.tensor(v[0]), torch.tensor(v[2], dtype=torch.float64)
        np.testing.assert_allclose(hv[0][i], (H[0][0] @ vx + H[0][1] * vs).numpy(), rtol=1e-12)
        np.testing.assert_allclose(hv[2][i], (H[1][0] @ vx + H[1][1] * vs).numpy(), rtol=1e-12)


def test_hessian_with_tuple_argnums_is_the_nested_block_matrix():
    x, s = np.array([0.3, -0.4]), 0.7
    H = td.hessian(scaled, argnums=(0, 2))(x, 2, s)
    expected = torch.autograd.functional.hessian(
        lambda x_, s_: s_ * (x_ * x_).sum() * 2 + torch.sin(s_ * x_[0]),
        (torch.tensor(x), torch.tensor(s, dtype=torch.float64)),
    )
    for a in range(2):
        for b in range(2):
            np.testing.assert_allclose(H[a][b], expected[a][b].numpy(), rtol=1e-12, atol=1e-15)


@ti.func
def named_like_locals(p: ti.math.vec3, e: ti.f64, t: ti.f64, r: ti.f64) -> ti.f64:
    return e * p.dot(p) + ti.sin(t * p[0]) * r


def test_parameters_named_like_generated_locals():
    rng = np.random.default_rng(4)
    p, e, t, r = (
        rng.uniform(0.2, 1.0, (2, 3)),
        rng.uniform(0.2, 1.0, 2),
        rng.uniform(0.2, 1.0, 2),
        rng.uniform(0.2, 1.0, 2),
    )
    grads = td.grad(named_like_locals, argnums=(0, 1, 2, 3))(p, e, t, r)
    hess = td.hessian(named_like_locals)(p, e, t, r)
    _, vjp_fn = td.vjp(named_like_locals, p, e, t, r)
    for b in range(2):
        args = tuple(torch.tensor(v[b]) for v in (p, e, t, r))
        fn = lambda p_, e_, t_, r_: e_ * p_.dot(p_) + torch.sin(t_ * p_[0]) * r_  # noqa: E731
        for got, want in zip(grads, torch.autograd.functional.jacobian(fn, args)):
            np.testing.assert_allclose(got[b], want.numpy(), rtol=1e-13)
        want_h = torch.autograd.functional.hessian(lambda p_, fn=fn, args=args: fn(p_, *args[1:]), args[0])
        np.testing.assert_allclose(hess[b], want_h.numpy(), rtol=1e-13, atol=1e-14)
    for got, want in zip(vjp_fn(np.ones(2)), grads):
        np.testing.assert_allclose(got, want, rtol=1e-13)


@ti.func
def scaled_by_r(p: ti.types.vector(3, ti.f64), r: ti.f64) -> ti.types.vector(3, ti.f64):
    return p * r + ti.sin(p)


def test_a_parameter_named_like_the_reverse_call_in_a_torch_backward():
    p = torch.rand(2, 3, dtype=torch.float64, requires_grad=True)
    r = torch.rand(2, dtype=torch.float64, requires_grad=True)
    td.torch.function(scaled_by_r)(p, r).sum().backward()
    np.testing.assert_allclose(p.grad.numpy(), (r[:, None] + torch.cos(p)).detach().numpy(), rtol=1e-14)
    np.testing.assert_allclose(r.grad.numpy(), p.sum(1).detach().numpy(), rtol=1e-14)
