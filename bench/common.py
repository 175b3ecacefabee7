"""Shared machinery for the tidiff benchmarks: environment, timing, checking, rows.

Every workload module builds a list of :class:`Case` objects (tidiff and its
peers on the same float64 data) and hands them to :func:`measure`, which

1. calls each case once and records that first call apart (it includes
   compilation / tracing),
2. checks the result against the workload's reference (``assert close``):
   a wrong tidiff result is never timed, a wrong peer is timed but flagged,
3. warms up, then times the cases *round-robin* (one sample of each case per
   round) so that load from other processes on this shared machine hits all
   of them alike, and reports the median and the spread (min and max) of the
   samples. Tiny calls are timed in loops of ``number`` calls per sample.
"""
import os

# Torch's OpenMP workers spin after every op and fight Taichi's threads for
# the two cores unless told to sleep (DESIGN.md); this must precede `import torch`.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import statistics
import sys
import time
import traceback

import numpy as np

_state = {"ti": False, "jax": None, "jax_error": None}


def init_taichi(offline_cache=False):
    """Taichi on the CPU in float64. The offline cache is off by default so that
    first-call (compile) times are the same on every run of the benchmark."""
    import taichi as ti

    if not _state["ti"]:
        ti.init(arch=ti.cpu, default_fp=ti.f64, offline_cache=offline_cache, log_level=ti.WARN)
        _state["ti"] = True
    return ti


def get_jax():
    """The ``jax`` module configured for float64 on the CPU, or None when not installed."""
    if _state["jax"] is None and _state["jax_error"] is None:
        try:
            import jax

            jax.config.update("jax_enable_x64", True)
            jax.config.update("jax_platforms", "cpu")
            _state["jax"] = jax
        except Exception as e:  # ImportError, or a broken install
            _state["jax_error"] = f"{type(e).__name__}: {e}"
    return _state["jax"]


def jax_missing_reason():
    get_jax()
    return _state["jax_error"]


def ti_sync():
    import taichi as ti

    ti.sync()


def median_seconds(call, repeats):
    """The median wall time of ``repeats`` calls of ``call`` (the caller warms up first if it must)."""
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def first_and_warm(call, repeats):
    """``(first, warm, result)``: the first call's seconds (compiling included), the median of ``repeats``
    later calls, and the first call's result. For the benchmarks that time one contender per process."""
    t0 = time.perf_counter()
    result = call()
    first = time.perf_counter() - t0
    return first, median_seconds(call, repeats), result


class Case:
    """One contender in a workload.

    Args:
        peer: the name printed in the table ("tidiff jacfwd", "JAX jit(vmap(jacfwd))").
        fn: a zero-argument callable doing one complete call (inputs in, result out).
        kind: "tidiff", "peer" or "limit" (hand-written closed form, memory bound, launch floor).
        to_numpy: maps fn's result to a NumPy array for checking (default: np.asarray).
        sync: called after fn when timing (JAX's block_until_ready is done by fn itself).
        check: False to skip the numerical check (e.g. a plain copy).
        note: text shown in the table.
        number: calls per timing sample (for microsecond calls).
    """

    def __init__(self, peer, fn, kind="peer", to_numpy=None, check=True, note="", number=1, rtol=1e-9, atol=1e-9,
                 ref=None):
        self.peer = peer
        self.ref = ref  # overrides the workload's reference for this case
        self.fn = fn
        self.kind = kind
        self.to_numpy = to_numpy or (lambda r: np.asarray(r))
        self.check = check
        self.note = note
        self.number = number
        self.rtol, self.atol = rtol, atol


class Row:
    def __init__(self, workload, peer, kind, samples=None, first_call=None, err=None, note="", status="ok",
                 compiles_after_first=None, unit="ms"):
        self.workload = workload
        self.peer = peer
        self.kind = kind
        self.samples = samples or []
        self.first_call = first_call
        self.err = err
        self.note = note
        self.status = status  # ok | wrong | error | skipped
        self.compiles_after_first = compiles_after_first
        self.unit = unit

    @property
    def median(self):
        return statistics.median(self.samples) if self.samples else None

    @property
    def lo(self):
        return min(self.samples) if self.samples else None

    @property
    def hi(self):
        return max(self.samples) if self.samples else None


