"""User story 4: RWKV's depthwise causal convolution written as a Taichi ndarray kernel, used as a
differentiable torch op without copies, gradchecked, equal to the pure-torch conv1d formulation."""
import pathlib
import runpy

import torch

import tidiff as td

example = runpy.run_path(str(pathlib.Path(__file__).parents[2] / "examples" / "rwkv_operator.py"), run_name="example")
rwkv_conv, rwkv_conv_torch, rwkv_conv_kernel = (
    example["rwkv_conv"],
    example["rwkv_conv_torch"],
    example["rwkv_conv_kernel"],
)


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
    rwkv_conv.operator.keeps_outputs([k, w])  # decided from the kernel itself, before the spy stands in for it

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
    compiles = td.cache_info()["rwkv_conv"].compiles
    for shape in ((1, 2, 5), (4, 8, 33), (2, 3, 8)):
        k, w = _data(*shape, seed=3)
        rwkv_conv(k, w).sum().backward()
    assert td.cache_info()["rwkv_conv"].compiles == compiles


def test_a_sequence_longer_than_taichis_autodiff_stack():
    """The kernel carries a local through a loop of up to T iterations: Taichi's own reverse mode keeps it on a
    stack of 32 entries by default and dies past it; tidiff's adjoint recomputes the loop instead."""
    k, w = _data(1, 2, 200, seed=3)
    kr, wr = k.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    cot = torch.randn(1, 2, 200, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    rwkv_conv(k, w).backward(cot)
    rwkv_conv_torch(kr, wr).backward(cot)
    torch.testing.assert_close(k.grad, kr.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w.grad, wr.grad, rtol=1e-12, atol=1e-12)
