"""Run every tidiff benchmark against its peers and write bench/RESULTS.md.

    python bench/run.py            # everything (about 5 minutes on 2 cores)
    python bench/run.py --quick    # smaller sizes, fewer repeats (under a minute)
    python bench/run.py --only W1,W4 --no-scaling

See bench/README.md for what is measured and how.
"""
import argparse
import datetime
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "workloads")]

import common  # noqa: E402  (sets OMP_WAIT_POLICY before torch is imported)
from common import Row, fmt_time  # noqa: E402

WORKLOADS = {
    "W1": "w1_tanh_jacobian",
    "W2": "w2_neohookean_hessian",
    "W3": "w3_vjp",
    "W4": "w4_grad_latency",
}


# --------------------------------------------------------------------------- W5 hook
def run_w5(quick, log):
    """W5 (RWKV operator vs F.conv1d) lives in bench/rwkv.py, owned by another engineer.

    Hook: if bench/rwkv.py defines ``run(quick=False, log=print)`` returning
    :class:`common.Row` objects (or dicts with the same field names), its rows
    join the tables; otherwise the script is run as ``python bench/rwkv.py
    [--quick]`` and its output is copied into RESULTS.md verbatim.
    """
    path = os.path.join(HERE, "rwkv.py")
    if not os.path.exists(path):
        return [], "bench/rwkv.py does not exist yet: W5 (RWKV vs F.conv1d) not measured."
    import importlib

    try:
        mod = importlib.import_module("rwkv")
    except Exception as e:
        mod = None
        log(f"  bench/rwkv.py did not import ({type(e).__name__}: {e}); running it as a script")
    if mod is not None and callable(getattr(mod, "run", None)):
        rows = []
        for r in mod.run(quick=quick, log=log):
            rows.append(r if isinstance(r, Row) else Row(**r))
        return rows, ""
    cmd = [sys.executable, path] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    text = (proc.stdout + ("\n" + proc.stderr if proc.returncode else "")).strip()
    log(text)
    return [], f"Output of `python bench/rwkv.py` (exit status {proc.returncode}):\n\n```\n{text}\n```"


# --------------------------------------------------------------------------- scaling
def run_scaling(rows, log):
    """W1 and W2 time against batch size; the main sizes are reused from ``rows``."""
    import w1_tanh_jacobian as w1
    import w2_neohookean_hessian as w2
    from common import measure

    extra = []
    w1_peers = ["tidiff td.jacfwd", "tidiff td.jacobian", "closed-form kernel", "JAX jit(vmap(jacfwd))",
                "torch.func"]
    for B in (100, 1_000, 100_000):
        wl, cs, ref, _ = w1.cases(B, which=w1_peers)
        log(f"\n{wl} (scaling)")
        extra += measure(wl, cs, ref, repeats=5, log=log, min_sample_s=0.02)
    w2_peers = ["tidiff", "closed-form kernel", "JAX", "torch.func"]
    for B in (100, 1_000, 10_000):
        wl, cs, ref, _ = w2.cases(B, which=w2_peers, log=log)
        log(f"\n{wl} (scaling)")
        extra += measure(wl, cs, ref, repeats=5, log=log, min_sample_s=0.02)
    return extra


def batch_of(workload):
    return float(workload.split("B=")[1]) if "B=" in workload else None


def scaling_series(rows, prefix, peers):
    series = {}
    for r in rows:
        if r.workload.startswith(prefix) and r.samples and r.status == "ok" and any(p == r.peer for p in peers):
            series.setdefault(r.peer, []).append((batch_of(r.workload), r.median))
    return {k: sorted(v) for k, v in series.items()}


