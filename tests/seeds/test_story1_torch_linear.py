"""User story 1: a linear layer written in Taichi inside a torch model trains, passes gradcheck in
float64, and compiles its kernels once over 100 forward/backward calls; tensors reach the kernel
without a copy."""
import pathlib
import runpy

import taichi as ti
import torch

import tidiff as td

F64 = torch.float64


example = runpy.run_path(
    str(pathlib.Path(__file__).parents[2] / "examples" / "torch_linear_layer.py"), run_name="example"
)
linear, linear_kernel, TaichiLinear = example["linear"], example["linear_kernel"], example["TaichiLinear"]


def test_linear_layer_trains_and_compiles_once():
    g = torch.Generator().manual_seed(0)
    true_W = torch.randn(3, 5, dtype=F64, generator=g)
    x = torch.randn(64, 5, dtype=F64, generator=g)
    target = x @ true_W.T + 0.5
    layer = TaichiLinear(5, 3, g)
    torch.testing.assert_close(layer(x), x @ layer.W.T + layer.b, rtol=1e-12, atol=1e-12)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    losses, compiles = [], []
    for _ in range(100):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(layer(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        compiles.append(td.cache_info()["linear"].compiles)
    assert losses[-1] < 1e-2 * losses[0]
    assert all(c == compiles[0] for c in compiles), compiles  # compiled in the first call, never again
    info = td.cache_info()["linear"]
    assert info.calls >= 200 and info.hits >= info.calls - 2


def test_linear_layer_gradcheck_and_gradgradcheck():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 5, dtype=F64, generator=g, requires_grad=True)
    W = torch.randn(3, 5, dtype=F64, generator=g, requires_grad=True)
    b = torch.randn(3, dtype=F64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(linear, (x, W, b), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(linear, (x, W, b))


def test_batched_pointwise_layer_from_a_ti_func():
    # the same layer as a @ti.func: batched over x, W and b broadcast; one launch per call
    @ti.func
    def affine(x: ti.types.vector(4, ti.f64), W: ti.types.matrix(2, 4, ti.f64), b: ti.types.vector(2, ti.f64)):
        return W @ x + b

    op = td.torch.function(affine)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 4, dtype=F64, generator=g, requires_grad=True)
    W = torch.randn(2, 4, dtype=F64, generator=g, requires_grad=True)
    b = torch.randn(2, dtype=F64, generator=g, requires_grad=True)
    torch.testing.assert_close(op(x, W, b), x @ W.T + b, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(op, (x, W, b), check_forward_ad=True)
