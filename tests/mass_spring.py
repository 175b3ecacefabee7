"""A DiffTaichi-style mass-spring system, written twice: a step over state fields (for ``td.scan``)
and the stored trajectory (``(T + 1, n)`` fields, the way DiffTaichi writes it, for ``ti.ad.Tape``).

The masses form a chain of triangles; each spring's stiffness is a parameter. The loss is the
final positions weighted by a fixed vector (its gradient reaches every input).
"""
import numpy as np
import taichi as ti
from taped import tape

DT = 0.01
DAMPING = 0.995


def layout(n_masses):
    """Springs of a triangle strip: (a, b) pairs, with the rest lengths of a unit-spaced strip."""
    pos = np.array([[0.5 * i, 0.4 * (i % 2)] for i in range(n_masses)])
    ends = [(i, i + 1) for i in range(n_masses - 1)] + [(i, i + 2) for i in range(n_masses - 2)]
    rest = [np.linalg.norm(pos[a] - pos[b]) for a, b in ends]
    return pos, np.array(ends, np.int32), np.array(rest)


class MassSpring:
    """The system over state fields without a time axis: ``step`` maps ``(x, v, k)`` to ``(x_next, v_next)``."""

    def __init__(self, n_masses):
        pos, ends, rest = layout(n_masses)
        self.n, self.n_springs = n_masses, len(ends)
        self.x0 = pos
        self.x = ti.Vector.field(2, ti.f64, n_masses)
        self.v = ti.Vector.field(2, ti.f64, n_masses)
        self.x_next = ti.Vector.field(2, ti.f64, n_masses)
        self.v_next = ti.Vector.field(2, ti.f64, n_masses)
        self.force = ti.Vector.field(2, ti.f64, n_masses)
        self.k = ti.field(ti.f64, self.n_springs)
        self.ends = ti.Vector.field(2, ti.i32, self.n_springs)
        self.rest = ti.field(ti.f64, self.n_springs)
        self.weights = ti.Vector.field(2, ti.f64, n_masses)
        self.loss = ti.field(ti.f64, ())
        self.kinetic = ti.field(ti.f64, ())
        self.ends.from_numpy(ends)
        self.rest.from_numpy(rest)
        self.weights.from_numpy(np.stack([np.linspace(1, 2, n_masses), np.linspace(-1, 0.5, n_masses)], 1))
        x, v, x_next, v_next, force, k = self.x, self.v, self.x_next, self.v_next, self.force, self.k
        kinetic = self.kinetic
        ends_f, rest_f, weights, loss = self.ends, self.rest, self.weights, self.loss

        @ti.kernel
        def springs():
            for s in range(ends_f.shape[0]):
                a, b = ends_f[s][0], ends_f[s][1]
                d = x[b] - x[a]
                length = d.norm()
                f = k[s] * (length - rest_f[s]) * d / length
                force[a] += f
                force[b] -= f

        @ti.kernel
        def advance():
            for i in x:
                v_next[i] = DAMPING * v[i] + DT * (force[i] + ti.Vector([0.0, -1.0]))
                x_next[i] = x[i] + DT * v_next[i]

        @ti.kernel
        def final_loss():
            for i in x:
                loss[None] += weights[i].dot(x[i]) + 0.1 * v[i].norm_sqr()

        @ti.kernel
        def energy():
            for i in v_next:
                kinetic[None] += 0.5 * v_next[i].norm_sqr()

        def step():
            springs()
            advance()

        def step_and_energy():
            springs()
            advance()
            energy()

        self.step = step
        self.step_and_energy = step_and_energy
        self.final_loss = final_loss

    def step_function(self, td):
        return td.function(self.step, inputs=[self.x, self.v, self.k], outputs=[self.x_next, self.v_next],
                           state=[self.force])

    def step_and_energy_function(self, td):
        """The step with a per-step output: the kinetic energy after it."""
        return td.function(self.step_and_energy, inputs=[self.x, self.v, self.k],
                           outputs=[self.x_next, self.v_next, self.kinetic], state=[self.force])

    def torch_steps(self, torch, x, v, k, steps):
        """The same steps in torch: the final ``(x, v)`` and the kinetic energy after each step."""
        ends = torch.tensor(self.ends.to_numpy(), dtype=torch.long)
        rest = torch.tensor(self.rest.to_numpy())
        energies = []
        for _ in range(steps):
            d = x[ends[:, 1]] - x[ends[:, 0]]
            length = d.norm(dim=1, keepdim=True)
            f = k[:, None] * (length - rest[:, None]) * d / length
            force = torch.zeros_like(x).index_add(0, ends[:, 0], f).index_add(0, ends[:, 1], -f)
            v = DAMPING * v + DT * (force + torch.tensor([0.0, -1.0], dtype=x.dtype))
            x = x + DT * v
            energies.append(0.5 * (v * v).sum())
        return x, v, torch.stack(energies)

    def loss_function(self, td):
        return td.function(self.final_loss, inputs=[self.x, self.v], outputs=[self.loss])

    def arguments(self, seed=0):
        rng = np.random.default_rng(seed)
        return (self.x0 + 0.05 * rng.normal(size=self.x0.shape), 0.1 * rng.normal(size=(self.n, 2)),
                50.0 + 10 * rng.random(self.n_springs))


