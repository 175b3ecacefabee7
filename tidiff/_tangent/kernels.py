"""Tangent of kernels over global fields (every float field ``x`` gets a tangent field ``dx``) or ndarrays.

NOTE: [Tangent of a kernel] A kernel's inputs and results are global
fields, so its tangent kernel pairs every float field ``x`` it touches with
a tangent field ``dx`` of the same shape (the caller allocates them and
passes the pairing as :class:`FieldTangents`). Field accesses then follow
the same rules as local variables:

- a load ``x[i]`` is the pair ``(x[i], dx[i])``;
- a store ``x[i] = e`` also stores ``dx[i] = de``; ``x[i] += e`` (an atomic
  add in a parallel loop) also adds ``dx[i] += de``, and
  ``ti.atomic_add(x[i], e)`` also ``ti.atomic_add(dx[i], de)``;
- loops (``for i in x``, ``range``, ``ti.ndrange``, ``ti.static``) and
  conditions are copied as written: they carry no tangent.

NOTE: [Atomic extremes forward] ``ti.atomic_max(y[i], e)`` (or min) in a
parallel loop: which iteration wins is known only once they all ran, so the
loop does the atomic on ``y`` alone, and loops after it give ``dy``: zero a
count per entry of ``y``; count the iterations whose ``e`` equals ``y[i]``
now (a copy of the loop computing its locals again and writing no field;
``e`` as the first loop kept its bits, NOTE: [Winners by kept values]);
where one won, ``dy[i] = 0``; then each winner adds ``de / count`` (a tie
splits evenly, as ``max`` does: NOTE: [Ties]). Where none won, the old value
did and ``dy[i]`` keeps its tangent. The counts are left as they are, so
the kernel's adjoint reads them (reverse over forward: Hessian-vector
products). The target is written by nothing else in the kernel from that
loop on (what comes before sets the old value and its tangent) and read by
nothing else in that loop, whose iterations race the atomic; later loops
and kernels read what won. Reverse mode: NOTE: [Atomic extremes in reverse].

The tangent kernel has the primal kernel's parameters (numbers, which have
zero tangent) and computes primal and tangent together, so its tangent
fields obey Taichi's global data access rules whenever the primal fields
do: Taichi's reverse mode can differentiate it again (that is how tidiff
gets Hessian-vector products of field programs). ``@ti.func``s a kernel
calls are transformed the same way when they reach a float field
(directly or through further calls), else by the ordinary transform.

A ``ti.template()`` parameter ``src`` is taken for a field: the tangent
kernel gets a parameter ``dsrc`` beside it, and :func:`jvp_kernel` returns a
Python launcher with the kernel's own parameters that looks the tangent
field up at each launch (``FieldTangents.tangent_of``; 0 for a template
argument that is not a field).

Fields reached through objects (``self.x``, ``sim.fields[k]``) are named
first (NOTE: [Fields through objects] in :mod:`.objects`); a float field
without a tangent field is a constant (NOTE: [Known-zero tangents] in
:mod:`.field_flows`): reading it carries no tangent.

A kernel over ``ti.types.ndarray()`` parameters (:func:`jvp_ndarray_kernel`)
is the same transform with the pairing made by parameter instead of by
field: each ndarray parameter named an input or an output gets a tangent
ndarray parameter beside it (the caller allocates it, zeroed for an
output). Global fields it reads are constants.

Limitations: ndarray parameters of a kernel over fields, struct fields,
reading ``x.grad``/``x.dual`` and a ``for`` loop over a list of active
fields are refused with a :class:`~tidiff._errors.TransformError`.
"""
from __future__ import annotations

import ast
import copy
import functools
import inspect
from collections.abc import Iterable, Sequence
from typing import Any

import taichi as ti
from taichi.lang._ndarray import Ndarray
from taichi.lang.field import Field, ScalarField
from taichi.lang.matrix import MatrixType
from taichi.types.annotations import Template
from taichi.types.ndarray_type import NdarrayType

from .._lang import extremes
from .._lang.activity import assignments, root_names, stop_grad_arguments
from .._lang.callees import call_name, transformable
from .._lang.compile import compile_source, info, mark
from .._lang.generate import generate
from .._lang.inline import inlined
from .._lang.naming import RULE_HELPERS, helper_name
from .._lang.nodes import Value, call, entry_root, function, if_, statement, taichi
from .._lang.objects import Unbound, argcount, bind, fields_of, is_float_field, method_parts, parsed_for
from .._lang.parse import MISSING, Parsed, hashable, resolve, without_docstring
from .._lang.scratch import Scratch, holds_scalars
from .._rules import helpers as rule_helpers
from .._rules.calls import callable_rule
from .emit import jvp_func
from .transform import Transformer, _name, retarget

_RULES = {RULE_HELPERS: rule_helpers}

_GRADIENT_ATTRIBUTES = {"grad", "dual"}


