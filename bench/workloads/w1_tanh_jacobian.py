"""W1: per-sample Jacobians of ``y = tanh(W x + b)``, W 4x8, x batched, W and b broadcast.

Result: ``J`` of shape ``(B, 4, 8)``, ``J[i] = (1 - y_i^2) * W``.
"""
import numpy as np
from common import Case, get_jax, init_taichi, jax_missing_reason, measure, skipped, ti_sync

M, N = 4, 8
ti = init_taichi()
vec8 = ti.types.vector(N, ti.f64)
vec4 = ti.types.vector(M, ti.f64)
mat48 = ti.types.matrix(M, N, ti.f64)


@ti.func
def layer(x: vec8, W: mat48, b: vec4) -> vec4:
    return ti.tanh(W @ x + b)


@ti.kernel
def closed_form(x: ti.types.ndarray(dtype=vec8, ndim=1), W: ti.types.ndarray(dtype=ti.f64, ndim=2),
                b: ti.types.ndarray(dtype=ti.f64, ndim=1), J: ti.types.ndarray(dtype=mat48, ndim=1)):
    for i in x:
        Wm = ti.Matrix.zero(ti.f64, M, N)
        bv = ti.Vector.zero(ti.f64, M)
        for r, c in ti.static(ti.ndrange(M, N)):
            Wm[r, c] = W[r, c]
        for r in ti.static(range(M)):
            bv[r] = b[r]
        y = ti.tanh(Wm @ x[i] + bv)
        Ji = ti.Matrix.zero(ti.f64, M, N)
        for r, c in ti.static(ti.ndrange(M, N)):
            Ji[r, c] = (1.0 - y[r] * y[r]) * Wm[r, c]
        J[i] = Ji


class HandWritten:
    """The way Taichi users write it today (seeds/001): fields with needs_grad,
    one reverse pass per output component, a kernel to gather each row.
    (The seed clears and seeds gradients with Python loops over elements; here
    that is done by kernels and ``fill``, which is what makes it usable at all
    at B = 1e6.)"""

    def __init__(self, B, W, b):
        self.B = B
        self.x = ti.Vector.field(N, ti.f64, shape=B, needs_grad=True)
        self.y = ti.Vector.field(M, ti.f64, shape=B, needs_grad=True)
        self.Wf = ti.Matrix.field(M, N, ti.f64, shape=())
        self.bf = ti.Vector.field(M, ti.f64, shape=())
        self.J = ti.Matrix.field(M, N, ti.f64, shape=B)
        self.Wf.from_numpy(W)
        self.bf.from_numpy(b)
        x, y, Wf, bf, J = self.x, self.y, self.Wf, self.bf, self.J

        @ti.kernel
        def forward():
            for i in x:
                y[i] = ti.tanh(Wf[None] @ x[i] + bf[None])

        @ti.kernel
        def seed(q: ti.i32):
            for i in y:
                e = ti.Vector.zero(ti.f64, M)
                e[q] = 1.0
                y.grad[i] = e

        @ti.kernel
        def gather(q: ti.i32):
            for i in x:
                for c in ti.static(range(N)):
                    J[i][q, c] = x.grad[i][c]

        self.forward, self.seed, self.gather = forward, seed, gather

    def __call__(self, xs):
        self.x.from_numpy(xs)
        for q in range(M):
            self.x.grad.fill(0.0)
            self.seed(q)
            self.forward()
            self.forward.grad()
            self.gather(q)
        return self.J.to_numpy()


def reference(x, W, b):
    y = np.tanh(x @ W.T + b)
    return (1.0 - y * y)[:, :, None] * W[None]


_hand = {}


def cases(B, which=None, seed=0):
    """The contenders at batch size B; ``which`` filters them by name substring."""
    import torch

    import tidiff as td

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, N))
    W = rng.standard_normal((M, N)) * 0.5
    b = rng.standard_normal(M) * 0.5
    ref = reference(x, W, b)
    out, skips = [], []
    wl = f"W1 jacobian tanh(Wx+b) B={B:.0e}"

    def want(name):
        return which is None or any(w in name for w in which)

    # --- tidiff
    for name in ("jacfwd", "jacobian", "jacrev"):
        tf = getattr(td, name)(layer)
        peer = f"tidiff td.{name}"
        if want(peer):
            out.append(Case(peer, lambda tf=tf: tf(x, W, b), kind="tidiff"))
    # --- hand-written Taichi
    Jbuf = np.empty((B, M, N))
    if want("Taichi closed-form kernel (limit)"):
        out.append(Case("Taichi closed-form kernel (limit)", lambda: (closed_form(x, W, b, Jbuf), ti_sync(), Jbuf)[2],
                        kind="limit", note="output preallocated"))
    if want("Taichi closed-form + fresh output"):
        def fresh():
            J = np.empty((B, M, N))
            closed_form(x, W, b, J)
            ti_sync()
            return J
        out.append(Case("Taichi closed-form + fresh output", fresh, kind="limit"))
    if want("Taichi by hand (needs_grad, 4 reverse passes)"):
        if B not in _hand:
            _hand[B] = HandWritten(B, W, b)
        h = _hand[B]
        h.Wf.from_numpy(W)
        h.bf.from_numpy(b)
        out.append(Case("Taichi by hand (needs_grad, 4 reverse passes)", lambda: h(x)))
    # --- JAX
    jax = get_jax()
    if jax is not None:
        import jax.numpy as jnp

        def f(x, W, b):
            return jnp.tanh(W @ x + b)

        xj, Wj, bj = jnp.asarray(x), jnp.asarray(W), jnp.asarray(b)
        for mode in ("jacfwd", "jacrev"):
            peer = f"JAX jit(vmap({mode}))"
            if want(peer):
                g = jax.jit(jax.vmap(getattr(jax, mode)(f), in_axes=(0, None, None)))
                out.append(Case(peer, lambda g=g: g(xj, Wj, bj).block_until_ready()))
    elif want("JAX"):
        skips.append(skipped(wl, "JAX", "peer", f"JAX not installed ({jax_missing_reason()})"))
    # --- torch
    xt, Wt, bt = (torch.from_numpy(a) for a in (x, W, b))

    def ft(x, W, b):
        return torch.tanh(W @ x + b)

    if want("torch.func vmap(jacrev)"):
        g = torch.func.vmap(torch.func.jacrev(ft), in_dims=(0, None, None))
        out.append(Case("torch.func vmap(jacrev)", lambda: g(xt, Wt, bt)))
    if want("torch.autograd.functional.jacobian"):
        def taf():
            # jacobian of the batch-summed output: (M, B, N), one reverse pass per output row
            J = torch.autograd.functional.jacobian(lambda xx: torch.tanh(xx @ Wt.T + bt).sum(0), xt)
            return J.permute(1, 0, 2)
        out.append(Case("torch.autograd.functional.jacobian", taf,
                        note="of the batch-summed output (per-sample trick); the full (B,4,B,8) Jacobian does not fit"))
    return wl, out, ref, skips


def run(quick=False, log=print):
    rows = []
    sizes = [10_000] if quick else [10_000, 1_000_000]
    for B in sizes:
        wl, cs, ref, skips = cases(B)
        log(f"\n{wl}")
        repeats = 5 if quick else 9
        rows += measure(wl, cs, ref, repeats=repeats, log=log, min_sample_s=0.02 if B < 1e5 else 0.0)
        rows += skips
    return rows
