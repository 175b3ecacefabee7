"""CUDA tensors through every kind on Taichi's CUDA runtime, with the host copies of each warm call counted.

Run by tests/test_gpu.py in a process of its own (``TI_ARCH=cuda``) where
there is a CUDA device. Per-element transforms, field programs and their
torch operators and ndarray-kernel operators must make no host copy once
warm (NOTE: [Tensors in place] in tidiff/_arrays.py).
"""
import numpy as np
import taichi as ti
import torch
from in_place_functions import energy, f, g, pendulum_energy

import tidiff as td
from tidiff._testing.host_copies import HostCopies

ti.init(arch=ti.cuda, default_fp=ti.f64, log_level=ti.WARN)
assert ti.lang.impl.current_cfg().arch.name == "cuda", "Taichi did not start on CUDA"
cuda = torch.device("cuda")


dfdx = td.grad(f)


@ti.kernel
def forces(x: ti.types.ndarray(dtype=ti.math.vec3, ndim=1), s: ti.f64,
           out: ti.types.ndarray(dtype=ti.math.vec3, ndim=1)):
    for i in x:
        out[i] = dfdx(x[i], s)


@ti.kernel
def scale(k: ti.types.ndarray(), w: ti.types.ndarray(), out: ti.types.ndarray()):
    for i, j in out:
        out[i, j] = w[j] * k[i, j] * k[i, j]


def no_copies(name, call, allowed=0):
    """Run ``call`` warm (after a first call) and check the host copies it makes."""
    call()
    torch.cuda.synchronize()
    with HostCopies() as copies:
        result = call()
        torch.cuda.synchronize()
    print(f"{name}: {copies.count} host copies {dict(copies.seen)}")
    assert copies.count <= allowed, (name, dict(copies.seen))
    return result


def close(ours, reference, rtol=1e-12):
    assert isinstance(ours, torch.Tensor) and ours.device.type == "cuda", (type(ours), getattr(ours, "device", None))
    torch.testing.assert_close(ours, reference, rtol=rtol, atol=rtol)


gen = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(1000, 3, dtype=torch.float64, device=cuda, generator=gen)
s = torch.tensor(0.7, dtype=torch.float64, device=cuda)
e0 = torch.nn.functional.pad(torch.cos(x[:, :1]), (0, 2))
ref_dx = 1.4 * x + e0

# -- per-element transforms -------------------------------------------------------------------------------------
close(no_copies("td.grad", lambda: td.grad(f)(x, s)), ref_dx)
jx, js = no_copies("td.jacfwd", lambda: td.jacfwd(f, argnums=(0, 1))(x, s))
close(jx, ref_dx)
close(td.jacrev(f, argnums=(0, 1))(x, s)[1], (x * x).sum(-1))
hess = no_copies("td.hessian", lambda: td.hessian(f)(x, s))
close(hess, 1.4 * torch.eye(3, dtype=torch.float64, device=cuda).expand(1000, 3, 3)
      - torch.diag_embed(torch.nn.functional.pad(torch.sin(x[:, :1]), (0, 2))))
F = torch.eye(3, dtype=torch.float64, device=cuda) + 0.1 * torch.randn(1000, 3, 3, dtype=torch.float64, device=cuda,
                                                                     generator=gen)
H = no_copies("td.hessian written by a blocks kernel", lambda: td.hessian(energy)(F))
close(H, torch.as_tensor(td.hessian(energy)(F.cpu().numpy()), device=cuda))
tx = torch.randn(1000, 3, dtype=torch.float64, device=cuda, generator=gen)
y, ty = no_copies("td.jvp", lambda: td.jvp(f, (x, s), (tx, torch.zeros_like(s))))
close(ty, (ref_dx * tx).sum(-1))
out, vjp_fn = no_copies("td.vjp", lambda: td.vjp(g, x))
c = torch.randn(1000, 2, dtype=torch.float64, device=cuda, generator=gen)
(ct,) = no_copies("vjp_fn", lambda: vjp_fn(c))
close(ct, torch.stack([c[:, 0] * x[:, 1], c[:, 0] * x[:, 0], c[:, 1] * torch.exp(x[:, 2])], -1))
_, (hx, hs) = no_copies("td.hvp", lambda: td.hvp(f, (x, s), (tx, torch.zeros_like(s))))
close(hs, 2 * (x * tx).sum(-1))
out_forces = torch.empty_like(x)
no_copies("a kernel calling td.grad(f)", lambda: forces(x, 0.7, out_forces))
close(out_forces, ref_dx)

# -- the torch operator -----------------------------------------------------------------------------------------
op = td.torch.function(f)
xr = x.clone().requires_grad_()


def forward_backward():
    xr.grad = None
    op(xr, s).sum().backward()
    return xr.grad