class FieldTangents:
    """The tangent field of each float field, and the transforms generated for this pairing.

    Args:
        pairs: ``(field, tangent_field)`` for every float field the kernels
            may touch.
    """

    def __init__(self, pairs: Iterable[tuple[Field, Field]]) -> None:
        self._pairs = {id(f): (f, df) for f, df in pairs}
        self.generated: dict[Any, Any] = {}  # (callee, active) -> generated kernel or func
        self._touches: dict[Any, bool] = {}
        self._void: dict[Any, bool] = {}

    def __getitem__(self, field: Field) -> Field | None:
        """The tangent field of ``field``, or None (a field whose tangent is known to be zero)."""
        pair = self._pairs.get(id(field))
        return None if pair is None or pair[0] is not field else pair[1]

    def of(self, value: object) -> Any:
        """The tangent of a namespace value: a field's tangent field, or the list (tuple, dict) of a list's; else
        None."""
        fields = fields_of(value)
        if not fields:
            return None
        if isinstance(value, Field):
            return self[value]
        assert isinstance(value, (list, tuple, dict))  # what fields_of finds fields in besides a field
        tangents = [self[f] for f in fields]
        if all(t is None for t in tangents):
            return None
        if any(t is None for t in tangents):
            raise TypeError("a list of fields mixes fields with and without a tangent (integer fields, or "
                            "fields that do not depend on an input); keep float fields that depend on the "
                            "inputs in lists of their own")
        return dict(zip(value, tangents, strict=True)) if isinstance(value, dict) else type(value)(tangents)

    def add(self, pairs: Iterable[tuple[Field, Field]]) -> None:
        """Pair more fields (the twins a field program runs the tangent kernels on)."""
        self._pairs.update({id(f): (f, df) for f, df in pairs})

    def tangent_of(self, value: object) -> Field | int:
        """The tangent of a ``ti.template()`` argument at launch: a field's tangent field, else 0."""
        if not isinstance(value, Field):
            return 0
        tangent = self[value]
        if tangent is None:
            kind = "float field without a tangent field" if is_float_field(value) else "integer field"
            raise TypeError(
                f"a tangent kernel got a {kind} as a ti.template() argument; only float fields "
                "paired with a tangent field (the fields the program reaches by name) can be passed"
            )
        return tangent

    def touches(self, f: Any) -> bool:
        """Whether ``@ti.func`` (or helper) ``f``, maybe bound to an object, reaches a field, directly or
        through its callees.

        Such a func is transformed with field accesses (:func:`jvp_field_func`),
        the others by the ordinary transform, which refuses fields.
        """
        if callable_rule(f) is not None:  # a transform called in the kernel (td.grad(E)(x)): a func of values
            return False
        if f not in self._touches:
            self._touches[f] = False  # a recursive func: assume not, while looking
            self._touches[f] = any(
                bool(fields_of(obj)) or any(self.touches(c) for c in _callees(obj))
                for obj in _globals_used(parsed_for(f))
            )
        return self._touches[f]

    def is_void(self, f: Any) -> bool:
        """Whether ``f`` returns nothing (a func that only writes fields)."""
        if f not in self._void:
            tree = parsed_for(f).tree
            self._void[f] = not any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(tree))
        return self._void[f]


def template_parameters(parsed: Parsed) -> list[str]:
    """The parameters of a parsed ``@ti.func`` annotated ``ti.template()``."""
    return [a.arg for a in parsed.tree.args.args
            if isinstance(a.annotation, ast.Call) and resolve(a.annotation.func, parsed.namespace) is ti.template]


def _given_fields(callee: Any, active: Sequence[bool]) -> bool:
    """Whether a func is called with a tangent for one of its ``ti.template()`` parameters (a field given to it)."""
    if not transformable(callee):
        return False
    parsed = parsed_for(callee)
    params = [a.arg for a in parsed.tree.args.args]
    marked = {p for p, a in zip(params, active, strict=False) if a}
    return bool(marked & set(template_parameters(parsed)))


def _callees(obj: object) -> list[Any]:
    """The functions a global stands for that calls may reach: itself, a partial's function, or
    the entries of a table of them (``OPS["sin"](x)``)."""
    if isinstance(obj, dict):
        found = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        found = list(obj)
    else:
        found = [obj]
    found = [o.func if isinstance(o, functools.partial) else o for o in found]
    return [o for o in found if hashable(o) and transformable(o)]


def _globals_used(parsed: Parsed) -> list[Any]:
    """The objects the non-local names of a parsed function stand for."""
    local = _bound_names(parsed.tree)
    names = {n.id for n in ast.walk(parsed.tree) if isinstance(n, ast.Name) and n.id not in local}
    found = []
    for name in sorted(names):
        obj = resolve(ast.Name(name, ast.Load()), parsed.namespace)
        if obj is not MISSING:
            found.append(obj)
    return found


def _bound_names(tree: ast.FunctionDef) -> set[str]:
    """Parameters and variables bound by name (``v = ...``, ``for v in ...``): not ``f`` of ``f[i] = ...``."""
    bound = {a.arg for a in tree.args.args}

    def names(target: ast.expr) -> list[str]:
        if isinstance(target, ast.Name):
            return [target.id]
        if isinstance(target, (ast.Tuple, ast.List)):
            return [n for elt in target.elts for n in names(elt)]
        if isinstance(target, ast.Starred):
            return names(target.value)
        return []

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            bound.update(n for t in node.targets for n in names(t))
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.comprehension)):
            bound.update(names(node.target))
        elif isinstance(node, ast.NamedExpr):
            bound.update(names(node.target))
    return bound


