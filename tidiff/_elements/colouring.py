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
gradient, its products ``td.hvp``; being symmetric, it takes fewer (NOTE:
[Star colouring]).

NOTE: [Star colouring] A Hessian's entry ``H[i, j]`` is also ``H[j, i]``: it
may be read from the product of ``j``'s colour at row ``i`` or from that of
``i``'s colour at row ``j``. A star colouring of the graph whose edges are
the off-diagonal entries (adjacent vertices differ, and no path of four
vertices takes only two colours: Gebremedhin, Manne and Pothen 2005) lets one
of the two always hold alone: were ``i`` to have another neighbour ``k`` of
``j``'s colour and ``j`` another neighbour ``l`` of ``i``'s, ``k-i-j-l``
would be such a path. The diagonal is read at its own colour, which no
neighbour has. Colours are chosen greedily, each vertex avoiding the colours
of its neighbours and those that would close a two-coloured path of four
through it. A distance-2 colouring (the column colouring of a symmetric
pattern with its diagonal) is a star colouring too, so the fewest star
colours are never more; of the two greedy colourings the one with fewer
colours is used: a Hessian coupling one value to all the others (an arrow)
takes 2 products instead of one per value, a 5-point stencil's 5 instead of 7.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._api import hvp, jvp
from .._kinds.ndarray import NdarrayFunction
from .._protocol import Function, as_function, require_taichi
from .._tree import leaves
from .detected import KernelPattern, NotDetected


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
    ptr, idx = conflicts.indptr.tolist(), conflicts.indices.tolist()
    colours = [-1] * pattern.shape[1]
    for j in range(len(colours)):
        taken = {colours[k] for k in idx[ptr[j]:ptr[j + 1]]}
        c = 0
        while c in taken:
            c += 1
        colours[j] = c
    return np.asarray(colours, np.int64)


def _off_diagonal(pattern: Any) -> Any:
    """The graph of a pattern's off-diagonal entries, both ways, as CSR with ones."""
    import scipy.sparse as sparse

    adjacency = sparse.csr_matrix(pattern + pattern.T)
    adjacency.setdiag(0)
    adjacency.eliminate_zeros()
    adjacency.data[:] = 1
    return adjacency


def star_colours(pattern: Any) -> np.ndarray:
    """A star colouring (NOTE: [Star colouring]) of the graph of a symmetric pattern's off-diagonal entries."""
    adjacency = _off_diagonal(pattern)
    ptr, idx = adjacency.indptr, adjacency.indices
    n = adjacency.shape[0]
    neighbours = [idx[ptr[v]:ptr[v + 1]].tolist() for v in range(n)]
    colours = [-1] * n
    around: list[dict[int, int]] = [{} for _ in range(n)]  # per vertex: colour -> its coloured neighbours of it
    # per coloured vertex w: the colours of its coloured neighbours x having another neighbour of w's colour
    # (x - w ... x - y, y of w's colour): what a vertex beside w may not take (v - w - x - y)
    centres: list[set[int]] = [set() for _ in range(n)]
    for v in range(n):
        forbidden = set()
        for w in neighbours[v]:
            cw = colours[w]
            if cw < 0:
                continue
            forbidden.add(cw)
            if around[v][cw] >= 2:  # u - v - w - x: every colour beside w
                forbidden.update(around[w])
            else:
                forbidden.update(centres[w])
        c = 0
        while c in forbidden:
            c += 1
        colours[v] = c
        for u in neighbours[v]:
            seen = around[u][c] = around[u].get(c, 0) + 1
            if colours[u] < 0:
                continue
            if seen == 2:  # u now has two neighbours of colour c: each of them is beside a centre
                for w in neighbours[u]:
                    if colours[w] == c:
                        centres[w].add(colours[u])
            elif seen > 2:
                centres[v].add(colours[u])
            if around[v].get(colours[u], 0) >= 2:  # v has two neighbours of u's colour
                centres[u].add(c)
    return np.asarray(colours, np.int64)


def column_gather(pattern: Any, colours: np.ndarray) -> np.ndarray:
    """Where each entry of ``pattern`` (CSC order) lies in the products ``P[c] = J t_c`` of a column colouring,
    flattened: ``J[i, j] = P[colour of j, i]``."""
    col_of = np.repeat(np.arange(pattern.shape[1]), np.diff(pattern.indptr))
    return colours[col_of] * pattern.shape[0] + pattern.indices


def symmetric_gather(pattern: Any, colours: np.ndarray) -> np.ndarray:
    """Where each entry of a symmetric ``pattern`` (CSC order) lies in the products ``P[c] = H t_c`` of a star
    colouring (NOTE: [Star colouring]), flattened: ``H[i, j]`` from ``j``'s colour at row ``i`` where ``j`` is
    ``i``'s one neighbour of that colour, else from ``i``'s colour at row ``j``."""
    import scipy.sparse as sparse

    n = pattern.shape[0]
    count = int(colours.max()) + 1 if colours.size else 0
    of_colour = sparse.csr_matrix((np.ones(n), (np.arange(n), colours)), shape=(n, count))
    by_colour = (_off_diagonal(pattern) @ of_colour).tocsr()
    rows = pattern.indices
    cols = np.repeat(np.arange(n), np.diff(pattern.indptr))
    alone = (np.asarray(by_colour[rows, colours[cols]]).ravel() == 1) | (rows == cols)
    return np.where(alone, colours[cols] * n + rows, colours[rows] * n + cols)


