"""A tuple ``argnums`` in any order (permutations, negatives) gives its blocks in that order.

Regression for issue 10, item 1: tangents were handed to the tangent function
in argnums order instead of parameter order, so ``argnums=(1, 0)`` swapped
blocks (or crashed inside Taichi when the arguments had different shapes).
"""
import itertools

import numpy as np
import pytest
import taichi as ti
import torch

import tidiff as td

vec2 = ti.types.vector(2, ti.f64)
mat2 = ti.types.matrix(2, 2, ti.f64)


@ti.func
def straight(x: ti.f64, v: vec2, m: mat2) -> ti.f64:
    return x * v.dot(m @ v) + ti.sin(x * v[1]) + (m * m).sum() * x


@ti.func
def branchy(x: ti.f64, v: vec2, m: mat2) -> ti.f64:
    out = x * v.dot(m @ v)
    if v[0] > 0.0:  # a runtime branch: no reverse function, forward pushes
        out += ti.sin(x * v[1]) * m[0, 1]
    for i in range(2):  # a runtime loop
        out += m[i, i] * x * x
    return out


def torch_straight(x, v, m):
    return x * (v @ (m @ v)) + torch.sin(x * v[1]) + (m * m).sum() * x


def torch_branchy(x, v, m):
    out = x * (v @ (m @ v))
    if v[0] > 0.0:
        out = out + torch.sin(x * v[1]) * m[0, 1]
    for i in range(2):
        out = out + m[i, i] * x * x
    return out


FUNCS = {"straight": (straight, torch_straight), "branchy": (branchy, torch_branchy)}
ARGS = (0.7, np.array([0.4, -1.3]), np.array([[1.1, -0.2], [0.5, 0.9]]))
ORDERS = [(1, 0), (2, 0, 1), (-1, 0), (0, -2), (2, 1, 0), (-1, -3, 1)]


def torch_blocks(torch_f):
    args = tuple(torch.tensor(a, dtype=torch.float64) for a in ARGS)
    grads = torch.autograd.functional.jacobian(torch_f, args)
    hessian = torch.autograd.functional.hessian(torch_f, args)
    return [g.numpy() for g in grads], [[h.numpy() for h in row] for row in hessian]


def close(actual, expected):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("order", ORDERS, ids=str)
@pytest.mark.parametrize("name", FUNCS)
def test_first_order_blocks_follow_argnums(name, order):
    f, torch_f = FUNCS[name]
    grads, _ = torch_blocks(torch_f)
    want = [grads[a % 3] for a in order]
    for transform in (td.grad, td.jacfwd, td.jacrev, td.jacobian):
        got = transform(f, argnums=order)(*ARGS)
        assert len(got) == len(order)
        for g, w in zip(got, want):
            close(g, w)
    value, got = td.value_and_grad(f, argnums=order)(*ARGS)
    close(value, torch_f(*(torch.tensor(a, dtype=torch.float64) for a in ARGS)).item())
    for g, w in zip(got, want):
        close(g, w)


@pytest.mark.parametrize("order", ORDERS[:3], ids=str)
@pytest.mark.parametrize("name", FUNCS)
def test_hessian_blocks_follow_argnums(name, order):
    f, torch_f = FUNCS[name]
    _, hessian = torch_blocks(torch_f)
    got = td.hessian(f, argnums=order)(*ARGS)
    for i, j in itertools.product(range(len(order)), repeat=2):
        close(got[i][j], hessian[order[i] % 3][order[j] % 3])


def test_scalar_example_from_the_issue():
    @ti.func
    def f(x: ti.f64, z: ti.f64) -> ti.f64:
        return x + 3 * z

    @ti.func
    def g(x: ti.f64, z: ti.f64) -> ti.f64:
        return x * x * z + z**3

    assert [float(d) for d in td.jacfwd(f, argnums=(1, 0))(1.0, 1.0)] == [3.0, 1.0]
    hessian = td.hessian(g, argnums=(1, 0))(2.0, 3.0)
    assert [[float(h) for h in row] for row in hessian] == [[18.0, 4.0], [4.0, 6.0]]


