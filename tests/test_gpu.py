"""Field programs, time loops, the examples and CUDA tensors in place on a CUDA GPU (issue 13, item 7; issue 38).

Taichi's ``ti.init`` follows the ``TI_ARCH`` environment variable, so the same
test files and examples run on the GPU in a process of their own with
``TI_ARCH=cuda``. Where Taichi finds no CUDA device (it falls back to the
CPU), the tests skip and say so.
"""
import functools
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[1]
GPU_FILES = ["tests/test_fields.py", "tests/test_fields_programs.py", "tests/test_fields_objects.py",
             "tests/test_fields_parts.py", "tests/test_scan.py", "tests/test_against_taichi_reverse.py"]
GPU_EXAMPLES = ["mass_spring_controller", "wave_inverse", "quickstart"]


def _env() -> dict[str, str]:
    return dict(os.environ, TI_ARCH="cuda", OMP_WAIT_POLICY="PASSIVE")


@functools.cache
def _cuda_arch() -> bool:
    """Whether ``ti.init`` with TI_ARCH=cuda starts on a CUDA device here (it falls back to the CPU if not)."""
    probe = "import taichi as ti; ti.init(); print('ARCH', ti.lang.impl.current_cfg().arch.name)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=_env())
    return "ARCH cuda" in result.stdout


needs_cuda = pytest.mark.skipif("not _cuda_arch()", reason="no CUDA device for Taichi here: "
                                "GPU runs are done on a machine with one (TI_ARCH=cuda)")


def test_the_probe_reads_the_arch_taichi_started_on():
    """On this machine's CPU fallback the probe must say so, not claim a GPU it has not got."""
    probe = "import taichi as ti; ti.init(); print('ARCH', ti.lang.impl.current_cfg().arch.name)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, TI_ARCH="x64"))
    assert "ARCH x64" in result.stdout, result.stdout + result.stderr


@needs_cuda
def test_field_programs_and_time_loops_on_cuda():
    run = ("import sys, pytest, taichi as ti; "
           "code = pytest.main(['-q', '-n', '0', '-p', 'no:cacheprovider', *sys.argv[1:]]); "
           "print('ARCH', ti.lang.impl.current_cfg().arch.name); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", run, *GPU_FILES], capture_output=True, text=True, timeout=3000,
                            env=_env(), cwd=ROOT)
    assert result.returncode == 0, result.stdout[-5000:]
    assert "ARCH cuda" in result.stdout, result.stdout[-2000:]


@needs_cuda
@pytest.mark.parametrize("name", GPU_EXAMPLES)
def test_examples_on_cuda(name):
    result = subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py")], capture_output=True, text=True,
                            timeout=600, env=_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "arch=cuda" in result.stdout + result.stderr


@needs_cuda
def test_cuda_tensors_in_place_through_every_kind():
    """tests/cuda_in_place.py: every transform, the torch operator and ndarray kernels on CUDA tensors, no host copy
    once warm (NOTE: [Tensors in place] in tidiff/_arrays.py)."""
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "cuda_in_place.py")], capture_output=True, text=True,
                            timeout=900, env=_env(), cwd=ROOT)
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout[-3000:] + result.stderr[-5000:]