def _alone_in_extremes(root: str, tree: ast.FunctionDef, loop: ast.For, namespace: dict[str, Any]) -> bool:
    """Whether the field ``root`` is written only by atomic extremes from the parallel loop ``loop`` on (its
    statements before, ``m[None] = -1e9``, give the old value), and read in none of them in ``loop`` (whose
    iterations race the extremes): later loops read what won."""
    def is_extreme(n: ast.AST) -> bool:
        return isinstance(n, ast.Call) and bool(n.args) and root_names(n.args[0])[:1] == [root] \
            and resolve(n.func, namespace) in (ti.atomic_max, ti.atomic_min)

    def is_write(n: ast.AST) -> bool:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, (ast.AugAssign,
                                                                                            ast.AnnAssign)) else []
        return any(root_names(t)[:1] == [root] for t in targets) or isinstance(n, ast.Call) and bool(n.args) \
            and not is_extreme(n) and root_names(n.args[0])[:1] == [root] \
            and getattr(resolve(n.func, namespace), "__name__", "").startswith("atomic_")

    body = without_docstring(tree.body)
    after = body[next((k for k, stmt in enumerate(body) if stmt is loop), 0):]
    uses = sum(isinstance(n, ast.Name) and n.id == root for n in ast.walk(loop))
    return not any(is_write(n) for stmt in after for n in ast.walk(stmt)) \
        and uses == sum(map(is_extreme, ast.walk(loop)))


class _Recomputed(ast.NodeTransformer):
    """A copy of a parallel loop of the tangent kernel that writes no field: each atomic extreme replaced by its
    counting (``which`` 0) or adding (1) statement, every other write into a field (and call of a func, which
    may write one) dropped; locals are computed as before (NOTE: [Atomic extremes forward])."""

    def __init__(self, sites: dict[str, tuple[ast.stmt, ast.stmt]], which: int, fields: set[str],
                 local: set[str]) -> None:
        self.sites, self.which, self.fields, self.local = sites, which, fields, local

    def writes_field(self, target: ast.expr) -> bool:
        roots = root_names(target)
        return bool(roots) and roots[0] in self.fields

    def visit_Expr(self, node: ast.Expr) -> ast.AST | None:
        site = self.sites.get(ast.dump(node))
        if site is not None:
            return copy.deepcopy(site[self.which])
        value = node.value
        if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Attribute):
            return node if not isinstance(value, ast.Call) else None  # a call of a func may write a field
        if value.func.attr.startswith("atomic_"):
            return None if not value.args or self.writes_field(value.args[0]) else node  # kept on a local
        receiver = root_names(value.func.value)
        return node if receiver and receiver[0] in self.local else None  # a method of a local (v.fill(0))

    def visit_Assign(self, node: ast.Assign) -> ast.AST | None:
        return None if any(self.writes_field(t) for t in node.targets) else node

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AST | None:
        return None if self.writes_field(node.target) else node

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        if isinstance(node, (ast.For, ast.While, ast.If)) and not node.body:
            node.body = [ast.Pass()]  # every statement of it wrote a field
        return node


def jvp_kernel(kernel: Any, tangents: FieldTangents, owner: object = None) -> Any:
    """Tangent transform of a ``@ti.kernel`` over global fields (see NOTE: [Tangent of a kernel]).

    Args:
        kernel: a ``@ti.kernel``; its parameters must be numbers (scalars,
            vectors, matrices), which get zero tangent, or ``ti.template()`` fields.
        tangents: a :class:`FieldTangents` pairing every float field the
            kernel (and the funcs it calls) reach with its tangent field
            (a field without one is a constant).
        owner: for a kernel of a ``@ti.data_oriented`` class, the object it is
            bound to; the tangent kernel is a plain kernel of that object
            (without ``self``).

    Returns:
        A ``@ti.kernel`` with the same parameters that computes what
        ``kernel`` does and, beside it, the tangent of every field it writes
        from the tangents of the fields it reads. Generated once per
        ``(kernel, tangents)``; ``source(result)`` gives its code.

    Example:
        >>> x, dx = ti.field(ti.f64, shape=3), ti.field(ti.f64, shape=3)
        >>> loss, dloss = ti.field(ti.f64, shape=()), ti.field(ti.f64, shape=())
        >>> @ti.kernel
        ... def energy():
        ...     for i in x:
        ...         loss[None] += x[i] ** 2
        >>> energy_jvp = jvp_kernel(energy, FieldTangents([(x, dx), (loss, dloss)]))
        >>> x.from_numpy(np.array([1.0, 2.0, 3.0])); dx.from_numpy(np.array([1.0, 0.0, 0.0]))
        >>> energy_jvp()                              # loss and dloss, from x and dx
        >>> loss[None], dloss[None]
        (14.0, 2.0)
    """
    key = (kernel, id(owner))
    if key not in tangents.generated:
        g, transformer = _transform_kernel(kernel, tangents, owner=owner)
        if transformer.template_params:
            g = _launcher(g, transformer, tangents)
        tangents.generated[key] = g
    return tangents.generated[key]


