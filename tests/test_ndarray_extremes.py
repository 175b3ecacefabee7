"""``ti.atomic_max`` / ``ti.atomic_min`` into an output ndarray: a segment maximum as a torch user writes one
(NOTE: [Scratch arrays]). The derivative goes to the winner, ties split evenly, as torch's ``amax`` / ``amin``
over the same candidates (float64); both modes, second order, through torch; no run-time check, no warning.
"""
import warnings

import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tidiff as td
from tidiff._adjoint.kernels import KernelAdjoint, vjp_ndarray_kernel

N, M = 7, 3


@ti.kernel
def segment_extremes(x: ti.types.ndarray(dtype=ti.f64, ndim=1), seg: ti.types.ndarray(dtype=ti.i32, ndim=1),
                     floor: ti.types.ndarray(dtype=ti.f64, ndim=1), top: ti.types.ndarray(dtype=ti.f64, ndim=1),
                     low: ti.types.ndarray(dtype=ti.f64, ndim=1)):
    for k in range(top.shape[0]):
        top[k] = floor[k]  # the old values, set first
        low[k] = 2.0 - floor[k]
    for i in range(x.shape[0]):
        v = ti.sin(x[i]) * x[i]
        ti.atomic_max(top[seg[i]], v)
        ti.atomic_min(low[seg[i]], v * v)


OP = td.function(segment_extremes, inputs=["x", "seg", "floor"],
                 outputs={"top": lambda x, seg, floor: floor.shape, "low": lambda x, seg, floor: floor.shape})


def twin(x, seg, floor):
    v = torch.sin(x) * x
    top = [torch.amax(torch.cat([floor[k].reshape(1), v[seg == k]])) for k in range(M)]
    low = [torch.amin(torch.cat([(2.0 - floor[k]).reshape(1), (v * v)[seg == k]])) for k in range(M)]
    return torch.stack(top), torch.stack(low)


# a few values, so that iterations tie often; the old values from other ones (a tie with the old value goes to
# the iteration)
VALUES = st.sampled_from([-1.3, -0.7, 0.3, 0.45, 1.1, 1.3])
SEGMENTS = st.lists(st.integers(0, M - 1), min_size=N, max_size=N).map(lambda s: np.array(s, dtype=np.int32))
FLOORS = st.lists(st.sampled_from([-0.2, 0.05, 0.2, 0.9]), min_size=M, max_size=M).map(np.array)


def torch_args(x, seg, floor):
    return torch.tensor(x), torch.tensor(seg, dtype=torch.int64), torch.tensor(floor)


def test_the_transform_takes_the_kernel_with_arrays_allocated_at_launch():
    adjoint = vjp_ndarray_kernel(segment_extremes, {"x": ti.f64, "seg": None, "floor": ti.f64, "top": ti.f64,
                                                    "low": ti.f64})
    assert isinstance(adjoint, KernelAdjoint)
    assert [s.param for s in adjoint.scratch] == ["top_ties", "top_kept", "low_ties", "low_kept"]


@settings(max_examples=25)
@given(x=st.lists(VALUES, min_size=N, max_size=N).map(np.array), seg=SEGMENTS, floor=FLOORS,
       ct=st.lists(st.floats(-2, 2), min_size=2 * M, max_size=2 * M).map(np.array),
       t=st.lists(st.floats(-2, 2), min_size=N + M, max_size=N + M).map(np.array))
