"""The mass-spring system of tests/mass_spring.py in NVIDIA Warp (float64, CPU), reversed by ``wp.Tape``.

Written as a Warp user writes a differentiable simulation: one state array per step (``x[t]``, ``v[t]``,
``force[t]``), the step's kernels launched ``T`` times under a tape, ``tape.backward(loss)``. Same layout,
stiffnesses, damping and loss as the Taichi programs, so gradients agree to rounding.
"""
import numpy as np
import warp as wp

DT = 0.01
DAMPING = 0.995

wp.config.quiet = True


@wp.kernel
def springs(x: wp.array(dtype=wp.vec2d), k: wp.array(dtype=wp.float64), ends: wp.array(dtype=wp.vec2i),
            rest: wp.array(dtype=wp.float64), force: wp.array(dtype=wp.vec2d)):
    s = wp.tid()
    a = ends[s][0]
    b = ends[s][1]
    d = x[b] - x[a]
    length = wp.length(d)
    f = k[s] * (length - rest[s]) * d / length
    wp.atomic_add(force, a, f)
    wp.atomic_sub(force, b, f)


@wp.kernel
def advance(x: wp.array(dtype=wp.vec2d), v: wp.array(dtype=wp.vec2d), force: wp.array(dtype=wp.vec2d),
            x_next: wp.array(dtype=wp.vec2d), v_next: wp.array(dtype=wp.vec2d)):
    i = wp.tid()
    vn = wp.float64(DAMPING) * v[i] + wp.float64(DT) * (force[i] + wp.vec2d(wp.float64(0.0), wp.float64(-1.0)))
    v_next[i] = vn
    x_next[i] = x[i] + wp.float64(DT) * vn


@wp.kernel
def final_loss(x: wp.array(dtype=wp.vec2d), v: wp.array(dtype=wp.vec2d), weights: wp.array(dtype=wp.vec2d),
               loss: wp.array(dtype=wp.float64)):
    i = wp.tid()
    wp.atomic_add(loss, 0, wp.dot(weights[i], x[i]) + wp.float64(0.1) * wp.dot(v[i], v[i]))


class WarpMassSpring:
    """``gradients(x0, v0, k) -> (loss, dx0, dv0, dk)`` over ``steps`` steps, the trajectory stored."""

    def __init__(self, ends, rest, weights, steps, device="cpu"):
        n = len(weights)
        self.n, self.steps, self.device = n, steps, device
        self.ends = wp.array(ends, dtype=wp.vec2i, device=device)
        self.rest = wp.array(rest, dtype=wp.float64, device=device)
        self.weights = wp.array(weights, dtype=wp.vec2d, device=device)

        def states(count):
            return [wp.zeros(n, dtype=wp.vec2d, device=device, requires_grad=True) for _ in range(count)]

        self.x, self.v, self.force = states(steps + 1), states(steps + 1), states(steps)
        self.k = wp.zeros(len(rest), dtype=wp.float64, device=device, requires_grad=True)
        self.loss = wp.zeros(1, dtype=wp.float64, device=device, requires_grad=True)

    def gradients(self, x0, v0, k):
        self.x[0].assign(wp.array(x0, dtype=wp.vec2d, device=self.device))
        self.v[0].assign(wp.array(v0, dtype=wp.vec2d, device=self.device))
        self.k.assign(wp.array(k, dtype=wp.float64, device=self.device))
        for f in self.force:
            f.zero_()
        self.loss.zero_()
        tape = wp.Tape()
        with tape:
            for t in range(self.steps):
                wp.launch(springs, dim=len(k), inputs=[self.x[t], self.k, self.ends, self.rest, self.force[t]],
                          device=self.device)
                wp.launch(advance, dim=self.n, inputs=[self.x[t], self.v[t], self.force[t]],
                          outputs=[self.x[t + 1], self.v[t + 1]], device=self.device)
            wp.launch(final_loss, dim=self.n, inputs=[self.x[self.steps], self.v[self.steps], self.weights],
                      outputs=[self.loss], device=self.device)
        tape.backward(self.loss)
        result = tuple(np.array(r, dtype=np.float64)  # copies: a CPU array's numpy() is a view
                       for r in (self.loss.numpy()[0], self.x[0].grad.numpy(), self.v[0].grad.numpy(),
                                 self.k.grad.numpy()))
        tape.zero()
        return result
