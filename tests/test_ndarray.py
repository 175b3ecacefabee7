"""Kernels over ti.types.ndarray() parameters as Functions (API.md 1c), alone and as torch ops."""
import numpy as np
import pytest
import taichi as ti
import torch
import torch.nn.functional as F
from ndarray_kernels import EPS, causal_conv, conv_torch

import tidiff as td
from tidiff._composite import cotangent_map_of as vjp_function

F64 = torch.float64


def make(name="causal_conv"):
    return td.function(causal_conv, inputs=["k", "w"], outputs={"out": lambda k, w: k.shape},
                       constants={"eps": EPS}, name=name)


conv = make()
op = td.torch.function(conv)


def _rand(*shape, seed=0, grad=True, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, dtype=dtype, generator=g).requires_grad_(grad)


def test_forward_numpy_and_torch():
    k, w = _rand(2, 3, 6, grad=False), _rand(3, 1, 6, seed=1, grad=False)
    expected = conv_torch(k, w)
    np.testing.assert_allclose(conv(k.numpy(), w.numpy()), expected.numpy(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(op(k, w), expected, rtol=1e-12, atol=1e-12)


def test_td_transforms_match_torch():
    k, w = _rand(1, 2, 4, grad=False), _rand(2, 1, 4, seed=1, grad=False)
    kn, wn = k.numpy(), w.numpy()
    c, dk, dw = (
        _rand(1, 2, 4, seed=2, grad=False),
        _rand(1, 2, 4, seed=3, grad=False),
        _rand(2, 1, 4, seed=4, grad=False),
    )
    _, vjp_fn = td.vjp(conv, kn, wn)
    gk, gw = vjp_fn(c.numpy())
    rk, rw = torch.func.vjp(conv_torch, k, w)[1](c)
    np.testing.assert_allclose(gk, rk.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gw, rw.numpy(), rtol=1e-12, atol=1e-12)
    _, tangent = td.jvp(conv, (kn, wn), (dk.numpy(), dw.numpy()))
    np.testing.assert_allclose(tangent, torch.func.jvp(conv_torch, (k, w), (dk, dw))[1].numpy(), rtol=1e-12, atol=1e-12)
    jac = torch.autograd.functional.jacobian(conv_torch, (k, w))
    for transform in (td.jacfwd, td.jacrev):
        got = transform(conv, argnums=(0, 1))(kn, wn)
        for g, r in zip(got, jac):
            np.testing.assert_allclose(g, r.numpy(), rtol=1e-12, atol=1e-12)


def test_second_order_hessian_vector_products():
    k, w, c = _rand(1, 2, 4, grad=False), _rand(2, 1, 4, seed=1, grad=False), _rand(1, 2, 4, seed=2, grad=False)
    dk, dw, dc = (
        _rand(1, 2, 4, seed=3, grad=False),
        _rand(2, 1, 4, seed=4, grad=False),
        _rand(1, 2, 4, seed=5, grad=False),
    )
    V = vjp_function(conv)
    outs, touts = td.jvp(V, (k.numpy(), w.numpy(), c.numpy()), (dk.numpy(), dw.numpy(), dc.numpy()))

    def v_torch(k, w, c):
        return torch.func.vjp(conv_torch, k, w)[1](c)

    ref_out, ref_t = torch.func.jvp(v_torch, (k, w, c), (dk, dw, dc))
    for a, b in zip(list(outs) + list(touts), list(ref_out) + list(ref_t)):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-11, atol=1e-12)


def test_gradcheck_forward_ad_and_gradgradcheck():
    k, w = _rand(2, 2, 5), _rand(2, 1, 5, seed=1)
    assert torch.autograd.gradcheck(op, (k, w), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(op, (k, w))


def test_tensors_reach_the_kernel_without_a_copy():
    fn = make("conv_zero_copy")
    seen, launch = [], fn._launch

    def recording(kernel, tensors, counted=None, extra=()):  # the data pointers each launch gets, in parameter order
        seen.append(("primal" if kernel is causal_conv else "adjoint",
                     [tensors[p].data_ptr() for p in fn.params if p in tensors]))
        return launch(kernel, tensors, counted, extra)

    fn._launch = recording
    zop = td.torch.function(fn)
    k, w = _rand(2, 3, 6), _rand(3, 1, 6, seed=1)
    y = zop(k, w)
    (kind, ptrs), = seen
    assert kind == "primal" and ptrs == [k.data_ptr(), w.data_ptr(), y.data_ptr()]
    y.sum().backward()
    kind, ptrs = seen[-1]
    assert kind == "adjoint" and ptrs[:2] == [k.data_ptr(), w.data_ptr()]
    # NumPy arrays too: a zero-copy torch view reaches the kernel
    kn = np.ascontiguousarray(k.detach().numpy().copy())
    fn(kn, w.detach().numpy())
    assert seen[-1][1][0] == kn.ctypes.data


def test_gradients_counted_once_no_grad_allocates_nothing_inputs_untouched():
    k, w = _rand(2, 3, 6), _rand(3, 1, 6, seed=1)
    before = k.detach().clone()
    with torch.no_grad():
        y = op(k, w)
    assert not y.requires_grad and k.grad is None and w.grad is None
    kr, wr = k.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    conv_torch(kr, wr).sum().backward()
    op(k, w).sum().backward()
    torch.testing.assert_close(k.grad, kr.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w.grad, wr.grad, rtol=1e-12, atol=1e-12)
    op(k, w).sum().backward()  # torch accumulation: exactly twice, never more (taichi #8101)
    torch.testing.assert_close(k.grad, 2 * kr.grad, rtol=1e-12, atol=1e-12)
    assert torch.equal(k.detach(), before)


def test_compiled_once_per_dtype_not_per_shape():
    fn = make("conv_compile_count")
    cop = td.torch.function(fn)
    cop(_rand(2, 3, 6), _rand(3, 1, 6, seed=1)).sum().backward()
    compiles = td.cache_info()["conv_compile_count"].compiles
    for shape in ((1, 1, 3), (4, 2, 9), (2, 3, 6)):
        for seed in range(3):
            k, w = _rand(*shape, seed=seed), _rand(shape[1], 1, shape[2], seed=seed + 7)
            cop(k, w).sum().backward()
    assert td.cache_info()["conv_compile_count"].compiles == compiles
    # float32 is a new dtype: new kernel instances, and the output keeps float32
    k32, w32 = _rand(2, 3, 6, dtype=torch.float32), _rand(3, 1, 6, seed=1, dtype=torch.float32)
    y32 = cop(k32, w32)
    assert y32.dtype == torch.float32
    y32.sum().backward()
    assert k32.grad.dtype == torch.float32
    assert td.cache_info()["conv_compile_count"].compiles > compiles


def test_vmap_loops_over_an_unbatched_kernel():
    ks, w = _rand(3, 2, 2, 5, grad=False), _rand(2, 1, 5, seed=1, grad=False)
    torch.testing.assert_close(torch.func.vmap(op, in_dims=(0, None))(ks, w),
                               torch.stack([conv_torch(k, w) for k in ks]), rtol=1e-12, atol=1e-12)
    per_k = torch.func.vmap(torch.func.jacrev(lambda k, w: op(k, w).sum(), argnums=1), in_dims=(0, None))(ks, w)
    ref = torch.func.vmap(torch.func.jacrev(lambda k, w: conv_torch(k, w).sum(), argnums=1), in_dims=(0, None))(ks, w)
    torch.testing.assert_close(per_k, ref, rtol=1e-12, atol=1e-12)


def test_tangent_kernel_source_is_readable():
    ones = np.ones((1, 1, 2))
    text = td.source(conv.tangent(), ones, ones, ones, ones)
    assert "dout[b, c, t] = " in text
    assert "def causal_conv_jvp(k" in text


def test_clear_errors():
    def bad(**kwargs):
        base = dict(inputs=["k", "w"], outputs={"out": lambda k, w: k.shape}, constants={"eps": 0.1})
        base.update(kwargs)
        return td.function(causal_conv, **base)

    with pytest.raises(ValueError, match="'x'.*not a parameter"):
        bad(inputs=["k", "x"])
    with pytest.raises(TypeError, match="eps.*ndarray"):
        bad(inputs=["k", "w", "eps"], constants={})
    with pytest.raises(TypeError, match=r"\['eps'\].*constants"):
        bad(constants={})
    with pytest.raises(TypeError, match="outputs="):
        bad(outputs=["out"])
    with pytest.raises(TypeError, match="expected 2 arguments"):
        conv(np.ones((1, 1, 2)))


@ti.kernel
def conv_energy(k: ti.types.ndarray(), w: ti.types.ndarray(), out: ti.types.ndarray()):
    """A scalar energy of the convolution: sum over (b, c, t) of sin(conv)^2."""
    for b, c, t in k:
        T = k.shape[2]
        s = 0.0
        for u in range(t + 1):
            s += w[c, 0, T - 1 - (t - u)] * k[b, c, u]
        out[None] += ti.sin(s) ** 2


def conv_energy_torch(k, w):
    T = k.shape[-1]
    return (torch.sin(F.conv1d(F.pad(k, (T - 1, 0)), w, groups=k.shape[1])) ** 2).sum()


energy_fn = td.function(conv_energy, inputs=["k", "w"], outputs={"out": ()})


def test_hessian_and_hvp_of_an_ndarray_kernel():
    """Issue 10, item 11: second order of ndarray kernels through the protocol."""
    k, w = _rand(1, 2, 4, grad=False), _rand(2, 1, 4, seed=1, grad=False)
    dk, dw = _rand(1, 2, 4, seed=2, grad=False), _rand(2, 1, 4, seed=3, grad=False)
    H = td.hessian(energy_fn, argnums=(0, 1))(k.numpy(), w.numpy())
    ref = torch.autograd.functional.hessian(conv_energy_torch, (k, w))
    for got_row, want_row in zip(H, ref):
        for got, want in zip(got_row, want_row):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-12)
    value, (hk, hw) = td.hvp(energy_fn, (k.numpy(), w.numpy()), (dk.numpy(), dw.numpy()))
    ref_value, (rk, rw) = torch.autograd.functional.hvp(conv_energy_torch, (k, w), (dk, dw))
    np.testing.assert_allclose(value, ref_value.numpy(), rtol=1e-12)
    np.testing.assert_allclose(hk, rk.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(hw, rw.numpy(), rtol=1e-10, atol=1e-12)
    # and with torch tensors, which stay tensors
    Ht = td.hessian(energy_fn)(k, w)
    assert isinstance(Ht, torch.Tensor)
    np.testing.assert_allclose(Ht.numpy(), ref[0][0].numpy(), rtol=1e-10, atol=1e-12)


@ti.kernel
def frozen_scale(x: ti.types.ndarray(), s: ti.types.ndarray(needs_grad=False), out: ti.types.ndarray()):
    for i in x:
        out[i] = s[i] * x[i] ** 2


def test_needs_grad_false_means_no_derivative_in_every_mode():
    """Issue 10, item 7: one meaning for ``needs_grad=False``: that input has zero derivatives (vjp, jvp)."""
    fn = td.function(frozen_scale, inputs=["x", "s"], outputs={"out": lambda x, s: x.shape})
    x, s = np.array([1.0, 2.0, 3.0]), np.array([0.5, -1.0, 2.0])
    _, vjp_fn = td.vjp(fn, x, s)
    gx, gs = vjp_fn(np.ones(3))
    np.testing.assert_allclose(gx, 2 * s * x)
    np.testing.assert_array_equal(gs, np.zeros(3))
    _, tangent = td.jvp(fn, (x, s), (np.zeros(3), np.ones(3)))
    np.testing.assert_array_equal(tangent, np.zeros(3))
    _, tangent = td.jvp(fn, (x, s), (np.ones(3), np.ones(3)))
    np.testing.assert_allclose(tangent, 2 * s * x)
    np.testing.assert_array_equal(td.jacrev(fn, argnums=1)(x, s), np.zeros((3, 3)))
    np.testing.assert_array_equal(td.jacfwd(fn, argnums=1)(x, s), np.zeros((3, 3)))


@ti.kernel
def advance_in_place(x: ti.types.ndarray(), v: ti.types.ndarray(), out: ti.types.ndarray()):
    for i in x:
        x[i] = x[i] + 0.1 * v[i]
        out[i] = x[i] ** 2


@ti.kernel
def accumulate_into_input(x: ti.types.ndarray(), out: ti.types.ndarray()):
    for i in x:
        ti.atomic_add(x[i], 1.0)
        out[i] = x[i]


@ti.kernel
def advance_into_an_output(x: ti.types.ndarray(), v: ti.types.ndarray(), x_new: ti.types.ndarray()):
    for i in x:
        x_new[i] = x[i] + 0.1 * v[i]


@pytest.mark.parametrize("kernel, inputs", [(advance_in_place, ["x", "v"]), (accumulate_into_input, ["x"])])
def test_a_kernel_writing_an_input_is_refused_by_name(kernel, inputs):
    """Outside code: a kernel updating its input in place gave jacrev [2.2, 4.3], jacfwd [2.1, 4.2], vjp [2.2, 4.2]
    (right: [2.1, 4.1]) and advanced the caller's own array by a step at every evaluation."""
    with pytest.raises(ValueError, match=r"inputs= lists 'x', which the kernel writes .*test_ndarray\.py:\d+: `"):
        td.function(kernel, inputs=inputs, outputs={"out": lambda x, *rest: x.shape})


def test_the_update_written_into_an_output_is_differentiated():
    fn = td.function(advance_into_an_output, inputs=["x", "v"], outputs={"x_new": lambda x, v: x.shape})
    x, v = np.array([1.0, 2.0]), np.array([0.5, -0.5])
    np.testing.assert_allclose(fn(x, v), x + 0.1 * v, rtol=1e-15)
    for jacobian in (td.jacrev, td.jacfwd):
        dx, dv = jacobian(fn, argnums=(0, 1))(x, v)
        np.testing.assert_allclose(dx, np.eye(2), rtol=1e-15)
        np.testing.assert_allclose(dv, 0.1 * np.eye(2), rtol=1e-15)
    np.testing.assert_array_equal(x, [1.0, 2.0])


@ti.kernel
def scale_f64(x: ti.types.ndarray(dtype=ti.f64, ndim=1), s: ti.types.ndarray(needs_grad=False),
              out: ti.types.ndarray(dtype=ti.f64, ndim=1)):
    for i in x:
        out[i] = s[i] * x[i] ** 2


def test_repeated_calls_take_the_launch_plan_and_stay_exact():
    """Issue 40: a call of an operator with the dtypes, shapes and devices of an earlier one launches by the plan
    that call left (NOTE: [Launch plans] in tidiff/_torch.py): values, gradients, conversions (float32 into a
    float64 kernel), a frozen input and the cache counts are those of the full path."""
    fresh_op = td.torch.function(make("conv_plans"))
    first = None
    for seed in range(4):  # the first call, then plans
        k, w = _rand(2, 3, 6, seed=seed), _rand(3, 1, 6, seed=seed + 10)
        cot = _rand(2, 3, 6, seed=seed + 20, grad=False)
        out = fresh_op(k, w)
        torch.testing.assert_close(out, conv_torch(k, w), rtol=1e-13, atol=1e-13)
        got = torch.autograd.grad(out, (k, w), cot)
        want = torch.autograd.grad(conv_torch(k, w), (k, w), cot)
        for g, h in zip(got, want):
            torch.testing.assert_close(g, h, rtol=1e-13, atol=1e-13)
        first = first or td.cache_info(fresh_op.fn)
    info = td.cache_info(fresh_op.fn)
    assert first.calls == 2 and info.calls == 8 and info.hits - first.hits == 6  # a forward and a backward each
    # time; the first ones may compile (the adjoint is made once per kernel, maybe by an earlier test), no other
    scaled = td.torch.function(td.function(scale_f64, inputs=["x", "s"], outputs={"out": lambda x, s: x.shape}))
    for seed in range(3):
        x = _rand(5, seed=seed, dtype=torch.float32)
        s = _rand(5, seed=seed + 5, dtype=torch.float32)
        out = scaled(x, s)
        assert out.dtype == F64
        torch.testing.assert_close(out, s.double() * x.double() ** 2, rtol=1e-15, atol=0)
        gx, gs = torch.autograd.grad(out.sum(), (x, s))
        torch.testing.assert_close(gx, (2 * s.double() * x.double()).float(), rtol=1e-6, atol=0)
        assert not gs.any()
