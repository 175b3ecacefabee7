"""One Taichi runtime for the whole suite (float64, on-disk cache on) and a hypothesis profile."""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's idle threads otherwise spin beside Taichi's

import taichi as ti
from hypothesis import settings

ti.init(arch=ti.cpu, default_fp=ti.f64, offline_cache=True, log_level=ti.WARN)

# First launches compile kernels (tens of ms): no deadline, few but varied examples.
settings.register_profile("tidiff", deadline=None, max_examples=25, derandomize=True)
settings.load_profile("tidiff")
