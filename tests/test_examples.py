"""Every example runs (a smoke test): each in its own process, as a user would run it."""
import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).parents[1] / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    result = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip(), "an example should print what it shows"


OPTIMIZING = [p for p in EXAMPLES if p.stem in ("mass_spring_controller", "wave_inverse")]
assert len(OPTIMIZING) == 2


@pytest.mark.parametrize("path", OPTIMIZING, ids=[p.stem for p in OPTIMIZING])
def test_optimizing_examples_lower_their_loss(path):
    """The DiffTaichi-style examples print 'loss decreased from A to B': B must be below A."""
    import re

    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    result = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    found = re.search(r"loss decreased from (\S+) to ([^;\s]+)", result.stdout)
    assert found, result.stdout
    first, last = float(found.group(1)), float(found.group(2))
    assert last < first, result.stdout
