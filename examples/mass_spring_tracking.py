"""A mass-spring arm learns to follow a moving target: a loss over the whole trajectory, by per-step outputs.

The arm of examples/mass_spring_controller.py (springs as muscles driven by sine waves, imported
from there) now tracks a target moving on a circle at the muscles' frequency. Each step reports
the squared distance from the tip to where the target is at that step: a per-step output
(``td.scan(..., per_step=1)``, ``jax.lax.scan``'s ``ys``), so the loop returns all of them and
the loss, their mean over the 300 steps, needs no accumulator field. One ``td.vjp`` gives the
loss and its gradient by the controller's weights; memory stays at sqrt(T) carries however long
the loop.
"""
import numpy as np
import taichi as ti
from mass_spring_controller import (  # the arm: its fields, muscles and integrator
    DT,
    N_MASSES,
    N_SPRINGS,
    OMEGA,
    WAVES,
    advance,
    b,
    force,
    muscles,
    pos,
    t,
    t_next,
    v,
    v_next,
    w,
    x,
    x_next,
)

import tidiff as td

STEPS = 300
CENTRE, RADIUS = pos[-1] + np.array([-0.2, 0.2]), 0.25
gap = ti.field(ti.f64, ())


@ti.kernel
def track():
    angle = OMEGA * (t[None] + 1) * DT
    goal = ti.Vector([CENTRE[0] + RADIUS * ti.cos(angle), CENTRE[1] + RADIUS * ti.sin(angle)])
    gap[None] = (x_next[N_MASSES - 1] - goal).norm_sqr()
    t_next[None] = t[None] + 1


def step():
    muscles()
    advance()
    track()


arm = td.scan(td.function(step, inputs=[x, v, t, w, b], outputs=[x_next, v_next, t_next, gap], state=[force]),
              length=STEPS, per_step=1)                   # gap: read at every step

rng = np.random.default_rng(0)
params = [0.1 * rng.normal(size=(N_SPRINGS, WAVES)), np.zeros(N_SPRINGS)]
state0 = (pos, np.zeros_like(pos), 0)
mean_of_gaps = np.full(STEPS, 1 / STEPS)                 # the loss's cotangent on the per-step gaps
first = loss = None
for iteration in range(8):
    (_, _, _, gaps), vjp_fn = td.vjp(arm, *state0, *params)
    loss = gaps.mean()
    first = loss if first is None else first
    *_, dw, db = vjp_fn((np.zeros_like(pos), np.zeros_like(pos), np.zeros((), np.int32), mean_of_gaps))
    scale = 0.05 / max(np.abs(dw).max(), np.abs(db).max())  # a normalized gradient step
    params = [params[0] - scale * dw, params[1] - scale * db]
    print(f"iteration {iteration}: mean squared distance over {STEPS} steps {loss:.4e}")
final = arm(*state0, *params)[3].mean()
print(f"loss decreased from {first:.4e} to {final:.4e}")
assert final < 0.5 * first
