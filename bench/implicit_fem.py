"""Taichi's implicit FEM example by hand against tidiff's element sums (issue 37, item 2).

The example (python/taichi/examples/simulation/implicit_fem.py; its kernels in
bench/workloads/implicit_fem_hand.py) at n = 32: a cube of 32^3 nodes (98,304
unknowns) cut into 5 * 31^3 = 148,955 tets, corotated elasticity with lambda = 0,
CPU, float64. tidiff gets the same model as one per-tet energy, a ``@ti.func``

    psi(xe, B, W) = W (mu |F - R|^2 + rho g / 4 * sum of the corners' heights),   F = Ds(xe) B,  R, S = polar(F)

(gravity lumped as the example lumps the masses; ``Ds^T = [[1,0,0,-1],[0,1,0,-1],[0,0,1,-1]] @ xe``),
summed by ``td.element_sum``. Compared:

1. force: the example's ``get_force`` (``f = -W 2 mu (F - U V^T) B^T`` from ``ti.svd``,
   plus gravity) against ``-td.grad(E)``, and ``td.grad`` of the same energy with ``Ds`` written from
   row slices ``xe[i, :] - xe[3, :]`` (tidiff's reverse mode refused slices until 2026-11-28 and
   pushed one tangent per input component instead, 28x the time; it reads them now);
2. stiffness assembly: the example's ``compute_A`` (``A = M + dt^2 K``, ``K`` the
   rest-state stiffness ``dP = 2 mu dF``: 144 triplets per tet into a
   ``ti.linalg.SparseMatrixBuilder``) + ``build()`` against ``td.sparse_hessian(E)``
   (the exact Hessian, polar decomposition differentiated twice) in CSR and BSR,
   and, like for like, ``td.sparse_hessian`` of the frozen energy ``W mu |F - I|^2``
   whose Hessian is the example's ``K``;
3. the conjugate-gradient product: the example's matrix-free ``matmul_cell``
   (``A v``) and its ``SparseMatrix @ ndarray`` against ``td.hessian_operator(E)(...) @ v``
   (made once, applied: as in CG) and ``csr @ v`` / ``bsr @ v`` (scipy);
4. first call (compiling included) of each, every contender in a fresh process, with
   the process's peak RSS growth over the first call and over a warm call (the
   high-water mark reset through /proc/self/clear_refs; tracemalloc does not see
   Taichi's memory).

Checks before anything is timed, at a deformed state (the cube stretched, rotated
and jittered, no tet inverted): the hand force against ``-td.grad(E)`` and both
against a NumPy force whose rotation comes from LAPACK's SVD; ``A v`` of the
example's matrix against ``m v + dt^2 K v`` of tidiff's frozen Hessian; tidiff's
exact Hessian in CSR, BSR and as an operator against each other and against
central differences of ``td.grad``.

Warm times are medians of round-robin samples (``common.measure``) in one
process; ``/ hand`` is a row's median over its section's hand-written row (above 1:
tidiff is slower). The issue's targets, judged on the exact-energy rows: force
<= 1.1x, assembly <= 1.2x, product <= 1.2x the hand figures, first call <= 2x.

    python bench/implicit_fem.py            # n = 32, the example at the issue's size
    python bench/implicit_fem.py --small    # n = 8 (1,536 unknowns), a quick run
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
from common import fmt_time, init_taichi, measure  # bench/ is the script's folder: on sys.path

FIRST_CALL = {  # contender -> section; each runs alone in a fresh process
    "hand get_force": "force",
    "td.grad(E)": "force",
    "hand compute_A + build": "assembly",
    "td.sparse_hessian(E) csr": "assembly",
    "td.sparse_hessian(E) bsr": "assembly",
    "hand matmul_cell": "product",
    "td.hessian_operator(E) @ v": "product",
}
TARGETS = {"force": 1.1, "assembly": 1.2, "product": 1.2}
TIDIFF_ROW = {"force": "td.grad(E)", "assembly": "td.sparse_hessian(E) csr", "product": "td.hessian_operator(E) @ v"}
LIKE_FOR_LIKE = {"assembly": "td.sparse_hessian(E_frozen) csr", "product": "td.hessian_operator(E_frozen) @ v"}
HAND_ROW = {"force": "hand get_force", "assembly": "hand compute_A + build", "product": "hand matmul_cell"}


# -- the model ------------------------------------------------------------------------------
def energies(ti, hand):
    """The per-tet energies as ``@ti.func``: the corotated one (the example's force is its exact negative
    gradient), the same with ``Ds`` built from row slices ``xe[i, :]`` (as tidiff's tests and examples write
    it), and the frozen one (the example's stiffness is its Hessian)."""
    tet = ti.types.matrix(4, 3, ti.f64)
    mat3 = ti.types.matrix(3, 3, ti.f64)
    mu, weight = hand.MU, hand.DENSITY * hand.GRAVITY / 4
    edges = ti.Matrix([[1, 0, 0, -1], [0, 1, 0, -1], [0, 0, 1, -1]], ti.f64)  # Ds^T = edges @ xe

    @ti.func
    def corotated(xe: tet, B: mat3, W: ti.f64) -> ti.f64:
        F = (edges @ xe).transpose() @ B
        R, S = ti.polar_decompose(F)
        height = xe[0, 1] + xe[1, 1] + xe[2, 1] + xe[3, 1]
        return W * (mu * (F - R).norm_sqr() + weight * height)

    @ti.func
    def corotated_slices(xe: tet, B: mat3, W: ti.f64) -> ti.f64:
        F = ti.Matrix.cols([xe[0, :] - xe[3, :], xe[1, :] - xe[3, :], xe[2, :] - xe[3, :]]) @ B
        R, S = ti.polar_decompose(F)
        height = xe[0, 1] + xe[1, 1] + xe[2, 1] + xe[3, 1]
        return W * (mu * (F - R).norm_sqr() + weight * height)

    @ti.func
    def frozen(xe: tet, B: mat3, W: ti.f64) -> ti.f64:
        F = (edges @ xe).transpose() @ B
        return W * mu * (F - ti.Matrix.identity(ti.f64, 3)).norm_sqr()

    return corotated, corotated_slices, frozen


class Problem:
    """The mesh, a deformed state ``x`` and a CG direction ``v``: the same arrays in every process."""

    def __init__(self, n, hand):
        self.tets, rest, self.B, self.W, self.m = hand.cube_mesh(n)
        rng = np.random.default_rng(37)
        c = rest.mean(axis=0)
        angle = 0.3
        turn = np.array([[np.cos(angle), 0, np.sin(angle)], [0, 1, 0], [-np.sin(angle), 0, np.cos(angle)]])
        stretch = turn @ np.diag([1.15, 0.9, 1.05])
        self.x = (rest - c) @ stretch.T + c + 0.05 / (n - 1) * rng.standard_normal(rest.shape)
        J = np.linalg.det(hand.edge_matrices(self.x, self.tets) @ self.B)
        assert J.min() > 0.5, f"an element nearly or fully inverted (det F = {J.min():.3g})"
        self.v = rng.standard_normal(self.x.shape)
        self.args = (self.x, self.B, self.W)

    @property
    def unknowns(self):
        return self.x.size


def load_hand():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "workloads"))
    import implicit_fem_hand

    return implicit_fem_hand


