"""dtypes and devices of td.torch.function operators (issue 14, item 4)."""
import subprocess
import sys

import pytest
import taichi as ti
import torch
from child_env import child_env

import tidiff as td


@ti.func
def g(x: ti.math.vec3, s: ti.f64) -> ti.f64:
    return s * x.dot(x) + ti.sin(x[0])


@ti.kernel
def scale(k: ti.types.ndarray(), w: ti.types.ndarray(), out: ti.types.ndarray()):
    for i, j in out:
        out[i, j] = w[j] * k[i, j] * k[i, j]


g_op = td.torch.function(g)
scale_op = td.torch.function(scale, inputs=["k", "w"], outputs={"out": lambda k, w: k.shape})


def test_float32_in_float32_out_every_step():
    """float32 tensors in: float32 out and float32 gradients, from kernels compiled for float32 (no float64 round
    trip), for a @ti.func and an ndarray kernel."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=gen).requires_grad_()
    s = torch.tensor(0.7).requires_grad_()
    y = g_op(x, s)
    assert y.dtype == torch.float32
    y.sum().backward()
    assert x.grad.dtype == s.grad.dtype == torch.float32
    x64, s64 = x.detach().double(), s.detach().double()
    reference = s64 * (x64 * x64).sum(-1) + torch.sin(x64[:, 0])
    torch.testing.assert_close(y.detach().double(), reference, rtol=1e-6, atol=1e-6)
    assert {str(spec.dtype) for spec in g_op.fn.specs_for([x, s])} == {"float32"}  # what the kernel compiles for
    k, w = torch.randn(5, 4, generator=gen).requires_grad_(), torch.randn(4, generator=gen).requires_grad_()
    out = scale_op(k, w)
    assert out.dtype == torch.float32
    out.sum().backward()
    assert k.grad.dtype == w.grad.dtype == torch.float32
    torch.testing.assert_close(out, w * k * k)
    torch.testing.assert_close(k.grad, 2 * w * k.detach())


CUDA_SCRIPT = """
import taichi as ti, torch
ti.init(arch=ti.cuda, default_fp=ti.f64, log_level=ti.ERROR)
import tidiff as td

@ti.kernel
def scale(k: ti.types.ndarray(), w: ti.types.ndarray(), out: ti.types.ndarray()):
    for i, j in out:
        out[i, j] = w[j] * k[i, j] * k[i, j]

@ti.func
def g(x: ti.math.vec3, s: ti.f64) -> ti.f64:
    return s * x.dot(x) + ti.sin(x[0])

op = td.torch.function(scale, inputs=["k", "w"], outputs={"out": lambda k, w: k.shape})
for dtype in (torch.float32, torch.float64):
    k = torch.randn(300, 40, dtype=dtype, device="cuda", requires_grad=True)
    w = torch.randn(40, dtype=dtype, device="cuda", requires_grad=True)
    out = op(k, w)
    assert out.device.type == "cuda" and out.dtype == dtype
    torch.testing.assert_close(out, w * k * k)
    out.sum().backward()
    torch.testing.assert_close(k.grad, 2 * w * k.detach())
    compiled = torch.compile(lambda k, w: op(k, w).sum(), fullgraph=True)
    torch.testing.assert_close(compiled(k, w), (w * k * k).sum())
x = torch.randn(100, 3, dtype=torch.float64, device="cuda", requires_grad=True)
y = td.torch.function(g)(x, 0.5)
assert y.device.type == "cuda"
y.sum().backward()
torch.testing.assert_close(x.grad, x.detach() + torch.nn.functional.pad(torch.cos(x.detach()[:, :1]), (0, 2)))
print("ok")
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: GPU runs are done on a GPU machine")
def test_cuda_tensors_with_taichi_cuda(tmp_path):
    """CUDA tensors with ti.init(arch=ti.cuda), in a process of its own (ti.init resets the runtime)."""
    script = tmp_path / "cuda_run.py"  # Taichi reads a @ti.func's source from its file
    script.write_text(CUDA_SCRIPT)
    env = child_env()
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-3000:]
