"""W1 experiment: the body td.jacfwd generates (runtime loop over tangent directions) against
ti.static-unrolled and vector-mode variants and the closed form. python bench/experiments/w1_tangent_codegen.py"""
import os
import sys
import time

os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
H = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [H, os.path.join(H, "workloads")]

import common  # noqa: E402
import numpy as np  # noqa: E402
import w1_tanh_jacobian as w1  # noqa: E402

import tidiff as td  # noqa: E402

ti = common.init_taichi()
vec8, vec4, mat48 = w1.vec8, w1.vec4, w1.mat48


def med(fn, r=7):
    fn()  # warm-up
    return common.median_seconds(fn, r)

@ti.func
def layer_jvp(x, W, b, dx):
    add = W @ x + b
    dadd = W @ dx
    return (ti.tanh(add), dadd * (1 - ti.tanh(add) ** 2))

@ti.func
def layer_jvp_bound(x, W, b, dx):   # tangent rule reusing the primal tanh
    y = ti.tanh(W @ x + b)
    return (y, (W @ dx) * (1 - y * y))

@ti.func
def jac_dynamic(x, W, b):   # what td.jacfwd generates today
    J = ti.Matrix.zero(ti.f64, 4, 8)
    for p in range(8):
        e = ti.Vector.zero(ti.f64, 8)
        e[p] = 1.0
        t = layer_jvp(x, W, b, e)
        for r in ti.static(range(4)):
            J[r, p] = t[1][r]
    return J

@ti.func
def jac_static(x, W, b):    # same, loop unrolled (ti.static)
    J = ti.Matrix.zero(ti.f64, 4, 8)
    for p in ti.static(range(8)):
        e = ti.Vector.zero(ti.f64, 8)
        e[p] = 1.0
        t = layer_jvp(x, W, b, e)
        for r in ti.static(range(4)):
            J[r, p] = t[1][r]
    return J

@ti.func
def jac_static_bound(x, W, b):
    J = ti.Matrix.zero(ti.f64, 4, 8)
    for p in ti.static(range(8)):
        e = ti.Vector.zero(ti.f64, 8)
        e[p] = 1.0
        t = layer_jvp_bound(x, W, b, e)
        for r in ti.static(range(4)):
            J[r, p] = t[1][r]
    return J

@ti.func
def jac_vector(x, W, b):    # vector mode: the 8x8 identity tangent pushed at once
    y = ti.tanh(W @ x + b)
    dadd = W @ ti.Matrix.identity(ti.f64, 8)
    d = 1 - y * y
    J = ti.Matrix.zero(ti.f64, 4, 8)
    for r, c in ti.static(ti.ndrange(4, 8)):
        J[r, c] = dadd[r, c] * d[r]
    return J

def make(body):
    @ti.kernel
    def k(x: ti.types.ndarray(dtype=vec8, ndim=1), W: ti.types.ndarray(dtype=mat48, ndim=1),
          b: ti.types.ndarray(dtype=vec4, ndim=1), J: ti.types.ndarray(dtype=mat48, ndim=1)):
        for i in range(x.shape[0]):
            J[i] = body(x[i], W[0], b[0])
    return k


kernels = {n: make(f) for n, f in [("generated (runtime loop over p)", jac_dynamic), ("ti.static loop", jac_static),
           ("ti.static + tanh bound once", jac_static_bound), ("vector mode (identity tangent)", jac_vector)]}
for B in (10_000, 1_000_000):
    rng = np.random.default_rng(0)
    x, W, b = rng.standard_normal((B, 8)), rng.standard_normal((1, 4, 8)), rng.standard_normal((1, 4))
    J = np.empty((B, 4, 8))
    ref = w1.reference(x, W[0], b[0])
    jf = td.jacfwd(w1.layer)
    res = {"td.jacfwd": med(lambda jf=jf, x=x, W=W, b=b: jf(x, W[0], b[0])),
           "closed form": med(lambda x=x, W=W, b=b, J=J: w1.closed_form(x, W[0], b[0], J))}
    for n, k in kernels.items():
        t0 = time.perf_counter()
        k(x, W, b, J)
        c = time.perf_counter() - t0
        assert np.allclose(J, ref, atol=1e-12), n
        res[n] = med(lambda k=k, x=x, W=W, b=b, J=J: k(x, W, b, J))
        res[n + " compile"] = c
    print(B, {k: f"{v * 1e3:.2f} ms" for k, v in res.items()})
