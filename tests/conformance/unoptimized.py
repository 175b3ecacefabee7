"""A program's value by tidiff with Taichi's optimizer off, in a process of its own.

Programs calling transforms (``td.grad``, ``td.jvp`` in the function) run
tidiff's code in any kernel, so Taichi alone cannot say whether their value's
disagreement with the twin is tidiff's fault (NOTE: [Taichi pitfalls] in
``checks``). Taichi's optimizer miscompiles some programs (docs/limits.md: a
literal of a local's entries with the local written around it, in a runtime
loop): where tidiff's value with ``advanced_optimization=False`` agrees with
the twin, the optimizer is at fault (long run, seeds 9924 and 10407: the same
program with the transform call replaced by a plain func that returns 0 gives
the same wrong value, no tidiff involved). Such a pitfall may sit in tidiff's
generated code as well as in the user's: the pitfall log keeps each one.

Run as ``python -m tests.conformance.unoptimized FOLDER NAME`` (by
:func:`values_without_optimizer`): ``FOLDER`` holds ``program.py`` and
``args.npz``; the value's leaves are written to ``out.npz``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def values_without_optimizer(text: str, name: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The leaves of ``td.function(name)(*arrays)`` for the program ``text``, compiled without Taichi's optimizer."""
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "program.py"), "w") as f:
            f.write(text)
        np.savez(os.path.join(folder, "args.npz"), *arrays)
        subprocess.run([sys.executable, "-m", "tests.conformance.unoptimized", folder, name], cwd=ROOT, check=True,
                       capture_output=True, timeout=600)
        with np.load(os.path.join(folder, "out.npz")) as out:
            return [out[f"arr_{k}"] for k in range(len(out.files))]


def main() -> None:
    folder, name = sys.argv[1:3]
    import taichi as ti

    ti.init(arch=ti.cpu, default_fp=ti.f64, advanced_optimization=False, offline_cache=False, log_level=ti.ERROR)
    sys.path.insert(0, os.path.join(ROOT, "tests"))  # the library's custom functions, as under pytest

    import tidiff as td
    from tests.conformance import render_taichi
    from tests.conformance.oracle import leaves

    with open(os.path.join(folder, "program.py")) as f:
        fn = render_taichi.compile_text(f.read(), name, render_taichi.namespace(), "unoptimized")
    with np.load(os.path.join(folder, "args.npz")) as args:
        arrays = [args[f"arr_{k}"] for k in range(len(args.files))]
    value = td.function(fn)(*arrays)
    np.savez(os.path.join(folder, "out.npz"), *[np.asarray(v, dtype=np.float64) for v in leaves(value)])


if __name__ == "__main__":
    main()