def blocks_in_a_kernel(branchy_f, straight_f):
    """A kernel writing entries of a jacfwd and a hessian block (in argnums order) of these functions."""
    @ti.kernel
    def run(x: ti.f64, v: vec2, m: mat2, out: ti.types.ndarray(ndim=1)):
        gm, gx, gv = td.jacfwd(branchy_f, argnums=(2, 0, 1))(x, v, m)
        hv, hx = td.hessian(straight_f, argnums=(1, 0))(x, v, m)[0]
        out[0] = gx
        out[1] = gv[1]
        out[2] = gm[0, 1]
        out[3] = hv[1, 0]
        out[4] = hx[1]
    return run


def check_blocks_in_a_kernel(branchy_f, straight_f):
    grads, _ = torch_blocks(torch_branchy)
    _, hessian = torch_blocks(torch_straight)
    out = np.zeros(5)
    blocks_in_a_kernel(branchy_f, straight_f)(*ARGS, out)
    close(out, [grads[0], grads[1][1], grads[2][0, 1], hessian[1][1][1, 0], hessian[1][0][1]])


def test_in_kernel_blocks_follow_argnums():
    check_blocks_in_a_kernel(branchy, straight)


# -- every argument's pushes in one loop (NOTE: [One loop of pushes]) ---------------------------------------
@ti.func
def straight_again(x: ti.f64, v: vec2, m: mat2) -> ti.f64:  # straight, as a function of its own (own caches)
    return x * v.dot(m @ v) + ti.sin(x * v[1]) + (m * m).sum() * x


@ti.func
def branchy_again(x: ti.f64, v: vec2, m: mat2) -> ti.f64:
    out = x * v.dot(m @ v)
    if v[0] > 0.0:
        out += ti.sin(x * v[1]) * m[0, 1]
    for i in range(2):
        out += m[i, i] * x * x
    return out


def test_pushes_of_all_arguments_in_one_loop(monkeypatch):
    """With no lane budget every Jacobian by several arguments pushes all their components by one call in one
    runtime loop (scalar blocks stored in it too): the same blocks, in argnums order, host and in kernels."""
    monkeypatch.setattr(td._modes, "LANE_BUDGET", 0)
    torch_f = {straight_again: torch_straight, branchy_again: torch_branchy}
    for f in (straight_again, branchy_again):
        grads, hessian = torch_blocks(torch_f[f])
        for order in ORDERS:
            for transform in (td.jacfwd, td.jacobian):
                for g, w in zip(transform(f, argnums=order)(*ARGS), [grads[a % 3] for a in order], strict=True):
                    close(g, w)
            got = td.hessian(f, argnums=order)(*ARGS)
            for i, j in itertools.product(range(len(order)), repeat=2):
                close(got[i][j], hessian[order[i] % 3][order[j] % 3])
        vjp = td.vjp(f, *ARGS)[1](1.5)
        for g, w in zip(vjp, grads, strict=True):
            close(g, 1.5 * w)
    check_blocks_in_a_kernel(branchy_again, straight_again)
    assert td.source(td.jacfwd(branchy_again, argnums=(2, 0, 1)), *ARGS).count("= branchy_again_jvp(") == 1


@pytest.mark.parametrize("transform", [td.grad, td.value_and_grad, td.jacfwd, td.jacrev, td.jacobian, td.hessian])
@pytest.mark.parametrize("argnums", [(0, 0), (1, -2)])
def test_an_argument_named_twice_is_refused(transform, argnums):
    """Outside code: td.grad gave the gradient twice, td.jacfwd and td.hessian raised a TaichiSyntaxError whose
    message was an empty line."""
    with pytest.raises(ValueError, match=r"names argument 'v' \(1\)|names argument 'x' \(0\)"):
        transform(straight, argnums=argnums)(0.3, np.array([0.5, -0.2]), np.eye(2))
