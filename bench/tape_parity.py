"""td.value_and_grad of a field program against ti.ad.Tape on the same program (issue 13 item 4).

Two DiffTaichi-style programs, each written once (kernels over a stored trajectory) and run both
ways on the same data: the mass-spring system of tests/mass_spring.py, and a 2-D heat diffusion
(a DiffTaichi "diffuse" program: a (T+1, n, n) field, a loss of the final field against a target).
Tape's side does what a user does: load the initial state, zero the accumulators, run under
``ti.ad.Tape(loss)``, read the gradients. tidiff's side calls ``td.value_and_grad`` of
``td.function(run, inputs=[td.part(x, 0), ...], outputs=[loss])``. Results are checked equal
(rtol 1e-12) before timing.

"first" is the first call in a fresh process (compiles included, offline cache off); "warm" the
median of interleaved repeats in one process.

    python bench/tape_parity.py [--steps 100] [--repeats 15]
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def diffusion(n, steps, td):
    import taichi as ti

    u = ti.field(ti.f64, (steps + 1, n, n), needs_grad=True)
    kappa = ti.field(ti.f64, (n, n), needs_grad=True)
    target = ti.field(ti.f64, (n, n))
    loss = ti.field(ti.f64, (), needs_grad=True)
    grid = np.linspace(0, 1, n)
    target.from_numpy(np.outer(np.sin(np.pi * grid), np.sin(2 * np.pi * grid)))

    @ti.kernel
    def diffuse(t: ti.i32):
        for i, j in ti.ndrange((1, n - 1), (1, n - 1)):
            lap = u[t, i - 1, j] + u[t, i + 1, j] + u[t, i, j - 1] + u[t, i, j + 1] - 4 * u[t, i, j]
            u[t + 1, i, j] = u[t, i, j] + 0.2 * kappa[i, j] * lap

    @ti.kernel
    def misfit():
        for i, j in ti.ndrange(n, n):
            loss[None] += (u[steps, i, j] - target[i, j]) ** 2

    def run():
        for t in range(steps):
            diffuse(t)
        misfit()

    rng = np.random.default_rng(0)
    u0, k0 = rng.random((n, n)), 0.5 + 0.5 * rng.random((n, n))

    def tape():
        whole = np.zeros((steps + 1, n, n))
        whole[0] = u0
        u.from_numpy(whole)
        kappa.from_numpy(k0)
        loss[None] = 0.0
        with ti.ad.Tape(loss=loss):
            run()
        return loss[None], u.grad.to_numpy()[0], kappa.grad.to_numpy()

    F = td.value_and_grad(td.function(run, inputs=[td.part(u, 0), kappa], outputs=[loss]), argnums=(0, 1))

    def tidiff():
        value, grads = F(u0, k0)
        return (value, *grads)

    return tape, tidiff


def mass_spring(n, steps, td):
    sys.path.insert(0, str(ROOT / "tests"))
    from mass_spring import MassSpring, Trajectory

    args = MassSpring.arguments(MassSpring(n))
    traj = Trajectory(n, steps)
    F = td.value_and_grad(traj.program(td), argnums=(0, 1, 2))

    def tidiff():
        value, grads = F(*args)
        return (value, *grads)

    return (lambda: traj.tape_gradients(*args)), tidiff


PROGRAMS = {"mass-spring (n=64)": (mass_spring, 64), "diffusion (32x32)": (diffusion, 32)}


def child(program, steps, side, repeats):
    sys.path.insert(0, str(ROOT))
    import taichi as ti

    ti.init(arch=ti.cpu, default_fp=ti.f64, offline_cache=False, log_level=ti.WARN)
    import tidiff as td

    make, n = PROGRAMS[program]
    tape, tidiff = make(n, steps, td)
    calls = {"tape": tape, "tidiff": tidiff}
    start = time.perf_counter()
    first = calls[side]()
    elapsed = time.perf_counter() - start
    other = calls["tidiff" if side == "tape" else "tape"]()
    for a, b in zip(first, other, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    times = {"tape": [], "tidiff": []}
    for _ in range(repeats):
        for name in ("tape", "tidiff"):
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    print(json.dumps({"first": elapsed, "warm": {k: statistics.median(v) for k, v in times.items()}}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(opts.child[0], opts.steps, opts.child[1], opts.repeats)
        return
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    print(f"T = {opts.steps} steps, float64, {os.environ.get('TI_ARCH', 'cpu')} (TI_ARCH)\n")
    print("| program | Tape first | tidiff first | first ratio | Tape warm | tidiff warm | warm ratio |")
    print("|---|---|---|---|---|---|---|")
    for program in PROGRAMS:
        stats = {}
        for side in ("tape", "tidiff"):
            proc = subprocess.run([sys.executable, __file__, "--child", program, side, "--steps", str(opts.steps),
                                   "--repeats", str(opts.repeats)], capture_output=True, text=True, env=env)
            if proc.returncode:
                print(proc.stderr[-2000:], file=sys.stderr)
                raise SystemExit(f"{program} ({side}) failed")
            stats[side] = json.loads(proc.stdout.strip().splitlines()[-1])
        warm_tape = statistics.mean(s["warm"]["tape"] for s in stats.values())
        warm_td = statistics.mean(s["warm"]["tidiff"] for s in stats.values())
        print(f"| {program} | {stats['tape']['first']:.2f} s | {stats['tidiff']['first']:.2f} s | "
              f"{stats['tidiff']['first'] / stats['tape']['first']:.2f}x | {warm_tape * 1e3:.1f} ms | "
              f"{warm_td * 1e3:.1f} ms | {warm_td / warm_tape:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
