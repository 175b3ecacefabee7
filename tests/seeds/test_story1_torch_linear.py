"""User story 1: a linear layer written in Taichi inside a torch model trains, passes gradcheck in
float64, and compiles its kernels once over 100 forward/backward calls; tensors reach the kernel
without a copy."""
import taichi as ti
import torch

import tidiff as td

F64 = torch.float64


@ti.kernel
def linear_kernel(x: ti.types.ndarray(), W: ti.types.ndarray(), b: ti.types.ndarray(), y: ti.types.ndarray()):
    for i, j in y:
        acc = b[j]
        for k in range(x.shape[1]):
            acc += x[i, k] * W[j, k]
        y[i, j] = acc


linear = td.torch.function(
    linear_kernel, inputs=["x", "W", "b"], outputs={"y": lambda x, W, b: (x.shape[0], W.shape[0])},
    name="story1_linear",
)


class TaichiLinear(torch.nn.Module):
    def __init__(self, n_in, n_out, generator):
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(n_out, n_in, dtype=F64, generator=generator) / n_in**0.5)
        self.b = torch.nn.Parameter(torch.zeros(n_out, dtype=F64))

    def forward(self, x):
        return linear(x, self.W, self.b)


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
        compiles.append(td.cache_info()["story1_linear"].compiles)
    assert losses[-1] < 1e-2 * losses[0]
    assert all(c == compiles[0] for c in compiles), compiles  # compiled in the first call, never again
    info = td.cache_info()["story1_linear"]
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
