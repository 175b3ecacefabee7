"""User story 4: RWKV's depthwise causal convolution as a Taichi ndarray kernel, used as a torch op.

    out[b, c, t] = eps + sum_{u <= t} w[c, 0, T-1-(t-u)] * k[b, c, u]

The kernel reads the torch tensors in place (no copies); td.torch.function gives it
a backward (tidiff's adjoint of the kernel), forward-mode AD (tidiff's tangent transform of
the kernel) and a double backward (the adjoint of that tangent kernel).
"""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's idle threads otherwise spin beside Taichi's

import taichi as ti
import torch
import torch.nn.functional as F

import tidiff as td

EPS = 1e-3


@ti.kernel
def rwkv_conv_kernel(k: ti.types.ndarray(), w: ti.types.ndarray(), out: ti.types.ndarray(), eps: ti.f64):
    # A loop-carried local of any length: tidiff's adjoint recomputes the loop backwards, where
    # Taichi's own reverse mode keeps such a local on a stack of ti.init(ad_stack_size=...)
    # entries (32 by default) that a long causal loop overflows, ending the process.
    for b, c, t in out:
        T = k.shape[2]
        s = eps
        for u in range(t + 1):
            s += w[c, 0, T - 1 - (t - u)] * k[b, c, u]
        out[b, c, t] = s


rwkv_conv = td.torch.function(
    rwkv_conv_kernel, inputs=["k", "w"], outputs={"out": lambda k, w: k.shape}, constants={"eps": EPS}, name="rwkv_conv"
)


def rwkv_conv_torch(k, w):
    """The pure-torch formulation: left-pad by T-1 and a grouped (depthwise) conv1d."""
    T = k.shape[-1]
    return EPS + F.conv1d(F.pad(k, (T - 1, 0)), w, groups=k.shape[1])


if __name__ == "__main__":
    ti.init(arch=ti.cpu, default_fp=ti.f64, log_level=ti.WARN)
    g = torch.Generator().manual_seed(0)
    B, C, T = 2, 4, 16
    k = torch.randn(B, C, T, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(C, 1, T, dtype=torch.float64, generator=g, requires_grad=True)
    out = rwkv_conv(k, w)
    print("max |taichi - torch conv1d|:", (out - rwkv_conv_torch(k, w)).abs().max().item())
    print("gradcheck (with forward AD):", torch.autograd.gradcheck(rwkv_conv, (k, w), check_forward_ad=True))
    print("gradgradcheck:", torch.autograd.gradgradcheck(rwkv_conv, (k, w)))
    out.square().sum().backward()
    print("k.grad norm:", k.grad.norm().item(), " w.grad norm:", w.grad.norm().item())
    print("cache:", td.cache_info()["rwkv_conv"])