def test_both_modes_give_the_winners_derivative_as_torch(x, seg, floor, ct, t):
    xt, segt, floort = torch_args(x, seg, floor)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exact: no check of reverse mode against forward mode
        (top, low), vjp_fn = td.vjp(OP, x, seg, floor)
        gx, _, gfloor = vjp_fn((ct[:M], ct[M:]))
        _, (dtop, dlow) = td.jvp(OP, (x, seg, floor), (t[:N], None, t[N:]))
    want_top, want_low = twin(xt, segt, floort)
    np.testing.assert_array_equal(top, want_top.numpy())
    np.testing.assert_array_equal(low, want_low.numpy())
    _, want_vjp = torch.autograd.functional.vjp(lambda a, f: twin(a, segt, f), (xt, floort),
                                                (torch.tensor(ct[:M]), torch.tensor(ct[M:])))
    np.testing.assert_allclose(gx, want_vjp[0].numpy(), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(gfloor, want_vjp[1].numpy(), rtol=1e-13, atol=1e-15)
    _, want_jvp = torch.func.jvp(lambda a, f: twin(a, segt, f), (xt, floort),
                                 (torch.tensor(t[:N]), torch.tensor(t[N:])))
    np.testing.assert_allclose(dtop, want_jvp[0].numpy(), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(dlow, want_jvp[1].numpy(), rtol=1e-13, atol=1e-15)


def test_against_central_differences_where_nothing_ties():
    x, seg, floor = np.array([0.2, -0.5, 1.2, 0.6, -1.4, 0.9, 0.35]), np.array([0, 1, 2, 0, 1, 2, 0], np.int32), \
        np.array([-0.3, 0.1, 0.4])
    ct = (np.array([0.7, -1.1, 0.4]), np.array([1.3, -0.4, 0.6]))

    def pairing(z):
        top, low = OP(z, seg, floor)
        return ct[0] @ top + ct[1] @ low

    gx = td.vjp(OP, x, seg, floor)[1](ct)[0]
    eps = 1e-6
    central = [(pairing(x + eps * e) - pairing(x - eps * e)) / (2 * eps) for e in np.eye(N)]
    np.testing.assert_allclose(gx, central, rtol=1e-8, atol=1e-9)


def test_second_order_and_torch_double_backward():
    x, seg, floor = np.array([0.2, -0.5, 1.2, 0.6, -1.4, 0.9, 0.35]), np.array([0, 1, 2, 0, 1, 2, 0], np.int32), \
        np.array([-0.3, 0.1, 0.4])
    xt, segt, floort = torch_args(x, seg, floor)

    def torch_top(a):
        return twin(a, segt, floort)[0]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exact: no check against forward mode
        got = td.jacrev(td.jacfwd(OP))(x, seg, floor)
        t_op = td.torch.function(OP)
        v = torch.tensor(np.sin(np.arange(N, dtype=np.float64)))
        hv = torch.autograd.functional.hvp(lambda a: (t_op(a, segt.to(torch.int32), floort)[0] ** 2).sum(), xt, v)[1]
    want = torch.autograd.functional.jacobian(
        lambda a: torch.autograd.functional.jacobian(lambda b: twin(b, segt, floort), a, create_graph=True), xt)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-12, atol=1e-13)
    want_hv = torch.autograd.functional.hvp(lambda a: (torch_top(a) ** 2).sum(), xt, v)[1]
    np.testing.assert_allclose(hv.numpy(), want_hv.numpy(), rtol=1e-12, atol=1e-13)


def test_forward_over_forward_as_torch():
    x, seg, floor = np.array([0.2, -0.5, 1.2, 0.6, -1.4, 0.9, 0.35]), np.array([0, 1, 2, 0, 1, 2, 0], np.int32), \
        np.array([-0.3, 0.1, 0.4])
    xt, segt, floort = torch_args(x, seg, floor)
    got = td.jacfwd(td.jacfwd(OP))(x, seg, floor)
    want = torch.autograd.functional.jacobian(
        lambda a: torch.autograd.functional.jacobian(lambda b: twin(b, segt, floort), a, create_graph=True), xt)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-12, atol=1e-13)


@ti.kernel
def runtime_loop_maxima(x: ti.types.ndarray(dtype=ti.f64, ndim=2), top: ti.types.ndarray(dtype=ti.f64, ndim=1)):
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):  # the atomic in an inner loop: its values are compared again, not kept
            ti.atomic_max(top[i], x[i, j] ** 3)


def test_an_atomic_in_an_inner_loop_in_reverse_mode_and_refused_by_forward_mode():
    op = td.function(runtime_loop_maxima, inputs=["x"], outputs={"top": lambda x: (x.shape[0],)})
    x = np.array([[0.2, 0.9, -0.4], [0.5, 0.1, 0.8]])
    gx = td.vjp(op, x)[1](np.array([1.0, 2.0]))[0]
    np.testing.assert_allclose(gx, [[0, 3 * 0.81, 0], [0, 0, 2 * 3 * 0.64]], rtol=1e-14)
    with pytest.raises(td.TransformError, match="once per iteration of a loop"):
        td.jvp(op, (x,), (np.ones_like(x),))
