"""Taichi's own implicit FEM example (python/taichi/examples/simulation/implicit_fem.py, Taichi 1.7.4), by hand.

The mesh, the material and the three hand-written kernels of the example, kept as
the example writes them, in float64 and for any cube size ``n`` (the example has
``n = 5``):

- :meth:`HandFEM.get_force`: the corotated force ``f = -W 2 mu (F - U V^T) B^T``
  (rotation from ``ti.svd`` with the example's sign fix ``ssvd``), plus gravity;
- :meth:`HandFEM.compute_A`: ``A = M + dt^2 K`` into a ``ti.linalg.SparseMatrixBuilder``,
  ``K`` the stiffness of ``dP = 2 mu dF`` (no rotation: the rest-state stiffness
  of the corotated model, i.e. the Hessian of ``W mu |F - I|^2``), 144 triplets per tet;
- :meth:`HandFEM.matmul_cell`: the same ``A v`` matrix-free, the example's CG product.

Only the storage changed: fields are made per instance (``@ti.data_oriented``)
instead of at module level, and the mesh comes from :func:`cube_mesh` (the
example's ``get_vertices`` and ``init`` in NumPy) so that every contender of the
benchmark starts from the same arrays.
"""
import numpy as np
import taichi as ti

E_YOUNG, NU = 5e4, 0.0
MU = E_YOUNG / (2 * (1 + NU))  # lambda = 0 (nu = 0), as in the example
DENSITY = 1000.0
DT = 1e-2  # the example's implicit time step
GRAVITY = 9.8


def cube_mesh(n):
    """The example's cube of ``n^3`` nodes and ``5 (n-1)^3`` tets at rest (``get_vertices`` and ``init``).

    Returns ``(tets, rest, B, W, m)``: tets (M, 4) int32, rest positions (N, 3) (the
    example lifts the cube by 1 in y), ``B = Ds^-1`` (M, 3, 3), volumes ``W`` (M,),
    lumped masses ``m`` (N,).
    """
    cells = np.stack(np.meshgrid(*[np.arange(n - 1)] * 3, indexing="ij"), -1).reshape(-1, 3)  # e // 5 order

    def corners(verts):  # set_element: I + ((bits of v) ^ I) & 1, each cell's cut mirrored by parity
        bits = np.array([[(v >> k) & 1 for k in range(3)] for v in verts])  # (4, 3)
        nodes = cells[:, None, :] + ((bits[None] ^ cells[:, None, :]) & 1)
        return (nodes[..., 0] * n + nodes[..., 1]) * n + nodes[..., 2]

    per_cell = [corners((j, j ^ 1, j ^ 2, j ^ 4)) for j in (0, 3, 5, 6)] + [corners((1, 2, 4, 7))]
    tets = np.stack(per_cell, axis=1).reshape(-1, 4).astype(np.int32)
    grid = np.stack(np.meshgrid(*[np.arange(n)] * 3, indexing="ij"), -1).reshape(-1, 3)
    rest = grid / (n - 1) + np.array([0.0, 1.0, 0.0])
    Ds = edge_matrices(rest, tets)
    B = np.linalg.inv(Ds)
    W = np.abs(np.linalg.det(Ds)) / 6
    m = np.zeros(len(rest))
    np.add.at(m, tets, np.repeat(W[:, None] / 4 * DENSITY, 4, axis=1))
    return tets, rest, B, W, m


def edge_matrices(x, tets):
    """The example's ``Ds``: columns ``x[v_i] - x[v_3]``, i = 0, 1, 2; shape (M, 3, 3)."""
    xe = x[tets]
    return np.stack([xe[:, i] - xe[:, 3] for i in range(3)], axis=2)


