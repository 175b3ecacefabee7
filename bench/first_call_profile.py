"""What tidiff does on a first call: how many of its functions run, in how many modules.

``python bench/first_call_profile.py`` profiles ``td.grad(f)(x)`` for the README's ``f`` in a fresh
process (Taichi's offline cache off) and prints the calls into tidiff's own code: their number, the
distinct functions, the modules they sit in, and how many calls generate or compile code (the tangent
and reverse transforms, ``compile_source``). ``--top N`` lists the N modules with the most calls.
"""

import argparse
import cProfile
import os
import pstats

import numpy as np
import taichi as ti

import tidiff as td


@ti.func
def f(x: ti.math.vec3, s: ti.f64) -> ti.f64:
    return s * x.dot(x) + ti.sin(x[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=0, help="list the N modules with the most calls")
    args = parser.parse_args()
    ti.init(arch=ti.cpu, default_fp=ti.f64, offline_cache=False, log_level=ti.WARN)
    x = np.random.default_rng(0).random((4, 3))
    profiler = cProfile.Profile()
    profiler.enable()
    td.grad(f)(x, 2.0)
    profiler.disable()
    root = os.path.dirname(td.__file__)
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    calls, functions, by_module = 0, 0, {}
    for (filename, _, _), (_, ncalls, *_rest) in stats.items():
        if filename.startswith(root):
            module = os.path.relpath(filename, root)
            calls += ncalls
            functions += 1
            by_module[module] = by_module.get(module, 0) + ncalls
    generated = sum(v[1] for (fn, _, name), v in stats.items() if fn.startswith(root) and name in (
        "jvp_func", "vjp_func", "compile_source"))
    tangents = sum(v[1] for (fn, _, name), v in stats.items() if fn.startswith(root) and name == "jvp_func")
    print(f"td.grad(f)(x), first call: {calls} calls to {functions} tidiff functions in {len(by_module)} modules")
    print(f"  jvp_func {tangents} calls; jvp_func + vjp_func + compile_source: {generated} calls")
    for module, n in sorted(by_module.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {n:6d}  {module}")


if __name__ == "__main__":
    main()
