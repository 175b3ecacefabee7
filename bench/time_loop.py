"""Memory and time of a differentiable time loop: td.scan (checkpointed) against the stored trajectory.

The DiffTaichi mass-spring system of tests/mass_spring.py (the one tests/test_scan.py checks against
ti.ad.Tape), n masses, T steps, the gradient of a loss of the final state by the initial positions,
velocities and every spring's stiffness. Contenders, each in a fresh process (peak RSS is per process):

- tape:      the trajectory stored in (T+1, n) fields with needs_grad, ti.ad.Tape (DiffTaichi's way);
- program:   tidiff's field program over the same stored trajectory (td.part(x, 0) inputs);
- scan:      td.compose(loss, td.scan(step, T)) over state fields without a time axis, sqrt(T) checkpoints;
- scan K=T:  the same keeping every carry (no recomputation);
- warp:      NVIDIA Warp's CPU tape over the same system written the Warp way (one array per step),
             where ``warp-lang`` is installed (bench/workloads/warp_mass_spring.py).

Forward mode (issue 36, item 3): the loop's own forward pass (``sim(x0, v0, k)``) against ``td.jvp`` of
the loop with a tangent on every input (the state and its tangent pushed together, nothing kept); the
jvp's primal is checked against the forward pass's.

Each gradient is checked against the tape's (rtol 1e-9) before its time is reported. "first" is the first
call (compiles included), "warm" the median of three later calls; "T-memory" the bytes that grow with T
(trajectory fields and their gradients, or the checkpoint slots); "peak RSS" the process's maximum.

    python bench/time_loop.py                     # T = 1000 and 10000, n = 128
    python bench/time_loop.py --steps 200 --masses 32
    python bench/time_loop.py --forward           # forward mode only
"""
import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile

import numpy as np
from common import first_and_warm  # bench/ is the script's own folder: on sys.path

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONTENDERS = ["tape", "program", "scan", "scan K=T"]
try:
    import warp  # noqa: F401

    CONTENDERS.append("warp")
except ImportError:
    pass


