"""Sparse Hessians of element sums, sparse Jacobians of element maps, and Hessians as linear operators.

Each is a transform: ``td.sparse_hessian(F)`` is a function of ``F``'s
arguments returning a matrix. The pattern is computed once per node count
(NOTE: [Element patterns] in ``pattern``) and the values are one launch of
the per-element Hessian (or Jacobian) of ``f``, tidiff's own generated
derivative code, adding each block where the pattern says.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import taichi as ti

from .._api import grad, hessian, jacfwd
from .._codegen.batch import identifier
from .._protocol import Function, require_taichi, taichi_callable
from .._signature import ArgSpec
from .assembled import assembling_body
from .colouring import coloured, detected
from .function import Elements
from .kernels import (
    ADDED,
    BLOCKS,
    EACH,
    NODE,
    SKIP,
    ElementKernel,
    KeptValues,
    _add_blocks,
    _add_rows,
    element_kernel,
    fill_builder,
    same,
)
from .pattern import Pattern
from .psd import project_psd

FORMATS = ("csr", "bsr", "taichi")


def _elements_of(f: Any, summed: bool, call: str) -> Elements:
    what = "td.element_sum" if summed else "td.element_map"
    if not isinstance(f, Elements) or f.primal is not None or f.summed != summed:
        raise TypeError(f"{call}: expects a function made by {what}(f, elements), or sparsity= (the pattern) for "
                        f"any other function; got {getattr(f, 'name', type(f).__name__)}")
    return f


def _node_argument(F: Elements, argnums: Any, call: str) -> int:
    if isinstance(argnums, bool) or not isinstance(argnums, int):
        raise TypeError(f"{call}: argnums must be one int (the node argument to differentiate by); got {argnums!r}")
    names = F.param_names()
    if not -len(names) <= argnums < len(names):
        raise ValueError(f"{call}: argnums {argnums} is out of range for {F.fn.name}'s {len(names)} parameters")
    p = argnums % len(names)
    if not F.nodal[p]:
        nodal = [n for n, flag in zip(names, F.nodal, strict=True) if flag]
        raise ValueError(f"{call}: argnums {argnums} ({names[p]!r}) holds values per element; the sparse derivative "
                         f"is by an argument holding values per node ({nodal})")
    return p


def read_call(F: Elements, p: int, args: Sequence[Any], call: str) -> tuple[Any, list[ArgSpec], list[str],
                                                                          list[bool]]:
    """One call's arguments of ``F``, read and checked (``F.element_specs``), differentiated by argument ``p``."""
    require_taichi(call)
    batch = F.read(F.bind(args, {}, call), call)
    specs, ways, shared = F.element_specs(batch.specs, call)
    if not specs[p].is_float:
        raise TypeError(f"{call}: argument {specs[p].name!r} holds integers; there is nothing to differentiate")
    return batch, specs, ways, shared


def check_energy(F: Elements, specs: Sequence[ArgSpec], call: str) -> None:
    """A Hessian needs one scalar per element."""
    outs, _ = F.fn.signature(specs)
    if len(outs) != 1 or outs[0].shape != ():
        raise TypeError(f"{call}: {F.fn.name} must return one scalar per element (an energy) for a Hessian; it "
                        f"returns {[o.shape for o in outs]}")


def node_size(spec: ArgSpec) -> int:
    """``d``: the values a node argument holds per node (1 for scalar nodes)."""
    return spec.shape[1] if len(spec.shape) == 2 else 1


class _SparseDerivative:
    """What :class:`SparseHessian` and :class:`SparseJacobian` share: reading a call, and the matrix's formats."""

    def __init__(self, F: Elements, argnums: int, format: str, call: str) -> None:
        if format not in FORMATS:
            raise ValueError(f"{call}: format must be one of {FORMATS}; got {format!r}")
        self.F, self.p, self.format, self.call = F, argnums, format, call

    def _read(self, args: Sequence[Any]) -> tuple[Any, list[ArgSpec], list[str], list[bool]]:
        return read_call(self.F, self.p, args, self.call)

    def _matrix(self, pattern: Pattern, data: np.ndarray) -> Any:
        if self.format != "taichi":
            return pattern.scipy(data)
        rows, cols = pattern.rows_and_columns()
        dtype = ti.f64 if data.dtype == np.float64 else ti.f32
        builder = ti.linalg.SparseMatrixBuilder(pattern.shape[0], pattern.shape[1], max(len(data), 1), dtype=dtype)
        fill_builder(builder, rows.astype(np.int32), cols.astype(np.int32), data)
        return builder.build()


