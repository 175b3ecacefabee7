"""tidiff's per-element transforms beside their peers on one device (a GPU, or the CPU), in one process.

    TI_ARCH=cuda python bench/gpu.py              # on the GPU machine (the default device is cuda)
    python bench/gpu.py --device cpu --quick      # the same run on the CPU, small sizes (a smoke test)
    python bench/gpu.py --json results.json       # also write every row to a JSON file

Every contender gets the same float64 data, as tensors on the device (JAX: arrays on its default
device, which must be that GPU), and does one complete call per sample, inputs on the device in,
results on the device out, synchronised (``ti.sync()`` and ``torch.cuda.synchronize()``, JAX's
``block_until_ready``):

- W1 per-sample Jacobian of ``tanh(W x + b)``, W 4x8 and b broadcast, B = 1e6 (``--quick`` 1e4):
  ``td.jacfwd``; JAX ``jit(vmap(jacfwd))``; ``torch.func.vmap(jacfwd)``; a closed-form Taichi
  kernel ``J = (1 - y^2) W`` writing into a preallocated tensor.
- W2 per-element Hessian of the Neo-Hookean energy of a 3x3 F, B = 1e5 (1e3): ``td.hessian``;
  JAX ``jit(vmap(hessian))``; ``torch.func.vmap(hessian)``; the closed-form Hessian of
  bench/workloads/w2_neohookean_hessian.py as a Taichi kernel.
- W3 vjp over 1e7 (1e5) elements of ``h(x) = sin(x) x^2 + exp(-x)``: ``td.vjp`` + ``vjp_fn(c)``;
  ``td.torch.function(h)`` + ``backward(c)``; JAX ``jit(vjp)``; torch autograd; a closed-form kernel.

For each contender: a first call (compiling included, reported apart), a check against a float64
reference computed with torch (``rtol = atol = 1e-9``; a wrong tidiff result is not timed, a wrong
peer is timed and flagged), one warm call counting its host-device copies
(``tidiff._testing.host_copies.HostCopies``; only a CUDA runtime has any), then samples taken
round-robin, one per contender per round. A table per workload gives the median, the spread, the
ratio ``peer / tidiff`` (above 1: tidiff is faster), the first call and the host copies.
The exit status is 1 if a tidiff row was wrong or raised, 2 if the device asked for is not there.
"""
import os

# Before torch and JAX are imported: torch's idle OpenMP workers otherwise spin beside Taichi's
# threads (bench/common.py), and JAX would otherwise take most of the GPU's memory at its start.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import taichi as ti  # noqa: E402
import torch  # noqa: E402

import tidiff as td  # noqa: E402
from tidiff._testing.host_copies import HostCopies  # noqa: E402

RTOL = ATOL = 1e-9
M, N = 4, 8  # W1: W is M x N
MU, LAM = 1.3, 2.1  # W2: the Neo-Hookean constants
vec8 = ti.types.vector(N, ti.f64)
vec4 = ti.types.vector(M, ti.f64)
mat48 = ti.types.matrix(M, N, ti.f64)
mat3 = ti.types.matrix(3, 3, ti.f64)

warnings.filterwarnings("ignore", message="You are unrolling", category=SyntaxWarning)


# --------------------------------------------------------------------------- the functions, in Taichi
@ti.func
def layer(x: vec8, W: mat48, b: vec4) -> vec4:
    return ti.tanh(W @ x + b)


@ti.func
def neo_hookean(F: mat3) -> ti.f64:
    J = F.determinant()
    logJ = ti.log(J)
    return 0.5 * MU * ((F.transpose() @ F).trace() - 3.0) - MU * logJ + 0.5 * LAM * logJ * logJ


@ti.func
def h(x: ti.f64) -> ti.f64:
    return ti.sin(x) * x ** 2 + ti.exp(-x)


# --------------------------------------------------------------------------- closed forms, by hand
@ti.kernel
def w1_closed_form(x: ti.types.ndarray(dtype=vec8, ndim=1), W: ti.types.ndarray(dtype=mat48, ndim=0),
                   b: ti.types.ndarray(dtype=vec4, ndim=0), J: ti.types.ndarray(dtype=mat48, ndim=1)):
    for i in x:
        y = ti.tanh(W[None] @ x[i] + b[None])
        Ji = ti.Matrix.zero(ti.f64, M, N)
        for r, c in ti.static(ti.ndrange(M, N)):
            Ji[r, c] = (1.0 - y[r] * y[r]) * W[None][r, c]
        J[i] = Ji


