"""W3: a vjp over 1e7 elements of ``h(x) = sin(x) x^2 + exp(-x)``: value and ``J^T c``.

Every contender returns ``(h(x), c * h'(x))`` for the same x and c; the memory
bandwidth bound is a plain copy of x (read 80 MB, write 80 MB) by a Taichi kernel.
The vjp itself reads x and c and writes two arrays: about 2x the copy's traffic.
"""
import numpy as np
from common import Case, get_jax, init_taichi, jax_missing_reason, measure, skipped, ti_sync

ti = init_taichi()


@ti.func
def h(x: ti.f64) -> ti.f64:
    return ti.sin(x) * x ** 2 + ti.exp(-x)


@ti.kernel
def closed_form(x: ti.types.ndarray(dtype=ti.f64, ndim=1), c: ti.types.ndarray(dtype=ti.f64, ndim=1),
                y: ti.types.ndarray(dtype=ti.f64, ndim=1), g: ti.types.ndarray(dtype=ti.f64, ndim=1)):
    for i in x:
        xi = x[i]
        s, co, e = ti.sin(xi), ti.cos(xi), ti.exp(-xi)
        y[i] = s * xi * xi + e
        g[i] = c[i] * (co * xi * xi + 2.0 * xi * s - e)


@ti.kernel
def copy(x: ti.types.ndarray(dtype=ti.f64, ndim=1), y: ti.types.ndarray(dtype=ti.f64, ndim=1)):
    for i in x:
        y[i] = x[i]


class RawTaichi:
    """Taichi's own reverse mode on fields holding the same data (x, c loaded once):
    per call clear x.grad, seed y.grad = c, run the kernel and ``kernel.grad``."""

    def __init__(self, x, c):
        n = x.shape[0]
        self.x = ti.field(ti.f64, shape=n, needs_grad=True)
        self.y = ti.field(ti.f64, shape=n, needs_grad=True)
        self.c = ti.field(ti.f64, shape=n)
        self.x.from_numpy(x)
        self.c.from_numpy(c)
        xf, yf, cf = self.x, self.y, self.c

        @ti.kernel
        def forward():
            for i in xf:
                yf[i] = ti.sin(xf[i]) * xf[i] ** 2 + ti.exp(-xf[i])

        @ti.kernel
        def seed():
            for i in yf:
                yf.grad[i] = cf[i]
                xf.grad[i] = 0.0

        self.forward, self.seed = forward, seed

    def __call__(self):
        self.seed()          # kernel.grad zeroes y.grad after each pass: seed it every time
        self.forward()
        self.forward.grad()
        ti_sync()
        return self.x.grad

    def result(self):
        return self.x.grad.to_numpy()


def cases(n, which=None, seed=0):
    import torch

    import tidiff as td

    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, n)
    c = rng.standard_normal(n)
    ref_y = np.sin(x) * x * x + np.exp(-x)
    ref_g = c * (np.cos(x) * x * x + 2 * x * np.sin(x) - np.exp(-x))
    ref = np.stack([ref_y, ref_g])
    wl = f"W3 vjp sin(x)x^2+exp(-x) n={n:.0e}"
    out, skips = [], []

    def pair(y, g):
        return np.stack([np.asarray(y), np.asarray(g)])

    def tidiff_vjp():
        y, f = td.vjp(h, x)
        (g,) = f(c)
        return y, g

    out.append(Case("tidiff td.vjp (+ vjp_fn(c))", tidiff_vjp, kind="tidiff", to_numpy=lambda r: pair(*r)))
    y, f = td.vjp(h, x)
    out.append(Case("tidiff vjp_fn(c) alone", lambda: f(c)[0], kind="tidiff", to_numpy=lambda r: r,
                    ref=ref_g, note="primal done once"))
    raw = RawTaichi(x, c)
    out.append(Case("Taichi raw kernel + kernel.grad (fields)", raw,
                    to_numpy=lambda r: pair(raw.y.to_numpy(), r.to_numpy()),
                    note="data already in fields; gradient left in x.grad (no copy out)"))
    yb, gb = np.empty(n), np.empty(n)
    out.append(Case("Taichi closed-form kernel (limit)", lambda: (closed_form(x, c, yb, gb), ti_sync(), (yb, gb))[2],
                    kind="limit", to_numpy=lambda r: pair(*r), note="outputs preallocated"))

    def fresh():
        y2, g2 = np.empty(n), np.empty(n)
        closed_form(x, c, y2, g2)
        ti_sync()
        return y2, g2

    out.append(Case("Taichi closed-form + fresh outputs", fresh, kind="limit", to_numpy=lambda r: pair(*r)))
    cb = np.empty(n)
    out.append(Case("memory bound: Taichi copy kernel (1 read + 1 write)", lambda: (copy(x, cb), ti_sync())[0],
                    kind="limit", check=False))
    jax = get_jax()
    if jax is not None:
        import jax.numpy as jnp

        def hj(x):
            return jnp.sin(x) * x ** 2 + jnp.exp(-x)

        @jax.jit
        def jvjp(x, c):
            y, f = jax.vjp(hj, x)
            return y, f(c)[0]

        xj, cj = jnp.asarray(x), jnp.asarray(c)
        out.append(Case("JAX jit(vjp)", lambda: jax.block_until_ready(jvjp(xj, cj)), to_numpy=lambda r: pair(*r)))
    else:
        skips.append(skipped(wl, "JAX", "peer", f"JAX not installed ({jax_missing_reason()})"))
    xt, ct = torch.from_numpy(x), torch.from_numpy(c)

    def torch_vjp():
        xx = xt.detach().requires_grad_(True)
        yy = torch.sin(xx) * xx ** 2 + torch.exp(-xx)
        (g,) = torch.autograd.grad(yy, xx, ct)
        return yy.detach(), g

    out.append(Case("torch autograd", torch_vjp, to_numpy=lambda r: pair(r[0].numpy(), r[1].numpy())))
    return wl, out, ref, skips


def run(quick=False, log=print):
    n = 1_000_000 if quick else 10_000_000
    wl, cs, ref, skips = cases(n)
    log(f"\n{wl}")
    rows = measure(wl, cs, ref, repeats=5 if quick else 7, log=log)
    return rows + skips