class Trajectory:
    """The same system with its trajectory stored, DiffTaichi's way: ``x[t]`` for every step ``t``."""

    def __init__(self, n_masses, steps, needs_grad=True):
        pos, ends, rest = layout(n_masses)
        self.n, self.steps = n_masses, steps
        flags = {"needs_grad": needs_grad}
        self.x = ti.Vector.field(2, ti.f64, (steps + 1, n_masses), **flags)
        self.v = ti.Vector.field(2, ti.f64, (steps + 1, n_masses), **flags)
        self.force = ti.Vector.field(2, ti.f64, (steps, n_masses), **flags)
        self.k = ti.field(ti.f64, len(ends), **flags)
        self.ends = ti.Vector.field(2, ti.i32, len(ends))
        self.rest = ti.field(ti.f64, len(ends))
        self.weights = ti.Vector.field(2, ti.f64, n_masses)
        self.loss = ti.field(ti.f64, (), **flags)
        self.ends.from_numpy(ends)
        self.rest.from_numpy(rest)
        self.weights.from_numpy(np.stack([np.linspace(1, 2, n_masses), np.linspace(-1, 0.5, n_masses)], 1))
        x, v, force, k, ends_f, rest_f = self.x, self.v, self.force, self.k, self.ends, self.rest
        weights, loss = self.weights, self.loss

        @ti.kernel
        def springs(t: ti.i32):
            for s in range(ends_f.shape[0]):
                a, b = ends_f[s][0], ends_f[s][1]
                d = x[t, b] - x[t, a]
                length = d.norm()
                f = k[s] * (length - rest_f[s]) * d / length
                force[t, a] += f
                force[t, b] -= f

        @ti.kernel
        def advance(t: ti.i32):
            for i in range(x.shape[1]):
                v[t + 1, i] = DAMPING * v[t, i] + DT * (force[t, i] + ti.Vector([0.0, -1.0]))
                x[t + 1, i] = x[t, i] + DT * v[t + 1, i]

        @ti.kernel
        def final_loss():
            for i in range(x.shape[1]):
                loss[None] += weights[i].dot(x[steps, i]) + 0.1 * v[steps, i].norm_sqr()

        def run():
            for t in range(steps):
                springs(t)
                advance(t)
            final_loss()

        self.run = run

    def tape_gradients(self, x0, v0, k0):
        """``(loss, dx0, dv0, dk)`` by ``ti.ad.Tape`` over the stored trajectory."""
        self.x.fill(0)
        self.v.fill(0)
        self.force.fill(0)
        x = np.zeros((self.steps + 1, self.n, 2))
        v = np.zeros_like(x)
        x[0], v[0] = x0, v0
        self.x.from_numpy(x)
        self.v.from_numpy(v)
        self.k.from_numpy(k0)
        with tape(self.loss, self.x, self.v, self.force, self.k):
            self.run()
        return self.loss[None], self.x.grad.to_numpy()[0], self.v.grad.to_numpy()[0], self.k.grad.to_numpy()

    def program(self, td):
        """tidiff's field program over the stored trajectory: ``(x[0], v[0], k) -> loss``."""
        return td.function(self.run, inputs=[td.part(self.x, 0), td.part(self.v, 0), self.k], outputs=[self.loss],
                           state=[self.force])