@ti.kernel
def w2_closed_form(F: ti.types.ndarray(dtype=mat3, ndim=1), H: ti.types.ndarray(dtype=ti.f64, ndim=5)):
    # H[i,j,k,l] = mu d_ik d_jl + lam G_ij G_kl - (lam log J - mu) G_il G_kj with G = F^-T
    for e in F:
        Fe = F[e]
        G = Fe.inverse().transpose()
        c = LAM * ti.log(Fe.determinant()) - MU
        for i, j, k, m in ti.static(ti.ndrange(3, 3, 3, 3)):
            v = LAM * G[i, j] * G[k, m] - c * G[i, m] * G[k, j]
            if ti.static(i == k and j == m):
                v += MU
            H[e, i, j, k, m] = v


@ti.kernel
def w3_closed_form(x: ti.types.ndarray(dtype=ti.f64, ndim=1), c: ti.types.ndarray(dtype=ti.f64, ndim=1),
                   y: ti.types.ndarray(dtype=ti.f64, ndim=1), g: ti.types.ndarray(dtype=ti.f64, ndim=1)):
    for i in x:
        xi = x[i]
        s, co, e = ti.sin(xi), ti.cos(xi), ti.exp(-xi)
        y[i] = s * xi * xi + e
        g[i] = c[i] * (co * xi * xi + 2.0 * xi * s - e)


# --------------------------------------------------------------------------- the same functions in torch and JAX
def layer_torch(x, W, b):
    return torch.tanh(W @ x + b)


def neo_hookean_torch(F):
    logJ = torch.log(torch.linalg.det(F))
    return 0.5 * MU * ((F * F).sum() - 3.0) - MU * logJ + 0.5 * LAM * logJ * logJ


def h_torch(x):
    return torch.sin(x) * x ** 2 + torch.exp(-x)


def jax_functions(jnp):
    def layer_jax(x, W, b):
        return jnp.tanh(W @ x + b)

    def neo_hookean_jax(F):
        logJ = jnp.log(jnp.linalg.det(F))
        return 0.5 * MU * (jnp.sum(F * F) - 3.0) - MU * logJ + 0.5 * LAM * logJ * logJ

    def h_jax(x):
        return jnp.sin(x) * x ** 2 + jnp.exp(-x)

    return layer_jax, neo_hookean_jax, h_jax


# --------------------------------------------------------------------------- the device
class Device:
    """Where everything runs: the torch device, how to synchronise it, and JAX (or why there is none)."""

    def __init__(self, name):
        self.name = name
        self.torch = torch.device(name)
        self.jax, self.jax_missing = load_jax(name)

    def sync(self):
        ti.sync()
        if self.name == "cuda":
            torch.cuda.synchronize()

    def tensor(self, array):
        return torch.from_numpy(array).to(self.torch)

    def jax_array(self, array):
        return self.jax.numpy.asarray(array)  # placed on JAX's default device

    def synced(self, call):
        """``call`` followed by a full synchronisation of Taichi and torch; returns call's result."""
        def run():
            result = call()
            self.sync()
            return result
        return run


def start_taichi(device):
    """Taichi in float64 on the device; exits with status 2 when the device is not there."""
    arch = ti.cuda if device == "cuda" else ti.cpu
    ti.init(arch=arch, default_fp=ti.f64, offline_cache=True, log_level=ti.WARN)
    started = ti.lang.impl.current_cfg().arch.name
    if device == "cuda" and started != "cuda":
        stop(f"--device cuda: Taichi started on {started}, not on cuda (no CUDA GPU or driver?). "
             "Use --device cpu for the CPU.")
    if device == "cuda" and not torch.cuda.is_available():
        stop(f"--device cuda: torch {torch.__version__} sees no CUDA device (a CPU-only build?).")
    if device == "cpu" and started == "cuda":
        stop("--device cpu: Taichi started on cuda (is TI_ARCH=cuda set?).")
    return started


def stop(message):
    print(f"bench/gpu.py: {message} Nothing was measured.", file=sys.stderr)
    sys.exit(2)


def load_jax(device):
    """``(jax, None)`` configured for float64 on the device, or ``(None, why not)``."""
    try:
        import jax
    except Exception as e:  # not installed, or a broken install
        return None, f"JAX not importable ({type(e).__name__}: {e})"
    jax.config.update("jax_enable_x64", True)
    if device == "cpu":
        jax.config.update("jax_platforms", "cpu")
    backend = jax.default_backend()
    if device == "cuda" and backend not in ("gpu", "cuda"):
        return None, f"JAX runs on {backend}, not on the GPU (jaxlib without CUDA?)"
    return jax, None


