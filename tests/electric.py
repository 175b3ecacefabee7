"""DiffTaichi's electric.py, written as published: a controller network steers a charged particle by eight
attractors; a stored trajectory of ``steps`` steps, a loss summed over them.

As published, ``nn1(t)`` reads ``x[t]`` and ``v[t]`` before ``advance(t)`` writes them: the controller sees
what the field held before the run (the last run's trajectory), and Taichi's reverse mode, which sees the
values ``advance`` wrote, gets the gradient wrong. ``current=False`` is the corrected program (``nn1`` reads
step ``t - 1``), which keeps Taichi's global data access rules. Used by tests/test_overwritten_values.py and
bench/overwritten.py; :func:`torch_loss` is the same program in torch.
"""
import math

import numpy as np
import taichi as ti
import torch

ATTRACTORS = [[0.1, 0.1], [0.1, 0.9], [0.9, 0.9], [0.9, 0.1], [0.5, 0.9], [0.5, 0.1], [0.1, 0.5], [0.9, 0.5]]
N_GRAVITATION = len(ATTRACTORS)
DT, DAMPING = 0.03, 0.2


class Electric:
    """The fields and kernels of one program; ``run()`` launches it; ``parameters`` are the network's fields."""

    def __init__(self, steps, n_hidden, strength=1e-3, current=True, dtype=ti.f64):
        self.steps, self.n_hidden, self.strength, self.current = steps, n_hidden, strength, current
        x = self.x = ti.Vector.field(2, dtype, steps, needs_grad=True)
        v = self.v = ti.Vector.field(2, dtype, steps, needs_grad=True)
        goal = self.goal = ti.Vector.field(2, dtype, steps)
        goal_v = self.goal_v = ti.Vector.field(2, dtype, steps)
        hidden = self.hidden = ti.field(dtype, (steps, n_hidden), needs_grad=True)
        gravitation = self.gravitation = ti.field(dtype, (steps, N_GRAVITATION), needs_grad=True)
        weight1 = self.weight1 = ti.field(dtype, (8, n_hidden), needs_grad=True)
        bias1 = self.bias1 = ti.field(dtype, n_hidden, needs_grad=True)
        weight2 = self.weight2 = ti.field(dtype, (n_hidden, N_GRAVITATION), needs_grad=True)
        bias2 = self.bias2 = ti.field(dtype, N_GRAVITATION, needs_grad=True)
        loss = self.loss = ti.field(dtype, (), needs_grad=True)
        self.parameters = [weight1, bias1, weight2, bias2]
        seen = 0 if current else 1  # the step nn1 reads is t - seen
        decay = math.exp(-DT * DAMPING)

        @ti.kernel
        def nn1(t: ti.i32):
            for i in range(n_hidden):
                act = 0.0
                act += (x[t - seen][0] - 0.5) * weight1[0, i]
                act += (x[t - seen][1] - 0.5) * weight1[1, i]
                act += v[t - seen][0] * weight1[2, i]
                act += v[t - seen][1] * weight1[3, i]
                act += (goal[t][0] - 0.5) * weight1[4, i]
                act += (goal[t][1] - 0.5) * weight1[5, i]
                act += (goal_v[t][0] - 0.5) * weight1[6, i]
                act += (goal_v[t][1] - 0.5) * weight1[7, i]
                act += bias1[i]
                hidden[t, i] = ti.tanh(act)

        @ti.kernel
        def nn2(t: ti.i32):
            for i in range(N_GRAVITATION):
                act = 0.0
                for j in ti.static(range(n_hidden)):
                    act += hidden[t, j] * weight2[j, i]
                act += bias2[i]
                gravitation[t, i] = ti.tanh(act)

        @ti.kernel
        def advance(t: ti.i32):
            for _ in range(1):
                force = ti.Vector([0.0, 0.0])
                for i in ti.static(range(N_GRAVITATION)):
                    r = x[t - 1] - ti.Vector(ATTRACTORS[i])
                    len_r = ti.max(r.norm(), 1e-1)
                    force += strength * gravitation[t, i] / (len_r * len_r * len_r) * r
                v[t] = v[t - 1] * decay + DT * force
                x[t] = x[t - 1] + DT * v[t]

        @ti.kernel
        def compute_loss(t: ti.i32):
            ti.atomic_add(loss[None], DT * (x[t] - goal[t]).norm_sqr())

        def run():
            for t in range(1, steps):
                nn1(t)
                nn2(t)
                advance(t)
                compute_loss(t)

        self.run = run

    def fill(self, seed=0):
        """Random network weights, a goal path, a start, and a trajectory left by an earlier run in x and v
        (what the published nn1 reads)."""
        rng = np.random.default_rng(seed)
        self.weight1.from_numpy((rng.random((8, self.n_hidden)) - 0.5) * 0.3)
        self.bias1.from_numpy(np.zeros(self.n_hidden))
        self.weight2.from_numpy((rng.random((self.n_hidden, N_GRAVITATION)) - 0.5) * 0.3)
        self.bias2.from_numpy(np.zeros(N_GRAVITATION))
        s = np.linspace(0.0, 1.0, self.steps)[:, None]
        start, end = rng.uniform(0.3, 0.7, 2), rng.uniform(0.3, 0.7, 2)
        self.goal.from_numpy((1 - s) * start + s * end)
        self.goal_v.from_numpy(np.broadcast_to(end - start, (self.steps, 2)).copy())
        self.x.from_numpy(rng.uniform(0.3, 0.7, (self.steps, 2)))
        self.v.from_numpy(rng.uniform(-0.1, 0.1, (self.steps, 2)))
        self.x_before, self.v_before = self.x.to_numpy(), self.v.to_numpy()

    def arrays(self):
        return [p.to_numpy() for p in self.parameters]

    def tape_gradients(self):
        """Taichi's own: the loss and the parameters' gradients under ti.ad.Tape (x and v as fill left them)."""
        self.x.from_numpy(self.x_before)
        self.v.from_numpy(self.v_before)
        self.loss[None] = 0.0
        with ti.ad.Tape(self.loss):
            self.run()
        found = (self.loss[None], *(p.grad.to_numpy() for p in self.parameters))
        self.x.from_numpy(self.x_before)  # as fill left them, for the next run
        self.v.from_numpy(self.v_before)
        return found

    def torch_loss(self, weight1, bias1, weight2, bias2):
        """The same program in torch, from the x and v ``fill`` left."""
        like = dict(dtype=weight1.dtype)
        xs = list(torch.tensor(self.x_before, **like))
        vs = list(torch.tensor(self.v_before, **like))
        goal, goal_v = torch.tensor(self.goal.to_numpy(), **like), torch.tensor(self.goal_v.to_numpy(), **like)
        attractors = torch.tensor(ATTRACTORS, **like)
        seen = 0 if self.current else 1
        loss = torch.zeros((), **like)
        for t in range(1, self.steps):
            features = torch.cat([xs[t - seen] - 0.5, vs[t - seen], goal[t] - 0.5, goal_v[t] - 0.5])
            hidden = torch.tanh(features @ weight1 + bias1)
            gravitation = torch.tanh(hidden @ weight2 + bias2)
            r = xs[t - 1] - attractors
            len_r = torch.clamp(torch.linalg.norm(r, dim=1), min=0.1)
            force = (self.strength * gravitation / len_r**3)[:, None] * r
            vs[t] = vs[t - 1] * math.exp(-DT * DAMPING) + DT * force.sum(0)
            xs[t] = xs[t - 1] + DT * vs[t]
            loss = loss + DT * ((xs[t] - goal[t]) ** 2).sum()
        return loss
