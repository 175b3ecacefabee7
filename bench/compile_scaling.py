"""How first-call (compile) time grows with the element size: tidiff, JAX and hand-written Taichi.

Every measurement runs in a fresh process with Taichi's offline cache off, so a
first call pays every compile, as on a user's first run::

    python bench/compile_scaling.py                 # n = 4 .. 64, writes compile_scaling.md/.png
    python bench/compile_scaling.py --sizes 4,16 --quick

Workloads (B elements, float64):

- ``hessian``: ``f(x) = log(sum exp x) + (x.x)^2`` for ``x`` a vector of n;
  tidiff ``td.hessian(f)``, JAX ``jit(vmap(hessian(f)))``, and a hand-written
  Taichi kernel of the closed form ``diag(p) - p p^T + 4 (x.x) I + 8 x x^T``.
- ``jacobian``: ``g(x) = tanh(x * sum(x))``; ``td.jacobian(g)``, JAX
  ``jit(vmap(jacfwd(g)))``, closed form ``(1 - y_i^2)(S delta_ij + x_i)``.
- ``mlp``: ``jacfwd(jacrev(layer, 0), 0)`` of ``tanh(W x + b)`` by its 4x8 ``W``
  (a 4x4x8x4x8 block per element), tidiff and JAX.
- ``hessian3``: the Hessian by three arguments, ``x`` (n) and two scalars, of
  ``log(sum exp(a x)) + b (x.x)^2``: nine blocks per element, tidiff and JAX
  (NOTE: [One loop of pushes] in ``tidiff/_codegen/bodies.py``).
- ``grad_loop``, ``hessian_loop``: the gradient and the Hessian of the same ``f``
  written entry by entry, ``s += exp(x[i])`` in a ``ti.static`` loop, then
  ``log(s) + (x.x)^2`` (issue 39: compile time that grows with the function's
  own, not with the square of its size); tidiff and JAX (``jit(vmap(grad))``,
  ``jit(vmap(hessian))``).

Peer ``value`` is the function itself (``td.function(f)(x)``: one kernel calling ``f``
per element), the yardstick of "compile time that grows with the function's own".

``--offline-cache`` instead measures the second of two processes sharing
Taichi's on-disk cache (nothing should compile).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from common import first_and_warm  # bench/ is the script's own folder: on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
B = 1000


# --------------------------------------------------------------------------- one measurement, in a child
def _tidiff(workload: str, n: int, cache_dir: str | None) -> tuple[float, float, np.ndarray]:
    import taichi as ti

    import tidiff as td

    if cache_dir:
        ti.init(arch=ti.cpu, default_fp=ti.f64, offline_cache=True, offline_cache_file_path=cache_dir)
    else:
        ti.init(arch=ti.cpu, default_fp=ti.f64, offline_cache=False)
    source = _TAICHI_SOURCES[workload].format(n=n)
    namespace = _load(source, f"compile_scaling_{workload}_{n}")
    x = _inputs(workload, n)
    call = {"hessian": lambda: td.hessian(namespace["f"])(x[0]),
            "jacobian": lambda: td.jacobian(namespace["g"])(x[0]),
            "mlp": lambda: td.jacfwd(td.jacrev(namespace["layer"], argnums=0), argnums=0)(*x),
            "hessian3": lambda: _flat_blocks(td.hessian(namespace["f3"], argnums=(0, 1, 2))(*x)),
            "grad_loop": lambda: td.grad(namespace["f"])(x[0]),
            "hessian_loop": lambda: td.hessian(namespace["f"])(x[0])}[workload]
    return _first_and_warm(call)


_FUNCTION = {"hessian": "f", "grad_loop": "f", "hessian_loop": "f", "jacobian": "g", "mlp": "layer", "hessian3": "f3"}


def _value(workload: str, n: int) -> tuple[float, float, np.ndarray]:
    """The function itself, through tidiff: what its derivatives' compile time is measured against."""
    import taichi as ti

    import tidiff as td

    ti.init(arch=ti.cpu, default_fp=ti.f64, offline_cache=False)
    namespace = _load(_TAICHI_SOURCES[workload].format(n=n), f"compile_scaling_value_{workload}_{n}")
    x = _inputs(workload, n)
    fn = td.function(namespace[_FUNCTION[workload]])
    return _first_and_warm(lambda: fn(*x))


def _flat_blocks(blocks) -> np.ndarray:
    """A Hessian by several arguments (a tuple of rows of blocks) as one (B, -1) array."""
    return np.concatenate([np.asarray(b).reshape(B, -1) for row in blocks for b in row], axis=1)


def _closed_form(workload: str, n: int) -> tuple[float, float, np.ndarray]:
    import taichi as ti

    ti.init(arch=ti.cpu, default_fp=ti.f64, offline_cache=False)
    namespace = _load(_CLOSED_FORMS[workload].format(n=n), f"compile_scaling_closed_{workload}_{n}")
    x = _inputs(workload, n)[0]
    out = np.empty((B, n, n))

    def call() -> np.ndarray:
        namespace["kernel"](x, out)
        return out
    return _first_and_warm(call)


