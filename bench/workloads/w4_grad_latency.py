"""W4: latency of one tiny ``grad`` call: ``p(x) = x^3 + 2x^2 - 3x + 1``, ``p'(1) = 4``.

Per-call times (each sample is a loop of many calls). The floor is a Taichi
kernel launch: an empty one, and one taking and returning a scalar.
"""
import numpy as np
from common import Case, get_jax, init_taichi, jax_missing_reason, measure, skipped

ti = init_taichi()


@ti.func
def p(x: ti.f64) -> ti.f64:
    return x ** 3 + 2 * x ** 2 - 3 * x + 1


@ti.kernel
def empty():
    pass


@ti.kernel
def closed_form(x: ti.f64) -> ti.f64:
    return 3 * x * x + 4 * x - 3


class RawTaichi:
    """The RFC's 'naive current Taichi equivalent' (seeds/002): 0-D fields and
    ``kernel.grad``, plus clearing x.grad, which the seed forgets (gradients
    accumulate across calls otherwise)."""

    def __init__(self):
        self.x = ti.field(ti.f64, shape=(), needs_grad=True)
        self.y = ti.field(ti.f64, shape=(), needs_grad=True)
        x, y = self.x, self.y

        @ti.kernel
        def f():
            y[None] += x[None] ** 3 + 2 * x[None] ** 2 - 3 * x[None] + 1

        self.f = f

    def __call__(self, v):
        self.x[None] = v
        self.x.grad[None] = 0.0
        self.y.grad[None] = 1.0
        self.f.grad()
        return self.x.grad[None]


def cases():
    import torch

    import tidiff as td

    wl = "W4 latency of one scalar grad call"
    ref = np.asarray(4.0)
    out, skips = [], []
    dp = td.grad(p)
    out.append(Case("tidiff td.grad(p)(1.0)", lambda: dp(1.0), kind="tidiff"))
    raw = RawTaichi()
    out.append(Case("Taichi raw 0-D fields + kernel.grad", lambda: raw(1.0)))
    out.append(Case("Taichi kernel returning p'(x) (floor)", lambda: closed_form(1.0), kind="limit"))
    out.append(Case("Taichi empty kernel launch (floor)", empty, kind="limit", check=False))
    jax = get_jax()
    if jax is not None:
        g = jax.jit(jax.grad(lambda x: x ** 3 + 2 * x ** 2 - 3 * x + 1))
        out.append(Case("JAX jit(grad)", lambda: g(1.0).block_until_ready()))
    else:
        skips.append(skipped(wl, "JAX", "peer", f"JAX not installed ({jax_missing_reason()})"))

    def torch_grad():
        x = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
        (gx,) = torch.autograd.grad(x ** 3 + 2 * x ** 2 - 3 * x + 1, x)
        return gx

    out.append(Case("torch autograd.grad (eager)", torch_grad))
    return wl, out, ref, skips


def run(quick=False, log=print):
    wl, cs, ref, skips = cases()
    log(f"\n{wl}")
    rows = measure(wl, cs, ref, repeats=5 if quick else 9, log=log, min_sample_s=0.01 if quick else 0.05)
    for r in rows:
        r.unit = "us"
    return rows + skips
