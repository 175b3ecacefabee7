"""Sparsity patterns of element sums and element maps, computed once from the connectivity.

NOTE: [Element patterns] The Hessian of ``sum_e f_e(x[elements[e]])`` by
``x`` (``N`` nodes of ``d`` values) has a ``d x d`` block ``(R, C)`` wherever
nodes ``R`` and ``C`` share an element. The pattern lists those blocks
sorted by row then column (block CSR), and for each element's block
``(a, b)`` where its entries go: row ``i`` of the block starts at
``start[e, a k + b] + i * stride[R]`` in the value array, its ``d``
entries are consecutive. One layout serves both formats:

- BSR (``d x d`` blocks): block ``p`` of the block row ``R`` is at
  ``(ptr[R] + p) d^2``, its rows ``d`` apart;
- CSR: row ``R d + i`` starts at ``d^2 ptr[R] + i n_R d`` (``n_R`` blocks in
  the row), block ``p``'s entries at ``p d`` in it.

So refilling the values is one launch adding each element's block where
the pattern says (``kernels._add_blocks``), with no sort and no search.

The Jacobian of an element map (``r_e = f_e(x[elements[e]])``, ``q`` values
per element) has rows ``e q .. e q + q - 1`` whose columns are the element's
distinct nodes' values, sorted: row ``e q + t`` starts at ``row[e] + t L_e``
(``L_e = d`` times the element's distinct nodes), node ``a``'s columns at
``start[e, a]`` in it (a node listed twice in an element adds into one place).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Pattern:
    """Where a sparse matrix's values go (NOTE: [Element patterns]): the index arrays the assembler reads and the
    structure of the result."""

    shape: tuple[int, int]
    indptr: np.ndarray  # CSR row pointers, or BSR block-row pointers
    indices: np.ndarray  # CSR columns, or BSR block columns
    index: tuple[np.ndarray, ...]  # what the assembly kernel reads
    nnz: int
    block: int  # BSR block size, 0 for CSR

    def scipy(self, data: np.ndarray) -> Any:
        """A scipy.sparse matrix holding ``data`` on this pattern (the index arrays are shared, not copied)."""
        import scipy.sparse as sparse

        if self.block:
            m = sparse.bsr_matrix((data.reshape(-1, self.block, self.block), self.indices, self.indptr),
                                  shape=self.shape, copy=False)
        else:
            m = sparse.csr_matrix((data, self.indices, self.indptr), shape=self.shape, copy=False)
        m.has_sorted_indices = True
        return m

    def rows_and_columns(self) -> tuple[np.ndarray, np.ndarray]:
        """The row and column of each value, in the order of the value array (CSR only)."""
        rows = np.repeat(np.arange(self.shape[0], dtype=np.int64), np.diff(self.indptr))
        return rows, self.indices.astype(np.int64)


def _index(values: np.ndarray) -> np.ndarray:
    if values.size and values.max() >= 2**31:
        raise ValueError(f"a sparse matrix with {int(values.max())} values: tidiff indexes them by 32-bit integers")
    return np.ascontiguousarray(values, dtype=np.int32)


def hessian_pattern(elements: np.ndarray, nodes: int, d: int, bsr: bool) -> Pattern:
    """The pattern of an element sum's Hessian by ``nodes`` nodes of ``d`` values (NOTE: [Element patterns])."""
    m, k = elements.shape
    e64 = elements.astype(np.int64)
    rows = np.repeat(e64, k, axis=1).ravel()  # element e's pair (a, b) at e k^2 + a k + b
    cols = np.tile(e64, (1, k)).ravel()
    keys, which = np.unique(rows * nodes + cols, return_inverse=True)
    block_row, block_col = keys // nodes, keys % nodes
    ptr = np.zeros(nodes + 1, np.int64)
    np.cumsum(np.bincount(block_row, minlength=nodes), out=ptr[1:])
    count = np.diff(ptr)
    place = np.arange(len(keys)) - ptr[block_row]  # a block's place in its row
    if bsr:
        start = (ptr[block_row] + place) * d * d
        stride = np.full(nodes, d, np.int64)
        shape = (nodes * d, nodes * d)
        return Pattern(shape, _index(ptr), _index(block_col), (_index(start[which].reshape(m, k * k)),
                                                               _index(stride)), len(keys) * d * d, d)
    start = d * d * ptr[block_row] + place * d
    stride = count * d
    indptr = np.zeros(nodes * d + 1, np.int64)
    indptr[1:] = (d * d * ptr[:-1, None] + (np.arange(1, d + 1) * count[:, None] * d)).ravel()
    indices = np.empty(len(keys) * d * d, np.int64)
    cols_d = block_col[:, None] * d + np.arange(d)
    for i in range(d):
        at = (d * d * ptr[block_row] + i * count[block_row] * d + place * d)[:, None] + np.arange(d)
        indices[at] = cols_d
    return Pattern((nodes * d, nodes * d), _index(indptr), _index(indices),
                   (_index(start[which].reshape(m, k * k)), _index(stride)), len(keys) * d * d, 0)


def jacobian_pattern(elements: np.ndarray, nodes: int, d: int, q: int) -> Pattern:
    """The CSR pattern of an element map's Jacobian, ``q`` values per element, by ``nodes`` nodes of ``d`` values."""
    m, k = elements.shape
    e64 = elements.astype(np.int64)
    order = np.sort(e64, axis=1)
    distinct = np.ones((m, k), bool)
    distinct[:, 1:] = order[:, 1:] != order[:, :-1]
    length = distinct.sum(axis=1) * d  # values per row of element e
    rank = np.cumsum(distinct, axis=1) - 1  # the place of each sorted node among the element's distinct ones
    # node a's place: the rank of its first occurrence in the sorted row
    first = np.argmax(order[:, :, None] == e64[:, None, :], axis=1)  # (m, k): where c[a] sits in the sorted row
    start = np.take_along_axis(rank, first, axis=1) * d
    row = np.zeros(m + 1, np.int64)
    np.cumsum(length * q, out=row[1:])
    indptr = np.zeros(m * q + 1, np.int64)
    indptr[1:] = (row[:-1, None] + np.arange(1, q + 1) * length[:, None]).ravel()
    cols = (order[:, :, None] * d + np.arange(d)).reshape(m, k * d)
    if distinct.all():
        indices = np.broadcast_to(cols[:, None, :], (m, q, k * d)).ravel()
    else:  # an element listing a node twice: its columns once
        keep = np.repeat(distinct, d, axis=1)
        indices = np.concatenate([np.tile(cols[e][keep[e]], q) for e in range(m)])
    return Pattern((m * q, nodes * d), _index(indptr), _index(indices),
                   (_index(row[:-1]), _index(length), _index(start)), int(row[-1]), 0)