def _jax(workload: str, n: int) -> tuple[float, float, np.ndarray]:
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)

    def f(x):
        return jnp.log(jnp.sum(jnp.exp(x))) + jnp.dot(x, x) ** 2

    def g(x):
        return jnp.tanh(x * jnp.sum(x))

    def layer(W, x, b):
        return jnp.tanh(W @ x + b)

    def f3(x, a, b):
        return jnp.log(jnp.sum(jnp.exp(a * x))) + b * jnp.dot(x, x) ** 2

    fn = {"hessian": jax.jit(jax.vmap(jax.hessian(f))),
          "grad_loop": jax.jit(jax.vmap(jax.grad(f))),
          "hessian_loop": jax.jit(jax.vmap(jax.hessian(f))),
          "jacobian": jax.jit(jax.vmap(jax.jacfwd(g))),
          "mlp": jax.jit(jax.vmap(jax.jacfwd(jax.jacrev(layer, 0), 0), in_axes=(None, 0, None))),
          "hessian3": jax.jit(jax.vmap(jax.hessian(f3, argnums=(0, 1, 2))))}[workload]
    x = [jnp.asarray(a) for a in _inputs(workload, n)]
    if workload == "hessian3":
        return _first_and_warm(lambda: _flat_blocks(jax.block_until_ready(fn(*x))))
    return _first_and_warm(lambda: np.asarray(fn(*x).block_until_ready()))


def _first_and_warm(call) -> tuple[float, float, np.ndarray]:
    first, warm, result = first_and_warm(call, 5)
    return first, warm, np.asarray(result)


def _inputs(workload: str, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    if workload == "mlp":
        return [rng.standard_normal((4, 8)) * 0.3, rng.standard_normal((B, 8)), rng.standard_normal(4) * 0.1]
    if workload == "hessian3":
        return [rng.standard_normal((B, n)) * 0.3, 1.0 + 0.1 * rng.standard_normal(B), rng.standard_normal(B)]
    return [rng.standard_normal((B, n)) * 0.3]


def _load(source: str, name: str) -> dict:
    """Taichi reads a function's source from its file: write a real one."""
    path = os.path.join(tempfile.mkdtemp(), name + ".py")
    with open(path, "w") as f:
        f.write(source)
    namespace: dict = {"__name__": name}
    exec(compile(source, path, "exec", dont_inherit=True), namespace)  # no `annotations` future
    return namespace


_TAICHI_SOURCES = {
    "hessian": '''
import taichi as ti

@ti.func
def f(x: ti.types.vector({n}, ti.f64)) -> ti.f64:
    return ti.log(ti.exp(x).sum()) + x.dot(x) ** 2
''',
    "grad_loop": '''
import taichi as ti

@ti.func
def f(x: ti.types.vector({n}, ti.f64)) -> ti.f64:
    s = 0.0
    for i in ti.static(range({n})):
        s += ti.exp(x[i])
    return ti.log(s) + x.dot(x) ** 2
''',
    "jacobian": '''
import taichi as ti

@ti.func
def g(x: ti.types.vector({n}, ti.f64)) -> ti.types.vector({n}, ti.f64):
    return ti.tanh(x * x.sum())
''',
    "hessian3": '''
import taichi as ti

@ti.func
def f3(x: ti.types.vector({n}, ti.f64), a: ti.f64, b: ti.f64) -> ti.f64:
    return ti.log(ti.exp(a * x).sum()) + b * x.dot(x) ** 2
''',
    "mlp": '''
import taichi as ti

@ti.func
def layer(W: ti.types.matrix(4, 8, ti.f64), x: ti.types.vector(8, ti.f64),
          b: ti.types.vector(4, ti.f64)) -> ti.types.vector(4, ti.f64):
    return ti.tanh(W @ x + b)
''',
}

_TAICHI_SOURCES["hessian_loop"] = _TAICHI_SOURCES["grad_loop"]

_CLOSED_FORMS = {
    "hessian": '''
import taichi as ti

@ti.kernel
def kernel(x: ti.types.ndarray(dtype=ti.f64, ndim=2), out: ti.types.ndarray(dtype=ti.f64, ndim=3)):
    for e in range(x.shape[0]):
        m = x[e, 0]
        for i in range({n}):
            m = ti.max(m, x[e, i])
        total = 0.0
        r = 0.0
        for i in range({n}):
            total += ti.exp(x[e, i] - m)
            r += x[e, i] * x[e, i]
        for i in range({n}):
            p_i = ti.exp(x[e, i] - m) / total
            for j in range({n}):
                p_j = ti.exp(x[e, j] - m) / total
                out[e, i, j] = -p_i * p_j + 8.0 * x[e, i] * x[e, j]
            out[e, i, i] += p_i + 4.0 * r
''',
    "jacobian": '''
import taichi as ti

@ti.kernel
def kernel(x: ti.types.ndarray(dtype=ti.f64, ndim=2), out: ti.types.ndarray(dtype=ti.f64, ndim=3)):
    for e in range(x.shape[0]):
        s = 0.0
        for i in range({n}):
            s += x[e, i]
        for i in range({n}):
            y = ti.tanh(x[e, i] * s)
            for j in range({n}):
                out[e, i, j] = (1.0 - y * y) * x[e, i]
            out[e, i, i] += (1.0 - y * y) * s
''',
}


def child(spec: str) -> None:
    peer, workload, n, cache_dir = json.loads(spec)
    if peer == "tidiff":
        first, warm, result = _tidiff(workload, n, cache_dir)
    elif peer == "jax":
        first, warm, result = _jax(workload, n)
    elif peer == "value":
        first, warm, result = _value(workload, n)
    else:
        first, warm, result = _closed_form(workload, n)
    checksum = float(np.sum(result * np.cos(np.arange(result.size).reshape(result.shape))))
    print(json.dumps({"first": first, "warm": warm, "checksum": checksum, "shape": list(result.shape)}))


# --------------------------------------------------------------------------- the parent
def measure(peer: str, workload: str, n: int, cache_dir: str | None = None, timeout: float = 900) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]),
               TI_LOG_LEVEL="error")
    try:
        done = subprocess.run([sys.executable, __file__, "--child", json.dumps([peer, workload, n, cache_dir])],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="4,8,16,24,32,48,64")
    ap.add_argument("--workloads", default="hessian,jacobian,mlp")
    ap.add_argument("--peers", default="tidiff,jax,taichi")
    ap.add_argument("--offline-cache", action="store_true", help="second process on a shared on-disk cache")
    ap.add_argument("--out", default=os.path.join(HERE, "compile_scaling.md"))
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    if args.offline_cache:
        offline_cache(args)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for workload in args.workloads.split(","):
        for n in sizes if workload != "mlp" else [8]:
            row = {"workload": workload, "n": n}
            for peer in args.peers.split(","):
                if peer == "taichi" and workload in ("mlp", "hessian3", "grad_loop", "hessian_loop"):
                    continue
                row[peer] = measure(peer, workload, n)
                print(workload, n, peer, _cell(row[peer]), flush=True)
            _check_agreement(row)
            rows.append(row)
    write(args.out, rows)
    plot(rows, os.path.splitext(args.out)[0] + ".png")


