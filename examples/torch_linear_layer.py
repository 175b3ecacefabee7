"""User story 1: a linear layer written in Taichi inside a torch nn.Module, trained on a toy regression.

The layer is an ndarray kernel (no copies between torch and Taichi); td.torch.function
makes it an autograd operator: backward is tidiff's adjoint of the kernel, gradients are
counted once, and the kernels compile once, not per call.
"""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's idle threads otherwise spin beside Taichi's

import taichi as ti
import torch

import tidiff as td


@ti.kernel
def linear_kernel(x: ti.types.ndarray(), W: ti.types.ndarray(), b: ti.types.ndarray(), y: ti.types.ndarray()):
    for i, j in y:
        acc = b[j]
        for k in range(x.shape[1]):
            acc += x[i, k] * W[j, k]
        y[i, j] = acc


linear = td.torch.function(
    linear_kernel, inputs=["x", "W", "b"], outputs={"y": lambda x, W, b: (x.shape[0], W.shape[0])}, name="linear"
)


class TaichiLinear(torch.nn.Module):
    """``y = x W^T + b`` computed by a Taichi kernel."""

    def __init__(self, n_in, n_out, generator=None):
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(n_out, n_in, dtype=torch.float64, generator=generator) / n_in**0.5)
        self.b = torch.nn.Parameter(torch.zeros(n_out, dtype=torch.float64))

    def forward(self, x):
        return linear(x, self.W, self.b)


def train(steps=100, seed=0):
    """Fit a random linear map with a Taichi layer; returns the losses."""
    g = torch.Generator().manual_seed(seed)
    true_W = torch.randn(3, 5, dtype=torch.float64, generator=g)
    x = torch.randn(64, 5, dtype=torch.float64, generator=g)
    target = x @ true_W.T + 0.5
    model = torch.nn.Sequential(TaichiLinear(5, 3, generator=g))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    ti.init(arch=ti.cpu, default_fp=ti.f64, log_level=ti.WARN)
    losses = train()
    print(f"loss: {losses[0]:.4f} -> {losses[-1]:.2e} in {len(losses)} steps")
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    W = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    print("gradcheck:", torch.autograd.gradcheck(linear, (x, W, b), check_forward_ad=True))
    print("gradgradcheck:", torch.autograd.gradgradcheck(linear, (x, W, b)))
    print("cache:", td.cache_info()["linear"])
