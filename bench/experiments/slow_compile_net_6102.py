# ruff: noqa: E501  (the generated program keeps its lines as the net wrote them)
"""A generated program whose gradient compiles slowly (issue 39 item 5), kept from the net's long run.

    python bench/experiments/slow_compile_net_6102.py [--no-advanced-optimization]

Long run of 2026-11-29 (kernel programs, seed 6102, transforms of 99050c0): a field program's checks
ran past the chunk's 25 minutes. The element function ``f`` calls a 7-line helper ``h1`` three times
(one call in a 2-iteration loop; Taichi inlines every call), with a 3x3 inverse, determinants and
normalize. On the 2-core machine, quiet: ``td.grad(f)`` first call 18.8 s (30 s of ``compile_kernel``
under load), 8.0 s with ``advanced_optimization=False``; its generated adjoint is 561 lines,
``h1_vjp`` 270 of them. The program needs the conformance net's namespace (``tests/conformance``).
"""
import os
import sys
import time

import numpy as np
import taichi as ti

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

PROGRAM = """
@ti.func
def h0(x0: ti.types.matrix(3, 2, ti.f64)) -> ti.types.matrix(2, 2, ti.f64):
    t0 = ti.pow((((x0 % 1.3) ** 2 + 0.5) ** ti.tanh((0.4 / (x0[0, 0] ** 2 + 1.0)))), 3)
    if ti.pow(ti.Matrix([[t0[2, 1], t0[2, 0]], [x0[0, 1], t0[0, 0]]]) ** 2 + 0.5, 0.7).norm_inv(0.25) > 0.0:
        if ti.log(ti.Matrix([[x0[1, 0], x0[1, 1], t0[1, 0]], [x0[1, 1], x0[0, 0], x0[0, 1]], [x0[1, 0], x0[0, 0], x0[0, 1]]]).trace() ** 2 + 1.0) > -0.2:
            t0 = ti.cast(x0, ti.f64)
    else:
        j1 = 0
        while j1 < 3:
            t0[1, 0] -= ti.math.dot(ti.rsqrt(ti.Vector([t0[1, 0], x0[1, 1]]) ** 2 + 0.5), ti.cast(ti.Vector([t0[0, 1], x0[1, 1]]), ti.f64))
            j1 += 1
        t0 = ti.asin(ti.tanh(ti.tan(ti.tanh((ti.Matrix([[t0[0, 0], x0[0, 0], t0[1, 1]], [t0[0, 0], x0[1, 0], t0[0, 0]], [x0[2, 1], t0[1, 0], t0[0, 0]]]) @ x0)))) * 0.9)
    return (2.3 - (td.stop_gradient(ti.Matrix([[t0[0, 1], t0[2, 0]], [x0[1, 0], t0[2, 0]]])) % 1.3))


@ti.func
def h1(x0: ti.types.matrix(3, 3, ti.f64)):
    t0 = ti.acos(ti.tanh(ti.abs((1.7 - ti.Vector([x0[0, 0], x0[0, 1]])))) * 0.9)
    for i1 in range(2):
        t0 -= ti.max(ti.Vector([t0[0]]).dot(ti.Vector([x0[1, 2]])), min(x0[0, 0], t0[0]))
        if (-ti.math.length(t0 + 0.7391)) > 0.3:
            t0.y -= ti.sqrt(ti.Matrix([[t0[1], x0[0, 1]], [t0[0], t0[1]], [t0[0], t0[0]]]) ** 2 + 0.5).norm(0.25)
            t0 -= ti.tanh(ti.Matrix([[t0[0], t0[0], x0[2, 1]], [x0[1, 2], t0[0], x0[0, 1]]]).min())
    return ti.math.determinant(ti.abs(ti.pow(x0, 3))), (abs(ti.math.normalize(t0 + 0.7391)) % 1.3)


@ti.func
def f(x0: ti.f64, x1: ti.f64) -> ti.f64:
    t0 = ((0.4 / ((x0 * x0) ** 2 + 1.0)) / (ti.math.determinant(ti.acos(ti.tanh(ti.Matrix([[x0, x0, x0], [x1, x1, x1], [x1, x0, x0]])) * 0.9)) ** 2 + 1.0))
    t1, t2 = h1(mat33d((-ti.Matrix([[t0, x0, t0], [x1, t0, t0], [x1, x1, x0]]))))
    if ti.sqrt((t1 + 1.7) ** 2 + 0.5) > 0.0:
        t0, t2 = h1(ti.math.inverse(ti.Matrix.identity(ti.f64, 3) + 0.25 * ti.tanh(ti.min(ti.Matrix([[x0, t0, x0], [x1, x1, x1], [t1, t1, x0]]), ti.Matrix([[t0, t1, t0], [x0, x0, x0], [x0, t0, x1]])))))
        t1 = min(abs(lib_softsign(t1)), (t2.cross(t2) + (t1 / (t1 ** 2 + 1.0))))
    else:
        t1 = (td.stop_gradient(x1) + ti.abs(ti.Vector([t0]))).min()
        for i3 in range(2):
            t0, t2 = h1(((ti.Matrix([[t0, t0], [x1, t0], [x1, t0]]) @ ti.Matrix([[x1, x1, t1], [x0, x0, t0]])) * ti.math.clamp(t1, 0.1, 0.6)))
    t2[0] -= float(ti.Matrix([[x1, x0], [t0, t0]]).determinant())
    return (ti.math.clamp(max(x0, t0), -0.8, -0.30000000000000004) ** 2)
"""


def main() -> None:
    advanced = "--no-advanced-optimization" not in sys.argv
    ti.init(ti.cpu, default_fp=ti.f64, offline_cache=False, advanced_optimization=advanced)
    from conformance import render_taichi

    import tidiff as td

    ns = render_taichi.namespace()
    f = render_taichi.compile_text(PROGRAM, "f", ns, "slow")
    x0, x1 = np.array([-1.0480906095337716]), np.array([-1.2257326521214822])
    for name, make in [("value", lambda: td.function(f)), ("grad", lambda: td.grad(f, argnums=(0, 1))),
                       ("jacfwd", lambda: td.jacfwd(f, argnums=(0, 1)))]:
        t = time.perf_counter()
        make()(x0, x1)
        print(f"{name}: first call {time.perf_counter() - t:.1f} s", flush=True)
    print("generated adjoint:", len(td.source(td.grad(f, argnums=(0, 1)), x0, x1).splitlines()), "lines")


if __name__ == "__main__":
    main()