def _check_agreement(row: dict) -> None:
    sums = {peer: r["checksum"] for peer, r in row.items()
            if isinstance(r, dict) and "checksum" in r and peer != "value"}  # the value is not a derivative
    ref = sums.get("taichi", sums.get("jax"))
    for peer, s in sums.items():
        if ref is not None and not np.isclose(s, ref, rtol=1e-9, atol=1e-9):
            row[peer]["error"] = f"WRONG VALUES (checksum {s} vs {ref})"


def _cell(r: dict, key: str = "first") -> str:
    if "error" in r:
        return r["error"] if key == "first" else "-"
    value = r[key]
    return f"{value:.2f} s" if key == "first" else f"{value * 1e3:.2f} ms"


def write(path: str, rows: list[dict]) -> None:
    peers = [p for p in ("tidiff", "jax", "taichi", "value") if any(p in r for r in rows)]
    lines = ["# Compile scaling", "", f"First call (compile + one run) and warm run, B = {B}, float64, "
             "one fresh process per cell, Taichi offline cache off. `taichi` is a hand-written "
             "closed-form kernel; `value` is the function itself (`td.function(f)(x)`). Written by "
             "`python bench/compile_scaling.py`.", "",
             "| workload | n | " + " | ".join(f"{p} first" for p in peers) + " | "
             + " | ".join(f"{p} warm" for p in peers) + " | tidiff / JAX first |",
             "|---|---" + "|---" * (2 * len(peers) + 1) + "|"]
    for r in rows:
        firsts = [_cell(r[p]) if p in r else "" for p in peers]
        warms = [_cell(r[p], "warm") if p in r else "" for p in peers]
        ratio = ""
        if "first" in r.get("tidiff", {}) and "first" in r.get("jax", {}):
            ratio = f"{r['tidiff']['first'] / r['jax']['first']:.1f}x"
        lines.append(f"| {r['workload']} | {r['n']} | " + " | ".join(firsts) + " | " + " | ".join(warms)
                     + f" | {ratio} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot(rows: list[dict], path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no plot")
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, workload in zip(axes, ("hessian", "jacobian"), strict=True):
        for peer, style in (("tidiff", "o-"), ("jax", "s--"), ("taichi", "^:")):
            pts = [(r["n"], r[peer]["first"]) for r in rows
                   if r["workload"] == workload and "first" in r.get(peer, {})]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, label=peer)
        ax.set(title=f"{workload}: first call (B = {B})", xlabel="n (inputs per element)", ylabel="seconds")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print("wrote", path)


def offline_cache(args: argparse.Namespace) -> None:
    cache_dir = tempfile.mkdtemp(prefix="tidiff_cache_")
    for workload in args.workloads.split(","):
        n = 8 if workload == "mlp" else 32
        first = measure("tidiff", workload, n, cache_dir)
        second = measure("tidiff", workload, n, cache_dir)
        print(f"{workload} n={n}: first process {_cell(first)}, second process {_cell(second)}", flush=True)


if __name__ == "__main__":
    main()
