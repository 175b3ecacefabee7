"""Every example runs (a smoke test): each in its own process, as a user would run it."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).parents[1] / "examples").glob("*.py"))


OPTIMIZING = ("mass_spring_controller", "mass_spring_tracking", "wave_inverse")
"""The DiffTaichi-style examples print 'loss decreased from A to B': B must be below A."""
assert all((EXAMPLES[0].parent / f"{name}.py").exists() for name in OPTIMIZING)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    result = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip(), "an example should print what it shows"
    if path.stem in OPTIMIZING:
        found = re.search(r"loss decreased from (\S+) to ([^;\s]+)", result.stdout)
        assert found, result.stdout
        assert float(found.group(2)) < float(found.group(1)), result.stdout