class SparseHessian(_SparseDerivative):
    """``td.sparse_hessian(F, ...)``: the Hessian of an element sum by one node argument, sparse."""

    def __init__(self, F: Elements, argnums: int, format: str, project: str | None, call: str) -> None:
        super().__init__(F, argnums, format, call)
        if project not in (None, "psd"):
            raise ValueError(f"{call}: project must be None or 'psd'; got {project!r}")
        self.project = project
        self.block = hessian(F.fn, argnums=argnums)

    def __call__(self, *args: Any) -> Any:
        batch, specs, ways, shared = self._read(args)
        check_energy(self.F, specs, self.call)
        x = batch.specs[self.p]
        d = node_size(x)
        k = self.F.mesh.arity
        pattern = self.F.mesh.hessian(x.shape[0], d, self.format == "bsr")
        (h,), _ = self.block.signature(specs)
        flat = len(h.shape) > 2
        data = np.zeros(pattern.nnz, x.dtype)
        inputs = self.F._inputs(batch)
        elements = self.F.mesh.elements
        name = identifier(self.block.name)
        if self.project is None:  # NOTE: [Blocks added from the pushes] in assembled.py
            kernel = element_kernel(self.block, lambda: assembling_body(self.block, specs), k, specs, ways, [h],
                                    [ADDED], False, name, blocks=(None, 2), keeps=True)
            kernel.recording(elements, inputs, [data], pattern.index)
            return self._matrix(pattern, data)
        n = k * d
        blocks = np.zeros((len(elements),) + h.shape, x.dtype)
        element_kernel(self.block, lambda: self.block.body_for(specs), k, specs, ways, [h], [EACH], False,
                       name, keeps=True).recording(elements, inputs, [blocks])
        if len(elements):
            square = blocks.reshape(len(elements), n, n)
            project_psd(square, np.empty_like(square), np.empty((len(elements), n), x.dtype))
        element_kernel(self.block, lambda: same, k, [h], [EACH], [h], [BLOCKS], False, "assemble",
                       blocks=(_add_blocks(k, d, flat), 2))(elements, [blocks], [data], pattern.index)
        return self._matrix(pattern, data)


class SparseJacobian(_SparseDerivative):
    """``td.sparse_jacobian(F, ...)``: the Jacobian of an element map by one node argument, sparse (CSR rows: element
    ``e``'s flattened result)."""

    def __init__(self, F: Elements, argnums: int, format: str, call: str) -> None:
        if format == "bsr":
            raise ValueError(f"{call}: format must be 'csr' or 'taichi' (an element's rows span its nodes' columns, "
                             "no square blocks); got 'bsr'")
        super().__init__(F, argnums, format, call)
        self.block = jacfwd(F.fn, argnums=argnums)

    def __call__(self, *args: Any) -> Any:
        batch, specs, ways, _ = self._read(args)
        outs, _ = self.F.fn.signature(specs)
        if len(outs) != 1:
            raise TypeError(f"{self.call}: {self.F.fn.name} must return one value per element (a residual); it "
                            f"returns {len(outs)}")
        x = batch.specs[self.p]
        d = node_size(x)
        k = self.F.mesh.arity
        q = int(np.prod(outs[0].shape, dtype=np.int64))
        pattern = self.F.mesh.jacobian(x.shape[0], d, q)
        (j,), _ = self.block.signature(specs)
        data = np.zeros(pattern.nnz, x.dtype)
        kernel = element_kernel(self.block, lambda: self.block.body_for(specs), k, specs, ways, [j], [BLOCKS], False,
                                identifier(self.block.name),
                                blocks=(_add_rows(q, k, d, _form(j.shape, outs[0].shape)), 3))
        kernel(self.F.mesh.elements, self.F._inputs(batch), [data], pattern.index)
        return self._matrix(pattern, data)


def _form(jacobian: tuple[int, ...], result: tuple[int, ...]) -> str:
    """How a kernel holds an element's Jacobian block (``kernels._add_rows``)."""
    if len(jacobian) > 2:
        return "flat"
    if len(jacobian) == 1:
        return "a"
    return "ta" if result else "aj"


