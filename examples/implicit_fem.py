"""A Neo-Hookean cube falling onto the ground, by implicit Euler: each time step minimizes an energy by Newton.

The whole model is the energy. Implicit Euler's step is the minimizer of the
incremental potential (Kane et al. 2000; the "optimization time integrator")

    E(x) = sum_nodes m / (2 h^2) |x - x_hat|^2 + m g z + k/2 min(z, 0)^2     (inertia, gravity, the ground)
         + sum_tets vol W(F(x))                                              (Neo-Hookean elasticity)

with ``x_hat = x + h v``. Both sums are ``td.element_sum``s of per-element
``@ti.func`` energies (a node is an element of one node), so tidiff gives the
gradient and the sparse Hessian; the Newton step solves ``H dx = -g`` with the
elastic Hessian projected to positive semi-definite (``project="psd"``), and a
backtracking line search keeps the energy falling (and elements uninverted:
``log J`` of an inverted tet is NaN, which the search rejects).

Nothing here is differentiated by hand: no force, no stiffness matrix, no
assembly loop.
"""
import time

import numpy as np
import scipy.sparse.linalg as spla
import taichi as ti

import tidiff as td

MU, LAM = 2e3, 8e3  # Lamé parameters
GRAVITY, GROUND_STIFFNESS = 9.8, 1e5

tet = ti.types.matrix(4, 3, ti.f64)
node = ti.types.matrix(1, 3, ti.f64)


@ti.func
def neo_hookean(xe: tet, B: ti.math.mat3, vol: ti.f64) -> ti.f64:
    """The stored energy of one tet: ``xe`` its corners now, ``B`` the inverse of its rest edge matrix."""
    F = ti.Matrix.cols([xe[1, :] - xe[0, :], xe[2, :] - xe[0, :], xe[3, :] - xe[0, :]]) @ B
    log_j = ti.log(F.determinant())
    return vol * (MU / 2 * ((F.transpose() @ F).trace() - 3) - MU * log_j + LAM / 2 * log_j**2)


@ti.func
def inertia(xn: node, x_hat: ti.math.vec3, m: ti.f64, h: ti.f64) -> ti.f64:
    """One node's inertia, gravity and ground penalty."""
    x = ti.Vector([xn[0, 0], xn[0, 1], xn[0, 2]])
    below = ti.min(x[2], 0.0)
    return m / (2 * h * h) * (x - x_hat).norm_sqr() + m * GRAVITY * x[2] + GROUND_STIFFNESS / 2 * below**2


def cube(n: int, size: float = 1.0, height: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """An ``n x n x n`` grid of cells, each cut into 5 tets: nodes ``(N, 3)`` and tets ``(M, 4)``."""
    g = np.stack(np.meshgrid(*[np.arange(n + 1)] * 3, indexing="ij"), -1).reshape(-1, 3)
    nodes = g * (size / n) + np.array([0.0, 0.0, height])
    idx = np.arange((n + 1) ** 3).reshape(n + 1, n + 1, n + 1)
    tets = []
    for i in range(n):
        for j in range(n):
            for k in range(n):
                c = [idx[i + a, j + b, k + d] for a in (0, 1) for b in (0, 1) for d in (0, 1)]
                if (i + j + k) % 2:  # alternate the cut so that faces match
                    tets += [[c[0], c[1], c[2], c[4]], [c[3], c[1], c[2], c[7]], [c[5], c[1], c[4], c[7]],
                             [c[6], c[2], c[4], c[7]], [c[1], c[2], c[4], c[7]]]
                else:
                    tets += [[c[1], c[0], c[3], c[5]], [c[2], c[0], c[3], c[6]], [c[4], c[0], c[5], c[6]],
                             [c[7], c[3], c[5], c[6]], [c[0], c[3], c[5], c[6]]]
    return nodes, np.array(tets)


class FallingBody:
    """The body, its energy as two element sums, and implicit Euler steps by projected Newton."""

    def __init__(self, n: int, h: float = 1e-2, density: float = 1e3) -> None:
        self.x, self.tets = cube(n)
        self.v = np.zeros_like(self.x)
        self.h = h
        rest = self.x[self.tets]
        edges = np.stack([rest[:, 1] - rest[:, 0], rest[:, 2] - rest[:, 0], rest[:, 3] - rest[:, 0]], axis=2)
        self.B = np.linalg.inv(edges)
        self.vol = np.abs(np.linalg.det(edges)) / 6
        self.mass = np.zeros(len(self.x))
        np.add.at(self.mass, self.tets, np.repeat(density * self.vol[:, None] / 4, 4, axis=1))
        self.elastic = td.element_sum(neo_hookean, self.tets)
        self.nodal = td.element_sum(inertia, np.arange(len(self.x))[:, None])

    def energy(self, x: np.ndarray, x_hat: np.ndarray) -> float:
        e = float(self.elastic(x, self.B, self.vol) + self.nodal(x, x_hat, self.mass, self.h))
        return e if np.isfinite(e) else np.inf

    def gradient(self, x: np.ndarray, x_hat: np.ndarray) -> np.ndarray:
        return td.grad(self.elastic)(x, self.B, self.vol) + td.grad(self.nodal)(x, x_hat, self.mass, self.h)

    def hessian(self, x: np.ndarray, x_hat: np.ndarray, project: str | None = "psd") -> "spla.LinearOperator":
        return (td.sparse_hessian(self.elastic, project=project)(x, self.B, self.vol)
                + td.sparse_hessian(self.nodal)(x, x_hat, self.mass, self.h))

    def newton_direction(self, x: np.ndarray, x_hat: np.ndarray, project: str | None = "psd") -> np.ndarray:
        g = self.gradient(x, x_hat)
        return spla.spsolve(self.hessian(x, x_hat, project).tocsc(), -g.ravel()).reshape(x.shape)

    def step(self, tolerance: float = 1e-8, iterations: int = 30) -> list[float]:
        """One time step; returns the energy after each Newton iteration (falling)."""
        x_hat = self.x + self.h * self.v
        x = self.x.copy()
        energies = [self.energy(x, x_hat)]
        for _ in range(iterations):
            dx = self.newton_direction(x, x_hat)
            if np.abs(dx).max() < tolerance:
                break
            alpha = 1.0
            while self.energy(x + alpha * dx, x_hat) > energies[-1] and alpha > 1e-8:
                alpha /= 2
            x = x + alpha * dx
            energies.append(self.energy(x, x_hat))
        self.v = (x - self.x) / self.h
        self.x = x
        return energies


def main(n: int = 4, steps: int = 50) -> None:
    ti.init(arch=ti.cpu, default_fp=ti.f64, log_level=ti.WARN)
    body = FallingBody(n)
    print(f"{len(body.x)} nodes, {len(body.tets)} tets; the cube's lowest point per step:")
    start = time.perf_counter()
    for k in range(steps):
        energies = body.step()
        if k % 10 == 9:
            print(f"  step {k + 1}: z_min {body.x[:, 2].min():+.4f}, {len(energies) - 1} Newton iterations")
    print(f"{steps} steps in {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
