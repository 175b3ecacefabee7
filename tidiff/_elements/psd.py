"""The nearest positive semi-definite matrix of each element block: negative eigenvalues clamped to zero.

NOTE: [Projected element Hessians] A robust Newton step on a nonconvex
energy (elasticity under compression, contact) needs a positive
semi-definite Hessian; the common remedy (Teran et al. 2005, and every
"projected Newton" solver since) projects each element's Hessian before
assembly: ``H_e = V diag(max(l, 0)) V^T``. The eigensystem is the cyclic
Jacobi method, run in global memory (a ``(k d)^2`` local matrix indexed at
run time makes Taichi 1.7.4 compile for half a minute at ``k d = 12``; these
runtime loops over ndarrays compile in under a second), to machine
precision (an off-diagonal mass below ``1e-30`` of the whole), one element
per thread.
"""
# no "from __future__ import annotations": Taichi reads the kernel's annotations as objects

import taichi as ti


@ti.kernel
def project_psd(blocks: ti.types.ndarray(ndim=3), vectors: ti.types.ndarray(ndim=3),  # type: ignore[valid-type]
                values: ti.types.ndarray(ndim=2)):  # type: ignore[valid-type]
    """Replace each symmetric ``blocks[e]`` by its projection; ``vectors`` and ``values`` are scratch."""
    n = blocks.shape[1]
    for e in range(blocks.shape[0]):
        for p in range(n):
            for q in range(n):
                vectors[e, p, q] = 1.0 if p == q else 0.0
        for _sweep in range(50):
            off = 0.0
            whole = 0.0
            for p in range(n):
                for q in range(n):
                    whole += blocks[e, p, q] ** 2
                    if q > p:
                        off += blocks[e, p, q] ** 2
            if off <= 1e-30 * whole:
                break
            for p in range(n - 1):
                for q in range(p + 1, n):
                    apq = blocks[e, p, q]
                    if apq != 0.0:
                        theta = (blocks[e, q, q] - blocks[e, p, p]) / (2.0 * apq)
                        t = 1.0 / (ti.abs(theta) + ti.sqrt(theta * theta + 1.0))
                        if theta < 0.0:
                            t = -t
                        c = 1.0 / ti.sqrt(t * t + 1.0)
                        s = t * c
                        for r in range(n):
                            arp, arq = blocks[e, r, p], blocks[e, r, q]
                            blocks[e, r, p] = c * arp - s * arq
                            blocks[e, r, q] = s * arp + c * arq
                        for r in range(n):
                            apr, aqr = blocks[e, p, r], blocks[e, q, r]
                            blocks[e, p, r] = c * apr - s * aqr
                            blocks[e, q, r] = s * apr + c * aqr
                        for r in range(n):
                            vrp, vrq = vectors[e, r, p], vectors[e, r, q]
                            vectors[e, r, p] = c * vrp - s * vrq
                            vectors[e, r, q] = s * vrp + c * vrq
        for p in range(n):
            values[e, p] = ti.max(blocks[e, p, p], 0.0)
        for i in range(n):
            for j in range(n):
                acc = 0.0
                for p in range(n):
                    acc += vectors[e, i, p] * values[e, p] * vectors[e, j, p]
                blocks[e, i, j] = acc