class HessianOperator:
    """The Hessian of an element sum at a point, as a linear operator: ``H @ v`` is one launch of each element's
    Hessian-vector product, never forming ``H``.

    ``shape`` is ``(N d, N d)``; ``matvec(v)`` takes ``v`` flat or in the node argument's shape and returns the same
    layout; ``scipy.sparse.linalg`` takes it as it is (``cg(H, b)``), and :meth:`taichi` gives a
    ``ti.linalg.LinearOperator`` for ``ti.linalg.MatrixFreeCG`` over fields.
    """

    def __init__(self, owner: HessianOperatorOf, inputs: list[Any], at: int, node_shape: tuple[int, ...], dtype: Any,
                 kernel: ElementKernel) -> None:
        self._owner, self._inputs, self._at, self._kernel = owner, inputs, at, kernel
        self._kept = KeptValues(len(owner.F.mesh.elements))
        self.node_shape = node_shape
        size = int(np.prod(node_shape, dtype=np.int64))
        self.shape = (size, size)
        self.dtype = np.dtype(dtype)

    def matvec(self, v: Any) -> np.ndarray:
        """``H v``, in ``v``'s layout (flat, a column, or the node argument's shape)."""
        v = np.asarray(v, self.dtype)
        if v.size != self.shape[1]:
            raise ValueError(f"{self._owner.call}: the vector must have {self.shape[1]} values "
                             f"(shape {self.node_shape} or flat); got shape {v.shape}")
        out = np.zeros(self.node_shape, self.dtype)
        inputs = list(self._inputs)
        inputs[self._at] = np.ascontiguousarray(v.reshape(self.node_shape))
        self._kernel(self._owner.F.mesh.elements, inputs, [out], keeping=self._kept.arguments(not self._kept.ready))
        self._kept.launched()
        return out.reshape(v.shape)

    def __matmul__(self, v: Any) -> np.ndarray:
        return self.matvec(v)

    def taichi(self) -> Any:
        """A ``ti.linalg.LinearOperator`` whose matvec reads and writes fields of the node argument's size."""
        def matvec(x: Any, ax: Any) -> None:
            ax.from_numpy(self.matvec(x.to_numpy().reshape(-1)).reshape(ax.shape).astype(ax.to_numpy().dtype))

        return ti.linalg.LinearOperator(matvec)


class HessianOperatorOf:
    """``td.hessian_operator(F, argnums)``: at given arguments, the :class:`HessianOperator`."""

    def __init__(self, F: Elements, argnums: int, call: str) -> None:
        self.F, self.p, self.call = F, argnums, call
        self.tangent_fn = grad(F.fn, argnums=argnums).tangent()

    def __call__(self, *args: Any) -> HessianOperator:
        F = self.F
        batch, specs, ways, _ = read_call(F, self.p, args, self.call)
        check_energy(F, specs, self.call)
        floats = [i for i, s in enumerate(specs) if s.is_float]
        t_specs = specs + [specs[i] for i in floats]
        t_ways = ways + [ways[i] for i in floats]
        t_outs, _ = self.tangent_fn.signature(t_specs)  # (g, dg): the gradient, and H v
        kernel = element_kernel(self.tangent_fn, lambda: self.tangent_fn.body_for(t_specs), F.mesh.arity, t_specs,
                                t_ways, t_outs, [SKIP, NODE], True, identifier(self.tangent_fn.name), keeps=True)
        tangents = [np.zeros(batch.specs[i].shape if ways[i] == NODE else (1,) + specs[i].shape, specs[i].dtype)
                    for i in floats]  # the data's tangents stay zero; the node argument's is v
        x = batch.specs[self.p]
        point = [np.array(a) for a in F._inputs(batch)]  # copies: the operator is the Hessian where it was made
        return HessianOperator(self, point + tangents, len(specs) + floats.index(self.p), x.shape, x.dtype, kernel)


