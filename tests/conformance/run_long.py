"""A long run of the conformance net, in chunks of separate processes with different seeds.

    python tests/conformance/run_long.py --total 20000 --chunk 200 [--minutes 60] [--jobs 4] [--only EXPR]

Each chunk is ``pytest tests/conformance`` with ``TIDIFF_CONFORMANCE_EXAMPLES``
set to the chunk size (shared by the tests by weight, see ``budget.py``) and
its own ``--hypothesis-seed``: Taichi keeps every compiled kernel of a process,
so chunks keep memory bounded. ``--only`` runs the tests pytest's ``-k``
selects (``--only "field_programs or ndarray_kernels"``: the kernel programs,
each drawing its share of the chunk). Failures (shrunk programs, printed by the
tests; drawn ones with ``--no-shrink``) are appended to
``conformance-failures.log``, Taichi pitfalls (NOTE: [Taichi pitfalls] in
``checks.py``: rejected, not failures) to ``conformance-failures.log.pitfalls``.
The count of programs checked is hypothesis's own (its passing test cases),
so a chunk cut short by a failure, or examples rejected as untame, are not
counted; the summary gives it and the rate. A chunk still running after
``--chunk-minutes`` is killed and logged with the check it was in (the
reproduction each check writes to a file while it runs): a compile that does
not end is a finding too.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from crashes import CURRENT_ENV, known_crash  # this script runs without the package: its own folder

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total", type=int, default=20_000, help="examples in all")
    ap.add_argument("--chunk", type=int, default=200, help="examples per process")
    ap.add_argument("--minutes", type=float, default=None, help="stop starting chunks after this long")
    ap.add_argument("--seed", type=int, default=0, help="seed of the first chunk")
    ap.add_argument("--jobs", type=int, default=1, help="chunks run at once (one core each: Taichi compiles "
                    "on one thread, so the rate grows with the free cores)")
    ap.add_argument("--log", default=os.path.join(ROOT, "conformance-failures.log"))
    ap.add_argument("--chunk-minutes", type=float, default=15.0, help="a chunk still running after this long is "
                    "killed and reported with the check it was in (a compile that does not end is a finding too)")
    ap.add_argument("--only", default=None, help="run only the tests this pytest -k expression selects")
    ap.add_argument("--no-shrink", action="store_true", help="report failures as drawn (shrinking compiles many "
                    "programs: minutes per failure)")
    args = ap.parse_args()
    start = time.time()
    tally = {"asked": 0, "checked": 0, "chunks": 0, "failed": 0, "timed out": 0}
    lock = threading.Lock()

    def run_chunk(k: int) -> None:
        if args.minutes is not None and time.time() - start > 60 * args.minutes:
            return
        n = min(args.chunk, args.total - k)
        env = dict(os.environ, TIDIFF_CONFORMANCE_EXAMPLES=str(n), OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1",
                   TIDIFF_CONFORMANCE_PITFALL_LOG=args.log + ".pitfalls")
        if args.no_shrink:
            env["TIDIFF_CONFORMANCE_NO_SHRINK"] = "1"
        seed = args.seed + k // args.chunk
        current = f"{args.log}.current-{seed}"
        env[CURRENT_ENV] = current
        try:
            # --capture=sys: what Taichi's C++ code writes reaches this script even when it ends the process
            # -n 0: one process (pyproject's addopts run files in parallel), whose statistics are read below;
            # --timeout=0: a chunk's test runs longer than the suite's per-test limit, the chunk has its own
            only = ["-k", args.only] if args.only else []
            run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                                  "--timeout=0", "--capture=sys", "--hypothesis-show-statistics",
                                  f"--hypothesis-seed={seed}", *only, os.path.join(HERE)],
                                 capture_output=True, text=True, env=env, cwd=ROOT, timeout=60 * args.chunk_minutes)
        except subprocess.TimeoutExpired:
            with lock:
                tally["asked"] += n
                tally["chunks"] += 1
                tally["timed out"] += 1
                with open(current) if os.path.exists(current) else open(os.devnull) as f:
                    under_way = f.read()
                if os.path.exists(current):
                    os.remove(current)
                with open(args.log, "a") as log:
                    log.write(f"=== chunk seed {seed} killed after {args.chunk_minutes} min, in this check:\n"
                              f"{under_way}\n")
                print(f"seed {seed}: killed after {args.chunk_minutes} min (the check under way is in {args.log})",
                      flush=True)
            return
        under_way = ""
        if os.path.exists(current):
            with open(current) as f:
                under_way = f.read()
            os.remove(current)
        passing = sum(int(p) for p in re.findall(r"(\d+) passing", run.stdout))
        known = known_crash(run.stdout + run.stderr, under_way)
        with lock:
            tally["asked"] += n
            tally["checked"] += passing
            tally["chunks"] += 1
            if run.returncode < 0 and known is not None:  # a known Taichi bug ended the process: a pitfall
                with open(args.log + ".pitfalls", "a") as log:
                    log.write(f"=== Taichi pitfall\nchunk seed {seed} died of signal {-run.returncode}: {known}\n"
                              f"{under_way}\n")
                print(f"seed {seed}: {passing} of {n} examples checked, then Taichi crashed: {known}", flush=True)
                return
            if run.returncode:
                tally["failed"] += 1
                with open(args.log, "a") as log:
                    log.write(f"=== chunk seed {seed}, {n} examples\n{run.stdout[-30000:]}\n")
                    if run.returncode < 0:  # killed by a signal (a crash inside Taichi): no report of its own
                        log.write(f"=== chunk seed {seed} died of signal {-run.returncode}, in this check:\n"
                                  f"{under_way}\n")
            minutes = (time.time() - start) / 60
            print(f"seed {seed}: {passing} of {n} examples checked, {'FAILED' if run.returncode else 'ok'}; "
                  f"{tally['checked']} in {minutes:.1f} min ({tally['checked'] / minutes:.1f} per minute)", flush=True)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(run_chunk, range(0, args.total, args.chunk)))
    minutes = (time.time() - start) / 60
    pitfalls = _count(args.log + ".pitfalls", "=== Taichi pitfall")
    print(f"{tally['checked']} programs checked ({tally['asked']} asked) in {tally['chunks']} chunks, "
          f"{tally['failed']} failing; {minutes:.1f} min, {tally['checked'] / max(minutes, 1e-9):.1f} per minute"
          + (f"; failures in {args.log}" if tally["failed"] else "")
          + (f"; {tally['timed out']} chunks killed at the time limit (in {args.log})" if tally["timed out"] else "")
          + (f"; {pitfalls} Taichi pitfalls (rejected) in {args.log}.pitfalls" if pitfalls else ""))
    return 1 if tally["failed"] else 0


def _count(path: str, marker: str) -> int:
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return f.read().count(marker)


if __name__ == "__main__":
    sys.exit(main())