# -- contenders: zero-argument calls, each a complete call --------------------------------------
class Contenders:
    """Every contender's call over one :class:`Problem`; objects are made on first use."""

    def __init__(self, ti, td, hand, problem):
        self.ti, self.td, self.hand_module, self.p = ti, td, hand, problem
        corotated, corotated_slices, frozen = energies(ti, hand)
        self.E = td.element_sum(corotated, problem.tets)
        self.E_slices = td.element_sum(corotated_slices, problem.tets)
        self.E_frozen = td.element_sum(frozen, problem.tets)
        self.fem = hand.HandFEM(problem.tets, problem.x, problem.B, problem.W, problem.m)
        self.fem.vel.from_numpy(problem.v)
        self.grad = td.grad(self.E)
        self.grad_slices = td.grad(self.E_slices)
        self.hessians = {fmt: td.sparse_hessian(self.E, format=fmt) for fmt in ("csr", "bsr")}
        self.frozen_hessian = td.sparse_hessian(self.E_frozen)
        self.operator_of = td.hessian_operator(self.E)
        self.frozen_operator_of = td.hessian_operator(self.E_frozen)

    def calls(self):
        """name -> call, for the first-call processes (each makes what it needs on its first call)."""
        p = self.p
        return {
            "hand get_force": self.fem.force,
            "td.grad(E)": lambda: self.grad(*p.args),
            "td.grad(E_slices)": lambda: self.grad_slices(*p.args),
            "hand compute_A + build": self.hand_assembly,
            "td.sparse_hessian(E) csr": lambda: self.hessians["csr"](*p.args),
            "td.sparse_hessian(E) bsr": lambda: self.hessians["bsr"](*p.args),
            "td.sparse_hessian(E_frozen) csr": lambda: self.frozen_hessian(*p.args),
            "hand matmul_cell": self.fem.product,
            "td.hessian_operator(E) @ v": lambda: self.operator_of(*p.args) @ p.v,
        }

    def hand_assembly(self):
        if self.fem.builder is None:
            self.fem.make_builder()  # the example makes it once, beside its fields
        return self.fem.assemble()

    def hand_vector(self):
        """``v`` flat in a ``ti.ndarray``, for the example's ``SparseMatrix @ ndarray``."""
        vn = self.ti.ndarray(self.ti.f64, self.p.unknowns)
        vn.from_numpy(self.p.v.ravel())
        return vn


