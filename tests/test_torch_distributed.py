"""DistributedDataParallel (gloo, two processes) over a td.torch.function operator trains to the
single-process parameters (issue 14, item 3)."""
import importlib.util
import pathlib
import subprocess
import sys

import torch
from child_env import child_env

WORKER = pathlib.Path(__file__).with_name("ddp_worker.py")


def _worker():
    spec = importlib.util.spec_from_file_location("ddp_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ddp_two_processes_equal_single_process(tmp_path):
    worker = _worker()
    single = worker.train(worker.Model())
    env = child_env(OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, str(WORKER), str(tmp_path)], capture_output=True, text=True, timeout=600,
                         env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    ddp = torch.load(tmp_path / "ddp.pt")
    state = single.state_dict()
    assert set(ddp) == set(state)
    for name, value in state.items():
        torch.testing.assert_close(ddp[name], value.detach(), rtol=1e-12, atol=1e-12)
    # the parameters moved: training is not a no-op
    assert not torch.allclose(state["s"], torch.tensor(0.3, dtype=torch.float64))
