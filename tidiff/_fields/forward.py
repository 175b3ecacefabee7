"""Drive ``ti.ad.FwdMode`` past its limits: several inputs, any field kind, float64 tangents.

NOTE: [FwdMode workaround] ``FwdMode`` takes one scalar ``param`` and a
seed list it casts to float32, and clears every dual in the process on
entry. tidiff writes the tangents straight into the input twins' ``.dual``
*before* entering, then enters with ``param`` (and ``loss``, only checked to
be a ScalarField) set to a 0-D field of its own seeded with 0.0 and
``clear_gradients=False``: every kernel launched inside runs its
forward-mode version and carries the tangents already in place, in the
field's own precision. Everything launched inside is forward-transformed,
``from_numpy``/``fill`` included, so all data movement happens outside.

NOTE: [forward mode needs scalarized matrices] Taichi 1.7.4's forward-mode
pass mishandles matrix-typed values unless they are scalarized first:
``A @ v`` silently gets a zero tangent, and ``v * s`` or ``ti.Vector([a, b])``
over fields with duals fails to compile (``UnaryOpStmt ... AllocaStmt``).
With ``force_scalarize_matrix`` both are exact, so tidiff turns that option
on while its forward-mode kernels compile and run, and restores it after.
"""
import contextlib

import taichi as ti
from taichi.lang import impl


class _GuardedFwdMode(ti.ad.FwdMode):
    """``FwdMode`` that first asks the launch guard (see :class:`.tape.LaunchGuard`)."""

    def __init__(self, seed, guard):
        super().__init__(loss=seed, param=seed, seed=[0.0], clear_gradients=False)
        self._guard = guard

    def insert(self, func):
        self._guard.check(func)
        super().insert(func)

    def recover_kernels(self):
        """Restore each kernel's own mode, also for kernels launched several times.

        Taichi restores in launch order, so a kernel launched twice ends in the
        mode saved at its second launch: FORWARD, for good. Last first fixes it.
        """
        for func, mode in reversed(list(zip(self.calls, self.modes))):
            func.autodiff_mode = mode
        self.kernels_recovered = True


@contextlib.contextmanager
def _scalarized_matrices():
    """Compile with ``force_scalarize_matrix`` on (see NOTE: [forward mode needs scalarized matrices])."""
    config = impl.current_cfg()
    previous = config.force_scalarize_matrix
    config.force_scalarize_matrix = True
    try:
        yield
    finally:
        config.force_scalarize_matrix = previous


@contextlib.contextmanager
def forward_mode(seed, guard):
    """Run the body with every kernel launch forward-transformed (see NOTE: [FwdMode workaround])."""
    with _scalarized_matrices(), _GuardedFwdMode(seed, guard):
        yield