# -- checks ---------------------------------------------------------------------------------
def relative(got, ref):
    got, ref = np.asarray(got).ravel(), np.asarray(ref).ravel()
    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


def lapack_force(p, hand):
    """The example's force in NumPy, its rotation ``U V^T`` from LAPACK's SVD (float64 to the last bits)."""
    F = hand.edge_matrices(p.x, p.tets) @ p.B
    U, _, Vt = np.linalg.svd(F)
    H = -p.W[:, None, None] * (2 * hand.MU * (F - U @ Vt)) @ p.B.transpose(0, 2, 1)
    f = np.zeros_like(p.x)
    for i in range(3):
        np.add.at(f, p.tets[:, i], H[:, :, i])
        np.add.at(f, p.tets[:, 3], -H[:, :, i])
    f[:, 1] -= hand.GRAVITY * p.m
    return f


def svd_rotation_error(ti, p, hand):
    """The largest entry of ``U V^T`` from Taichi's ``ti.svd`` minus LAPACK's, over the tets: Taichi's float64
    3x3 SVD runs a fixed number of sweeps and misses by up to ~1e-6 on a few tets; the hand force inherits
    that, tidiff's gradient does not (its rule for the rotation's derivative cancels the error to first order)."""
    mat3 = ti.types.matrix(3, 3, ti.f64)

    @ti.kernel
    def rotations(F: ti.types.ndarray(dtype=mat3, ndim=1), R: ti.types.ndarray(dtype=mat3, ndim=1)):
        for e in F:
            U, _, V = ti.svd(F[e])
            R[e] = U @ V.transpose()

    F = hand.edge_matrices(p.x, p.tets) @ p.B
    R = np.zeros_like(F)
    rotations(F, R)
    U, _, Vt = np.linalg.svd(F)
    return float(np.abs(R - U @ Vt).max())


def check(c):
    """Agreement of every pair that should agree; returns ``[(what, relative error, bound)]``. The bounds of the
    hand force are Taichi's SVD's accuracy (:func:`svd_rotation_error`)."""
    p, hand = c.p, c.hand_module
    f_hand = c.fem.force().to_numpy()
    f_td = -c.grad(*p.args)
    f_ref = lapack_force(p, hand)
    H = c.hessians["csr"](*p.args)
    Hb = c.hessians["bsr"](*p.args)
    Hv = c.operator_of(*p.args) @ p.v
    h = 1e-6 * np.abs(p.x).max()
    central = (c.grad(p.x + h * p.v, p.B, p.W) - c.grad(p.x - h * p.v, p.B, p.W)) / (2 * h)
    A = c.hand_assembly()
    A_v = (A @ c.hand_vector()).to_numpy()
    K_v = c.frozen_hessian(*p.args) @ p.v.ravel()
    mv_td = np.repeat(p.m, 3) * p.v.ravel() + hand.DT**2 * K_v
    frozen_op = c.frozen_operator_of(*p.args) @ p.v
    return [
        ("force: hand get_force vs -td.grad(E)", relative(f_hand, f_td), 1e-6),
        ("force: -td.grad(E) vs NumPy (LAPACK SVD)", relative(f_td, f_ref), 1e-12),
        ("force: hand get_force vs NumPy (LAPACK SVD)", relative(f_hand, f_ref), 1e-6),
        ("rotation: ti.svd's U V^T vs LAPACK's, max abs over tets", svd_rotation_error(c.ti, p, hand), 1e-6),
        ("force: -td.grad(E_slices) vs NumPy (LAPACK SVD)", relative(-c.grad_slices(*p.args), f_ref), 1e-12),
        ("Hessian: csr vs bsr (exact E)", float(abs(H - Hb.tocsr()).max() / abs(H).max()), 1e-14),
        ("Hessian: csr @ v vs hessian_operator @ v", relative(H @ p.v.ravel(), Hv), 1e-12),
        ("Hessian: csr @ v vs central differences of td.grad", relative(H @ p.v.ravel(), central), 1e-6),
        ("Hessian: |H - H^T| / |H| (csr)", float(abs(H - H.T).max() / abs(H).max()), 1e-12),
        ("stiffness: hand A @ v vs m v + dt^2 K_frozen(tidiff) v", relative(A_v, mv_td), 1e-12),
        ("stiffness: hand A @ v vs hand matmul_cell", relative(A_v, c.fem.product().to_numpy()), 1e-12),
        ("frozen: csr @ v vs hessian_operator @ v", relative(K_v, frozen_op), 1e-12),
    ]