# --------------------------------------------------------------------------- cases and rows
class Case:
    """One contender: ``call()`` does one complete, synchronised call and returns its result."""

    def __init__(self, name, call, kind="peer", note=""):
        self.name = name
        self.call = call
        self.kind = kind  # tidiff | peer | limit
        self.note = note


class Row:
    def __init__(self, workload, case):
        self.workload = workload
        self.contender = case.name
        self.kind = case.kind
        self.note = case.note
        self.samples = []
        self.first_s = None
        self.max_err = None
        self.host_copies = None
        self.seen = {}
        self.ok = None  # True, False (wrong values) or None (raised or not run)

    def add_note(self, text):
        self.note = f"{self.note}; {text}" if self.note else text

    def as_dict(self):
        return {"workload": self.workload, "contender": self.contender, "median_s": self.median,
                "min_s": min(self.samples, default=None), "max_s": max(self.samples, default=None),
                "first_s": self.first_s, "host_copies": self.host_copies, "ok": self.ok, "note": self.note,
                "max_err": self.max_err}

    @property
    def median(self):
        return statistics.median(self.samples) if self.samples else None


def to_host(result):
    """A result (torch tensor, JAX array, or a tuple of them) as one NumPy array, for checking only."""
    if isinstance(result, tuple):
        return np.stack([to_host(r) for r in result])
    if isinstance(result, torch.Tensor):
        return result.detach().cpu().numpy()
    return np.asarray(result)


def skipped(workload, name, why):
    row = Row(workload, Case(name, None))
    row.note = f"skipped: {why}"
    return row


def first_call(case, row, reference):
    """The first call, timed, and its check; False when the case is not to be timed."""
    t0 = time.perf_counter()
    result = case.call()
    row.first_s = time.perf_counter() - t0
    got = to_host(result)
    if got.shape != reference.shape:
        row.ok = False
        row.add_note(f"WRONG SHAPE {got.shape}, expected {reference.shape}")
    else:
        row.max_err = float(np.max(np.abs(got - reference)))
        row.ok = bool(np.allclose(got, reference, rtol=RTOL, atol=ATOL))
        if not row.ok:
            row.add_note(f"WRONG VALUES (max abs err {row.max_err:.2g})")
    if not row.ok and case.kind == "tidiff":
        row.add_note("not timed")
        return False
    return True


def count_host_copies(case, row):
    """One warm call under the host-copy counter (it also warms the case up)."""
    with HostCopies() as copies:
        case.call()
    row.host_copies = copies.count
    row.seen = dict(copies.seen)


def failed(row, error):
    row.ok = None
    row.samples = []
    row.add_note(f"ERROR: {type(error).__name__}: {error}".splitlines()[0][:200])


def measure(workload, cases, reference, rounds):
    """Check, count and time ``cases`` (round-robin, one sample of each per round); one Row each."""
    rows, live = [], []
    for case in cases:
        row = Row(workload, case)
        rows.append(row)
        try:
            if first_call(case, row, reference):
                count_host_copies(case, row)
                live.append((case, row))
        except Exception as e:
            failed(row, e)
    for _ in range(rounds):
        for case, row in list(live):
            try:
                t0 = time.perf_counter()
                case.call()
                row.samples.append(time.perf_counter() - t0)
            except Exception as e:
                failed(row, e)
                live.remove((case, row))
    return rows