def max_error(got, ref):
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        raise AssertionError(f"shape {got.shape} != reference shape {ref.shape}")
    return float(np.max(np.abs(got - ref))) if got.size else 0.0


def _close(got, ref, rtol, atol):
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return got.shape == ref.shape and np.allclose(got, ref, rtol=rtol, atol=atol)


def _tidiff_compiles():
    try:
        import tidiff as td

        return sum(c.compiles for c in td.cache_info().values())
    except Exception:
        return None


def measure(workload, cases, reference, repeats=7, warmup=1, log=print, min_sample_s=0.0, slow_s=1.5):
    """Check and time ``cases``; returns a list of :class:`Row` (times in seconds).

    ``reference`` is the NumPy array every case's result must match.
    ``min_sample_s``: a case's ``number`` grows until one sample lasts this long.
    ``slow_s``: a case whose first call took longer gets no warm-up and 3 samples.
    """
    rows, live = [], []
    for case in cases:
        row = Row(workload, case.peer, case.kind, note=case.note)
        rows.append(row)
        try:
            t0 = time.perf_counter()
            result = case.fn()
            row.first_call = time.perf_counter() - t0
            ref = case.ref if case.ref is not None else reference
            if case.check and ref is not None:
                got = case.to_numpy(result)
                try:
                    row.err = max_error(got, ref)
                except AssertionError as e:
                    row.err = float("inf")
                    row.note = (row.note + "; " if row.note else "") + str(e)
                if not _close(got, ref, case.rtol, case.atol):
                    row.status = "wrong"
                    msg = f"{workload} / {case.peer}: result differs from the reference (max abs err {row.err:.3g})"
                    log("  !! " + msg)
                    if case.kind == "tidiff":
                        continue  # never time a wrong tidiff answer
            if row.first_call > slow_s:
                case.repeats = 3  # a multi-second call: the first call was the warm-up; 3 samples
            else:
                for _ in range(warmup):
                    case.fn()
            if min_sample_s:
                while True:
                    t0 = time.perf_counter()
                    for _ in range(case.number):
                        case.fn()
                    if time.perf_counter() - t0 >= min_sample_s or case.number >= 1 << 20:
                        break
                    case.number *= 4
            live.append((case, row))
        except Exception as e:
            row.status = "error"
            row.note = (row.note + "; " if row.note else "") + f"{type(e).__name__}: {e}".splitlines()[0][:160]
            log(f"  !! {workload} / {case.peer} raised {type(e).__name__}: {e}")
            traceback.print_exc(limit=3, file=sys.stderr)
    before = _tidiff_compiles()
    for k in range(repeats):
        for case, row in live:
            if k >= getattr(case, "repeats", repeats):
                continue
            t0 = time.perf_counter()
            for _ in range(case.number):
                case.fn()
            row.samples.append((time.perf_counter() - t0) / case.number)
    after = _tidiff_compiles()
    if before is not None and after is not None:
        for case, row in live:
            if case.kind == "tidiff":
                row.compiles_after_first = after - before  # shared by all tidiff cases of this measure()
    for row in rows:
        log("  " + describe(row))
    return rows


def fmt_time(seconds):
    if seconds is None:
        return "—"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def describe(row):
    if row.status in ("error", "skipped") or not row.samples:
        return f"{row.peer:<44s} {row.status}: {row.note}"
    spread = f"[{fmt_time(row.lo)} – {fmt_time(row.hi)}]"
    first = f"first call {fmt_time(row.first_call)}" if row.first_call is not None else ""
    err = f"err {row.err:.1e}" if row.err is not None else ""
    flag = "  WRONG VALUES" if row.status == "wrong" else ""
    return f"{row.peer:<44s} {fmt_time(row.median):>10s} {spread:<26s} {first:<22s} {err}{flag}"


def skipped(workload, peer, kind, why):
    return Row(workload, peer, kind, status="skipped", note=why)
