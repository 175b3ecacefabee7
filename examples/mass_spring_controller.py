"""A DiffTaichi-style mass-spring robot: learn the actuation that brings its tip to a target.

Masses in a triangle strip are joined by springs; each spring is a muscle whose rest length a
controller changes over time, ``act[s](t) = tanh(sum_j w[s, j] sin(omega t + phase_j) + b[s])``.
The simulation is a step over state fields without a time axis, looped by ``td.scan`` (gradients
by checkpointing: memory grows as sqrt(T), not T); the step index is an integer carry. The loss,
the squared distance from the tip to a target after T steps, is a second program composed with
the loop (``td.compose``). Plain gradient descent on (w, b) makes it fall.
"""
import numpy as np
import taichi as ti

import tidiff as td

ti.init(arch=ti.cpu, default_fp=ti.f64, log_level=ti.WARN)

N_MASSES, STEPS, DT, WAVES = 6, 120, 0.01, 3
STIFFNESS, DAMPING, OMEGA = 60.0, 0.99, 10.0

pos = np.array([[0.5 * i, 0.4 * (i % 2)] for i in range(N_MASSES)])
ends = np.array([(i, i + 1) for i in range(N_MASSES - 1)] + [(i, i + 2) for i in range(N_MASSES - 2)], np.int32)
N_SPRINGS = len(ends)

x, v = ti.Vector.field(2, ti.f64, N_MASSES), ti.Vector.field(2, ti.f64, N_MASSES)
x_next, v_next = ti.Vector.field(2, ti.f64, N_MASSES), ti.Vector.field(2, ti.f64, N_MASSES)
t, t_next = ti.field(ti.i32, ()), ti.field(ti.i32, ())
force = ti.Vector.field(2, ti.f64, N_MASSES)
w, b = ti.field(ti.f64, (N_SPRINGS, WAVES)), ti.field(ti.f64, N_SPRINGS)
spring_ends, rest = ti.Vector.field(2, ti.i32, N_SPRINGS), ti.field(ti.f64, N_SPRINGS)
target, loss = ti.Vector.field(2, ti.f64, ()), ti.field(ti.f64, ())
spring_ends.from_numpy(ends)
rest.from_numpy(np.linalg.norm(pos[ends[:, 0]] - pos[ends[:, 1]], axis=1))
target[None] = [pos[-1, 0] - 0.3, pos[-1, 1] + 0.4]


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
        pinned = 1.0 if i < 2 else 0.0                    # the first two masses hold the robot in place
        v_next[i] = (1 - pinned) * (DAMPING * v[i] + DT * force[i])
        x_next[i] = x[i] + DT * v_next[i]


@ti.kernel
def tick():
    t_next[None] = t[None] + 1


def step():
    muscles()
    advance()
    tick()


@ti.kernel
def tip_distance():
    loss[None] += (x[N_MASSES - 1] - target[None]).norm_sqr()


def main():
    sim = td.scan(td.function(step, inputs=[x, v, t, w, b], outputs=[x_next, v_next, t_next], state=[force]),
                  length=STEPS)
    objective = td.compose(td.function(tip_distance, inputs=[x, v, t], outputs=[loss]), sim)
    value_and_grad = td.value_and_grad(objective, argnums=(3, 4))

    rng = np.random.default_rng(0)
    params = [0.1 * rng.normal(size=(N_SPRINGS, WAVES)), np.zeros(N_SPRINGS)]
    state0 = (pos, np.zeros_like(pos), 0)
    first = None
    for iteration in range(10):
        value, grads = value_and_grad(*state0, *params)
        first = value if first is None else first
        print(f"iteration {iteration}: loss {value:.3e}")
        params = [p - 0.5 * g for p, g in zip(params, grads, strict=True)]
    final = objective(*state0, *params)
    print(f"loss decreased from {first:.3e} to {final:.3e}")
    assert final < 0.5 * first


if __name__ == "__main__":
    main()