# --------------------------------------------------------------------------- the workloads
def w1(dev, quick):
    """Per-sample Jacobians of tanh(W x + b): (B, 4, 8)."""
    B = 10_000 if quick else 1_000_000
    wl = f"W1 per-sample Jacobian of tanh(W x + b), W 4x8, B={B:.0e}"
    rng = np.random.default_rng(0)
    xs, Ws, bs = rng.standard_normal((B, N)), rng.standard_normal((M, N)) * 0.5, rng.standard_normal(M) * 0.5
    x, W, b = dev.tensor(xs), dev.tensor(Ws), dev.tensor(bs)
    y = torch.tanh(x @ W.T + b)
    reference = to_host((1.0 - y * y)[:, :, None] * W[None])

    jac = td.jacfwd(layer, argnums=0)
    J = torch.empty((B, M, N), dtype=torch.float64, device=dev.torch)
    torch_jac = torch.func.vmap(torch.func.jacfwd(layer_torch), in_dims=(0, None, None))
    cases = [
        Case("tidiff td.jacfwd", dev.synced(lambda: jac(x, W, b)), kind="tidiff"),
        Case("Taichi closed-form kernel (limit)", dev.synced(lambda: (w1_closed_form(x, W, b, J), J)[1]),
             kind="limit", note="output preallocated"),
        Case("torch.func vmap(jacfwd)", dev.synced(lambda: torch_jac(x, W, b))),
    ]
    extra = []
    if dev.jax:
        layer_jax = jax_functions(dev.jax.numpy)[0]
        g = dev.jax.jit(dev.jax.vmap(dev.jax.jacfwd(layer_jax), in_axes=(0, None, None)))
        xj, Wj, bj = dev.jax_array(xs), dev.jax_array(Ws), dev.jax_array(bs)
        cases.append(Case("JAX jit(vmap(jacfwd))", lambda: g(xj, Wj, bj).block_until_ready()))
    else:
        extra.append(skipped(wl, "JAX jit(vmap(jacfwd))", dev.jax_missing))
    return wl, cases, reference, extra


def w2_reference(F):
    """The closed form in torch, checked against torch.autograd.functional.hessian on a few elements."""
    G = torch.linalg.inv(F).transpose(1, 2)
    c = LAM * torch.log(torch.linalg.det(F)) - MU
    eye = torch.eye(3, dtype=F.dtype, device=F.device)
    H = (LAM * torch.einsum("bij,bkl->bijkl", G, G)
         - c[:, None, None, None, None] * torch.einsum("bil,bkj->bijkl", G, G)
         + MU * torch.einsum("ik,jl->ijkl", eye, eye)[None])
    for e in range(min(len(F), 5)):
        oracle = torch.autograd.functional.hessian(neo_hookean_torch, F[e])
        assert torch.allclose(oracle, H[e], rtol=1e-12, atol=1e-12), "W2's closed form disagrees with torch.autograd"
    return to_host(H)


def w2(dev, quick):
    """Per-element Hessians of the Neo-Hookean energy: (B, 3, 3, 3, 3)."""
    B = 1_000 if quick else 100_000
    wl = f"W2 per-element Hessian of the Neo-Hookean energy of a 3x3 F, B={B:.0e}"
    Fs = np.eye(3)[None] + 0.2 * np.random.default_rng(0).standard_normal((B, 3, 3))  # det F > 0 for these
    F = dev.tensor(Fs)
    reference = w2_reference(F)

    hess = td.hessian(neo_hookean)
    H = torch.empty((B, 3, 3, 3, 3), dtype=torch.float64, device=dev.torch)
    torch_hess = torch.func.vmap(torch.func.hessian(neo_hookean_torch))
    cases = [
        Case("tidiff td.hessian", dev.synced(lambda: hess(F)), kind="tidiff"),
        Case("Taichi closed-form kernel (limit)", dev.synced(lambda: (w2_closed_form(F, H), H)[1]),
             kind="limit", note="output preallocated"),
        Case("torch.func vmap(hessian)", dev.synced(lambda: torch_hess(F)),
             note="torch 2.13's is wrong through det on the CPU (bench/workloads/w2_neohookean_hessian.py)"),
    ]
    extra = []
    if dev.jax:
        neo_hookean_jax = jax_functions(dev.jax.numpy)[1]
        g = dev.jax.jit(dev.jax.vmap(dev.jax.hessian(neo_hookean_jax)))
        Fj = dev.jax_array(Fs)
        cases.append(Case("JAX jit(vmap(hessian))", lambda: g(Fj).block_until_ready()))
    else:
        extra.append(skipped(wl, "JAX jit(vmap(hessian))", dev.jax_missing))
    return wl, cases, reference, extra


