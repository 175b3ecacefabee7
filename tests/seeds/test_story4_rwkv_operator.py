"""User story 4: RWKV's depthwise causal convolution written as a Taichi ndarray kernel, used as a
differentiable torch op without copies, gradchecked, equal to the pure-torch conv1d formulation."""
import taichi as ti
import torch
import torch.nn.functional as F

import tidiff as td

EPS = 1e-3


@ti.kernel
def rwkv_conv_kernel(k: ti.types.ndarray(), w: ti.types.ndarray(), out: ti.types.ndarray(), eps: ti.f64):
    # Accumulate straight into out (zeroed by tidiff), not into a local: Taichi's reverse
    # mode keeps a loop-carried local on a stack of ti.init(ad_stack_size=...) entries
    # (32 by default), which a long causal loop overflows (see docs/torch.md).
    for b, c, t in out:
        T = k.shape[2]
        for u in range(t + 1):
            out[b, c, t] += w[c, 0, T - 1 - (t - u)] * k[b, c, u]
    for b, c, t in out:
        out[b, c, t] += eps


rwkv_conv = td.torch.function(
    rwkv_conv_kernel, inputs=["k", "w"], outputs={"out": lambda k, w: k.shape}, constants={"eps": EPS},
    name="story4_rwkv_conv",
)


def rwkv_conv_torch(k, w):
    T = k.shape[-1]
    return EPS + F.conv1d(F.pad(k, (T - 1, 0)), w, groups=k.shape[1])


def _data(B, C, T, dtype=torch.float64, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, C, T, dtype=dtype, generator=g).requires_grad_(grad)
    w = torch.randn(C, 1, T, dtype=dtype, generator=g).requires_grad_(grad)
    return k, w


def test_matches_conv1d_forward_and_backward_in_both_dtypes():
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        k, w = _data(3, 4, 20, dtype)
        kr, wr = k.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        out, ref = rwkv_conv(k, w), rwkv_conv_torch(kr, wr)
        assert out.dtype == dtype
        torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
        cot = torch.randn_like(out)
        out.backward(cot)
        ref.backward(cot)
        torch.testing.assert_close(k.grad, kr.grad, rtol=tol, atol=tol)
        torch.testing.assert_close(w.grad, wr.grad, rtol=tol, atol=tol)


def test_gradcheck_forward_ad_and_gradgradcheck():
    k, w = _data(2, 3, 7, seed=1)
    assert torch.autograd.gradcheck(rwkv_conv, (k, w), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(rwkv_conv, (k, w))


def test_no_copies_and_one_compile_per_dtype():
    fn = rwkv_conv.fn
    k, w = _data(2, 3, 8, seed=2)
    seen = []
    real = fn.kernel

    class Spy:
        _primal, _adjoint, grad = real._primal, real._adjoint, real.grad

        def __call__(self, *args):
            seen.append([a.data_ptr() for a in args[:3]])
            return real(*args)

    fn.kernel = Spy()
    try:
        out = rwkv_conv(k, w)
    finally:
        fn.kernel = real
    assert seen == [[k.data_ptr(), w.data_ptr(), out.data_ptr()]]
    out.sum().backward()
    compiles = td.cache_info()["story4_rwkv_conv"].compiles
    for shape in ((1, 2, 5), (4, 8, 33), (2, 3, 8)):
        k, w = _data(*shape, seed=3)
        rwkv_conv(k, w).sum().backward()
    assert td.cache_info()["story4_rwkv_conv"].compiles == compiles