def jvp_ndarray_kernel(kernel: Any, inputs: Sequence[str], outputs: Sequence[str], scratch: Sequence[str] = ()
                       ) -> tuple[Any, list[str], list[str], list[Scratch]]:
    """Tangent transform of a kernel over ``ti.types.ndarray()`` parameters (see NOTE: [Tangent of a kernel]).

    Args:
        kernel: a ``@ti.kernel``.
        inputs: the ndarray parameters that carry a tangent in.
        outputs: the ndarray parameters the kernel writes results into.

    Returns:
        ``(kernel_jvp, input_tangents, output_tangents, scratch)``:
        ``kernel_jvp`` takes the kernel's parameters, then a tangent (named
        as listed, ``d<name>`` unless taken) for each input and each output
        (zeroed by the caller), then the ``scratch`` arrays (NOTE: [Scratch
        arrays]), and writes the outputs and their tangents. Parameters not
        listed (integer arrays, numbers) carry no tangent; ``scratch`` names a
        tangent kernel's own scratch arrays, which its tangent takes as they are.
    """
    g, transformer = _transform_kernel(kernel, FieldTangents(()), arrays=list(inputs) + list(outputs),
                                       scratch=scratch)
    names = transformer.namer.tangents
    return g, [names[p] for p in inputs], [names[p] for p in outputs], transformer.scratch


def _transform_kernel(kernel: Any, tangents: FieldTangents, owner: object = None,
                      arrays: Sequence[str] | None = None, scratch: Sequence[str] = ()
                      ) -> tuple[Any, KernelTransformer]:
    """The compiled tangent kernel and the transformer that wrote it."""
    made: list[KernelTransformer] = []

    def make(parsed: Parsed, active: tuple[bool, ...]) -> KernelTransformer:
        made.append(KernelTransformer(parsed, active, tangents, kernel=kernel, owner=owner, arrays=arrays,
                                      kept_arrays=scratch))
        return made[0]

    return generate(Unbound(kernel) if owner is not None else kernel, (), make, tag="jvp", namespace=_RULES), made[0]


def _launcher(g: Any, transformer: KernelTransformer, tangents: FieldTangents) -> Any:
    """``k(*args)`` -> ``k_jvp(*args, *tangents of the template arguments)``, looked up at launch.

    Built as an AST; the names it reads (the tangent kernel, the lookup) come
    from the transformer's namer, so no parameter name can shadow them.
    """
    params, name = transformer.params, transformer.tree.name
    kernel, lookup = transformer.jvp_name, transformer.namer.fresh("tangent_of")
    args: list[Value] = [*params, *(call(lookup, p) for p in transformer.template_params)]
    launch_def = function(name, [(p, None) for p in params], [ast.Return(call(kernel, *args))], decorator=None)
    namespace = {"__name__": "tidiff_generated", kernel: g, lookup: tangents.tangent_of}
    launch = compile_source(launch_def, name, namespace, tag="jvp-launch")
    mark(launch, source=f"{info(g).source}\n\n{info(launch).source}")
    return launch


def jvp_field_func(f: Any, active: Sequence[bool], tangents: FieldTangents) -> Any:
    """Tangent transform of a ``@ti.func`` that reaches global fields (a callee of :func:`jvp_kernel`).

    Like :func:`~.emit.jvp_func` (``active`` marks parameters with a
    tangent), with field accesses paired with tangent fields; a func that
    returns nothing gives a tangent func that returns nothing.
    """
    n = argcount(f)
    pattern = tuple(bool(a) for a in active)
    if len(pattern) != n:
        raise ValueError(f"jvp_field_func(f, active): f takes {n} parameters, active has {len(pattern)} entries")
    fn, owner = method_parts(f)
    key = (fn, id(owner), pattern)
    if key not in tangents.generated:
        tangents.generated[key] = generate(
            fn, pattern, lambda parsed, act: KernelTransformer(parsed, act, tangents, owner=owner), tag="jvp",
            namespace=_RULES)
    return tangents.generated[key]


