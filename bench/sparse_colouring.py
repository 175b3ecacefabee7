"""Sparse Jacobians and Hessians of whole kernels at about 10^5 unknowns, the pattern read from the kernel's code.

    python bench/sparse_colouring.py [--side 316]

Three kernels over ndarrays, none given a pattern (NOTE: [Patterns from index
expressions]): a 2-D diffusion step (5-point stencil, Jacobian), the forces of
a mass-spring grid (springs read through an integer array, Jacobian) and a
chain energy coupled to one value (band plus arrow, Hessian by star
colouring). For each: the products the call takes, the first call (reading the
pattern, colouring, compiling) and a warm call, and one ``td.jvp`` / ``td.hvp``
for scale. Beside the diffusion step, JAX (where installed) recovering the
same Jacobian from the same colours by ``jit(vmap(jvp))``, the way sparsejac
does. Entries are checked against a dense Jacobian at a small size in
tests/test_sparse_colouring.py; here the two Jacobians are compared entry by entry.
"""
import argparse
import time

import numpy as np
from common import init_taichi

ti = init_taichi()

import tidiff as td  # noqa: E402


@ti.kernel
def diffuse(u: ti.types.ndarray(ndim=2), out: ti.types.ndarray(ndim=2)):
    n, m = u.shape[0], u.shape[1]
    for i, j in u:
        lap = -4.0 * u[i, j]
        if i > 0:
            lap += u[i - 1, j]
        if i < n - 1:
            lap += u[i + 1, j]
        if j > 0:
            lap += u[i, j - 1]
        if j < m - 1:
            lap += u[i, j + 1]
        out[i, j] = u[i, j] + 0.1 * lap - 0.05 * u[i, j] ** 3


@ti.kernel
def spring_forces(x: ti.types.ndarray(dtype=ti.math.vec2, ndim=1), springs: ti.types.ndarray(dtype=ti.i32, ndim=2),
                  force: ti.types.ndarray(dtype=ti.math.vec2, ndim=1)):
    for s in range(springs.shape[0]):
        a, b = springs[s, 0], springs[s, 1]
        d = x[b] - x[a]
        f = (d.norm() - 1.0) * d.normalized()
        force[a] += f
        force[b] -= f


@ti.kernel
def chain_energy(u: ti.types.ndarray(ndim=1), out: ti.types.ndarray(ndim=0)):
    for i in range(u.shape[0] - 1):
        out[None] += (u[i + 1] - u[i]) ** 4 + u[0] * ti.sin(u[i])


def grid_springs(side):
    k = np.arange(side * side).reshape(side, side)
    pairs = [(k[:, :-1], k[:, 1:]), (k[:-1, :], k[1:, :]), (k[:-1, :-1], k[1:, 1:]), (k[:-1, 1:], k[1:, :-1])]
    return np.concatenate([np.stack([a.ravel(), b.ravel()], 1) for a, b in pairs]).astype(np.int32)


def timed(f, *args):
    t = time.perf_counter()
    out = f(*args)
    return out, time.perf_counter() - t


def warm(f, *args, repeats=3):
    return min(timed(f, *args)[1] for _ in range(repeats))


def row(name, unknowns, S, args, one_product):
    J, first = timed(S, *args)
    w = warm(S, *args)
    p = warm(one_product)
    print(f"| {name} | {unknowns:,} | {J.nnz:,} | {S.products} | {first:.2f} s | {w * 1e3:.0f} ms | "
          f"{p * 1e3:.1f} ms | {w / p:.1f} |")
    return J, w


def jax_diffusion(side, u, colours, J_tidiff):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        print("JAX not installed: no peer row")
        return
    jax.config.update("jax_enable_x64", True)

    def step(v):
        p = jnp.pad(v, 1)
        lap = p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * v
        return v + 0.1 * lap - 0.05 * v**3

    count = int(colours.max()) + 1
    seeds = jnp.asarray(np.stack([(colours == c).reshape(side, side) for c in range(count)]).astype(np.float64))
    products = jax.jit(lambda v, t: jax.vmap(lambda s: jax.jvp(step, (v,), (s,))[1])(t))
    rows, cols = J_tidiff.nonzero()

    def jacobian(v):
        out = np.asarray(products(jnp.asarray(v), seeds)).reshape(count, -1)
        return out[colours[cols], rows]

    values, first = timed(jacobian, u)
    w = warm(jacobian, u)
    assert np.allclose(values, np.asarray(J_tidiff[rows, cols]).ravel(), rtol=1e-12, atol=1e-14)
    print(f"| JAX jit(vmap(jvp)), same colours | {side * side:,} | {rows.size:,} | {count} | {first:.2f} s | "
          f"{w * 1e3:.0f} ms | | |")
    return w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", type=int, default=316, help="grid side: side^2 unknowns (diffusion, chain)")
    args = ap.parse_args()
    side = args.side
    rng = np.random.default_rng(0)
    print("| kernel | unknowns | entries | products | first call | warm call | one product | warm / product |")
    print("|---|---|---|---|---|---|---|---|")
    step = td.function(diffuse, inputs=["u"], outputs={"out": lambda u: u.shape})
    u = rng.random((side, side))
    du = rng.random((side, side))
    S = td.sparse_jacobian(step)
    J, w_tidiff = row("diffusion step (Jacobian)", side * side, S, (u,), lambda: td.jvp(step, (u,), (du,)))
    colours = next(iter(S.coloured.values()))[0]
    w_jax = jax_diffusion(side, u, colours, J)
    if w_jax:
        print(f"tidiff / JAX warm: {w_tidiff / w_jax:.2f}x")
    nodes = int(np.sqrt(side * side / 2))
    x = np.stack(np.meshgrid(np.arange(nodes), np.arange(nodes), indexing="ij"), -1).reshape(-1, 2) * 1.0
    x += 0.1 * rng.standard_normal(x.shape)
    springs = grid_springs(nodes)
    forces = td.function(spring_forces, inputs=["x", "springs"], outputs={"force": lambda x, s: x.shape})
    dx = rng.standard_normal(x.shape)
    row(f"mass-spring forces, {len(springs):,} springs (Jacobian)", x.size, td.sparse_jacobian(forces),
        (x, springs), lambda: td.jvp(forces, (x, springs), (dx, None)))
    chain = td.function(chain_energy, inputs=["u"], outputs={"out": lambda u: ()})
    v = rng.random(side * side)
    dv = rng.random(side * side)
    row("chain energy with one shared value (Hessian)", v.size, td.sparse_hessian(chain), (v,),
        lambda: td.hvp(chain, (v,), (dv,)))


if __name__ == "__main__":
    main()