close(no_copies("td.torch.function forward", lambda: op(x, s)), 0.7 * (x * x).sum(-1) + torch.sin(x[:, 0]))
close(no_copies("td.torch.function forward + backward", forward_backward), ref_dx)
small = torch.randn(5, 3, dtype=torch.float64, device=cuda, requires_grad=True)
sr = torch.tensor(0.7, dtype=torch.float64, device=cuda, requires_grad=True)
assert torch.autograd.gradcheck(op, (small, sr))
assert torch.autograd.gradgradcheck(op, (small, sr))
_, tangent = torch.func.jvp(lambda x: op(x, s), (x,), (tx,))
close(tangent, (ref_dx * tx).sum(-1))
compiled = torch.compile(lambda x: op(x, s).sum(), fullgraph=True)
close(compiled(x), (0.7 * (x * x).sum(-1) + torch.sin(x[:, 0])).sum())
no_copies("td.torch.function under torch.compile", lambda: compiled(x))

# a float32 training loop: fit s of f to data made with s = 1.5
x32 = torch.randn(4096, 3, device=cuda, generator=gen)
target = 1.5 * (x32 * x32).sum(-1) + torch.sin(x32[:, 0])
s32 = torch.tensor(0.2, device=cuda, requires_grad=True)
optimizer = torch.optim.SGD([s32], lr=0.02)
losses = []
for _ in range(60):
    optimizer.zero_grad()
    loss = ((op(x32, s32) - target) ** 2).mean()
    loss.backward()
    optimizer.step()
    losses.append(loss.detach())
losses = torch.stack(losses).cpu()
print(f"float32 training: loss {losses[0]:.3g} -> {losses[-1]:.3g}, s = {s32.item():.4f}")
assert losses[-1] < 1e-3 * losses[0] and abs(s32.item() - 1.5) < 1e-3

# -- an ndarray-kernel operator -----------------------------------------------------------------------------------
scale_op = td.torch.function(scale, inputs=["k", "w"], outputs={"out": lambda k, w: k.shape})
k = torch.randn(300, 40, dtype=torch.float64, device=cuda, generator=gen, requires_grad=True)
w = torch.randn(40, dtype=torch.float64, device=cuda, generator=gen, requires_grad=True)


def scale_forward_backward():
    k.grad = w.grad = None
    scale_op(k, w).sum().backward()
    return k.grad


close(no_copies("ndarray operator forward", lambda: scale_op(k, w)), w * k * k)
close(no_copies("ndarray operator forward + backward", scale_forward_backward), 2 * w * k.detach())

# -- field programs: loaded from the tensors and read into tensors on the GPU ---------------------------------------
xf = ti.field(ti.f64, shape=16)
wf = ti.field(ti.f64, shape=())
target = ti.field(ti.f64, shape=16)  # read besides the inputs
loss_f = ti.field(ti.f64, shape=())
pos = ti.Vector.field(2, ti.f64, shape=(3, 4))
spread = ti.field(ti.f64, shape=())


@ti.kernel
def energy_of_fields():
    for i in xf:
        loss_f[None] += wf[None] * (xf[i] - target[i]) ** 2


@ti.kernel
def spread_of_rows():
    for j in range(4):
        spread[None] += (pos[0, j] - pos[1, j]).norm_sqr()


E = td.function(energy_of_fields, inputs=[xf, wf], outputs=[loss_f])
S = td.function(spread_of_rows, inputs=[td.part(pos, 0)], outputs=[spread])
target.fill(0.5)
xs = torch.linspace(-1.0, 1.0, 16, dtype=torch.float64, device=cuda)
w2 = torch.tensor(2.0, dtype=torch.float64, device=cuda)
close(no_copies("field program td.grad", lambda: td.grad(E)(xs, w2)), 4.0 * (xs - 0.5))
close(no_copies("field program td.hvp", lambda: td.hvp(E, (xs, w2), (torch.ones_like(xs), torch.zeros_like(w2)))[1][0]),
      torch.full_like(xs, 4.0))
E_op = td.torch.function(E)
xr_f = xs.clone().requires_grad_()


def field_forward_backward():
    xr_f.grad = None
    E_op(xr_f, w2).backward()
    return xr_f.grad


close(no_copies("field program operator forward + backward", field_forward_backward), 4.0 * (xs - 0.5))
pos.fill(0.0)
rows = torch.ones(4, 2, dtype=torch.float64, device=cuda)
close(no_copies("field program with a part of a field as input", lambda: td.grad(S)(rows)), 2 * rows)
# -- a time loop of a field program's step ----------------------------------------------------------------------------
F_loop = pendulum_energy(64, length=100)
x0 = torch.linspace(0.1, 1.0, 64, dtype=torch.float64, device=cuda)
v0 = torch.zeros(64, dtype=torch.float64, device=cuda)
value, (dx0, dk) = no_copies("td.value_and_grad of a time loop", lambda: td.value_and_grad(F_loop, argnums=(0, 2))(
    x0, v0, w2))
reference = td.value_and_grad(F_loop, argnums=(0, 2))(x0.cpu().numpy(), v0.cpu().numpy(), 2.0)
close(dx0, torch.as_tensor(reference[1][0], device=cuda))
H = td.hessian(E)(np.arange(16.0), 2.0)
assert np.allclose(H, 4 * np.eye(16))
print("ok")