class KernelTransformer(Transformer):
    """The tangent of a kernel, or of a func it calls, with field accesses (see NOTE: [Tangent of a kernel]).

    ``arrays`` names the ndarray parameters of a kernel over ndarrays that get
    a tangent parameter; None for a kernel over fields, whose
    ``ti.template()`` parameters get one (looked up at launch) and which
    takes no ndarray.
    """

    def __init__(self, parsed: Parsed, active: Sequence[bool], tangents: FieldTangents, kernel: Any = None,
                 owner: object = None, arrays: Sequence[str] | None = None, kept_arrays: Sequence[str] = ()) -> None:
        self.field_tangents = tangents
        self.kept_arrays = frozenset(kept_arrays)  # a tangent kernel's own scratch arrays, transformed again: no
        # tangent (NOTE: [Scratch arrays])
        self.kernel = kernel  # the @ti.kernel being transformed, or None for a func
        self.owner = owner  # the object a class kernel or a func taken from an object is bound to
        self.is_kernel = kernel is not None
        self.arrays = arrays
        bind(parsed, owner)
        if kernel is not None:  # NOTE: [Structs through funcs]
            written_out = inlined(parsed, structs_only=True)
            parsed.namespace.update(written_out.namespace)  # the names bound for it, where the code is compiled
            parsed = written_out
        super().__init__(parsed, active, self._jvp_of)
        self.locals = _bound_names(self.tree)
        self.template_params: list[str] = []  # ti.template() fields: their tangent is passed at launch
        self.paired: list[str] = []  # a kernel's parameters with a tangent parameter beside them
        if kernel:
            self.decorator, self.returns = "kernel", parsed.tree.returns
            if arrays is None:
                self.template_params = [p.name for p in self._parameters() if isinstance(p.annotation, Template)]
                self.kept_arrays |= {p.name for p in self._parameters() if isinstance(p.annotation, NdarrayType)}
                # a NumPy array or tensor given to a kernel over fields: a constant of the program, read and
                # written (``out[i] = y[i]``, a copy out) without a tangent (NOTE: [Arrays given to a kernel
                # over fields])
            paired = self.template_params if arrays is None else arrays
            self.paired = self.active_params = [p for p in self.params if p in paired]
        else:  # a func given fields through ti.template() parameters: each active one comes with its tangent field
            self.template_params = [p for p in template_parameters(parsed) if p in self.active_params]
            self.paired = list(self.template_params)
        # sources: global names whose use carries a tangent (float fields, lists of them, funcs reaching them)
        self.sources: set[str] = set()
        self.fields: dict[str, Any] = {}
        for name in sorted({n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name)} - self.locals):
            obj = resolve(ast.Name(name, ast.Load()), parsed.namespace)
            if isinstance(obj, Ndarray) or fields_of(obj):
                self.fields[name] = obj
                tangent = None if isinstance(obj, Ndarray) else tangents.of(obj)
                if tangent is not None:
                    self.sources.add(name)
                    self.helpers[self.namer.tangent(name)] = tangent
            elif any(tangents.touches(c) for c in _callees(obj)):  # a func, helper or table of them
                self.sources.add(name)
        self._field_names = set(self.fields) | set(self.paired)
        self.parallel_node: ast.For | None = None  # the kernel's parallel loop being transformed
        self.extremes: list[tuple[ast.stmt, ast.stmt, ast.stmt, ast.expr, str]] = []  # its atomic max / min:
        # (the atomic, its counting and adding statements, the tangent entry, the counts' name)
        self.extremes_fields: dict[str, str] = {}  # the counts' name -> the field whose winners it counts
        self.scratch: list[Scratch] = []  # an ndarray kernel's: arrays its tangent takes after its parameters
        # (NOTE: [Scratch arrays])
        self.active = self._activity()

    def _jvp_of(self, callee: Any, active: Sequence[bool]) -> Any:
        if self.field_tangents.touches(callee) or _given_fields(callee, active):
            return jvp_field_func(callee, active, self.field_tangents)
        return jvp_func(callee, active)

    def _passes_fields(self, node: ast.Call) -> bool:
        """Whether a call passes a field with a tangent (a source, or a paired parameter) as an argument."""
        return any(isinstance(a, ast.Name) and (a.id in self.sources or a.id in self.paired) for a in node.args)

    def run(self) -> ast.FunctionDef:
        if self.is_kernel:
            self._check_parameters()
        tree = super().run()
        tree.args.args += [scratch.parameter(self.helpers, self.namer) for scratch in self.scratch]
        self.jvp_name = tree.name  # taken in the namer: no parameter or global has it
        return tree

    def _parameters(self) -> list[inspect.Parameter]:
        """The kernel's parameters (a class kernel's ``self`` is bound, not one)."""
        return list(inspect.signature(self.kernel.__wrapped__).parameters.values())[self.owner is not None:]

    def _check_parameters(self) -> None:
        args = self.tree.args
        if args.defaults:
            raise self.error(self.tree, "a kernel parameter list with defaults",
                             "give the kernel plain positional parameters")
        for p in self._parameters():
            ann = p.annotation
            if ann in (int, float) or isinstance(ann, (type(ti.f64), MatrixType, Template)):
                continue
            if isinstance(ann, NdarrayType):  # an input or output of an ndarray kernel; in a kernel over fields, a
                continue  # constant of the program (weights passed as a NumPy array): no tangent
            raise self.error(
                self.tree, f"the kernel parameter `{p.name}` of kind {type(ann).__name__}",
                "a tangent kernel takes numbers and ti.template() fields; refer to other data "
                "through fields instead of ndarray or struct arguments")

    # --- activity ------------------------------------------------------------
    def _loads(self, node: ast.AST) -> set[str]:
        """Names ``node`` reads, except fields read for their static attributes (``x.shape``)."""
        found: set[str] = set()

        def visit(n: ast.AST) -> None:
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in self._field_names:
                if n.attr in _GRADIENT_ATTRIBUTES:
                    raise self.error(n, f"the attribute `{ast.unparse(n)}` of a field",
                                     "compute from the fields' values: tidiff owns gradients and duals while it "
                                     "differentiates the program")
                return
            if isinstance(n, ast.Name):
                found.add(n.id)
            for child in ast.iter_child_nodes(n):
                visit(child)

        visit(node)
        return found

    def _activity(self) -> set[str]:
        """Locals that depend on an active parameter or a source (forward activity, to a fixpoint)."""
        writes, loop_vars = assignments(self.tree.body)
        active = set(self.active_params) | self.sources
        changed = True
        while changed:
            changed = False
            for names, value in writes:
                if self._loads(value) & active:
                    for name in names:
                        if name in self.locals and name not in loop_vars and name not in active \
                                and name not in self.kept_arrays:
                            active.add(name)
                            changed = True
        return active

    def is_active(self, node: ast.AST) -> bool:
        return bool(self._loads(node) & self.active)

    def _is_local(self, node: ast.expr) -> bool:
        """Local values, including elements of global fields (``x[i].norm()`` is a method on a value)."""
        root, subscripted = entry_root(node)
        if not isinstance(root, ast.Name):
            return True
        return root.id in self.locals or (subscripted and root.id in self.fields)

    def _check_fields(self) -> None:
        """Fields are welcome here (those without a tangent field are constants); ndarrays are not."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
                obj = self.fields.get(node.value.id)
                if isinstance(obj, Ndarray):
                    raise self.error(node, f"ndarray access `{ast.unparse(node)}` in a kernel over fields",
                                     "copy the data into a field, or make the program one kernel over ndarrays "
                                     "(td.function(kernel, inputs=[...], outputs={...}))")

    def _check_store(self, target: ast.expr, value: ast.expr) -> None:
        """A store of an active value into data without a tangent (a constant field, an ndarray
        parameter that is not an output) would drop it: refuse."""
        roots = root_names(target)
        if not roots or not self.is_active(value) or roots[0] in self.kept_arrays:
            return  # (a kept value of an atomic's, in the tangent kernel transformed again: NOTE: [Scratch arrays])
        root = roots[0]
        if isinstance(self.fields.get(root), Field) and not is_float_field(self.fields[root]):
            return  # an integer field: the value is cast (tidiff's own keep bits there: NOTE: [Winners by kept values])
        if root in self.fields and root not in self.sources:
            if self.arrays is not None:
                raise self.error(target, f"a write to the global `{root}` from differentiable values",
                                 "make it an ndarray parameter and list it in outputs=")
            raise self.error(target, f"a store of a differentiable value into `{ast.unparse(target)}`, "
                             "a field found not to depend on the inputs",
                             "this is a tidiff bug in its activity analysis; please report it")
        if self.arrays is not None and root in self.params and root not in self.active_params \
                and not isinstance(target, ast.Name):
            raise self.error(target, f"a write to parameter `{root}` from differentiable values",
                             f"list {root!r} in outputs= (or inputs=)")

    def stmt_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_store(target, node.value)
        super().stmt_Assign(node)

    def stmt_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_store(node.target, node.value)
        super().stmt_AugAssign(node)

    def kept_sums(self) -> frozenset[str]:
        """A kernel's top-level locals its parallel loops update in place (``total += e``, ``dtotal += de``):
        Taichi's reductions, atomic adds, kept as written by the renaming (NOTE: [Rebinding in loops]), whose copy
        and write-back would race across iterations."""
        if not self.is_kernel:
            return frozenset()
        top = {n.id for stmt in self.block if not isinstance(stmt, (ast.For, ast.While))
               for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        return frozenset(n.target.id for stmt in self.block if isinstance(stmt, ast.For) for n in ast.walk(stmt)
                         if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name) and n.target.id in top)

    # --- statements ----------------------------------------------------------
    def stmt_For(self, node: ast.For) -> None:
        if not (self.is_kernel and self.depth == 0):
            return self.parallel_for(node)
        self.parallel_node = node  # a parallel loop: it settles the atomic extremes in it
        self.parallel_for(node)
        if self.extremes:
            self.settle_extremes(self.block[-1])
        self.parallel_node, self.extremes = None, []

    def parallel_for(self, node: ast.For) -> None:
        iterated = node.iter.args[0] if isinstance(node.iter, ast.Call) and len(node.iter.args) == 1 \
            and resolve(node.iter.func, self.parsed.namespace) is ti.static else node.iter
        if isinstance(iterated, ast.Name) and iterated.id in self.sources \
                and isinstance(self.fields.get(iterated.id), (list, tuple)):
            raise self.error(node, f"a for loop over the fields of `{ast.unparse(iterated)}`",
                             "loop over indices instead: for k in ti.static(range(len(fields))): fields[k][i]")
        if self._loads(node.iter) & (self.active - self.sources - set(self.paired)):
            raise self.error(node, f"a for loop over differentiable values `{ast.unparse(node.iter)}`",
                             "loop over indices instead: for i in ti.static(range(n))")
        stopped = self._stopped(node.body) if self.is_kernel and self.depth == 0 else set()
        self.sources -= stopped  # ti.stop_grad(x) in a kernel's loop: x is a constant in that loop, as in
        active, self.active = self.active, self.active - stopped  # Taichi's reverse mode of it
        try:
            self.emit(ast.For(node.target, node.iter, self.nested(node.body),
                              self.nested(node.orelse) if node.orelse else []))
        finally:
            self.sources |= stopped & set(self.fields)
            self.active = active

    def statement(self, node: ast.stmt) -> None:
        """Calls of funcs reaching fields inside a test or a comparison run first, as statements of their own,
        so that their writes carry tangents (``if clipped(x[i]) > 0.5:`` carries none, and ran the primal
        func: its writes lost their tangents)."""
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.If, ast.Return)) and any(
                isinstance(n, ast.Call) and self._reaches_fields(n) for n in ast.walk(node)):
            node = copy.deepcopy(node)  # the parsed tree is shared: edit a copy
            for hoisted in self._hoisted_calls(node):
                super().statement(hoisted)
        super().statement(node)

    def _hoisted_calls(self, node: ast.stmt) -> list[ast.stmt]:
        """``v = f(...)`` for each call reaching fields nested in ``node``'s expressions (``node`` edited to
        read ``v``); a statement that is itself such a call, or assigns one, keeps it."""
        out: list[ast.stmt] = []
        transformer = self

        class Hoist(ast.NodeTransformer):
            untraced = 0  # how deep in an expression that carries no tangent (a comparison, a test)

            def visit_Compare(self, node: ast.Compare) -> ast.AST:
                return self.untraced_visit(node)

            def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
                return self.untraced_visit(node)

            def untraced_visit(self, node: ast.expr) -> ast.AST:
                self.untraced += 1
                self.generic_visit(node)
                self.untraced -= 1
                return node

            def visit_Call(self, call: ast.Call) -> ast.AST:
                self.generic_visit(call)
                if not self.untraced or not transformer._reaches_fields(call):
                    return call
                name = transformer.namer.fresh("called")
                transformer.locals.add(name)
                transformer.active.add(name)
                out.append(ast.Assign([ast.Name(name, ast.Store())], call))
                return ast.Name(name, ast.Load())

        hoist = Hoist()
        if isinstance(node, ast.If):
            hoist.untraced = 1  # a branch's test carries no tangent
            node.test = hoist.visit(node.test)
        elif isinstance(node, (ast.Assign, ast.Expr)) and isinstance(node.value, ast.Call):
            node.value.args = [hoist.visit(a) for a in node.value.args]
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return)) \
                and node.value is not None:
            node.value = hoist.visit(node.value)
        return out

    def _reaches_fields(self, call: ast.Call) -> bool:
        return not self._is_local(call.func) and bool(self.sources) and any(
            self.field_tangents.touches(c) for c in _callees(resolve(call.func, self.parsed.namespace)))

    def stmt_While(self, node: ast.While) -> None:
        if not any(isinstance(n, ast.Call) and self._reaches_fields(n) for n in ast.walk(node.test)):
            return super().stmt_While(node)
        test = self.namer.fresh("test")  # c = test; while c: body; c = test (the test's calls write fields)
        self.locals.add(test)
        self.statement(ast.Assign([ast.Name(test, ast.Store())], copy.deepcopy(node.test)))
        body = self.nested(node.body + [ast.Assign([ast.Name(test, ast.Store())], copy.deepcopy(node.test))])
        self.emit(ast.While(ast.Name(test, ast.Load()), body, []))

    def _stopped(self, body: list[ast.stmt]) -> set[str]:
        """The float fields ``ti.stop_grad(x)`` names in a loop body (Taichi stops them in that whole loop)."""
        return {a.id for a in stop_grad_arguments(body, self._is_stop_grad)
                if isinstance(a, ast.Name) and a.id in self.sources}

    def _is_stop_grad(self, func: ast.expr) -> bool:
        return not self._is_local(func) and resolve(func, self.parsed.namespace) is ti.stop_grad

    def stmt_Return(self, node: ast.Return) -> None:
        if self.is_kernel and self.arrays is not None and node.value is not None:
            raise self.error(node, "a kernel over ndarrays that returns a value",
                             "write results into an output ndarray")
        if self.is_kernel or node.value is None:
            return self.emit(node)  # a kernel's result (a number) and a bare return carry no tangent
        return super().stmt_Return(node)

    def stmt_Expr(self, node: ast.Expr) -> None:
        value = node.value
        if isinstance(value, ast.Call) and self.is_active(value) and not self._is_local(value.func):
            callee = resolve(value.func, self.parsed.namespace)
            kind = next((k for k in ("max", "min") if callee is getattr(ti, f"atomic_{k}")), None)
            if kind is not None:
                return self.extreme(value, kind)
            if any(self.field_tangents.touches(c) for c in _callees(callee)) or self._passes_fields(value):
                self.expr(value)  # a func that writes fields: call its tangent func
                return
        super().stmt_Expr(node)

    def extreme(self, node: ast.Call, kind: str) -> None:
        """``ti.atomic_max(y[i], e)`` (or min): the value now, its tangent once every iteration ran (NOTE:
        [Atomic extremes forward])."""
        target = node.args[0] if len(node.args) == 2 and not node.keywords else None
        root = root_names(target)[0] if target is not None and root_names(target) else None
        field = self.fields.get(root) if root is not None else None
        array = root is not None and root in self.paired and self.arrays is not None  # an output ndarray (NOTE:
        # [Scratch arrays])
        if target is None or not isinstance(target, ast.Subscript) or self.parallel_node is None \
                or not (isinstance(field, ScalarField) or array and self._scalar_array(str(root))):
            raise self.error(node, f"`{ast.unparse(node)}`",
                             f"ti.atomic_{kind} has a derivative into a scalar global field or ndarray, in a "
                             "parallel loop of a kernel, its result unused")
        assert root is not None  # a field was found for it
        if not _alone_in_extremes(root, self.tree, self.parallel_node, self.parsed.namespace):
            raise self.error(node, f"the field `{root}`, read or written besides ti.atomic_max / ti.atomic_min "
                             "in one kernel", "keep the extreme in a field of its own, read by a later loop or "
                             "kernel")
        p, dp = self.atom(node.args[1])
        primal = ast.Expr(ast.Call(node.func, [target, p], []))
        self.emit(primal)
        if root not in self.sources and not array:
            return  # a field without a tangent: a constant
        ties = next((e[4] for e in self.extremes if self.extremes_fields[e[4]] == root), None)  # one count of
        # winners per field and loop
        if ties is None:
            ties = self.namer.fresh(f"{root}_ties")
            if array:
                self.scratch.append(Scratch(ties, ti.i32, root))
            else:
                assert field is not None
                self.helpers[ties] = extremes.own_field(ti.i32, field.shape)
            self.extremes_fields[ties] = root
        kept = self.kept_value(node, root) if array else self.kept(node, root, field)
        if kept is not None:
            self.emit(kept.store(p))  # NOTE: [Winners by kept values]
        count = extremes.counted(p, extremes.type_of(root), target, ties, kept)
        tangent = retarget(target, self.namer.tangent(root))
        won = extremes.won(p, extremes.type_of(root), target) if kept is None else kept.won(target)
        add = if_(won, [statement(call(taichi("atomic_add"), tangent, extremes.share(
            ast.Constant(0.0) if dp is None else dp, ties, target)))])
        self.extremes.append((primal, count, add, tangent, ties))

    def kept(self, node: ast.Call, root: str, field: Any) -> extremes.Kept | None:
        """Where the parallel loop keeps this atomic's values (NOTE: [Winners by kept values]), or None."""
        assert self.parallel_node is not None
        if not extremes.once_per_iteration(self.parallel_node, ast.Expr(node)):
            return None
        return extremes.kept_field(self.parallel_node, self.parsed.namespace, field, self.helpers, self.namer,
                                   f"{root}_kept")

    def kept_value(self, node: ast.Call, root: str) -> extremes.Kept:
        """Where the parallel loop keeps an atomic's values into the ndarray ``root``: an array of its type (which
        the code cannot name), one entry per iteration (NOTE: [Scratch arrays]); the loop's iterations must be
        known at launch and the atomic run once in each."""
        assert self.parallel_node is not None
        arrays = {p.name for p in self._parameters() if isinstance(p.annotation, NdarrayType)}
        extents = extremes.array_extents(self.parallel_node, arrays, self.parsed.namespace)
        index = extremes.loop_index(self.parallel_node)
        if extents is None or isinstance(extents, str) and not self._scalar_array(extents) or index is None \
                or not extremes.once_per_iteration(self.parallel_node, ast.Expr(node)):
            raise self.error(node, f"`{ast.unparse(node)}`",
                             "forward mode of an atomic max / min into an ndarray takes it once per iteration of a "
                             "loop over an array of scalars, range(a.shape[k]), constants or ti.ndrange of them")
        param = self.namer.fresh(f"{root}_kept")
        self.scratch.append(Scratch(param, root, extents if isinstance(extents, str) else tuple(extents)))
        return extremes.KeptValue(param, index)

    def _scalar_array(self, param: str) -> bool:
        """Whether the ndarray parameter ``param`` holds scalars."""
        return holds_scalars(next((p.annotation for p in self._parameters() if p.name == param), None))

    def settle_extremes(self, loop: ast.stmt) -> None:
        """After a parallel loop with atomic extremes, the loops giving their targets' tangents (see the NOTE)."""
        assert isinstance(loop, ast.For)
        sites = {ast.dump(primal): (count, add) for primal, count, add, *_ in self.extremes}
        counts = list(dict.fromkeys(ties for *_, ties in self.extremes))  # a field's sites share its counts
        for ties in counts:  # zero first: the counts outlive the kernel, for its adjoint
            self.block += extremes.zeroed(ties, extremes.counts_ndim(self.helpers, ties), self.namer.fresh)
        for k in (0, 1):  # the counting loop, then (once cleared) the loop adding the winners' tangents
            recompute = _Recomputed(sites, k, self._field_names | set(self.helpers) | self.kept_arrays
                                    | {s.param for s in self.scratch}, self.locals).visit(
                copy.deepcopy(loop))
            if k == 1:
                tangents = {ties: tangent for *_, tangent, ties in self.extremes}
                for ties in counts:
                    tangent = tangents[ties]
                    assert isinstance(tangent, ast.Subscript)
                    self.block += extremes.lost(ties, extremes.counts_ndim(self.helpers, ties), self.namer.fresh,
                                                   tangent.value)
            self.emit(recompute)

    def call_tangent(self, node: ast.Call, callee: Any, custom: Any = None,
                     into: tuple[str, str] | None = None) -> tuple[ast.expr, ast.expr | None]:
        reaches = self.field_tangents.touches(callee) or self._passes_fields(node)
        if custom is not None or not reaches or not self.field_tangents.is_void(callee):
            return super().call_tangent(node, callee, custom, into)
        parts = [self.atom(a) for a in self._positional(node, callee)]
        fn = self.jvp_of(callee, tuple(dp is not None for _, dp in parts))
        helper = helper_name(self.helpers, self.namer, fn, call_name(node.func, callee) + "_jvp")
        args = [p for p, _ in parts] + [dp for _, dp in parts if dp is not None]
        self.emit(ast.Expr(ast.Call(_name(helper), args, [])))
        return ast.Constant(None), None