def w3(dev, quick):
    """The vjp of h over n elements: every contender returns (h(x), c * h'(x))."""
    n = 100_000 if quick else 10_000_000
    wl = f"W3 vjp of sin(x) x^2 + exp(-x), n={n:.0e}"
    rng = np.random.default_rng(0)
    xs, cs = rng.uniform(-3, 3, n), rng.standard_normal(n)
    x, c = dev.tensor(xs), dev.tensor(cs)
    reference = to_host((h_torch(x), c * (torch.cos(x) * x * x + 2 * x * torch.sin(x) - torch.exp(-x))))

    def tidiff_vjp():
        y, vjp_fn = td.vjp(h, x)
        (g,) = vjp_fn(c)
        return y, g

    op = td.torch.function(h)

    def backward_of(f):
        def call():
            x_req = x.detach().requires_grad_(True)
            y = f(x_req)
            y.backward(c)
            return y.detach(), x_req.grad
        return call

    y, g = torch.empty_like(x), torch.empty_like(x)
    cases = [
        Case("tidiff td.vjp + vjp_fn(c)", dev.synced(tidiff_vjp), kind="tidiff"),
        Case("tidiff td.torch.function(h) + backward(c)", dev.synced(backward_of(op)), kind="tidiff"),
        Case("Taichi closed-form kernel (limit)", dev.synced(lambda: (w3_closed_form(x, c, y, g), (y, g))[1]),
             kind="limit", note="outputs preallocated"),
        Case("torch autograd", dev.synced(backward_of(h_torch))),
    ]
    extra = []
    if dev.jax:
        jax = dev.jax
        h_jax = jax_functions(jax.numpy)[2]

        @jax.jit
        def jax_vjp(x, c):
            y, vjp_fn = jax.vjp(h_jax, x)
            return y, vjp_fn(c)[0]

        xj, cj = dev.jax_array(xs), dev.jax_array(cs)
        cases.append(Case("JAX jit(vjp)", lambda: jax.block_until_ready(jax_vjp(xj, cj))))
    else:
        extra.append(skipped(wl, "JAX jit(vjp)", dev.jax_missing))
    return wl, cases, reference, extra


# --------------------------------------------------------------------------- report
def ms(seconds):
    return "—" if seconds is None else f"{seconds * 1e3:.3f}"


def table(rows):
    """A markdown table of one workload's rows; ratios against its first tidiff row."""
    base = next((r.median for r in rows if r.kind == "tidiff"), None)
    lines = ["| contender | median ms | min-max ms | ratio | first call ms | host copies | max abs err | note |",
             "|---|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        spread = f"{ms(min(r.samples))}-{ms(max(r.samples))}" if r.samples else "—"
        ratio = f"{r.median / base:.2f}x" if base and r.median else "—"
        copies = "—" if r.host_copies is None else str(r.host_copies)
        err = "—" if r.max_err is None else f"{r.max_err:.1e}"
        lines.append(f"| {r.contender} | {ms(r.median)} | {spread} | {ratio} | {ms(r.first_s)} | {copies} | {err} "
                     f"| {r.note} |")
    for r in rows:
        if r.kind == "tidiff" and r.host_copies:
            lines.append(f"\n{r.contender}: host copies seen {r.seen}")
    return "\n".join(lines)


def header(dev, arch):
    name = torch.cuda.get_device_name() if dev.name == "cuda" else "CPU"
    jax_version = dev.jax.__version__ if dev.jax else "—"
    lines = [f"device: {name}; Taichi arch {arch}; taichi {'.'.join(map(str, ti.__version__))}, "
             f"torch {torch.__version__}, jax {jax_version}",
             f"JAX: {dev.jax.devices()[0]}" if dev.jax else f"JAX: not in this run ({dev.jax_missing})",
             warp_line(),
             "ratio = contender median / the workload's first tidiff row's median (above 1: tidiff faster); "
             "host copies = host-device copies of one warm call"]
    return "\n".join(lines)


def warp_line():
    try:
        import warp
    except Exception as e:
        return (f"NVIDIA Warp: not in this run (import warp failed: {type(e).__name__}; "
                "its wheel is too large to carry to the GPU machine)")
    return f"NVIDIA Warp {warp.__version__}: importable, but not benchmarked here"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="small sizes and 3 rounds (a smoke test)")
    parser.add_argument("--json", metavar="PATH", help="also write every row to this JSON file")
    args = parser.parse_args()

    arch = start_taichi(args.device)
    dev = Device(args.device)
    print(header(dev, arch), flush=True)
    rounds = 3 if args.quick else 10
    rows = []
    for workload in (w1, w2, w3):
        wl, cases, reference, extra = workload(dev, args.quick)
        print(f"\n## {wl}\n", flush=True)
        wl_rows = measure(wl, cases, reference, rounds) + extra
        print(table(wl_rows), flush=True)
        rows += wl_rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.as_dict() for r in rows], f, indent=1)
    bad = [r.contender for r in rows if r.kind == "tidiff" and r.ok is not True]
    if bad:
        print(f"\ntidiff rows wrong or raised: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
