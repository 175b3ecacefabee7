"""A process holding as many trees of fields as Taichi allows: tidiff refuses one more, by name, instead of the
segfault Taichi 1.7.4 gives at the 513th (NOTE: [Trees a process holds] in tidiff/_fields/twins.py).

The conformance net found it: a run of 100 field programs in one process died in ``from_numpy``.
"""
import subprocess
import sys

from child_env import child_env

SCRIPT = """
import numpy as np, taichi as ti
ti.init(arch=ti.cpu, default_fp=ti.f64, log_level=ti.ERROR)
import tidiff as td
from taichi.lang import impl

x = ti.field(ti.f64, shape=4)
loss = ti.field(ti.f64, shape=())

@ti.kernel
def total():
    for i in x:
        loss[None] += x[i] ** 2

F = td.function(total, inputs=[x], outputs=[loss])
assert td.grad(F)(np.ones(4)).tolist() == [2.0] * 4
while impl.get_runtime().prog.get_snode_tree_size() < 512:   # the user's own trees, up to Taichi's limit
    ti.field(ti.f64, shape=2).fill(0.0)
try:
    td.function(total, inputs=[x], outputs=[loss])
except RuntimeError as e:
    print("refused:", e)
assert td.grad(F)(np.ones(4)).tolist() == [2.0] * 4        # what was made before still runs
print("ok")
"""


def test_one_tree_past_taichi_s_limit_is_refused_and_the_process_lives(tmp_path):
    script = tmp_path / "trees.py"
    script.write_text(SCRIPT)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=child_env(), timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "refused: td.function(total): Taichi holds at most 512 trees of fields in a process and this one has 512" \
        in run.stdout, run.stdout
    assert run.stdout.rstrip().endswith("ok")