# -- one contender's first call, in this (fresh) process -------------------------------------------
def rss_mb(field="VmRSS"):
    with open("/proc/self/status") as status:
        return int(re.search(rf"{field}:\s+(\d+)", status.read()).group(1)) / 1024


def reset_peak():
    """Start the process's RSS high-water mark (VmHWM) again from the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def peak_growth(call):
    """``(seconds, result, MB)``: one call and how far the RSS rose above its level before the call."""
    before = rss_mb()
    reset_peak()
    t0 = time.perf_counter()
    result = call()
    seconds = time.perf_counter() - t0
    return seconds, result, rss_mb("VmHWM") - before


def result_bytes(result):
    """What the result holds: a scipy matrix's data + indices, or an array's bytes (0: not known)."""
    if hasattr(result, "indptr"):
        return result.data.nbytes + result.indices.nbytes + result.indptr.nbytes
    return getattr(result, "nbytes", 0)


def run_one(name, n):
    ti = init_taichi()
    import tidiff as td

    hand = load_hand()
    c = Contenders(ti, td, hand, Problem(n, hand))
    call = c.calls()[name]
    start = rss_mb()
    first, result, peak_first = peak_growth(call)
    size = result_bytes(result)
    del result  # the warm call makes its result anew, as a loop over time steps does
    warm, result, peak_warm = peak_growth(call)
    print(json.dumps({"first": first, "second": warm, "peak_first_mb": peak_first, "peak_warm_mb": peak_warm,
                      "held_mb": rss_mb() - start, "result_mb": size / 2**20}))


def first_calls(n):
    """Each contender's first call in its own process: name -> the child's figures."""
    # a fixed mmap threshold: glibc gives every large array back to the system when it is freed, so that
    # the RSS of a warm call is not hidden by memory the first call freed and malloc kept
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", MALLOC_MMAP_THRESHOLD_="65536")
    stats = {}
    for name in FIRST_CALL:
        proc = subprocess.run([sys.executable, __file__, "--n", str(n), "--one", name], capture_output=True,
                              text=True, env=env)
        if proc.returncode:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"first call of {name!r} failed")
        stats[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"  first call of {name}: {stats[name]['first']:.2f} s", flush=True)
    return stats


# -- warm times, side by side ------------------------------------------------------------------
def sections(c):
    """section -> [(row name, call)] in table order; the first row is the section's hand baseline."""
    from common import Case

    calls, p = c.calls(), c.p
    operator = c.operator_of(*p.args)
    frozen_operator = c.frozen_operator_of(*p.args)
    H = {fmt: c.hessians[fmt](*p.args) for fmt in ("csr", "bsr")}
    A, vn, flat = c.hand_assembly(), c.hand_vector(), p.v.ravel()
    rows = {
        "force": ["hand get_force", "td.grad(E)", "td.grad(E_slices)"],
        "assembly": ["hand compute_A + build", "td.sparse_hessian(E) csr", "td.sparse_hessian(E) bsr",
                     "td.sparse_hessian(E_frozen) csr"],
        "product": [("hand matmul_cell", calls["hand matmul_cell"]),
                    ("hand A @ v (SparseMatrix @ ndarray)", lambda: A @ vn),
                    ("td.hessian_operator(E) @ v", lambda: operator @ p.v),
                    ("td.hessian_operator(E)(x, B, W) @ v (made each call)", calls["td.hessian_operator(E) @ v"]),
                    ("td.hessian_operator(E_frozen) @ v", lambda: frozen_operator @ p.v),
                    ("csr @ v (scipy, H of E)", lambda: H["csr"] @ flat),
                    ("bsr @ v (scipy, H of E)", lambda: H["bsr"] @ flat)],
    }
    return {section: [Case(r, calls[r], check=False) if isinstance(r, str) else Case(r[0], r[1], check=False)
                      for r in entries] for section, entries in rows.items()}


