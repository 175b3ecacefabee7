"""The environment of a test's child process: this checkout first on PYTHONPATH, then what was there."""
import os
import pathlib

ROOT = pathlib.Path(__file__).parents[1]


def child_env(**extra: str) -> dict[str, str]:
    """``os.environ`` with ``extra`` set and the repository root put *before* PYTHONPATH: replacing it lost
    packages that came by PYTHONPATH (taichi on the GPU machine, installed with ``pip --target``)."""
    path = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return dict(os.environ, PYTHONPATH=path, **extra)
