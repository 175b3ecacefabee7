"""A mass-spring arm learns to follow a moving target: a loss over the whole trajectory, by per-step outputs.

The arm of examples/mass_spring_controller.py (springs as muscles driven by sine waves) now
tracks a target moving on a circle. Each step reports the squared distance from the tip to where
the target is at that step: a per-step output (``td.scan(..., per_step=1)``, ``jax.lax.scan``'s
``ys``), so the loop returns all of them and the loss, their mean over the 500 steps, needs no
accumulator field. One ``td.vjp`` gives the loss and its gradient by the controller's weights;
memory stays at sqrt(T) carries however long the loop.
"""
import numpy as np
import taichi as ti

import tidiff as td

ti.init(arch=ti.cpu, default_fp=ti.f64, log_level=ti.WARN)

N_MASSES, STEPS, DT, WAVES = 6, 500, 0.01, 3
STIFFNESS, DAMPING, OMEGA = 60.0, 0.99, 2.0

pos = np.array([[0.5 * i, 0.4 * (i % 2)] for i in range(N_MASSES)])
ends = np.array([(i, i + 1) for i in range(N_MASSES - 1)] + [(i, i + 2) for i in range(N_MASSES - 2)], np.int32)
N_SPRINGS = len(ends)
CENTRE, RADIUS = pos[-1] + np.array([-0.2, 0.2]), 0.25

x, v = ti.Vector.field(2, ti.f64, N_MASSES), ti.Vector.field(2, ti.f64, N_MASSES)
x_next, v_next = ti.Vector.field(2, ti.f64, N_MASSES), ti.Vector.field(2, ti.f64, N_MASSES)
t, t_next = ti.field(ti.i32, ()), ti.field(ti.i32, ())
force = ti.Vector.field(2, ti.f64, N_MASSES)
w, b = ti.field(ti.f64, (N_SPRINGS, WAVES)), ti.field(ti.f64, N_SPRINGS)
spring_ends, rest = ti.Vector.field(2, ti.i32, N_SPRINGS), ti.field(ti.f64, N_SPRINGS)
gap = ti.field(ti.f64, ())
spring_ends.from_numpy(ends)
rest.from_numpy(np.linalg.norm(pos[ends[:, 0]] - pos[ends[:, 1]], axis=1))


@ti.kernel
def muscles():
    for s in range(N_SPRINGS):
        drive = b[s]
        for j in ti.static(range(WAVES)):
            drive += w[s, j] * ti.sin(OMEGA * t[None] * DT + 2 * np.pi * j / WAVES)
        a, c = spring_ends[s][0], spring_ends[s][1]
        d = x[c] - x[a]
        length = d.norm()
        f = STIFFNESS * (length - rest[s] * (1 + 0.2 * ti.tanh(drive))) * d / length
        force[a] += f
        force[c] -= f


@ti.kernel
def advance():
    for i in x:
        pinned = 1.0 if i < 2 else 0.0                    # the first two masses hold the arm in place
        v_next[i] = (1 - pinned) * (DAMPING * v[i] + DT * force[i])
        x_next[i] = x[i] + DT * v_next[i]


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
for iteration in range(10):
    (_, _, _, gaps), vjp_fn = td.vjp(arm, *state0, *params)
    loss = gaps.mean()
    first = loss if first is None else first
    *_, dw, db = vjp_fn((np.zeros_like(pos), np.zeros_like(pos), np.zeros((), np.int32), mean_of_gaps))
    scale = 0.1 / max(np.abs(dw).max(), np.abs(db).max())  # a normalized gradient step
    params = [params[0] - scale * dw, params[1] - scale * db]
    print(f"iteration {iteration}: mean squared distance over {STEPS} steps {loss:.4e}")
final = arm(*state0, *params)[3].mean()
print(f"loss decreased from {first:.4e} to {final:.4e}")
assert final < 0.5 * first
