"""First-call and warm time of ``td.grad`` of a function with a runtime loop, by input size.

Every cell runs in a fresh process with Taichi's offline cache off, as
``compile_scaling.py`` does. The function is a small recurrence over the
entries of its input (B = 1000 elements, float64)::

    h = 0.5 x;  for i in range(m): h = tanh(h * x[i] + 0.1);  return h . x

with ``m = n`` an integer argument: a runtime loop. ``td.grad`` of it pushes one
tangent per input component (NOTE: [Loops in reverse cost their square] in
``tidiff/_modes.py``); ``tidiff-reverse`` times the same gradient in reverse mode
(one reverse call, recomputing the loop), reached through a ``td.custom_vjp``
identity without a jvp rule, where forward mode is impossible. Run it against
another checkout to compare::

    PYTHONPATH=. python bench/reverse_loops.py --sizes 8,32 --jax   # this checkout
    PYTHONPATH=/work/main python bench/reverse_loops.py            # another tidiff
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

B = 1000
SOURCE = '''
import taichi as ti

@ti.func
def f(x: ti.types.vector({n}, ti.f64), m: ti.i32) -> ti.f64:
    h = 0.5 * x
    for i in range(m):
        h = ti.tanh(h * x[i] + 0.1)
    return h.dot(x)

import tidiff as td

@td.custom_vjp
@ti.func
def reverse_only(x: ti.types.vector({n}, ti.f64)) -> ti.types.vector({n}, ti.f64):
    return x

@reverse_only.defvjp
@ti.func
def reverse_only_bwd(x, ct):
    return (ct,)

@ti.func
def f_reverse(x: ti.types.vector({n}, ti.f64), m: ti.i32) -> ti.f64:
    return f(reverse_only(x), m)
'''


def _jax_grad(n: int, x: np.ndarray):
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)

    def f(v):
        def step(h, xi):
            return jnp.tanh(h * xi + 0.1), None
        h, _ = jax.lax.scan(step, 0.5 * v, v)
        return h.dot(v)

    fn = jax.jit(jax.vmap(jax.grad(f)))
    xj = jnp.asarray(x)
    return lambda: np.asarray(fn(xj).block_until_ready())


def child(peer: str, n: int) -> dict:
    x = np.random.default_rng(0).standard_normal((B, n)) * 0.5
    if peer == "jax":
        call = _jax_grad(n, x)
        how = "jax.jit(jax.vmap(jax.grad(f))) with lax.scan"
    else:
        import taichi as ti

        ti.init(arch=ti.cpu, default_fp=ti.f64, offline_cache=False)
        import tidiff as td

        path = os.path.join(tempfile.mkdtemp(), f"reverse_loops_{n}.py")
        with open(path, "w") as file:
            file.write(SOURCE.format(n=n))
        namespace: dict = {"__name__": f"reverse_loops_{n}"}
        exec(compile(SOURCE.format(n=n), path, "exec", dont_inherit=True), namespace)
        f = namespace["f_reverse" if peer == "tidiff-reverse" else "f"]
        m = np.full(B, n, dtype=np.int32)
        call = lambda: td.grad(f)(x, m)  # noqa: E731
        how = "reverse" if "f_vjp(" in td.source(td.grad(f), x, m) else "forward pushes"
    first, warm, result = first_and_warm(call, 7)
    return {"first": first, "warm": warm, "how": how,
            "checksum": float(np.sum(result * np.cos(np.arange(result.size).reshape(result.shape))))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8,32")
    ap.add_argument("--jax", action="store_true", help="also time JAX")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        peer, n = json.loads(args.child)
        print(json.dumps(child(peer, n)))
        return
    import tidiff

    print(f"tidiff from {os.path.dirname(tidiff.__file__)}, B = {B}, float64, offline cache off")
    print("| peer | n | first call (s) | warm (ms) | how | checksum |")
    print("|---|---|---|---|---|---|")
    for n in [int(s) for s in args.sizes.split(",")]:
        for peer in ["tidiff", "tidiff-reverse"] + (["jax"] if args.jax else []):
            out = subprocess.run([sys.executable, __file__, "--child", json.dumps([peer, n])], capture_output=True,
                                 text=True, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
            if out.returncode:
                print(f"| {peer} | {n} | failed | | {out.stderr.strip().splitlines()[-1]} | |")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"| {peer} | {n} | {r['first']:.2f} | {1e3 * r['warm']:.2f} | {r['how']} | {r['checksum']:.12g} |",
                  flush=True)


if __name__ == "__main__":
    main()
