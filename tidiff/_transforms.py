"""grad, value_and_grad, jacfwd, jacrev, jacobian (and td.vjp's linearization) as Functions.

Each is a :class:`Jacobian` of a ``parent`` Function: its outputs are Jacobian
blocks of parent outputs by the arguments in ``argnums`` and, for some kinds,
parent outputs themselves (the value, aux), laid out by :func:`layout`. It
is built from the parent's protocol alone (``_protocol``):

- a pointwise parent gives a pointwise Jacobian whose ``@ti.func`` body pushes
  basis tangents through the parent's tangent function, or calls its reverse
  function once per output component (``_codegen.bodies``; ``_modes`` says which);
- any other parent gives a composed Jacobian (``_composite``): one evaluation
  of the parent's tangent per input component, or one evaluation of its
  cotangent map per output component.

Either way the Jacobian is a Function again, with a tangent and a vjp, so
transforms compose to any order: ``hessian`` is ``jacfwd(jacrev(f))``.
Derivatives are per batch element (as ``vmap`` of the transform).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _composite, _modes, _pointwise
from ._arrays import Batch, tensor_device
from ._cache import uses
from ._codegen.batch import flatten_batch, identifier
from ._codegen.blocks import BlocksKernel
from ._codegen.bodies import BodyWriter, LocalBlocks, jacobian_blocks
from ._codegen.nested import nested_blocks
from ._composite import Call, Composite, Const, Output
from ._derived import SameArguments
from ._errors import NoForwardRule, TransformError
from ._lang.compile import info, mark
from ._protocol import Function, RuntimeMemo
from ._signature import ArgSpec
from ._tree import Tree, leaves

TRANSFORMS = ("grad", "value_and_grad", "jacfwd", "jacrev", "jacobian", "linearize")
FLAVOUR = {"grad": "reverse", "value_and_grad": "reverse", "jacrev": "reverse", "jacfwd": "forward", "jacobian": "auto",
           "linearize": "auto"}


def normalize_argnums(argnums: Any, call: str) -> tuple[tuple[int, ...], bool]:
    """``(argnums as a tuple, whether it was a tuple)``; refuses what is not an int or a tuple of ints."""
    def is_int(a: Any) -> bool:
        return isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_))

    if is_int(argnums):
        return (int(argnums),), False
    if isinstance(argnums, (tuple, list)) and argnums and all(is_int(a) for a in argnums):
        return tuple(int(a) for a in argnums), True
    raise TypeError(f"{call}: argnums must be an int or a non-empty tuple of ints, got {argnums!r}")


def check_argnums(argnums: Sequence[int], specs: Sequence[ArgSpec], call: str) -> tuple[int, ...]:
    """Each argnum names an existing, float argument; negatives count from the end."""
    for a in argnums:
        if not -len(specs) <= a < len(specs):
            raise ValueError(f"{call}: argnums {a} is out of range for a function of {len(specs)} arguments")
        spec = specs[a]
        if not spec.is_float:
            raise TypeError(
                f"{call}: argument {spec.name!r} (argnums {a}) holds integers ({spec.dtype}); "
                "only float arguments are differentiable"
            )
    positions = tuple(a % len(specs) for a in argnums)
    twice = next((a for a in positions if positions.count(a) > 1), None)
    if twice is not None:  # one of them was differentiated twice, or Taichi refused the call with no reason
        raise ValueError(f"{call}: argnums {tuple(argnums)} names argument {specs[twice].name!r} ({twice}) more "
                         "than once; name each argument once")
    return positions


def non_scalar(tree: Tree, out_specs: Sequence[ArgSpec]) -> Any:
    """None for a single scalar output; else what it is: "a tuple", or its core shape."""
    if isinstance(tree, tuple):
        return "a tuple"
    return None if out_specs[tree].shape == () else out_specs[tree].shape


def split_aux(tree: Tree, call: str) -> tuple[Tree, Tree]:
    """``(main, aux)`` of a function returning the pair ``(out, aux)`` (JAX's ``has_aux``)."""
    if not isinstance(tree, tuple) or len(tree) != 2:
        got = f"a tuple of {len(tree)}" if isinstance(tree, tuple) else "a single value"
        raise TypeError(f"{call}: has_aux=True needs the function to return a pair (out, aux); it returns {got}")
    return tree[0], tree[1]


@dataclass(frozen=True)
class Layout:
    """What each flat result of a Jacobian is, and how the results nest.

    An item is ``("jac", o, a)``, the Jacobian block of parent output ``o`` by
    argument ``a``, or ``("out", o)``, parent output ``o`` itself.
    """

    argnums: tuple[int, ...]
    items: tuple[tuple[Any, ...], ...]
    specs: tuple[ArgSpec, ...]
    tree: Tree

    def wanted(self) -> list[int]:
        """The parent outputs whose Jacobian blocks are asked for."""
        return sorted({it[1] for it in self.items if it[0] == "jac"})


def jacobian_spec(out: ArgSpec, arg: ArgSpec) -> ArgSpec:
    return ArgSpec(f"d{out.name}_d{arg.name}", out.shape + arg.shape, out.dtype)


def layout(transform: str, argnums: tuple[int, ...], tuple_argnums: bool, has_aux: bool, specs: Sequence[ArgSpec],
           out_specs: Sequence[ArgSpec], tree: Tree, call: str, whole: bool = False) -> Layout:
    """The :class:`Layout` of ``transform`` (``"grad"``, ...) of a function with these input and output specs;
    ``whole``: the specs are the arguments' whole shapes (a function without annotations)."""
    argnums = check_argnums(argnums, specs, call)
    main, aux = split_aux(tree, call) if has_aux else (tree, None)
    items: list[tuple[Any, ...]] = []

    def keep(t: Tree) -> Tree:
        if isinstance(t, tuple):
            return tuple(keep(u) for u in t)
        items.append(("out", t))
        return len(items) - 1

    def block_of(o: int) -> Tree:
        if not out_specs[o].is_float:
            raise TypeError(
                f"{call}: output {out_specs[o].name!r} holds integers ({out_specs[o].dtype}); "
                "only float outputs are differentiable"
            )
        nodes = []
        for a in argnums:
            items.append(("jac", o, a))
            nodes.append(len(items) - 1)
        return tuple(nodes) if tuple_argnums else nodes[0]

    def over(t: Tree) -> Tree:
        return tuple(over(u) for u in t) if isinstance(t, tuple) else block_of(t)

    node: Tree
    if transform in ("grad", "value_and_grad"):
        shape = non_scalar(main, out_specs)
        if shape is not None:
            hint = " (for a function returning (out, aux), pass has_aux=True)" \
                if isinstance(main, tuple) and len(main) == 2 and not has_aux else ""
            read = [f"{s.name!r} (shape {s.shape})" for s in specs if s.shape] if whole else []
            if read:
                hint += (f". The function has no annotations, so each argument is one value of its whole shape: "
                         f"{', '.join(read)} {'was' if len(read) == 1 else 'were'} read as one value, not as a batch "
                         "of scalars; annotate the parameters (x: ti.f64) or pass td.function(f, signature=...) to "
                         "batch over leading dims")
            raise TypeError(
                f"{call}: grad is only defined for functions with a scalar output (per batch "
                f"element); the output has core shape {shape}{hint}. Use td.jacobian for vector outputs."
            )
        assert not isinstance(main, tuple)  # non_scalar calls a tuple not scalar
        # the flat results in this order: the value, the aux, the gradients
        value = keep(main) if transform == "value_and_grad" else None
        aux_node = keep(aux) if aux is not None else None
        grads = block_of(main)
        if value is None:
            node = grads if aux_node is None else (grads, aux_node)
        else:
            node = (value if aux_node is None else (value, aux_node), grads)
    elif transform == "linearize":  # every output, then Jacobian blocks of the main ones: td.vjp's residuals
        for o in range(len(out_specs)):
            items.append(("out", o))
        for o in leaves(main):
            block_of(o)
        node = tuple(range(len(items)))
    else:  # jacfwd, jacrev, jacobian
        jac = over(main)
        node = jac if aux is None else (jac, keep(aux))
    flat = tuple(jacobian_spec(out_specs[it[1]], specs[it[2]]) if it[0] == "jac" else out_specs[it[1]]
                 for it in items)
    return Layout(argnums, tuple(items), flat, node)


class Jacobian:
    """What a transform of ``parent`` computes (one of :data:`TRANSFORMS`; see the module docstring): its
    name, its arguments' checks and its outputs' :class:`Layout`. The Function computing it holds one."""

    def __init__(self, transform: str, parent: Function, argnums: Any = 0, has_aux: bool = False) -> None:
        call = f"td.{transform}"
        self.argnums, self.tuple_argnums = normalize_argnums(argnums, call)
        label = "" if argnums == 0 else f", argnums={argnums}"
        self.name = f"{transform}({parent.name}{label}{', has_aux=True' if has_aux else ''})"
        self.transform, self.parent, self.has_aux = transform, parent, has_aux
        self.memo = RuntimeMemo()

    def check_call(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        left_out = kwargs or len(args) < len(self.parent.param_names())
        if left_out and any(a >= len(args) or a < -len(args) for a in self.argnums):
            raise TypeError(
                f"td.{self.transform}({self.parent.name}): differentiating with respect to argnums={self.argnums} "
                f"needs them among the {len(args)} positional arguments; keyword arguments and default values are "
                "passed through, not differentiated"
            )

    def layout(self, in_specs: Sequence[ArgSpec]) -> Layout:
        def make() -> Layout:
            out_specs, tree = self.parent.signature(in_specs)
            return layout(self.transform, self.argnums, self.tuple_argnums, self.has_aux, in_specs, out_specs, tree,
                          f"td.{self.transform}({self.parent.name})", self.parent.declared_specs() is None)

        return self.memo.get(("layout", tuple(in_specs)), make)

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        lay = self.layout(in_specs)
        return list(lay.specs), lay.tree


class PointwiseJacobian(_pointwise.Pointwise):
    """A Jacobian of a pointwise parent: a generated ``@ti.func`` body (one launch on the host)."""

    arguments: SameArguments

    def __init__(self, jacobian: Jacobian) -> None:
        super().__init__(jacobian.name, arguments=SameArguments(jacobian.parent))
        self.jacobian, self.parent, self.transform = jacobian, jacobian.parent, jacobian.transform

    def layout(self, in_specs: Sequence[ArgSpec]) -> Layout:
        return self.jacobian.layout(in_specs)

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        return self.jacobian.signature(in_specs)

    def check_call(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        self.jacobian.check_call(args, kwargs)

    def read(self, args: Sequence[Any], call: str | None = None) -> Batch:
        return self.arguments.read(args, call or self.name)

    def make_body(self, specs: list[ArgSpec]) -> Any:
        lay = self.layout(specs)
        out_specs, tree = self.parent.signature(specs)
        parent_body = self.parent.body_for(specs)
        w = BodyWriter(identifier(self.name), [s.name for s in specs])
        sink = LocalBlocks(w)
        wants_value = any(it[0] == "out" for it in lay.items)
        value = jacobian_blocks(w, parent_body, specs, lay.argnums, out_specs, not isinstance(tree, tuple),
                                lay.wanted(), FLAVOUR[self.transform], sink, keep_value=wants_value)
        if wants_value and value is None:
            value = w.let("value", w.callee(parent_body, identifier(self.parent.name))(*w.args()))
        single = not isinstance(tree, tuple)

        def result(item: tuple[Any, ...]) -> Any:
            if item[0] == "jac":
                return sink.blocks[item[1], item[2]]
            assert value is not None  # made above where an output is wanted
            return value if single else value[item[1]]

        results = [result(it) for it in lay.items]
        body = w.compile(results, single=not isinstance(lay.tree, tuple), tag=self.transform)
        mark(body, looped=w.looped)
        return body

    def evaluate(self, batch: Batch) -> list[Any]:
        """One launch; a Jacobian whose pushes run in a loop writes its blocks straight into the outputs
        (NOTE: [Blocks written to the output] in ``_codegen/bodies``)."""
        specs = list(batch.specs)
        nested = self.memo.get(("nested", tuple(specs)), lambda: self._nested_writer(specs))
        if nested is None and not info(self.body_for(specs)).looped:
            return super().evaluate(batch)
        kernel = self.memo.get(("blocks kernel", tuple(specs)), lambda: self._blocks_kernel(specs, nested))
        uses(kernel.kernel)
        n, inputs = flatten_batch(batch.arrays, specs, batch.shape)
        return [o.reshape(batch.shape + tuple(o.shape[1:])) for o in kernel(n, inputs, tensor_device(batch.arrays))]

    def _blocks_kernel(self, specs: list[ArgSpec], write: Any = None) -> BlocksKernel:
        lay = self.layout(specs)
        out_specs, tree = self.parent.signature(specs)
        return BlocksKernel(identifier(self.name), self.parent.body_for(specs), specs, lay.argnums, lay.items,
                            lay.specs, out_specs, not isinstance(tree, tuple), lay.wanted(), FLAVOUR[self.transform],
                            self.transform, write)

    def _nested_writer(self, specs: list[ArgSpec]) -> Any:
        """The writer of this Jacobian of a reverse-mode Jacobian as one loop over cotangents (NOTE: [Nested
        blocks] in ``_codegen/nested``), or None where that does not apply or gains nothing."""
        inner = self.parent
        if not isinstance(inner, PointwiseJacobian) or not isinstance(inner.parent, _pointwise.Pointwise):
            return None
        lay, inner_lay = self.layout(specs), inner.layout(specs)
        if any(it[0] != "jac" for it in lay.items + inner_lay.items):
            return None
        f_out, _ = inner.parent.signature(specs)
        f_body = inner.parent.body_for(specs)
        inner_active = tuple(k in inner_lay.argnums for k in range(len(specs)))
        if sum(f_out[o].size for o in inner_lay.wanted()) < 2 or _modes.jacobian_mode(
                f_body, inner_active, specs, inner_lay.argnums, f_out, inner_lay.wanted(),
                FLAVOUR[inner.transform]).way != "reverse":
            return None
        active = tuple(k in lay.argnums for k in range(len(specs)))
        if _modes.jacobian_mode(inner.body_for(specs), active, specs, lay.argnums, list(inner_lay.specs),
                                lay.wanted(), FLAVOUR[self.transform]).way != "forward":
            return None

        def write(w: Any, sink: Any) -> None:
            nested_blocks(w, f_body, specs, f_out, inner_lay.argnums, inner_lay.items, lay.argnums, lay.wanted(),
                          sink)
        return write


class ComposedJacobian(_composite.Composed):
    """A Jacobian of a parent without a body: calls of its tangent or its cotangent map (``_composite``)."""

    def __init__(self, jacobian: Jacobian) -> None:
        super().__init__(jacobian.name, arguments=SameArguments(jacobian.parent))
        self.jacobian, self.parent, self.transform = jacobian, jacobian.parent, jacobian.transform

    def layout(self, in_specs: Sequence[ArgSpec]) -> Layout:
        return self.jacobian.layout(in_specs)

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        return self.jacobian.signature(in_specs)

    def check_call(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        self.jacobian.check_call(args, kwargs)

    def evaluate(self, batch: Batch) -> list[Any]:
        try:
            return super().evaluate(batch)
        except NoForwardRule as raised:  # forward mode, taken because reverse mode is refused
            refused = self.parent.reverse_refused()
            if refused is None:
                raise
            raise TransformError(
                f"td.{self.transform}({self.parent.name}): reverse mode is refused ({refused}), and forward mode "
                f"reaches `{raised.function}`, a td.custom_vjp function without a jvp rule",
                hint=f"give {raised.function} a jvp rule with {raised.function}.defjvp(...), or call the transform of "
                     "the @ti.func in the kernel body (td.grad(f)(...)), which is tidiff's own reverse mode and "
                     "applies the rule") from None

    def make_composite(self, specs: list[ArgSpec]) -> Composite:
        lay = self.layout(specs)
        out_specs, _ = self.parent.signature(specs)
        n, m = len(specs), len(out_specs)
        wanted = lay.wanted()
        n_in = sum(specs[a].size for a in lay.argnums)
        n_out = sum(out_specs[o].size for o in wanted)
        mode = _modes.composed_mode(FLAVOUR[self.transform], n_in, n_out, self.parent.reverse_refused())
        calls: list[Call] = []
        blocks: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {}
        value_call = None
        if mode.way == "forward":
            floats = [k for k, s in enumerate(specs) if s.is_float]
            T = self.parent.tangent()
            for a in lay.argnums:
                columns = []
                for p in range(specs[a].size):
                    tangents = [Const(_basis(specs[k], p if k == a else None)) for k in floats]
                    calls.append(Call(T, tuple(range(n)) + tuple(tangents)))
                    columns.append(len(calls) - 1)
                for o in wanted:
                    blocks[o, a] = tuple((c, m + o) for c in columns)
            value_call = 0 if calls else None
        else:
            V = _composite.cotangent_map_of(self.parent)
            rank = {a: r for r, a in enumerate(k for k, s in enumerate(specs) if s.is_float)}
            for o in wanted:
                rows = []
                for q in range(out_specs[o].size):
                    cotangents = [Const(_basis(out_specs[j], q if j == o else None)) for j in range(m)]
                    calls.append(Call(V, tuple(range(n)) + tuple(cotangents)))
                    rows.append(len(calls) - 1)
                for a in lay.argnums:
                    blocks[o, a] = tuple((c, rank[a]) for c in rows)
        if any(it[0] == "out" for it in lay.items) and value_call is None:
            calls.append(Call(self.parent, tuple(range(n))))
            value_call = len(calls) - 1
        stack = "columns" if mode.way == "forward" else "rows"

        def output(item: tuple[Any, ...], spec: ArgSpec) -> Output:
            if item[0] == "jac":
                return Output(blocks[item[1], item[2]], spec, stack)
            assert value_call is not None  # made above where an output is wanted
            return Output(((value_call, item[1]),), spec)

        outputs = [output(it, spec) for it, spec in zip(lay.items, lay.specs, strict=True)]
        return Composite(specs, calls, outputs, lay.tree)


def _basis(spec: ArgSpec, hot: int | None) -> np.ndarray:
    e = np.zeros(spec.size, spec.dtype)
    if hot is not None:
        e[hot] = 1.0
    return e.reshape(spec.shape)


def transform(name: str, f: Function, argnums: Any = 0, has_aux: bool = False) -> Function:
    """The transform ``name`` (one of :data:`TRANSFORMS`) of ``f``, made once per ``f``, name, argnums and
    has_aux."""
    if not isinstance(has_aux, bool):
        raise TypeError(f"td.{name}: has_aux must be True or False, got {has_aux!r}")
    normalized, is_tuple = normalize_argnums(argnums, f"td.{name}")
    key = (name, normalized if is_tuple else normalized[0], has_aux)
    if key not in f.derived:
        jacobian = Jacobian(name, f, key[1], has_aux)
        f.derived[key] = PointwiseJacobian(jacobian) if f.pointwise else ComposedJacobian(jacobian)
    return f.derived[key]