@ti.data_oriented
class HandFEM:
    """The example's fields and kernels (float64) over one mesh."""

    def __init__(self, tets, x, B, W, m):
        n_verts, n_cells = len(x), len(tets)
        self.n_verts = n_verts
        self.vertices = ti.Vector.field(4, dtype=ti.i32, shape=n_cells)
        self.x = ti.Vector.field(3, dtype=ti.f64, shape=n_verts)
        self.f = ti.Vector.field(3, dtype=ti.f64, shape=n_verts)
        self.vel = ti.Vector.field(3, dtype=ti.f64, shape=n_verts)
        self.mul_ans = ti.Vector.field(3, dtype=ti.f64, shape=n_verts)
        self.m = ti.field(dtype=ti.f64, shape=n_verts)
        self.B = ti.Matrix.field(3, 3, dtype=ti.f64, shape=n_cells)
        self.W = ti.field(dtype=ti.f64, shape=n_cells)
        for field, values in ((self.vertices, tets), (self.x, x), (self.B, B), (self.W, W), (self.m, m)):
            field.from_numpy(np.ascontiguousarray(values))
        self.triplets = 144 * n_cells + 3 * n_verts  # compute_A's += calls
        self.builder = None

    def make_builder(self):
        """The example's ``A_builder`` (float64, capacity exactly the triplets compute_A adds)."""
        self.builder = ti.linalg.SparseMatrixBuilder(3 * self.n_verts, 3 * self.n_verts,
                                                     max_num_triplets=self.triplets, dtype=ti.f64)
        return self.builder

    # -- the example's kernels ----------------------------------------------------------
    @ti.func
    def Ds(self, verts):
        return ti.Matrix.cols([self.x[verts[i]] - self.x[verts[3]] for i in range(3)])

    @ti.func
    def ssvd(self, F):
        U, sig, V = ti.svd(F)
        if U.determinant() < 0:
            for i in ti.static(range(3)):
                U[i, 2] *= -1
            sig[2, 2] = -sig[2, 2]
        if V.determinant() < 0:
            for i in ti.static(range(3)):
                V[i, 2] *= -1
            sig[2, 2] = -sig[2, 2]
        return U, sig, V

    @ti.func
    def get_force_func(self, c, verts):
        F = self.Ds(verts) @ self.B[c]
        P = ti.Matrix.zero(ti.f64, 3, 3)
        U, sig, V = self.ssvd(F)
        P = 2 * MU * (F - U @ V.transpose())
        H = -self.W[c] * P @ self.B[c].transpose()
        for i in ti.static(range(3)):
            force = ti.Vector([H[j, i] for j in range(3)])
            self.f[verts[i]] += force
            self.f[verts[3]] -= force

    @ti.kernel
    def get_force(self):
        for c in self.vertices:
            self.get_force_func(c, self.vertices[c])
        for u in self.f:
            self.f[u].y -= GRAVITY * self.m[u]

    @ti.func
    def stiffness_column(self, W_c, B_c, u, d):
        """``dH``: the force change on the element's nodes for a unit move of node ``u`` along ``d`` (the
        example writes this block twice, in ``matmul_cell`` and ``compute_A``)."""
        dD = ti.Matrix.zero(ti.f64, 3, 3)
        if u == 3:
            for j in range(3):
                dD[d, j] = -1
        else:
            dD[d, u] = 1
        dF = dD @ B_c
        dP = 2.0 * MU * dF
        return -W_c * dP @ B_c.transpose()

    @ti.kernel
    def matmul_cell(self, ret: ti.template(), vel: ti.template()):
        for i in ret:
            ret[i] = vel[i] * self.m[i]
        for c in self.vertices:
            verts = self.vertices[c]
            W_c = self.W[c]
            B_c = self.B[c]
            for u in range(4):
                for d in range(3):
                    dH = self.stiffness_column(W_c, B_c, u, d)
                    for i in range(3):
                        for j in range(3):
                            tmp = vel[verts[i]][j] - vel[verts[3]][j]
                            ret[verts[u]][d] += -(DT**2) * dH[j, i] * tmp

    @ti.kernel
    def compute_A(self, A: ti.types.sparse_matrix_builder()):
        # A = M - dt * dt * K
        for i in range(self.n_verts):
            for j in range(3):
                A[3 * i + j, 3 * i + j] += self.m[i]
        for c in self.vertices:
            verts = self.vertices[c]
            W_c = self.W[c]
            B_c = self.B[c]
            for u in range(4):
                for d in range(3):
                    dH = self.stiffness_column(W_c, B_c, u, d)
                    for i in range(3):
                        for j in range(3):
                            A[3 * verts[u] + d, 3 * verts[i] + j] += -(DT**2) * dH[j, i]
                    for i in range(3):
                        A[3 * verts[u] + d, 3 * verts[3] + i] += -(DT**2) * (-dH[i, 0] - dH[i, 1] - dH[i, 2])

    # -- one complete call of each, as the benchmark times them ---------------------------
    def force(self):
        """The example's force (cg() zeroes f before get_force accumulates into it); the field ``f``."""
        self.f.fill(0)
        self.get_force()
        ti.sync()
        return self.f

    def assemble(self):
        """The example's ``init_A`` up to ``build``: ``A = M + dt^2 K`` as a ``ti.linalg.SparseMatrix``."""
        self.compute_A(self.builder)
        return self.builder.build()

    def product(self):
        """The example's CG product ``mul_ans = A vel`` (matrix-free); the field ``mul_ans``."""
        self.matmul_cell(self.mul_ans, self.vel)
        ti.sync()
        return self.mul_ans
