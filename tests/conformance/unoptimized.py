"""A program by tidiff with Taichi's optimizer off, in a process of its own: its value, or its derivatives.

Programs calling transforms (``td.grad``, ``td.jvp`` in the function) run
tidiff's code in any kernel, so Taichi alone cannot say whether their value's
disagreement with the twin is tidiff's fault (NOTE: [Taichi pitfalls] in
``checks``). Taichi's optimizer miscompiles some programs (docs/limits.md: a
literal of a local's entries with the local written around it, in a runtime
loop): where tidiff's value with ``advanced_optimization=False`` agrees with
the twin, the optimizer is at fault (long run, seeds 9924 and 10407: the same
program with the transform call replaced by a plain func that returns 0 gives
the same wrong value, no tidiff involved). Such a pitfall may sit in tidiff's
generated code as well as in the user's: the pitfall log keeps each one. So
with derivatives: tidiff's tangent and reverse code of a field program whose
value was right disagreed with torch and central differences, and agreed
with both with the optimizer off (long run, seed 93014; reduced to Taichi
alone in tests/test_taichi_pitfalls.py).

Run as ``python -m tests.conformance.unoptimized FOLDER [NAME]``: with
``NAME`` (by :func:`values_without_optimizer`), ``FOLDER`` holds
``program.py`` and ``args.npz`` and the value's leaves are written to
``out.npz``; without (by :func:`passes_without_optimizer`), ``FOLDER``
holds ``check.pkl`` and ``agrees`` or ``differs`` is written to ``verdict``.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class RecheckFailed(Exception):
    """The process with the optimizer off ended in an error of its own: it says nothing of the program's numbers
    (not a RuntimeError, which the net may take for a Taichi error it knows)."""


def values_without_optimizer(text: str, name: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The leaves of ``td.function(name)(*arrays)`` for the program ``text``, compiled without Taichi's optimizer."""
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "program.py"), "w") as f:
            f.write(text)
        np.savez(os.path.join(folder, "args.npz"), *arrays)
        _run(folder, name)
        with np.load(os.path.join(folder, "out.npz")) as out:
            return [out[f"arr_{k}"] for k in range(len(out.files))]


def passes_without_optimizer(module: str, check: str, case: Any, *args: Any) -> bool:
    """Whether ``module.check(case, *args)`` (``case`` built anew from its program and arguments) finds every
    derivative equal to torch's with Taichi's optimizer off: False where it raises a ``Mismatch``; another
    error is the recheck's own: :class:`RecheckFailed`."""
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "check.pkl"), "wb") as f:
            pickle.dump((module, check, case.program, case.arrays, case.as_float, args), f)
        _run(folder)
        with open(os.path.join(folder, "verdict")) as f:
            return f.read() == "agrees"


def _run(folder: str, *name: str) -> None:
    done = subprocess.run([sys.executable, "-m", "tests.conformance.unoptimized", folder, *name], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RecheckFailed(f"with Taichi's optimizer off, in a process of its own (exit {done.returncode}):\n"
                            f"{done.stderr[-4000:]}")


def main() -> None:
    folder, *name = sys.argv[1:]
    import taichi as ti

    ti.init(arch=ti.cpu, default_fp=ti.f64, advanced_optimization=False, offline_cache=False, log_level=ti.ERROR)
    sys.path.insert(0, os.path.join(ROOT, "tests"))  # the library's custom functions, as under pytest
    if name:
        value_of(folder, name[0])
    else:
        recheck(folder)


def value_of(folder: str, name: str) -> None:
    import tidiff as td
    from tests.conformance import render_taichi
    from tests.conformance.oracle import leaves

    with open(os.path.join(folder, "program.py")) as f:
        fn = render_taichi.compile_text(f.read(), name, render_taichi.namespace(), "unoptimized")
    with np.load(os.path.join(folder, "args.npz")) as args:
        arrays = [args[f"arr_{k}"] for k in range(len(args.files))]
    value = td.function(fn)(*arrays)
    np.savez(os.path.join(folder, "out.npz"), *[np.asarray(v, dtype=np.float64) for v in leaves(value)])


def recheck(folder: str) -> None:
    import importlib

    with open(os.path.join(folder, "check.pkl"), "rb") as f:
        module_name, check, program, arrays, as_float, args = pickle.load(f)  # the program's classes are those
        # of the module's package, as pickled
    module = importlib.import_module(module_name)
    package = module_name.rpartition(".")[0]
    cases = importlib.import_module(f"{package}.cases")
    compare = importlib.import_module(f"{package}.compare")
    try:
        getattr(module, check)(cases.Case(program, arrays, as_float), *args)
        verdict = "agrees"
    except compare.Mismatch:
        verdict = "differs"
    with open(os.path.join(folder, "verdict"), "w") as f:
        f.write(verdict)


if __name__ == "__main__":
    main()
