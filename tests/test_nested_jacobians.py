"""Jacobians of reverse-mode Jacobians on the host (NOTE: [Nested blocks] in tidiff/_codegen/nested.py).

``jacfwd(jacrev(f))``, ``jacobian(jacrev(f))`` and ``hessian`` of functions with
several output components take one loop over cotangents in one kernel; they must
agree with torch.func's same composition (float64), over argnums in any order
and outputs of every rank, and with the composed bodies that calls inside a
kernel use.
"""
import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from nested_trees import close, nonnegative

import tidiff as td
from tidiff._lang.compile import info

B = 3


@ti.func
def layer(W: ti.types.matrix(3, 4, ti.f64), x: ti.types.vector(4, ti.f64),
          b: ti.types.vector(3, ti.f64)) -> ti.types.vector(3, ti.f64):
    return ti.tanh(W @ x + b) * (1.0 + x.dot(x))


def torch_layer(W, x, b):
    return torch.tanh(W @ x + b) * (1.0 + x @ x)


@ti.func
def pair(M: ti.types.matrix(3, 3, ti.f64), s: ti.f64):
    return ti.Matrix([[M[0, 0] * s, ti.sin(M[0, 1])], [M[1, 2] ** 2, s * s * M[2, 2]]]), \
        ti.exp(M.sum() * s * 0.1) * (M @ M @ M).trace()


def torch_pair(M, s):
    block = torch.stack([torch.stack([M[0, 0] * s, torch.sin(M[0, 1])]), torch.stack([M[1, 2] ** 2, s * s * M[2, 2]])])
    return block, torch.exp(M.sum() * s * 0.1) * torch.trace(M @ M @ M)


def floats(shape):
    return hnp.arrays(np.float64, shape, elements=st.floats(-1.5, 1.5))


def torch_batched(fn, args, batched):
    """``fn`` (a torch.func composition) per element of the batched arguments, stacked."""
    t = [torch.tensor(a) for a in args]
    return torch.func.vmap(fn, in_dims=tuple(0 if k in batched else None for k in range(len(t))))(*t)


# Each (inner, outer) pair compiles a kernel of its own: a few that take the nested kernel (inner
# argnums holding W) and one that does not, argnums in and out of order, negative ones.
@pytest.mark.parametrize("kind, inner, outer", [("jacfwd", 0, 1), ("jacobian", (2, 0), (1, -3)),
                                                ("jacfwd", (1, 0, 2), 0), ("jacfwd", -1, 2)])
@given(W=floats((3, 4)), x=floats((B, 4)), b=floats((3,)))
@settings(max_examples=10)
def test_jacobian_of_jacrev_of_a_layer_equals_torch_func(W, x, b, kind, inner, outer):
    td_outer = getattr(td, kind)
    got = td_outer(td.jacrev(layer, argnums=inner), argnums=outer)(W, x, b)
    want = torch_batched(torch.func.jacfwd(torch.func.jacrev(torch_layer, argnums=nonnegative(inner, 3)),
                                           argnums=nonnegative(outer, 3)), (W, x, b), batched={1})
    close(got, want)


@pytest.mark.parametrize("inner, outer", [(0, 0), ((1, 0), (1, 0))])
@given(M=floats((B, 3, 3)), s=floats((B,)))
@settings(max_examples=10)
def test_jacfwd_of_jacrev_of_several_outputs_equals_torch_func(M, s, inner, outer):
    got = td.jacfwd(td.jacrev(pair, argnums=inner), argnums=outer)(M, s)
    want = torch_batched(torch.func.jacfwd(torch.func.jacrev(torch_pair, argnums=inner), argnums=outer),
                         (M, s), batched={0, 1})
    close(got, want)


@given(W=floats((3, 4)), x=floats((B, 4)), b=floats((3,)))
def test_hessian_of_a_vector_function_equals_torch_func(W, x, b):
    got = td.hessian(layer, argnums=(1, 2))(W, x, b)
    want = torch_batched(torch.func.hessian(torch_layer, argnums=(1, 2)), (W, x, b), batched={1})
    close(got, want)


H = td.jacfwd(td.jacrev(layer, argnums=0), argnums=0)
out_in_kernel = ti.field(ti.f64, shape=(B, 3, 3, 4, 3, 4))


@ti.kernel
def nested_in_kernel(W: ti.types.ndarray(dtype=ti.f64, ndim=2), x: ti.types.ndarray(dtype=ti.f64, ndim=2),
                     b: ti.types.ndarray(dtype=ti.f64, ndim=1)):
    for e in range(B):
        Wm = ti.Matrix([[W[i, j] for j in ti.static(range(4))] for i in ti.static(range(3))], dt=ti.f64)
        xv = ti.Vector([x[e, j] for j in ti.static(range(4))], dt=ti.f64)
        bv = ti.Vector([b[i] for i in ti.static(range(3))], dt=ti.f64)
        block = H(Wm, xv, bv)  # flat past rank 2 (docs/in-kernel.md)
        for k in range(3 * 3 * 4 * 3 * 4):  # a runtime loop: unrolled, the 432 copies took Taichi 20 s to compile
            out_in_kernel[e, k // 144, k // 48 % 3, k // 12 % 4, k // 4 % 3, k % 4] = block[k]


def test_host_kernel_agrees_with_the_composed_body_used_inside_kernels():
    rng = np.random.default_rng(3)
    W, x, b = rng.standard_normal((3, 4)), rng.standard_normal((B, 4)), rng.standard_normal(3)
    nested_in_kernel(W, x, b)
    np.testing.assert_allclose(H(W, x, b), out_in_kernel.to_numpy(), rtol=1e-12, atol=1e-13)


def test_one_copy_of_the_reverse_function_whatever_the_outputs():
    """The host kernel calls the tangent of f's reverse function once, inside the loop over cotangents."""
    f = td.jacfwd(td.jacrev(layer, argnums=0), argnums=1)
    W, x, b = np.eye(3, 4), np.ones((2, 4)), np.zeros(3)
    f(W, x, b)
    (kernel,) = [v for k, v in f.memo._data.items() if k[0] == "blocks kernel"]
    source = info(kernel.kernel).source
    assert source.count("_vjp_jvp(") == 1, source


def test_one_copy_of_the_reverse_function_whatever_the_outputs_and_arguments():
    """Two outputs by two arguments, inside and out: one loop over the 5 cotangents, one over the 10 tangents,
    one copy (it was four: a first call of 74 s, 6 s now)."""
    f = td.jacfwd(td.jacrev(pair, argnums=(1, 0)), argnums=(1, 0))
    M, s = np.random.default_rng(5).standard_normal((2, 3, 3)), np.array([0.3, -0.7])
    got = f(M, s)
    (kernel,) = [v for k, v in f.memo._data.items() if k[0] == "blocks kernel"]
    source = info(kernel.kernel).source
    assert source.count("_vjp_jvp(") == 1 and "range(5)" in source and "range(10)" in source, source
    want = torch_batched(torch.func.jacfwd(torch.func.jacrev(torch_pair, argnums=(1, 0)), argnums=(1, 0)),
                         (M, s), batched={0, 1})
    close(got, want)
