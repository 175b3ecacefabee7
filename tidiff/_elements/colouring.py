"""Sparse Jacobians and Hessians of any function with a known sparsity pattern, recovered from a few products.

NOTE: [Column colouring] Columns of a Jacobian that share no row can be
pushed forward together: ``J (e_j + e_k)`` holds column ``j`` in ``j``'s rows
and column ``k`` in ``k``'s. Colouring the columns so that no two of one
colour share a row (a distance-1 colouring of the column intersection graph
``P^T P``, Curtis, Powell and Reid 1974) recovers every entry from one
product per colour: ``J[i, j] = (J t_c)[i]`` for ``j`` of colour ``c``. A
stencil's Jacobian takes a handful of colours whatever its size (a 5-point
stencil 5 to 7 with the greedy order here), so a 2-D step's Jacobian at
10^5 unknowns is a few ``td.jvp`` calls. A Hessian is the Jacobian of the
gradient, its products ``td.hvp``; the same colouring recovers it (star
colourings, which use symmetry for fewer colours, are not implemented).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._api import hvp, jvp
from .._protocol import Function, as_function, require_taichi
from .._tree import leaves


def _pattern(sparsity: Any, shape: tuple[int, int], call: str) -> Any:
    """The sparsity as a scipy CSC matrix of ``shape`` (a scipy matrix, or a boolean array)."""
    import scipy.sparse as sparse

    p = sparse.csc_matrix(sparsity if sparse.issparse(sparsity) else np.asarray(sparsity) != 0)
    if p.shape != shape:
        raise ValueError(f"{call}: sparsity must have the derivative's shape {shape} (outputs by the argument's "
                         f"values, flattened); got {p.shape}")
    p.data = np.ones_like(p.data, dtype=np.int8)
    p.eliminate_zeros()
    return p


def colour_columns(pattern: Any) -> np.ndarray:
    """A colour per column such that no two columns of one colour share a row (greedy, natural order)."""
    conflicts = (pattern.T @ pattern).tocsr()  # columns sharing a row
    n = pattern.shape[1]
    colours = np.full(n, -1, np.int64)
    ptr, idx = conflicts.indptr, conflicts.indices
    for j in range(n):
        taken = colours[idx[ptr[j]:ptr[j + 1]]]
        used = np.zeros(len(taken) + 2, bool)
        used[taken[(taken >= 0) & (taken < len(used))]] = True
        colours[j] = int(np.argmin(used))
    return colours


class ColouredDerivative:
    """``td.sparse_jacobian(f, sparsity=...)`` / ``td.sparse_hessian(f, sparsity=...)``: one product per colour."""

    def __init__(self, fn: Function, argnums: int, sparsity: Any, format: str, second: bool, call: str) -> None:
        if format not in ("csr", "csc"):
            raise ValueError(f"{call}: with sparsity= the format is 'csr' or 'csc'; got {format!r}")
        if isinstance(argnums, bool) or not isinstance(argnums, int):
            raise TypeError(f"{call}: argnums must be one int; got {argnums!r}")
        self.fn, self.p, self.sparsity, self.format, self.second = fn, argnums, sparsity, format, second
        self.call = call
        self.coloured: dict[tuple[int, int], tuple[Any, np.ndarray]] = {}
        self.products = 0  # products the last call took

    def __call__(self, *args: Any) -> Any:
        require_taichi(self.call)
        if not -len(args) <= self.p < len(args):
            raise ValueError(f"{self.call}: argnums {self.p} is out of range for {len(args)} arguments")
        batch = self.fn.read(self.fn.bind(args, {}, self.call), self.call)
        x = batch.arrays[self.p]
        outs, _ = self.fn.signature(batch.specs)
        if len(outs) != 1:
            raise TypeError(f"{self.call}: {self.fn.name} must have one output; it has {len(outs)}")
        out_size = int(np.prod(batch.shape + outs[0].shape, dtype=np.int64))
        if self.second and out_size != 1:
            raise TypeError(f"{self.call}: a Hessian needs a scalar output; {self.fn.name}'s has shape "
                            f"{batch.shape + outs[0].shape}")
        rows = x.size if self.second else out_size
        shape = (rows, x.size)
        if shape not in self.coloured:
            pattern = _pattern(self.sparsity, shape, self.call)
            self.coloured[shape] = (pattern, colour_columns(pattern))
        pattern, colours = self.coloured[shape]
        data = np.empty(pattern.nnz, x.dtype if x.dtype.kind == "f" else np.float64)
        row_of = pattern.indices
        col_of = np.repeat(np.arange(shape[1]), np.diff(pattern.indptr))
        count = int(colours.max()) + 1 if colours.size else 0
        for c in range(count):
            tangent = (colours == c).astype(data.dtype).reshape(x.shape)
            product = np.ravel(self._product(args, tangent))
            mine = colours[col_of] == c
            data[mine] = product[row_of[mine]]
        self.products = count
        import scipy.sparse as sparse

        matrix = sparse.csc_matrix((data, pattern.indices, pattern.indptr), shape=shape)
        return matrix.tocsr() if self.format == "csr" else matrix

    def _product(self, args: Sequence[Any], tangent: np.ndarray) -> Any:
        tangents = tuple(tangent if k == self.p else None for k in range(len(args)))
        if self.second:
            return hvp(self.fn, tuple(args), tangents)[1][self.p]
        return leaves(jvp(self.fn, tuple(args), tangents)[1])[0]


def coloured(f: Any, argnums: int, sparsity: Any, format: str, second: bool, call: str) -> ColouredDerivative:
    return ColouredDerivative(as_function(f, call), argnums, sparsity, format, second, call)
