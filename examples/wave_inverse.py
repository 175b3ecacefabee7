"""An inverse problem on the 1-D wave equation: recover the initial wave from its state at the end.

The wave starts at rest from an unknown displacement ``u0`` (``u_prev = u = u0``).

The leapfrog step ``u_next = 2 u - u_prev + c^2 dt^2/dx^2 (u[i-1] - 2 u[i] + u[i+1])`` is a program
over state fields ``(u_prev, u)``, looped by ``td.scan``; the misfit to the observed final state
is a second program, composed with the loop. The misfit is quadratic in ``u0``, so one Newton
step solves it: the step solves ``H p = -g`` by
conjugate gradients, where every product ``H q`` is one ``td.hvp`` (Hessian-vector product,
forward over the checkpointed reverse loop): the Hessian is never formed.
"""
import numpy as np
import taichi as ti

import tidiff as td

ti.init(arch=ti.cpu, default_fp=ti.f64, log_level=ti.WARN)

CELLS, STEPS, COURANT2 = 24, 40, 0.25                     # COURANT2 = c^2 dt^2 / dx^2

u_prev, u = ti.field(ti.f64, CELLS), ti.field(ti.f64, CELLS)
u_prev_next, u_next = ti.field(ti.f64, CELLS), ti.field(ti.f64, CELLS)
observed_prev, observed = ti.field(ti.f64, CELLS), ti.field(ti.f64, CELLS)
misfit = ti.field(ti.f64, ())


@ti.kernel
def leapfrog():
    for i in u:
        left = u[i - 1] if i > 0 else 0.0                  # fixed ends
        right = u[i + 1] if i < CELLS - 1 else 0.0
        u_next[i] = 2 * u[i] - u_prev[i] + COURANT2 * (left - 2 * u[i] + right)
        u_prev_next[i] = u[i]


@ti.kernel
def distance():
    for i in u:
        misfit[None] += 0.5 * ((u[i] - observed[i]) ** 2 + (u_prev[i] - observed_prev[i]) ** 2)


sim = td.scan(td.function(leapfrog, inputs=[u_prev, u], outputs=[u_prev_next, u_next]), length=STEPS)
objective = td.compose(td.function(distance, inputs=[u_prev, u], outputs=[misfit]), sim)

# the observation: the final state of a wave that started as two bumps
grid = np.linspace(0, 1, CELLS)
truth = np.exp(-100 * (grid - 0.3) ** 2) - 0.5 * np.exp(-150 * (grid - 0.7) ** 2)
final_prev, final = sim(truth, truth)                     # started at rest
observed_prev.from_numpy(final_prev)
observed.from_numpy(final)


def misfit_of(u0):
    return objective(u0, u0)


def gradient(u0):
    g_prev, g = td.grad(objective, argnums=(0, 1))(u0, u0)
    return g_prev + g


def hessian_times(u0, q):
    """H q: one td.hvp (the tangent moves u_prev and u together)."""
    _, (h_prev, h) = td.hvp(objective, (u0, u0), (q, q))
    return h_prev + h


u0 = np.zeros(CELLS)                                       # start from rest
first = misfit_of(u0)
print(f"Newton step 0: misfit {first:.3e}")
g = gradient(u0)
p, r = np.zeros_like(g), -g                                # conjugate gradients on H p = -g
d, products = r.copy(), 0
while products < CELLS:                                    # exact in CELLS steps, in exact arithmetic
    Hd, products = hessian_times(u0, d), products + 1
    alpha = np.vdot(r, r) / np.vdot(d, Hd)
    p, r_new = p + alpha * d, r - alpha * Hd
    if np.linalg.norm(r_new) < 1e-12 * np.linalg.norm(g):
        break
    d, r = r_new + np.vdot(r_new, r_new) / np.vdot(r, r) * d, r_new
u0 = u0 + p
final_misfit = misfit_of(u0)
print(f"Newton step 1 ({products} Hessian-vector products): misfit {final_misfit:.3e}")
print(f"loss decreased from {first:.3e} to {final_misfit:.3e}; "
      f"initial wave recovered to {np.abs(u0 - truth).max():.1e}")
assert final_misfit < 1e-12 * first