@taichi_callable
def sparse_hessian(f: Function, argnums: int = 0, *, format: str = "csr", project: str | None = None,
                   sparsity: Any = None) -> Any:
    """The Hessian of an element sum (``td.element_sum``) by a node argument, as a sparse matrix.

    Args:
        f: a function made by ``td.element_sum`` whose per-element function
            returns a scalar.
        argnums: the node argument (by default the first), ``N`` nodes of
            ``d`` values: the Hessian is ``(N d, N d)``, rows and columns
            node-major (node ``i``'s values at ``i d .. i d + d - 1``).
        format: ``"csr"`` (scipy.sparse), ``"bsr"`` (scipy.sparse, ``d x d``
            blocks) or ``"taichi"`` (``ti.linalg.SparseMatrix``, for
            ``ti.linalg.SparseSolver``).
        project: ``"psd"`` clamps each element Hessian's negative eigenvalues
            to zero before adding it: a positive semi-definite matrix for a
            robust Newton step. ``None``: the exact Hessian.
        sparsity: for any other function with a scalar output: the
            Hessian's pattern (a scipy sparse matrix or a boolean array,
            ``(n, n)`` for an argument of ``n`` values); the Hessian is then
            recovered from one ``td.hvp`` per colour (NOTE: [Star
            colouring]), as CSR or CSC. A kernel over ndarrays with one
            parallel loop needs none: its index expressions give the pattern
            (NOTE: [Patterns from index expressions]).

    Returns:
        a function of ``f``'s arguments returning the matrix. The pattern is
        computed on the first call (per node count) and kept; each call is
        one launch filling the values.

    Example:
        >>> @ti.func
        ... def spring(xe: ti.types.matrix(2, 2, ti.f64)) -> ti.f64:
        ...     return 0.5 * ((xe[1, :] - xe[0, :]).norm() - 1.0) ** 2
        >>> energy = td.element_sum(spring, np.array([[0, 1], [1, 2]]))
        >>> x = np.array([[0.0, 0.0], [2.0, 0.0], [2.0, 1.0]])
        >>> H = td.sparse_hessian(energy)(x)
        >>> H.shape, H.nnz
        ((6, 6), 28)
        >>> np.allclose(H.toarray(), td.hessian(energy)(x).reshape(6, 6))
        True
    """
    call = "td.sparse_hessian"
    if sparsity is not None:
        if project is not None:
            raise ValueError(f"{call}: project applies to element sums' blocks; with sparsity= it must be None")
        return coloured(f, argnums, sparsity, format, True, call)
    if project is None and (found := detected(f, argnums, format, True, call)) is not None:
        return found
    F = _elements_of(f, True, call)
    return SparseHessian(F, _node_argument(F, argnums, call), format, project, call)


@taichi_callable
def sparse_jacobian(f: Function, argnums: int = 0, *, format: str = "csr", sparsity: Any = None) -> Any:
    """The Jacobian of an element map (``td.element_map``) by a node argument, as a sparse matrix.

    Rows are the elements' results, flattened element-major (element ``e``'s
    ``q`` values at ``e q .. e q + q - 1``); columns the node argument's
    values, node-major. ``format`` is ``"csr"`` (scipy.sparse) or
    ``"taichi"``; the pattern is computed once, each call is one launch of
    the per-element Jacobian. For Gauss-Newton: ``J.T @ J``, ``J.T @ r``.

    Any other function (a kernel program, a ``@ti.func`` over a batch) with
    one output is given its Jacobian's pattern as ``sparsity`` (a scipy
    sparse matrix or a boolean array, outputs by the argument's values, both
    flattened); the Jacobian is then recovered from one ``td.jvp`` per colour
    of its columns (NOTE: [Column colouring]), as CSR or CSC. A kernel over
    ndarrays whose work is one parallel loop needs no ``sparsity``: the
    pattern is read from its index expressions (NOTE: [Patterns from index
    expressions]).
    """
    call = "td.sparse_jacobian"
    if sparsity is not None:
        return coloured(f, argnums, sparsity, format, False, call)
    if (found := detected(f, argnums, format, False, call)) is not None:
        return found
    F = _elements_of(f, False, call)
    return SparseJacobian(F, _node_argument(F, argnums, call), format, call)


@taichi_callable
def hessian_operator(f: Function, argnums: int = 0) -> Any:
    """The Hessian of an element sum by a node argument as a linear operator (matrix-free).

    ``td.hessian_operator(F)(x, *data)`` returns an operator ``H`` with
    ``shape``, ``dtype`` and ``H @ v`` (one launch of each element's exact
    Hessian-vector product, scattered onto the nodes): pass it to
    ``scipy.sparse.linalg.cg``, or ``H.taichi()`` to ``ti.linalg.MatrixFreeCG``.
    """
    call = "td.hessian_operator"
    F = _elements_of(f, True, call)
    return HessianOperatorOf(F, _node_argument(F, argnums, call), call)
