"""DiffTaichi's electric.py as published, whose nn1(t) reads x[t] before advance(t) overwrites it (issue 34
item 2), against ti.ad.Tape on the corrected program (nn1 reads step t - 1), which keeps Taichi's access rules.

tidiff keeps the overwritten entries for the replay (NOTE: [Overwritten values kept]); before, it found
Taichi's reverse mode wrong and pushed forward, one tangent run per parameter (about 20 s a gradient at these
sizes). Each contender runs in a fresh process for its first call (compiles included, offline cache off),
then all three warm, interleaved, in that process; the printed warm figures are the medians of both
processes. The published program's gradient is checked against central differences along one direction, the
corrected program's tidiff gradient against the tape's (rtol 1e-12), before timing.

    python bench/overwritten.py [--steps 512] [--hidden 64] [--repeats 15]
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
SIDES = ("tape, corrected", "tidiff, corrected", "tidiff, published")


def child(side, steps, hidden, repeats):
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    import taichi as ti

    ti.init(arch=ti.cpu, default_fp=ti.f64, offline_cache=False, log_level=ti.WARN)
    from electric import Electric

    import tidiff as td

    programs = {current: Electric(steps, hidden, current=current) for current in (True, False)}
    for p in programs.values():
        p.fill(seed=0)

    def tidiff_side(program):
        f = td.value_and_grad(td.function(program.run, inputs=program.parameters, outputs=[program.loss]),
                              argnums=(0, 1, 2, 3))
        arrays = program.arrays()
        return lambda: (lambda v, g: (v, *g))(*f(*arrays))

    calls = {"tape, corrected": programs[False].tape_gradients, "tidiff, corrected": tidiff_side(programs[False]),
             "tidiff, published": tidiff_side(programs[True])}
    start = time.perf_counter()
    calls[side]()
    first = time.perf_counter() - start
    for a, b in zip(calls["tape, corrected"](), calls["tidiff, corrected"](), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
    published = programs[True]
    loss = td.function(published.run, inputs=published.parameters, outputs=[published.loss])
    arrays = published.arrays()
    grads = calls["tidiff, published"]()[1:]
    direction = [np.cos(np.arange(a.size) + k).reshape(a.shape) for k, a in enumerate(arrays)]
    h = 1e-6
    differences = (loss(*(a + h * d for a, d in zip(arrays, direction, strict=True)))
                   - loss(*(a - h * d for a, d in zip(arrays, direction, strict=True)))) / (2 * h)
    along = sum(float((g * d).sum()) for g, d in zip(grads, direction, strict=True))
    np.testing.assert_allclose(along, differences, rtol=1e-6)
    times: dict[str, list[float]] = {s: [] for s in SIDES}
    for _ in range(repeats):
        for name in SIDES:
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    print(json.dumps({"first": first, "warm": {k: statistics.median(v) for k, v in times.items()},
                      "differences": [along, float(differences)]}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(opts.child, opts.steps, opts.hidden, opts.repeats)
        return
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    stats = {}
    for side in SIDES:
        proc = subprocess.run([sys.executable, __file__, "--child", side, "--steps", str(opts.steps), "--hidden",
                               str(opts.hidden), "--repeats", str(opts.repeats)], capture_output=True, text=True,
                              env=env)
        if proc.returncode:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{side} failed")
        stats[side] = json.loads(proc.stdout.strip().splitlines()[-1])
    along, differences = stats["tidiff, published"]["differences"]
    print(f"electric.py, {opts.steps} steps, {opts.hidden} hidden units, float64, CPU; published gradient along "
          f"one direction {along:.9g}, central differences {differences:.9g}\n")
    print("| contender | first call | first / tape's | warm | warm / tape's |")
    print("|---|---|---|---|---|")
    tape_first = stats["tape, corrected"]["first"]
    warm = {s: statistics.median(stats[p]["warm"][s] for p in SIDES) for s in SIDES}
    for side in SIDES:
        print(f"| {side} | {stats[side]['first']:.2f} s | {stats[side]['first'] / tape_first:.2f}x | "
              f"{warm[side] * 1e3:.1f} ms | {warm[side] / warm['tape, corrected']:.2f}x |")


if __name__ == "__main__":
    main()