def plot_scaling(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        return f"no plot: matplotlib is not installed ({type(e).__name__})"
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    panels = [
        ("W1", "W1: per-sample Jacobian of tanh(Wx+b), W 4x8",
         ["tidiff td.jacfwd", "tidiff td.jacobian", "Taichi closed-form kernel (limit)", "JAX jit(vmap(jacfwd))",
          "torch.func vmap(jacrev)"]),
        ("W2", "W2: per-element Neo-Hookean Hessian (3x3 F)",
         ["tidiff td.hessian", "Taichi closed-form kernel (limit)", "JAX jit(vmap(hessian))",
          "torch.func vmap(hessian)"]),
    ]
    for ax, (prefix, title, peers) in zip(axes, panels, strict=True):
        for peer, pts in scaling_series(rows, prefix, peers).items():
            if len(pts) < 2:
                continue
            xs, ys = zip(*pts, strict=True)
            style = "-o" if peer.startswith("tidiff") else "--s" if "closed-form" in peer else ":^"
            ax.loglog(xs, [y * 1e3 for y in ys], style, label=peer)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("batch size B")
        ax.set_ylabel("median time per call (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return ""


# --------------------------------------------------------------------------- targets
def find(rows, wl_prefix, peer_prefix, batch=None):
    for r in rows:
        if (r.workload.startswith(wl_prefix) and r.peer.startswith(peer_prefix) and r.samples
                and (batch is None or batch_of(r.workload) == batch)):
            return r
    return None


def targets(rows):
    """(target, measured, met) for the goals of issue 5, from this run's rows."""
    out = []

    def ratio(a, b):
        return a.median / b.median if a is not None and b is not None else None

    def add(goal, value, ok, detail=""):
        out.append((goal, value, ok, detail))

    for B in (1e6, 1e4):
        closed = find(rows, "W1", "Taichi closed-form kernel", B)
        jax_rows = (find(rows, "W1", "JAX jit(vmap(jacfwd", B), find(rows, "W1", "JAX jit(vmap(jacrev", B))
        jax_best = min([r for r in jax_rows if r is not None], key=lambda r: r.median, default=None)
        for name in ("td.jacfwd", "td.jacobian"):
            t = find(rows, "W1", f"tidiff {name}", B)
            if t is None:
                continue
            if B == 1e6:
                q = ratio(t, closed)
                add(f"W1 B=1e6: {name} ≤ 1.3× closed-form kernel", q, q is not None and q <= 1.3,
                    f"{fmt_time(t.median)} vs {fmt_time(closed.median) if closed else '—'}")
                qj = ratio(t, jax_best)
                if qj is not None:
                    add(f"W1 B=1e6: {name} faster than JAX (goal ≈2×)", qj, qj < 1.0,
                        f"{fmt_time(t.median)} vs {jax_best.peer} {fmt_time(jax_best.median)}")
            else:
                q = ratio(t, jax_best)
                add(f"W1 B=1e4: {name} ≤ 1.5× JAX", q, q is not None and q <= 1.5,
                    f"{fmt_time(t.median)} vs "
                    f"{jax_best.peer + ' ' + fmt_time(jax_best.median) if jax_best else 'JAX absent'}")
    t, closed, jx = find(rows, "W2", "tidiff td.hessian"), find(rows, "W2", "Taichi closed-form kernel"), \
        find(rows, "W2", "JAX")
    if t is not None:
        q = ratio(t, closed)
        add("W2: td.hessian ≤ 3× closed-form kernel", q, q is not None and q <= 3,
            f"{fmt_time(t.median)} vs {fmt_time(closed.median) if closed else '—'}")
        qj = ratio(jx, t)
        add("W2: JAX / td.hessian ≥ 6 (speed-up over JAX)", qj, qj is not None and qj >= 6,
            f"JAX {fmt_time(jx.median) if jx else 'absent'}")
    t, raw, jx = find(rows, "W3", "tidiff td.vjp"), find(rows, "W3", "Taichi raw"), find(rows, "W3", "JAX")
    if t is not None:
        q = ratio(t, raw)
        add("W3: td.vjp ≤ 1.2× raw kernel.grad", q, q is not None and q <= 1.2,
            f"{fmt_time(t.median)} vs {fmt_time(raw.median) if raw else '—'}")
        qj = ratio(t, jx)
        add("W3: td.vjp faster than JAX (ratio < 1)", qj, qj is not None and qj < 1,
            f"JAX {fmt_time(jx.median) if jx else 'absent'}")
    t, jx = find(rows, "W4", "tidiff"), find(rows, "W4", "JAX")
    if t is not None:
        q = ratio(t, jx)
        add("W4: td.grad(p)(1.0) ≤ 2× JAX jit(grad)", q, q is not None and q <= 2,
            f"{fmt_time(t.median)} vs {fmt_time(jx.median) if jx else 'absent'}")
    firsts = [r for r in rows if r.kind == "tidiff" and r.first_call is not None]
    if firsts:
        worst = max(firsts, key=lambda r: r.first_call)
        add("compile: every transform's first call ≤ 0.5 s", worst.first_call, worst.first_call <= 0.5,
            f"slowest: {worst.peer} in {worst.workload.split(' ')[0]}")
        later = [r.compiles_after_first for r in firsts if r.compiles_after_first is not None]
        if later:
            add("compile: no compiles on later calls", float(max(later)), max(later) == 0,
                "kernels compiled during the timed calls (td.cache_info)")
    return out


# --------------------------------------------------------------------------- report
def versions():
    import numpy
    import taichi
    import torch

    jax = common.get_jax()
    v = {"python": platform.python_version(), "taichi": taichi.__version__, "torch": torch.__version__,
         "numpy": numpy.__version__, "jax": jax.__version__ if jax else f"absent ({common.jax_missing_reason()})"}
    try:
        import tidiff

        v["tidiff"] = getattr(tidiff, "__version__", "dev")
    except Exception:
        pass
    return v


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def table(rows):
    lines = ["| workload | peer | median | spread (min – max) | peer / tidiff | first call | max err | note |",
             "|---|---|---:|---|---:|---:|---:|---|"]
    groups = []
    for r in rows:
        if r.workload not in groups:
            groups.append(r.workload)
    for wl in groups:
        rs = [r for r in rows if r.workload == wl]
        ref = next((r for r in rs if r.kind == "tidiff" and r.samples and r.status == "ok"), None)
        for r in rs:
            if r.samples:
                q = f"{r.median / ref.median:.2f}×" if ref is not None else "—"
                spread = f"{fmt_time(r.lo)} – {fmt_time(r.hi)}"
                med = fmt_time(r.median)
            else:
                q, spread, med = "—", "—", r.status
            err = f"{r.err:.1e}" if r.err is not None else ""
            note = r.note.replace("|", "\\|")
            if r.status == "wrong":
                note = "**WRONG VALUES**" + ("; " + note if note else "")
            peer = f"**{r.peer}**" if r.kind == "tidiff" else r.peer
            lines.append(f"| {wl} | {peer} | {med} | {spread} | {q} | {fmt_time(r.first_call)} | {err} | {note} |")
    return "\n".join(lines)


def write_results(path, rows, scaling_rows, tgs, meta, w5_text, plot_note, log_lines):
    L = [
        "# tidiff benchmark results",
        "",
        f"Written by `python bench/run.py{' --quick' if meta['quick'] else ''}` on {meta['date']} "
        f"in {meta['elapsed']:.0f} s.",
        "",
        f"- Machine: {meta['cpu']}, {os.cpu_count()} cores (shared: load average {meta['load0']} at start, "
        f"{meta['load1']} at end).",
        "- " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".",
        "- All data float64, one process, same arrays for every contender. Every result is checked against a "
        "reference before it is timed (`max err`); a wrong tidiff result is not timed.",
        "- `median` is over round-robin repeats (every contender timed once per round), after one warm-up call; "
        "`spread` is the fastest and slowest repeat. Microsecond calls are timed in loops.",
        "- `peer / tidiff`: the row's median over the workload's first tidiff row (above 1: tidiff is faster).",
        "- `first call`: the first call in this process, which includes compiling (Taichi kernels, "
        "tidiff's generated code, XLA); reported apart from the run time. Taichi's offline cache is off.",
        "",
        "## Targets (issue 5)",
        "",
        "| target | measured | met | detail |",
        "|---|---:|:---:|---|",
    ]
    for goal, value, ok, detail in tgs:
        if value is None:
            shown = "—"
        elif goal.startswith("compile: every"):
            shown = fmt_time(value)
        elif goal.startswith("compile: no"):
            shown = f"{value:.0f}"
        else:
            shown = f"{value:.2f}×"
        L.append(f"| {goal} | {shown} | {'yes' if ok else '**no**'} | {detail} |")
    if meta["quick"]:
        L += ["", "_Quick run: smaller sizes (W1 B=1e4 only, W2 B=1e4, W3 n=1e6); the B=1e6 / 1e5 / 1e7 "
              "targets need the full run._"]
    L += ["", "## All measurements", "", table(rows), ""]
    if scaling_rows:
        L += ["## Scaling with batch size (W1, W2)", "", "![scaling](scaling.png)" if not plot_note else plot_note, ""]
        for prefix in ("W1", "W2"):
            allr = [r for r in rows + scaling_rows if r.workload.startswith(prefix) and r.samples]
            sizes = sorted({batch_of(r.workload) for r in allr})
            peers = []
            for r in allr:
                if r.peer not in peers and sum(1 for q in allr if q.peer == r.peer) > 2:
                    peers.append(r.peer)
            L.append("| " + prefix + " peer | " + " | ".join(f"B={b:.0e}" for b in sizes) + " |")
            L.append("|---|" + "---:|" * len(sizes))
            for p in peers:
                cells = []
                for b in sizes:
                    r = next((q for q in allr if q.peer == p and batch_of(q.workload) == b), None)
                    cells.append(fmt_time(r.median) + (" (wrong)" if r is not None and r.status == "wrong" else "")
                                 if r is not None else "—")
                L.append(f"| {p} | " + " | ".join(cells) + " |")
            L.append("")
    L += ["## W5: RWKV operator vs F.conv1d", "", w5_text or "Rows above (workload W5).", ""]
    with open(path, "w") as f:
        f.write("\n".join(L))


def load():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    ap.add_argument("--only", default="W1,W2,W3,W4,W5", help="comma-separated workloads (default: all)")
    ap.add_argument("--no-scaling", action="store_true", help="skip the batch-size sweep and plot")
    ap.add_argument("--offline-cache", action="store_true", help="let Taichi use its offline kernel cache")
    ap.add_argument("--out", default=os.path.join(HERE, "RESULTS.md"), help="where to write the report")
    args = ap.parse_args(argv)
    only = {w.strip().upper() for w in args.only.split(",")}
    common.init_taichi(offline_cache=args.offline_cache)
    log_lines = []

    def log(msg=""):
        print(msg, flush=True)
        log_lines.append(msg)

    t0, load0 = time.time(), load()
    meta = {"quick": args.quick, "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "cpu": cpu_name(),
            "load0": load0, "versions": versions()}
    version_list = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    log(f"tidiff bench ({'quick' if args.quick else 'full'}); " + version_list)
    import importlib

    rows = []
    for key in ("W4", "W1", "W2", "W3"):  # W4 first: its latency is best measured before big arrays exist
        if key in only:
            rows += importlib.import_module(WORKLOADS[key]).run(quick=args.quick, log=log)
    w5_text = ""
    if "W5" in only:
        log("\nW5 RWKV operator vs F.conv1d")
        w5_rows, w5_text = run_w5(args.quick, log)
        rows += w5_rows
        if w5_text:
            log("  " + w5_text.splitlines()[0])
    scaling_rows, plot_note = [], ""
    if not args.quick and not args.no_scaling and {"W1", "W2"} <= only:
        scaling_rows = run_scaling(rows, log)
        plot_note = plot_scaling(rows + scaling_rows, os.path.join(HERE, "scaling.png"))
        if plot_note:
            log(plot_note)
    tgs = targets(rows)
    meta["elapsed"], meta["load1"] = time.time() - t0, load()
    write_results(args.out, rows, scaling_rows, tgs, meta, w5_text, plot_note, log_lines)
    log("\nTargets:")
    for goal, value, ok, detail in tgs:
        shown = "—" if value is None else (fmt_time(value) if goal.startswith("compile: every") else f"{value:.2f}")
        log(f"  [{'met' if ok else 'MISSED'}] {goal}: {shown}  ({detail})")
    log(f"\nwrote {os.path.relpath(args.out)} in {meta['elapsed']:.0f} s")
    wrong = [r for r in rows + scaling_rows if r.kind == "tidiff" and r.status in ("wrong", "error")]
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