def warm_times(c, repeats):
    """section -> [Row] (seconds), measured round-robin within each section."""
    quiet = lambda line: print(line) if line.lstrip().startswith("!!") else None  # noqa: E731
    return {section: measure(section, cases, None, repeats=repeats, log=quiet)
            for section, cases in sections(c).items()}


# -- the report ---------------------------------------------------------------------------------
def print_checks(results):
    print("| check | max relative error | bound | ok |")
    print("|---|---|---|---|")
    for what, err, bound in results:
        print(f"| {what} | {err:.1e} | {bound:.0e} | {'yes' if err <= bound else 'NO'} |")


def print_table(times, first):
    print("| section | contender | warm (median) | [min – max] | / hand | first call (fresh process) | first / hand "
          "| peak RSS growth, first call | peak RSS growth, warm call | RSS held after | result |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for section, rows in times.items():
        base = rows[0].median
        hand_first = first.get(HAND_ROW[section], {}).get("first")
        for row in rows:
            if row.status != "ok":
                print(f"| {section} | {row.peer} | {row.status}: {row.note} ||||||||")
                continue
            f = first.get(row.peer)
            cells = ["—"] * 6
            if f:
                cells = [fmt_time(f["first"]), f"{f['first'] / hand_first:.2f}x" if hand_first else "—",
                         f"{f['peak_first_mb']:.0f} MB", f"{f['peak_warm_mb']:.0f} MB", f"{f['held_mb']:.0f} MB",
                         f"{f['result_mb']:.1f} MB" if f["result_mb"] else "—"]
            print(f"| {section} | {row.peer} | {fmt_time(row.median)} | [{fmt_time(row.lo)} – {fmt_time(row.hi)}] "
                  f"| {row.median / base:.2f}x | " + " | ".join(cells) + " |")


def print_targets(times, first):
    print("| target | hand | tidiff | ratio | bound | met |")
    print("|---|---|---|---|---|---|")
    for section, bound in TARGETS.items():
        by = {r.peer: r for r in times[section]}
        hand = by[HAND_ROW[section]].median
        for label, row in ((f"{section}, warm", TIDIFF_ROW[section]),
                           (f"{section}, warm, like for like (frozen energy)", LIKE_FOR_LIKE.get(section))):
            if row is not None:
                mine = by[row].median
                print(f"| {label} | {fmt_time(hand)} | {fmt_time(mine)} | {mine / hand:.2f}x | {bound}x "
                      f"| {'yes' if mine <= bound * hand else 'no'} |")
    for section in TARGETS:
        if HAND_ROW[section] in first and TIDIFF_ROW[section] in first:
            hand, mine = first[HAND_ROW[section]]["first"], first[TIDIFF_ROW[section]]["first"]
            print(f"| {section}, first call | {fmt_time(hand)} | {fmt_time(mine)} | {mine / hand:.2f}x | 2x "
                  f"| {'yes' if mine <= 2 * hand else 'no'} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=32, help="nodes along each edge of the cube (the example: 5)")
    parser.add_argument("--small", action="store_true", help="n = 8: a quick run")
    parser.add_argument("--repeats", type=int, default=7, help="timing samples per contender (3 for slow calls)")
    parser.add_argument("--no-first-call", action="store_true", help="skip the fresh processes")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    n = 8 if opts.small else opts.n
    if opts.one:
        run_one(opts.one, n)
        return
    print(f"implicit FEM, n = {n}: {n**3} nodes ({3 * n**3:,} unknowns), {5 * (n - 1)**3:,} tets; CPU, float64; "
          f"load average {os.getloadavg()[0]:.2f}\n", flush=True)
    first = {} if opts.no_first_call else first_calls(n)
    ti = init_taichi()
    import tidiff as td

    hand = load_hand()
    c = Contenders(ti, td, hand, Problem(n, hand))
    print()
    print_checks(check(c))
    print()
    times = warm_times(c, opts.repeats)
    print_table(times, first)
    print()
    print_targets(times, first)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
