"""Count the Taichi kernel launches (and host<->Taichi copies) one tidiff call makes.

    python bench/launches.py

For each benchmarked transform: launches per call by kernel name (after a
warm-up call), where ``ext_arr_to_ndarray*`` / ``ndarray*_to_ext_arr`` are
copies between NumPy and ``ti.ndarray`` storage and ``fill_ndarray*`` clears,
and the per-call time split between the launches (total per kernel name, in
brackets) and tidiff's Python around them. A call at the floor is one launch and nothing else.
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "workloads")]

import common  # noqa: E402

ti = common.init_taichi()

import numpy as np  # noqa: E402
import taichi.lang.kernel_impl as kernel_impl  # noqa: E402


def main():
    import w1_tanh_jacobian as w1
    import w2_neohookean_hessian as w2
    import w3_vjp as w3
    import w4_grad_latency as w4

    import tidiff as td

    counts, spent, by_kernel = {}, [0.0], {}
    original = kernel_impl.Kernel.launch_kernel

    def counting(self, *args, **kwargs):
        mode = str(self.autodiff_mode).split(".")[-1]
        key = self.func.__name__ + ("" if mode == "NONE" else f".{mode.lower()}")
        counts[key] = counts.get(key, 0) + 1
        t0 = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            spent[0] += dt
            by_kernel[key] = by_kernel.get(key, 0.0) + dt

    rng = np.random.default_rng(0)
    B = 10_000
    x, W, b = rng.standard_normal((B, 8)), rng.standard_normal((4, 8)), rng.standard_normal(4)
    F = w2.make_F(B)
    xs, cs = rng.standard_normal(B), rng.standard_normal(B)
    dp = td.grad(w4.p)

    def vjp_call():
        y, f = td.vjp(w3.h, xs)
        return f(cs)

    calls = [
        ("W4 td.grad(p)(1.0)", lambda: dp(1.0)),
        ("W1 td.jacfwd(layer), B=1e4", lambda: td.jacfwd(w1.layer)(x, W, b)),
        ("W1 td.jacobian(layer), B=1e4", lambda: td.jacobian(w1.layer)(x, W, b)),
        ("W1 td.jacrev(layer), B=1e4", lambda: td.jacrev(w1.layer)(x, W, b)),
        ("W2 td.hessian(neo_hookean), B=1e4", lambda: td.hessian(w2.neo_hookean)(F, w2.MU, w2.LAM)),
        ("W3 td.vjp(h, x) + vjp_fn(c), n=1e4", vjp_call),
    ]
    kernel_impl.Kernel.launch_kernel = counting
    try:
        for label, fn in calls:
            fn()  # compile
            n = 20
            counts.clear()
            by_kernel.clear()
            spent[0] = 0.0
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            total = (time.perf_counter() - t0) / n
            launches = {k: v // n for k, v in counts.items()}
            copies = sum(v for k, v in launches.items() if "ext_arr" in k)
            clears = sum(v for k, v in launches.items() if k.startswith("fill"))
            print(f"{label}: {sum(launches.values())} launches/call ({copies} copies, {clears} clears); "
                  f"{common.fmt_time(total)}/call, of which in launches {common.fmt_time(spent[0] / n)}")
            print("    " + ", ".join(f"{k} x{v} ({common.fmt_time(by_kernel[k] / n)})"
                                  for k, v in sorted(launches.items())))
    finally:
        kernel_impl.Kernel.launch_kernel = original


if __name__ == "__main__":
    main()