def _symmetric_colouring(pattern: Any) -> tuple[Any, np.ndarray]:
    """A Hessian's pattern made symmetric, and the fewer-coloured of its greedy star and distance-2 colourings."""
    import scipy.sparse as sparse

    symmetric = sparse.csc_matrix(((pattern + pattern.T) != 0).astype(np.int8))
    star = star_colours(symmetric)
    with_diagonal = sparse.csc_matrix(((symmetric + sparse.identity(pattern.shape[0])) != 0).astype(np.int8))
    if np.sum(np.diff(with_diagonal.indptr).astype(np.float64) ** 2) > 50 * with_diagonal.nnz + 10**6:
        return symmetric, star  # columns sharing a row: a dense conflict graph (an arrow's), more colours anyway
    distance2 = colour_columns(with_diagonal)
    return symmetric, star if star.max(initial=0) <= distance2.max(initial=0) else distance2


def _one_argnum(argnums: Any, call: str) -> None:
    if isinstance(argnums, bool) or not isinstance(argnums, int):
        raise TypeError(f"{call}: argnums must be one int; got {argnums!r}")


class ColouredDerivative:
    """``td.sparse_jacobian(f, sparsity=...)`` / ``td.sparse_hessian(f, sparsity=...)``: one product per colour."""

    def __init__(self, fn: Function, argnums: int, sparsity: Any, format: str, second: bool, call: str) -> None:
        if format not in ("csr", "csc"):
            raise ValueError(f"{call}: with sparsity= the format is 'csr' or 'csc'; got {format!r}")
        _one_argnum(argnums, call)
        self.fn, self.p, self.sparsity, self.format, self.second = fn, argnums, sparsity, format, second
        self.call = call
        # by shape (and the integer arrays indices read): colours, the result's pattern, where its entries lie
        self.coloured: dict[tuple[Any, ...], tuple[np.ndarray, Any, np.ndarray]] = {}
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
        if isinstance(self.sparsity, KernelPattern):  # NOTE: [Patterns from index expressions]
            read = self.sparsity
            integers = read.integers(batch.specs, batch.arrays)
            key: tuple[Any, ...] = (shape, *((n, v.shape, hashlib.blake2b(v.tobytes()).digest())
                                             for n, v in sorted(integers.items())))
            by_name = {s.name: s for s in (*batch.specs, *outs)}
            make = lambda: read.pattern(by_name, integers, self.second, self.call)  # noqa: E731
        else:
            key = shape
            make = lambda: _pattern(self.sparsity, shape, self.call)  # noqa: E731
        if key not in self.coloured:
            if len(self.coloured) >= 8:  # a mesh changing every call: the oldest patterns go
                del self.coloured[next(iter(self.coloured))]
            self.coloured[key] = self._plan(make())
        colours, template, gather = self.coloured[key]
        dtype = x.dtype if x.dtype.kind == "f" else np.float64
        count = int(colours.max()) + 1 if colours.size else 0
        products = np.empty((count, shape[0]), dtype)
        for c in range(count):
            tangent = (colours == c).astype(dtype).reshape(x.shape)
            products[c] = np.ravel(self._product(args, tangent))
        self.products = count
        matrix = template.copy()
        matrix.data = products.ravel()[gather]
        return matrix

    def _plan(self, pattern: Any) -> tuple[np.ndarray, Any, np.ndarray]:
        """The colours, the result's pattern in its format, and where each of its entries lies in the products."""
        import scipy.sparse as sparse

        if self.second:
            pattern, colours = _symmetric_colouring(pattern)
            gather = symmetric_gather(pattern, colours)
        else:
            colours = colour_columns(pattern)
            gather = column_gather(pattern, colours)
        order = sparse.csc_matrix((np.arange(1, pattern.nnz + 1), pattern.indices, pattern.indptr), shape=pattern.shape)
        template = order.tocsr() if self.format == "csr" else order
        gather = gather[template.data - 1]
        return colours, template, gather

    def _product(self, args: Sequence[Any], tangent: np.ndarray) -> Any:
        tangents = tuple(tangent if k == self.p else None for k in range(len(args)))
        if self.second:
            return hvp(self.fn, tuple(args), tangents)[1][self.p]
        return leaves(jvp(self.fn, tuple(args), tangents)[1])[0]


def coloured(f: Any, argnums: int, sparsity: Any, format: str, second: bool, call: str) -> ColouredDerivative:
    return ColouredDerivative(as_function(f, call), argnums, sparsity, format, second, call)


def detected(f: Any, argnums: Any, format: str, second: bool, call: str) -> ColouredDerivative | None:
    """The coloured derivative of an ndarray kernel whose pattern its index expressions give (NOTE: [Patterns from
    index expressions]); None for any other function. A kernel whose pattern cannot be read is a TypeError."""
    if not isinstance(f, NdarrayFunction):
        return None
    _one_argnum(argnums, call)
    if not -len(f.inputs) <= argnums < len(f.inputs):
        raise ValueError(f"{call}: argnums {argnums} is out of range for {f.name}'s {len(f.inputs)} inputs")
    if len(f.outputs) != 1:
        raise TypeError(f"{call}: {f.name} must have one output; it has {len(f.outputs)}")
    try:
        pattern = KernelPattern(f, argnums % len(f.inputs))
    except NotDetected as reason:
        raise reason.refusal(call, f.name) from None
    return ColouredDerivative(f, argnums, pattern, format, second, call)