def run_one(contender, steps, masses, out):
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    import taichi as ti

    ti.init(arch=ti.cpu, default_fp=ti.f64, offline_cache=False, log_level=ti.WARN)
    from mass_spring import MassSpring, Trajectory

    import tidiff as td

    system = MassSpring(masses)
    args = system.arguments()
    if contender == "warp":
        sys.path.insert(0, str(ROOT / "bench" / "workloads"))
        from mass_spring import layout
        from warp_mass_spring import WarpMassSpring

        _, ends, rest = layout(masses)
        sim = WarpMassSpring(ends, rest, system.weights.to_numpy(), steps)

        def call():
            return sim.gradients(*args)

        t_bytes = 8 * 2 * ((steps + 1) * masses * 2 * 2 + steps * masses * 2)
    elif contender == "tape":
        traj = Trajectory(masses, steps)

        def call():
            return traj.tape_gradients(*args)

        t_bytes = 8 * 2 * ((steps + 1) * masses * 2 * 2 + steps * masses * 2)
    elif contender == "program":
        traj = Trajectory(masses, steps, needs_grad=False)
        F = td.value_and_grad(traj.program(td), argnums=(0, 1, 2))

        def call():
            value, grads = F(*args)
            return (value, *grads)

        t_bytes = 8 * 2 * ((steps + 1) * masses * 2 * 2 + steps * masses * 2)
    elif contender in ("loop", "jvp"):
        sim = td.scan(system.step_function(td), steps)
        tangents = tuple(np.random.default_rng(1).standard_normal(np.shape(a)) for a in args)

        def call():
            if contender == "loop":
                return sim(*args)
            outs, touts = td.jvp(sim, args, tangents)
            return (*outs, *touts)

        t_bytes = 0
    else:
        checkpoints = steps if contender == "scan K=T" else None
        sim = td.scan(system.step_function(td), steps, checkpoints=checkpoints)
        F = td.value_and_grad(td.compose(system.loss_function(td), sim), argnums=(0, 1, 2))

        def call():
            value, grads = F(*args)
            return (value, *grads)

        t_bytes = None
    first, warm, result = first_and_warm(call, 3)
    if t_bytes is None:  # the loop's own count: checkpoints and a segment's slots with their gradients
        t_bytes = sim._stepper.kept_bytes() if hasattr(sim._stepper, "kept_bytes") else \
            8 * sim.schedule.slots * masses * 2 * 2
    np.savez(out, *[np.asarray(r) for r in result])
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"first": first, "warm": warm, "t_bytes": t_bytes, "rss_mb": rss}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--masses", type=int, default=128)
    parser.add_argument("--forward", action="store_true", help="only forward mode: the loop against td.jvp")
    parser.add_argument("--one", nargs=2, metavar=("CONTENDER", "STEPS"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.one:
        run_one(opts.one[0], int(opts.one[1]), opts.masses, opts.out)
        return
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    arch = os.environ.get("TI_ARCH", "cpu")
    print(f"mass-spring, n = {opts.masses} masses ({2 * opts.masses - 3} springs), float64, {arch} (TI_ARCH)\n")
    if opts.forward:
        forward_mode(opts, env)
        return
    print("| T | contender | first call | warm | warm / tape | T-memory | peak RSS | max rel. error vs tape |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for steps in opts.steps:
            rows, reference = [], None
            for contender in CONTENDERS:
                out = os.path.join(tmp, f"{contender.replace(' ', '_').replace('=', '')}_{steps}.npz")
                proc = subprocess.run([sys.executable, __file__, "--one", contender, str(steps), "--masses",
                                       str(opts.masses), "--out", out], capture_output=True, text=True, env=env)
                if proc.returncode:
                    print(proc.stderr[-2000:], file=sys.stderr)
                    raise SystemExit(f"{contender} T={steps} failed")
                stats = json.loads(proc.stdout.strip().splitlines()[-1])
                with np.load(out) as data:
                    got = [data[k] for k in sorted(data.files, key=lambda k: int(k.split("_")[1]))]
                if reference is None:
                    reference = got
                error = max(float(np.max(np.abs(g - r)) / max(np.max(np.abs(r)), 1e-300))
                            for g, r in zip(got, reference, strict=True))
                if error > 1e-9:
                    raise SystemExit(f"{contender} T={steps}: gradient differs from the tape's (rel. {error:.2e})")
                rows.append((contender, stats, error))
            tape_warm = rows[0][1]["warm"]
            for contender, stats, error in rows:
                print(f"| {steps} | {contender} | {stats['first']:.2f} s | {stats['warm']:.3f} s | "
                      f"{stats['warm'] / tape_warm:.2f}x | {stats['t_bytes'] / 2**20:.2f} MiB | "
                      f"{stats['rss_mb']:.0f} MB | {error:.1e} |", flush=True)


def one_process(contender, steps, masses, env, tmp):
    """``run_one`` in a fresh process: its figures and its results."""
    out = os.path.join(tmp, f"{contender.replace(' ', '_').replace('=', '')}_{steps}.npz")
    proc = subprocess.run([sys.executable, __file__, "--one", contender, str(steps), "--masses", str(masses),
                           "--out", out], capture_output=True, text=True, env=env)
    if proc.returncode:
        print(proc.stderr[-2000:], file=sys.stderr)
        raise SystemExit(f"{contender} T={steps} failed")
    with np.load(out) as data:
        got = [data[k] for k in sorted(data.files, key=lambda k: int(k.split("_")[1]))]
    return json.loads(proc.stdout.strip().splitlines()[-1]), got


def forward_mode(opts, env):
    print("| T | the loop | td.jvp of the loop | jvp / loop | first call, loop / jvp |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for steps in opts.steps:
            loop, primal = one_process("loop", steps, opts.masses, env, tmp)
            jvp, pushed = one_process("jvp", steps, opts.masses, env, tmp)
            for a, b in zip(primal, pushed, strict=False):
                if not np.allclose(a, b, rtol=1e-12, atol=0):
                    raise SystemExit(f"T={steps}: the jvp's primal differs from the loop's")
            print(f"| {steps} | {loop['warm']:.3f} s | {jvp['warm']:.3f} s | {jvp['warm'] / loop['warm']:.2f}x | "
                  f"{loop['first']:.2f} s / {jvp['first']:.2f} s |", flush=True)


if __name__ == "__main__":
    main()
