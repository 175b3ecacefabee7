"""Element sums and element maps: a per-element ``@ti.func`` over a mesh's connectivity, as one Function.

``td.element_sum(f, elements)`` is ``F(x, *data) = sum_e f(x[elements[e]], data[e]...)``
and ``td.element_map(f, elements)`` is ``F(x, *data)[e] = f(x[elements[e]], data[e]...)``:
the first argument (or those ``nodal`` names) holds one value per node and is
gathered through the connectivity; every other argument holds one value per
element (leading axis ``M``) or one for all elements.

Each is a :class:`Function` like any other (``_protocol``), so every
transform takes it:

- ``evaluate`` is one launch gathering, calling ``f`` and adding (or storing)
  its result (``kernels.ElementKernel``);
- ``vjp`` is one launch of ``f``'s cotangent map per element, its node
  cotangents scattered back onto the nodes (the adjoint of the gather);
- ``tangent()`` is the element sum (map) of ``f``'s tangent, the tangents of
  node arguments gathered like their primals: forward mode, ``td.hvp``
  and every order follow from ``f``'s own generated derivatives.

Sparse Hessians and Jacobians (``sparse``) launch ``f``'s per-element
Hessian or Jacobian and add each block where the pattern says.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._arrays import Batch, is_tensor, to_numpy
from .._codegen.batch import identifier
from .._derived import TangentArguments
from .._pointwise import cotangent_map
from .._protocol import Function, RuntimeMemo, as_function
from .._signature import ArgSpec
from .._tree import Tree
from .kernels import EACH, NODE, SUM, as_elements, element_kernel
from .pattern import Pattern, hessian_pattern, jacobian_pattern


class Mesh:
    """The connectivity ``(M, k)`` of an element sum, checked once, and its sparsity patterns (made once each)."""

    def __init__(self, elements: Any, call: str) -> None:
        taichi_array = hasattr(elements, "to_numpy") and not is_tensor(elements)  # a field or an ndarray
        values = to_numpy(elements.to_numpy() if taichi_array else elements, "elements", call)
        if values.ndim != 2 or values.shape[1] < 1:
            raise ValueError(f"{call}: elements must be an (M, k) array of node indices, one row of k nodes per "
                             f"element; got shape {values.shape}")
        if values.dtype.kind not in "iu":
            raise TypeError(f"{call}: elements must hold integer node indices; got dtype {values.dtype}")
        if values.size and values.min() < 0:
            e = int(np.argwhere(values < 0)[0][0])
            raise ValueError(f"{call}: elements holds a negative node index (element {e}: {values[e].tolist()})")
        if values.size and values.max() >= 2**31:
            raise ValueError(f"{call}: elements holds node index {int(values.max())}, past 32-bit indices")
        self.elements = as_elements(values)
        self.count, self.arity = self.elements.shape
        self.top = int(self.elements.max()) if self.elements.size else -1
        self.patterns = RuntimeMemo()

    def check_nodes(self, spec: ArgSpec, call: str) -> None:
        """A node argument has a row for every node the elements name."""
        nodes = spec.shape[0] if spec.shape else 0
        if self.top >= nodes:
            raise ValueError(f"{call}: elements refer to node {self.top}, but argument {spec.name!r} holds values "
                             f"for {nodes} nodes (its leading axis)")

    def hessian(self, nodes: int, d: int, bsr: bool) -> Pattern:
        return self.patterns.get(("hessian", nodes, d, bsr), lambda: hessian_pattern(self.elements, nodes, d, bsr))

    def jacobian(self, nodes: int, d: int, q: int) -> Pattern:
        return self.patterns.get(("jacobian", nodes, d, q), lambda: jacobian_pattern(self.elements, nodes, d, q))


class Elements(Function):
    """``f`` over the elements of ``mesh``, summed (``summed``) or one result per element (module docstring).

    ``nodal`` says, per argument of ``f``, whether it holds one value per node;
    a tangent function (``primal``) takes its flags from its primal's.
    """

    def __init__(self, fn: Function, mesh: Mesh, summed: bool, nodal: tuple[bool, ...], name: str, *,
                 primal: Elements | None = None) -> None:
        super().__init__(name, listed=primal is None,
                         arguments=None if primal is None else TangentArguments(primal))
        self.fn, self.mesh, self.summed, self.nodal, self.primal = fn, mesh, summed, nodal, primal

    # -- arguments -------------------------------------------------------------------
    def param_names(self) -> list[str]:
        return self.fn.param_names() if self.arguments is None else self.arguments.param_names()

    def declared_specs(self) -> list[ArgSpec] | None:
        return None  # whole arrays: each call's values give their shapes

    def read(self, args: Sequence[Any], call: str | None = None) -> Batch:
        batch = super().read(args, call)
        self.element_specs(batch.specs, call or self.name)  # checks before anything runs
        return batch

    def flags(self, in_specs: Sequence[ArgSpec]) -> tuple[bool, ...]:
        """Per argument, whether it holds a value per node."""
        if self.primal is None:
            return self.nodal
        n = self.primal.arity(in_specs)
        flags = self.primal.flags(in_specs[:n])
        return flags + tuple(f for f, s in zip(flags, in_specs[:n], strict=True) if s.is_float)

    def element_specs(self, in_specs: Sequence[ArgSpec], call: str | None = None) -> tuple[list[ArgSpec], list[str],
                                                                                        list[bool]]:
        """``f``'s argument specs for these whole ones, how each is passed (``NODE``, ``EACH``), and which ``EACH``
        arguments are one value for all elements."""
        return self.memo.get(("element specs", tuple(in_specs)), lambda: self._element_specs(in_specs,
                                                                                            call or self.name))

    def _element_specs(self, in_specs: Sequence[ArgSpec], call: str) -> tuple[list[ArgSpec], list[str], list[bool]]:
        m, k = self.mesh.count, self.mesh.arity
        declared = self.fn.declared_specs()
        specs, ways, shared = [], [], []
        for i, (s, nodal) in enumerate(zip(in_specs, self.flags(in_specs), strict=True)):
            if nodal:
                if len(s.shape) not in (1, 2):
                    raise ValueError(f"{call}: argument {s.name!r} holds one value per node: a scalar or a vector "
                                     f"each, shape (N,) or (N, d); got {s.shape}")
                self.mesh.check_nodes(s, call)
                spec = ArgSpec(s.name, (k,) + s.shape[1:], s.dtype)
                if declared is not None and declared[i].shape != spec.shape:
                    raise ValueError(f"{call}: the elements have {k} nodes each, so {self.fn.name}'s parameter "
                                     f"{s.name!r} takes shape {spec.shape}; it is declared {declared[i].shape}")
                specs.append(spec)
                ways.append(NODE)
                shared.append(False)
                continue
            core = declared[i].shape if declared is not None else (s.shape[1:] if s.shape[:1] == (m,) else s.shape)
            if s.shape == (m,) + core:
                shared.append(False)
            elif s.shape == core:
                shared.append(True)
            else:
                raise ValueError(f"{call}: argument {s.name!r} holds one value {core} per element ({m} elements: "
                                 f"shape {(m,) + core}) or one for all (shape {core}); got {s.shape}")
            specs.append(ArgSpec(s.name, core, s.dtype))
            ways.append(EACH)
        return specs, ways, shared

    def _inputs(self, batch: Batch) -> list[Any]:
        specs, ways, shared = self.element_specs(batch.specs)
        return [np.ascontiguousarray(a) if w == NODE else (a.reshape((1,) + s.shape) if sh else a)
                for a, s, w, sh in zip(batch.arrays, specs, ways, shared, strict=True)]

    # -- the protocol ----------------------------------------------------------------
    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        specs, _, _ = self.element_specs(in_specs)
        outs, tree = self.fn.signature(specs)
        if not self.summed:
            outs = [ArgSpec(o.name, (self.mesh.count,) + o.shape, o.dtype) for o in outs]
        return outs, tree

    def evaluate(self, batch: Batch) -> list[Any]:
        specs, ways, shared = self.element_specs(batch.specs)
        outs, tree = self.fn.signature(specs)
        put = SUM if self.summed else EACH
        kernel = element_kernel(self.fn, lambda: self.fn.body_for(specs), self.mesh.arity, specs, ways, outs,
                                [put] * len(outs), isinstance(tree, tuple), identifier(self.fn.name))
        rows = 1 if self.summed else self.mesh.count
        results = [np.zeros((rows,) + o.shape, o.dtype) for o in outs]
        kernel(self.mesh.elements, self._inputs(batch), results)
        return [r[0] if self.summed else r for r in results]

    def vjp(self, batch: Batch, cotangents: Sequence[Any]) -> list[Any]:
        specs, ways, shared = self.element_specs(batch.specs)
        outs, _ = self.fn.signature(specs)
        V = cotangent_map(self.fn)  # type: ignore[arg-type]
        v_specs = V.arguments.specs_of(specs)
        v_outs, v_tree = V.signature(v_specs)
        floats = [i for i, s in enumerate(specs) if s.is_float]
        puts = [NODE if ways[i] == NODE else SUM if shared[i] else EACH for i in floats]
        kernel = element_kernel(V, lambda: V.body_for(v_specs), self.mesh.arity, v_specs, ways + [EACH] * len(outs),
                                v_outs, puts, isinstance(v_tree, tuple), identifier(V.name))
        rows = 1 if self.summed else self.mesh.count
        cts = [np.zeros((rows,) + o.shape, o.dtype) if c is None
               else np.ascontiguousarray(np.asarray(c, o.dtype).reshape((rows,) + o.shape))
               for c, o in zip(cotangents, outs, strict=True)]
        grads = []
        for i, put in zip(floats, puts, strict=True):
            shape = batch.specs[i].shape if put == NODE else (1 if put == SUM else self.mesh.count,) + specs[i].shape
            grads.append(np.zeros(shape, specs[i].dtype))
        kernel(self.mesh.elements, self._inputs(batch) + cts, grads)
        by_input: list[Any] = [None] * len(specs)
        for i, put, g in zip(floats, puts, grads, strict=True):
            by_input[i] = g.reshape(batch.specs[i].shape) if put == SUM else g
        return by_input

    def tangent(self) -> Function:
        if "tangent" not in self.derived:
            self.derived["tangent"] = Elements(self.fn.tangent(), self.mesh, self.summed, (),
                                               f"jvp({self.name})", primal=self)
        return self.derived["tangent"]


def _nodal(fn: Function, nodal: Any, call: str) -> tuple[bool, ...]:
    names = fn.param_names()
    picks = (nodal,) if isinstance(nodal, (int, str)) else tuple(nodal)
    flags = [False] * len(names)
    for p in picks:
        if isinstance(p, str):
            if p not in names:
                raise ValueError(f"{call}: nodal names {p!r}, which is not a parameter of {fn.name} ({names})")
            p = names.index(p)
        if not isinstance(p, int) or isinstance(p, bool) or not -len(names) <= p < len(names):
            raise ValueError(f"{call}: nodal must name parameters of {fn.name} by position or name ({names}); "
                             f"got {p!r}")
        flags[p] = True
    if not any(flags):
        raise ValueError(f"{call}: nodal names no parameter: at least one argument holds values per node")
    return tuple(flags)


def _make(f: Any, elements: Any, nodal: Any, summed: bool, what: str) -> Elements:
    call = f"td.{what}"
    fn = as_function(f, call)
    if not fn.pointwise:
        raise TypeError(f"{call}: the per-element function must be a @ti.func or a transform of one (its body runs "
                        f"inside tidiff's element kernels); got {fn.name}, which has no per-element body")
    mesh = Mesh(elements, call)
    return Elements(fn, mesh, summed, _nodal(fn, nodal, call), f"{what}({fn.name})")


def element_sum(f: Any, elements: Any, nodal: Any = 0) -> Elements:
    """The sum over elements of ``f`` applied to each element's nodes: ``F(x, *data) = sum_e f(x[elements[e]], ...)``.

    Args:
        f: the per-element ``@ti.func`` (or a transform of one), e.g. an
            energy ``f(xe, *data) -> scalar`` whose ``xe`` is the element's
            ``k`` nodes' values, shape ``(k, d)`` (``(k,)`` for scalar nodes).
        elements: the connectivity, ``(M, k)`` integer node indices (NumPy,
            torch, a Taichi field or ndarray); read once, here.
        nodal: the parameters holding one value per node (position or name;
            one, or a tuple), gathered through ``elements``: by default the
            first. Every other argument holds one value per element (leading
            axis ``M``) or one for all.

    Returns:
        a :class:`td.Function`: call it, and take ``td.grad``, ``td.hvp``,
        ``td.jvp``, ``td.hessian`` of it as of any function; its sparse
        Hessian is ``td.sparse_hessian`` and its Hessian as a linear
        operator ``td.hessian_operator``.

    Example:
        >>> @ti.func
        ... def spring(xe: ti.types.matrix(2, 2, ti.f64), rest: ti.f64) -> ti.f64:
        ...     return 0.5 * ((xe[1, :] - xe[0, :]).norm() - rest) ** 2
        >>> springs = np.array([[0, 1], [1, 2]])
        >>> energy = td.element_sum(spring, springs)
        >>> x = np.array([[0.0, 0.0], [2.0, 0.0], [2.0, 1.0]])
        >>> float(energy(x, np.array([1.0, 1.0])))
        0.5
        >>> td.grad(energy)(x, np.array([1.0, 1.0]))
        array([[-1.,  0.],
               [ 1.,  0.],
               [ 0.,  0.]])
    """
    return _make(f, elements, nodal, True, "element_sum")


def element_map(f: Any, elements: Any, nodal: Any = 0) -> Elements:
    """``f`` applied to each element's nodes, one result per element: ``F(x, *data)[e] = f(x[elements[e]], ...)``.

    Arguments as for :func:`element_sum`; each result has a leading axis of
    ``M`` elements. Its sparse Jacobian (Gauss-Newton, least squares) is
    ``td.sparse_jacobian``.
    """
    return _make(f, elements, nodal, False, "element_map")
