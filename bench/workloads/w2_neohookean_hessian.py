"""W2: per-element Hessians of the Neo-Hookean energy of a 3x3 deformation gradient.

    psi(F) = mu/2 (tr(F^T F) - 3) - mu log J + lam/2 (log J)^2,   J = det F

Hessian ``H[i,j,k,l] = d^2 psi / dF_ij dF_kl``, shape ``(B, 3, 3, 3, 3)``.

Closed form (derived here, checked against torch.autograd.functional.hessian):
with G = F^{-T}, dJ/dF = J G and d(G_ij)/dF_kl = -G_il G_kj,

    P = dpsi/dF = mu F + (lam log J - mu) G
    H[i,j,k,l] = mu d_ik d_jl + lam G_ij G_kl - (lam log J - mu) G_il G_kj
"""
import warnings

import numpy as np
from common import Case, get_jax, init_taichi, jax_missing_reason, max_error, measure, skipped, ti_sync

MU, LAM = 1.3, 2.1
ti = init_taichi()
mat3 = ti.math.mat3


@ti.func
def neo_hookean(F: mat3, mu: ti.f64, lam: ti.f64) -> ti.f64:
    J = F.determinant()
    logJ = ti.log(J)
    return 0.5 * mu * ((F.transpose() @ F).trace() - 3.0) - mu * logJ + 0.5 * lam * logJ * logJ


warnings.filterwarnings("ignore", message="You are unrolling", category=SyntaxWarning)


@ti.kernel
def closed_form(F: ti.types.ndarray(dtype=mat3, ndim=1), mu: ti.f64, lam: ti.f64,
                H: ti.types.ndarray(dtype=ti.f64, ndim=5)):
    for e in F:
        Fe = F[e]
        G = Fe.inverse().transpose()
        c = lam * ti.log(Fe.determinant()) - mu
        for i, j, k, m in ti.static(ti.ndrange(3, 3, 3, 3)):
            v = lam * G[i, j] * G[k, m] - c * G[i, m] * G[k, j]
            if ti.static(i == k and j == m):
                v += mu
            H[e, i, j, k, m] = v


def reference(F, mu, lam):
    """The closed form in NumPy."""
    G = np.linalg.inv(F).transpose(0, 2, 1)
    c = lam * np.log(np.linalg.det(F)) - mu
    eye = np.eye(3)
    H = lam * np.einsum("bij,bkl->bijkl", G, G) - c[:, None, None, None, None] * np.einsum("bil,bkj->bijkl", G, G)
    return H + mu * np.einsum("ik,jl->ijkl", eye, eye)[None]


def torch_energy(F, mu, lam):
    import torch

    J = torch.linalg.det(F)
    logJ = torch.log(J)
    return 0.5 * mu * ((F * F).sum() - 3.0) - mu * logJ + 0.5 * lam * logJ * logJ


def oracle_check(F, ref, k=5):
    """The closed form against torch.autograd.functional.hessian on the first k elements."""
    import torch

    worst = 0.0
    for e in range(k):
        Ht = torch.autograd.functional.hessian(lambda f: torch_energy(f, MU, LAM), torch.from_numpy(F[e])).numpy()
        worst = max(worst, max_error(Ht, ref[e]))
    assert worst < 1e-10, f"closed-form Neo-Hookean Hessian disagrees with torch.autograd.functional ({worst:.3g})"
    return worst


def make_F(B, seed=0):
    rng = np.random.default_rng(seed)
    return np.eye(3)[None] + 0.2 * rng.standard_normal((B, 3, 3))  # det > 0 for these


def cases(B, which=None, seed=0, log=print):
    import torch

    import tidiff as td

    F = make_F(B, seed)
    assert (np.linalg.det(F) > 0).all()
    ref = reference(F, MU, LAM)
    oracle_err = oracle_check(F, ref)
    wl = f"W2 hessian Neo-Hookean B={B:.0e}"
    out, skips = [], []

    def want(name):
        return which is None or any(w in name for w in which)

    H = td.hessian(neo_hookean)
    if want("tidiff td.hessian"):
        out.append(Case("tidiff td.hessian", lambda: H(F, MU, LAM), kind="tidiff"))
    Hbuf = np.empty((B, 3, 3, 3, 3))
    if want("Taichi closed-form kernel (limit)"):
        def closed() -> np.ndarray:
            closed_form(F, MU, LAM, Hbuf)
            ti_sync()
            return Hbuf
        out.append(Case("Taichi closed-form kernel (limit)", closed,
                        kind="limit", note=f"output preallocated; formula = torch.autograd to {oracle_err:.0e}"))
    if want("Taichi closed-form + fresh output"):
        def fresh():
            Hn = np.empty((B, 3, 3, 3, 3))
            closed_form(F, MU, LAM, Hn)
            ti_sync()
            return Hn
        out.append(Case("Taichi closed-form + fresh output", fresh, kind="limit"))
    jax = get_jax()
    if jax is not None:
        import jax.numpy as jnp

        def fj(F, mu, lam):
            logJ = jnp.log(jnp.linalg.det(F))
            return 0.5 * mu * (jnp.sum(F * F) - 3.0) - mu * logJ + 0.5 * lam * logJ * logJ

        Fj = jnp.asarray(F)
        if want("JAX jit(vmap(hessian))"):
            gj = jax.jit(jax.vmap(jax.hessian(fj), in_axes=(0, None, None)))
            out.append(Case("JAX jit(vmap(hessian))", lambda: gj(Fj, MU, LAM).block_until_ready()))
    elif want("JAX"):
        skips.append(skipped(wl, "JAX", "peer", f"JAX not installed ({jax_missing_reason()})"))
    Ft = torch.from_numpy(F)
    if want("torch.func vmap(hessian)"):
        gt = torch.func.vmap(torch.func.hessian(torch_energy), in_dims=(0, None, None))
        k = min(B, 4)
        errs = [max_error(e, r) for e, r in zip(gt(Ft[:k], MU, LAM).numpy(), ref[:k], strict=True)]
        log("  torch.func vmap(hessian) vs closed form (= torch.autograd.functional) per element: "
            + ", ".join(f"{e:.1e}" for e in errs))
        out.append(Case("torch.func vmap(hessian)", lambda: gt(Ft, MU, LAM), rtol=1e-9, atol=1e-9,
                        note="torch 2.13 through det: max err per element " + ", ".join(f"{e:.0e}" for e in errs)))
    return wl, out, ref, skips


def run(quick=False, log=print):
    B = 10_000 if quick else 100_000
    wl, cs, ref, skips = cases(B, log=log)
    log(f"\n{wl}")
    rows = measure(wl, cs, ref, repeats=5 if quick else 9, log=log)
    return rows + skips
