"""The transforms: grad, value_and_grad, jvp, vjp, jacfwd, jacrev, jacobian, hessian, hvp.

Each is a short composition of a function's three engines (``_evaluate``,
``_vjp``, ``_jvp``; see ``_function``). Derivatives are per batch element
(as ``vmap`` of the transform) except ``jvp`` and ``vjp``, which linearize
the whole batched function.

# NOTE: [Host and body] A transform of a function with a ``@ti.func`` body
# has a body too: generated source that pushes tangents through the parent's
# tangent transform. Kernels call that body, and further transforms
# transform it again (any order). On the host the body runs too, in one
# launch. Transforms of a function without a body (a field program) compose
# its engines: reverse-flavoured ones (grad, value_and_grad, jacrev) one
# reverse pass per output component, jacfwd one forward pass per input one.
"""
import numpy as np
import taichi as ti

from ._arrays import ArgBatch, contiguous, owned_copy, read_args, unbroadcast
from ._bodies import BodyWriter, body_params, forward_possible, jacobian_lines, jacobian_spec, tangent_functions
from ._codegen import compile_source
from ._function import Function, as_function, taichi_callable
from ._pointwise import DerivedFunction, identifier, tangent_function
from ._signature import ArgSpec
from ._tree import leaves, unflatten

_memo = {}


def _argnums_tuple(argnums, call):
    if isinstance(argnums, (int, np.integer)) and not isinstance(argnums, bool):
        return (int(argnums),), False
    if isinstance(argnums, (tuple, list)) and argnums and all(
        isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in argnums
    ):
        return tuple(int(a) for a in argnums), True
    raise TypeError(f"{call}: argnums must be an int or a non-empty tuple of ints, got {argnums!r}")


def check_argnums(argnums, specs, call):
    """Each argnum names an existing, float argument."""
    for a in argnums:
        if not -len(specs) <= a < len(specs):
            raise ValueError(f"{call}: argnums {a} is out of range for a function of {len(specs)} arguments")
        spec = specs[a]
        if not spec.is_float:
            raise TypeError(
                f"{call}: argument {spec.name!r} (argnums {a}) holds integers ({spec.dtype}); "
                "only float arguments are differentiable"
            )
    return tuple(a % len(specs) for a in argnums)


class Transformed(DerivedFunction):
    """A Function made by a transform from its ``parent`` (see NOTE: [Host and body])."""

    def __init__(self, kind, parent, argnums=0, has_aux=False):
        self.argnums, self.tuple_argnums = _argnums_tuple(argnums, f"td.{kind}")
        label = "" if argnums == 0 else f", argnums={argnums}"
        super().__init__(f"{kind}({parent.name}{label}{', has_aux=True' if has_aux else ''})")
        self.kind = kind
        self.parent = parent
        self.has_aux = has_aux
        self._layouts = {}
        self._bodies = {}

    def declared_specs(self):
        return self.parent.declared_specs()

    def param_names(self):
        return self.parent.param_names()

    # -- structure ---------------------------------------------------------
    def layout(self, in_specs):
        """``(argnums, items, out_specs, tree)``: what each flat result is and how they nest.

        An item is ``("jac", o, a)``, the Jacobian block of parent output
        ``o`` by argument ``a``, or ``("out", o)``, parent output ``o`` itself.
        """
        key = tuple(in_specs)
        if key not in self._layouts:
            self._layouts[key] = self._layout(list(key))
        return self._layouts[key]

    def _layout(self, specs):
        call = f"td.{self.kind}({self.parent.name})"
        argnums = check_argnums(self.argnums, specs, call)
        out_specs, tree = self.parent.signature(specs)
        items = []

        def block_of(o):  # the Jacobian (or gradient) of parent output o, by every argnum
            nodes = []
            for a in argnums:
                items.append(("jac", o, a))
                nodes.append(len(items) - 1)
            return tuple(nodes) if self.tuple_argnums else nodes[0]

        if self.kind in ("grad", "value_and_grad"):
            if self.has_aux:
                if not isinstance(tree, tuple) or len(tree) < 2:
                    raise TypeError(f"{call}: has_aux=True needs the function to return a pair (out, aux)")
                main, aux = tree[0], (tree[1] if len(tree) == 2 else tree[1:])
            else:
                main, aux = tree, None
            if isinstance(main, tuple) or out_specs[main].shape != ():
                shape = out_specs[leaves(main)[0]].shape if not isinstance(main, tuple) else "a tuple"
                raise TypeError(
                    f"{call}: grad is only defined for functions with a scalar output (per batch "
                    f"element); the output has core shape {shape}. Use td.jacobian for vector outputs."
                )

            def keep(t):
                if isinstance(t, tuple):
                    return tuple(keep(u) for u in t)
                items.append(("out", t))
                return len(items) - 1

            value = keep(main) if self.kind == "value_and_grad" else None
            aux_node = keep(aux) if aux is not None else None
            grads = block_of(main)
            if self.kind == "grad":
                node = (grads, aux_node) if self.has_aux else grads
            else:
                node = ((value, aux_node) if self.has_aux else value, grads)
        elif self.kind == "linearize":  # every output, then Jacobian blocks (not of aux): td.vjp's residuals
            for o in range(len(out_specs)):
                items.append(("out", o))
            for o in leaves(tree[0]) if self.has_aux else range(len(out_specs)):
                block_of(o)
            node = tuple(range(len(items)))
        else:  # jacfwd, jacrev, jacobian

            def over(t):
                return tuple(over(u) for u in t) if isinstance(t, tuple) else block_of(t)

            node = over(tree)
        flat_specs = [
            jacobian_spec(out_specs[it[1]], specs[it[2]], f"d{out_specs[it[1]].name}_d{specs[it[2]].name}")
            if it[0] == "jac" else out_specs[it[1]]
            for it in items
        ]
        return argnums, items, flat_specs, node

    def signature(self, in_specs):
        _, _, out_specs, tree = self.layout(in_specs)
        return out_specs, tree

    # -- body --------------------------------------------------------------
    def _make_body(self, specs):
        parent_body = self.parent.body_for(specs)
        if parent_body is None:
            return None
        argnums, items, _, own_tree = self.layout(specs)
        out_specs, tree = self.parent.signature(specs)
        single = not isinstance(tree, tuple)
        jvp_name = identifier(self.parent.name) + "_jvp"
        active = tuple(k in argnums for k in range(len(specs)))
        params = body_params(specs)
        writer = BodyWriter(identifier(self.name), params, parent_body, active)
        blocks = jacobian_lines(writer, jvp_name, params, specs, argnums, out_specs, single,
                                forward_only=self.kind == "jacfwd", wanted={it[1] for it in items if it[0] == "jac"},
                                reverse_flavoured=self.kind in ("grad", "value_and_grad", "jacrev"))
        primal_name = identifier(self.parent.name)
        if any(it[0] == "out" for it in items):  # the value a widened push computed, else the primal's
            writer.line(f"value = {writer.primal_value or primal_name + '(' + ', '.join(params) + ')'}")
        results = [
            blocks[it[1], it[2]] if it[0] == "jac" else ("value" if single else f"value[{it[1]}]")
            for it in items
        ]
        source = writer.source(results, single=not isinstance(own_tree, tuple))
        namespace = {"ti": ti, primal_name: parent_body, **tangent_functions(writer, jvp_name, parent_body, active)}
        return writer.finish(compile_source(source, writer.name, namespace, self.kind))

    # -- host --------------------------------------------------------------
    def _mode(self, specs):
        """How the host computes this: "fwd" (the body, or jvps) or "rev" (vjps of the parent).

        A function with a body runs its own body whatever the kind: one
        launch, where vjps would take one launch per output component (see
        NOTE: [Reverse by transposed forward] in ``_pointwise``).
        """
        if self.kind == "jacfwd" or self.body_for(specs) is not None:
            return "fwd"
        if self.kind in ("grad", "value_and_grad", "jacrev"):
            return "rev"
        argnums, items, _, _ = self.layout(specs)
        out_specs, _ = self.parent.signature(specs)
        n_in = sum(specs[a].size for a in argnums)
        n_out = sum(out_specs[o].size for o in {it[1] for it in items})
        return "fwd" if n_in <= n_out else "rev"

    def _evaluate(self, batch, counter):
        specs = batch.specs
        mode = self._mode(specs)
        if mode == "fwd" and self.body_for(specs) is not None:
            return super()._evaluate(batch, counter)
        argnums, items, _, _ = self.layout(specs)
        out_specs, _ = self.parent.signature(specs)
        # NOTE: per-element derivatives: a broadcast argument is expanded so its
        # derivative comes back once per element, as vmap of the transform would.
        arrays = list(batch.arrays)
        for a in argnums:
            arrays[a] = contiguous(np.broadcast_to(arrays[a], batch.batch_shape + specs[a].shape))
        full = ArgBatch(arrays, batch.batch_shape, batch.torch_device)
        full.specs = specs
        jac_outs = sorted({it[1] for it in items if it[0] == "jac"})
        if mode == "fwd":
            outs, blocks = self._columns_by_forward(full, jac_outs, out_specs, argnums, counter)
        else:
            blocks, outs = {}, None
            for o in jac_outs:
                outs, rows = self._rows_by_reverse(full, o, out_specs, argnums, counter)
                blocks.update({(o, a): rows[a] for a in argnums})
        if outs is None:
            outs = self.parent._evaluate(full, counter)
        return [blocks[it[1], it[2]] if it[0] == "jac" else outs[it[1]] for it in items]

    def _rows_by_reverse(self, batch, o, out_specs, argnums, counter):
        """Jacobian blocks of output ``o``: one reverse pass per output component."""
        shape, bshape = out_specs[o].shape, batch.batch_shape
        rows = {a: [] for a in argnums}
        outs = None
        for q in range(max(out_specs[o].size, 1)):
            e = np.zeros(out_specs[o].size, out_specs[o].dtype)
            e[q] = 1.0
            cts = [None] * len(out_specs)
            cts[o] = np.broadcast_to(e.reshape(shape), bshape + shape)
            outs, grads = self.parent._vjp(batch, cts, counter)
            for a in argnums:
                rows[a].append(grads[a])
        spec_of = batch.specs
        blocks = {}
        for a in argnums:
            stacked = np.stack(rows[a], axis=len(bshape))  # batch + (|O|,) + A
            blocks[a] = stacked.reshape(bshape + shape + spec_of[a].shape)
        return outs, blocks

    def _columns_by_forward(self, batch, jac_outs, out_specs, argnums, counter):
        """Jacobian blocks of every output in ``jac_outs``: one forward pass per input component."""
        bshape, specs = batch.batch_shape, batch.specs
        cols = {(o, a): [] for o in jac_outs for a in argnums}
        outs = None
        for a in argnums:
            for p in range(specs[a].size):
                e = np.zeros(specs[a].size, specs[a].dtype)
                e[p] = 1.0
                tangents = [None] * len(specs)
                tangents[a] = e.reshape(specs[a].shape)
                outs, touts = self.parent._jvp(batch, tangents, counter)
                for o in jac_outs:
                    cols[o, a].append(np.broadcast_to(touts[o], bshape + out_specs[o].shape))
        blocks = {
            (o, a): np.stack(c, axis=-1).reshape(bshape + out_specs[o].shape + specs[a].shape)  # O + (|A|,) -> O + A
            for (o, a), c in cols.items()
        }
        return outs, blocks


def _transform(kind, f, argnums=0, has_aux=False):
    parent = as_function(f, f"td.{kind}")
    _argnums_tuple(argnums, f"td.{kind}")
    if not isinstance(has_aux, bool):
        raise TypeError(f"td.{kind}: has_aux must be True or False, got {has_aux!r}")
    key = (kind, id(parent), argnums if isinstance(argnums, int) else tuple(argnums), has_aux)
    hit = _memo.get(key)
    if hit is None or hit.parent is not parent:
        hit = _memo[key] = Transformed(kind, parent, argnums, has_aux)
    return hit


@taichi_callable
def grad(f, argnums=0, has_aux=False):
    """Gradient of a scalar-output function, per batch element.

    Args:
        f: a ``td.Function`` or ``@ti.func``; its (first) output must be a
            scalar per batch element.
        argnums: which argument(s) to differentiate: an int, or a tuple
            (then the gradient is a tuple).
        has_aux: ``f`` returns ``(out, aux)``; aux is returned beside the gradient.

    Returns:
        A ``td.Function`` giving ``d out / d args[argnums]`` in the shape of
        that argument (``batch + core``), or ``(grad, aux)``. It is callable
        on the host and inside kernels.

    Example:
        >>> dfdx = td.grad(p)
        >>> dfdx(1.0)              # array(4.)

    Straight-line code with more than one input component is differentiated
    by one call of its generated reverse function, other code by forward
    pushes, one tangent per input component; the same on the host and inside
    kernels.
    """
    return _transform("grad", f, argnums, has_aux)


@taichi_callable
def value_and_grad(f, argnums=0, has_aux=False):
    """Like :func:`grad`, returning ``(value, grad)`` (``((value, aux), grad)`` with aux).

    Example:
        >>> td.value_and_grad(p)(1.0)    # (array(1.), array(4.))
    """
    return _transform("value_and_grad", f, argnums, has_aux)


@taichi_callable
def jacfwd(f, argnums=0):
    """Jacobian by forward mode, per batch element: shape ``batch + out_core + in_core``.

    Several outputs or a tuple ``argnums`` give nested tuples (outputs outer).

    Example:
        >>> td.jacfwd(f)(np.ones((5, 3)), 2.0).shape    # (5, 3) for a scalar f of a vec3
    """
    return _transform("jacfwd", f, argnums)


@taichi_callable
def jacrev(f, argnums=0):
    """Jacobian by reverse mode (one reverse pass per output component on the host).

    Same shapes as :func:`jacfwd`. Straight-line code takes one call of its reverse
    function per output component; other code (and Jacobians whose forward pushes
    are widened into one call) is computed by forward pushes.
    """
    return _transform("jacrev", f, argnums)


@taichi_callable
def jacobian(f, argnums=0):
    """Jacobian, by forward mode when the inputs are no larger than the outputs, else reverse."""
    return _transform("jacobian", f, argnums)


@taichi_callable
def hessian(f, argnums=0):
    """Hessian of a scalar function: ``jacfwd(jacrev(f, argnums), argnums)``.

    Shape ``batch + in_core + in_core``; a tuple ``argnums`` gives the nested
    block matrix.

    Example:
        >>> td.hessian(f)(np.ones((5, 3)), 2.0).shape    # (5, 3, 3)
    """
    return jacfwd(jacrev(f, argnums), argnums)


def _primals_tuple(primals, name, call):
    if not isinstance(primals, (tuple, list)):
        raise TypeError(f"{call}: {name} must be a tuple with one entry per argument, got {type(primals).__name__}")
    return tuple(primals)


def _read_tangents(specs, primals, batch, tangents, call, what="tangents"):
    """Tangents as arrays, each of its primal's shape; None stays None (zero)."""
    tangents = _primals_tuple(tangents, what, call)
    if len(tangents) != len(primals):
        raise TypeError(f"{call}: got {len(primals)} primals but {len(tangents)} {what}")
    out = []
    for k, (spec, p, t) in enumerate(zip(specs, batch.arrays, tangents)):
        if t is None or not spec.is_float:
            out.append(None)
            continue
        arr = read_args([ArgSpec(f"{what}[{k}]", spec.shape, spec.dtype)], [t], call).arrays[0]
        if arr.shape != p.shape:
            raise ValueError(
                f"{call}: {what}[{k}] must have the shape of primals[{k}] ({spec.name!r}), "
                f"{p.shape}; got {arr.shape}"
            )
        out.append(arr)
    return out


@taichi_callable
def jvp(f, primals, tangents):
    """Forward-mode Jacobian-vector product of the whole (batched) function.

    Args:
        f: a ``td.Function`` or ``@ti.func``.
        primals: tuple of arguments.
        tangents: tuple of tangents, each of its primal's shape (a broadcast
            argument's tangent applies to every element). Integer arguments
            take ``None`` or zeros.

    Returns:
        ``(primals_out, tangents_out)`` in the structure of ``f``'s outputs.

    Example:
        >>> td.jvp(p, (1.0,), (1.0,))     # (array(1.), array(4.))
    """
    fn = as_function(f, "td.jvp")
    if ti.lang.impl.inside_kernel():
        return _jvp_in_kernel(fn, primals, tangents)
    call = f"td.jvp({fn.name})"
    primals = _primals_tuple(primals, "primals", call)
    batch = fn.read(primals, call)
    ts = _read_tangents(batch.specs, primals, batch, tangents, call)
    counter = _counter_of("jvp", fn)
    with counter.tally():
        outs, touts = fn._jvp(batch, ts, counter)
    _, tree = fn.signature(batch.specs)
    return unflatten(tree, [batch.wrap(o) for o in outs]), unflatten(tree, [batch.wrap(o) for o in touts])


def _jvp_in_kernel(fn, primals, tangents):
    specs = fn.specs_for(primals)
    tfn = tangent_function(fn, tuple(specs))
    flat = tfn.body_for(tfn.in_specs)(
        *primals, *[t for t, s in zip(tangents, specs) if s.is_float]
    )
    _, tree = fn.signature(specs)
    half = len(flat) // 2
    return unflatten(tree, list(flat[:half])), unflatten(tree, list(flat[half:]))


_counters = {}


def _counter_of(kind, fn):
    """A cache_info entry for a transform that is a call, not a Function (jvp, vjp, hvp)."""
    key = (kind, id(fn))
    hit = _counters.get(key)
    if hit is None or hit[0] is not fn:
        holder = _CallCounter(f"{kind}({fn.name})")
        hit = _counters[key] = (fn, holder)
    return hit[1]._counter


class _CallCounter(Function):
    """Names the cache_info entry of a call-style transform."""

    def declared_specs(self):
        return None


def vjp(f, *primals, has_aux=False):
    """Reverse-mode vector-Jacobian product of the whole (batched) function.

    Returns:
        ``(primals_out, vjp_fn)``, or ``(primals_out, vjp_fn, aux)`` with
        ``has_aux``; ``vjp_fn(cotangent)`` takes a cotangent in the structure
        and shapes of ``primals_out`` and returns a tuple with one entry per
        primal, in that primal's shape (summed over the batch for a
        broadcast argument; ``None`` for an integer argument).

    Example:
        >>> y, vjp_fn = td.vjp(f, x, 2.0)
        >>> dx, ds = vjp_fn(np.ones(y.shape))
    """
    fn = as_function(f, "td.vjp")
    call = f"td.vjp({fn.name})"
    batch = fn.read(primals, call)
    counter = _counter_of("vjp", fn)
    out_specs, tree = fn.signature(batch.specs)
    if has_aux:
        if not isinstance(tree, tuple) or len(tree) < 2:
            raise TypeError(f"{call}: has_aux=True needs the function to return a pair (out, aux)")
        main_tree, aux_tree = tree[0], (tree[1] if len(tree) == 2 else tree[1:])
    else:
        main_tree, aux_tree = tree, None
    main_leaves = leaves(main_tree)
    lin = _linearization(fn, batch.specs, out_specs, main_leaves, has_aux)
    if lin is None:  # vjp_fn runs at the primals as they are now, whatever the caller does to them later
        batch.arrays = [owned_copy(a) for a in batch.arrays]
    with counter.tally():
        outs = (lin or fn)._evaluate(batch, counter)
    outs, jacobians = outs[:len(out_specs)], outs[len(out_specs):]

    def vjp_fn(cotangent):
        cts = [None] * len(out_specs)
        given = [cotangent] if not isinstance(main_tree, tuple) else list(_flatten_like(main_tree, cotangent, call))
        for leaf, c in zip(main_leaves, given):
            expected = batch.batch_shape + out_specs[leaf].shape
            arr = read_args([ArgSpec("cotangent", out_specs[leaf].shape, out_specs[leaf].dtype)], [c], call).arrays[0]
            if arr.shape != expected:
                raise ValueError(f"{call}: the cotangent must have the output's shape {expected}, got {arr.shape}")
            cts[leaf] = arr
        with counter.tally():
            if lin is not None:
                grads = _contract(lin, batch, jacobians, cts, out_specs)
            else:
                grads = fn._cotangents(batch, cts, counter)
        return tuple(batch.wrap(g) for g in grads)

    wrapped = [batch.wrap(o) for o in outs]
    if has_aux:
        return unflatten(main_tree, wrapped), vjp_fn, unflatten(aux_tree, wrapped)
    return unflatten(tree, wrapped), vjp_fn


# NOTE: [Linearized vjp] When a function with a body has per-element
# Jacobians no larger than its inputs and outputs together (elementwise
# maps, scalar energies), td.vjp computes the outputs and those Jacobians in
# its one launch, as JAX keeps residuals, and vjp_fn contracts them with the
# cotangent in NumPy: a memory-bound pass instead of a second launch that
# recomputes the primal and its tangents. W3 (sin(x) x^2 + exp(-x), n = 1e7)
# went from 166 ms + 235 ms to about 250 ms + 30 ms.


def _linearization(fn, specs, out_specs, main_leaves, has_aux):
    """The ``linearize`` transform of ``fn`` for td.vjp, or None (see NOTE: [Linearized vjp])."""
    floats = tuple(k for k, s in enumerate(specs) if s.is_float)
    if not floats or fn.body_for(specs) is None:
        return None
    if not forward_possible(fn.body_for(specs), tuple(s.is_float for s in specs)):
        return None  # a custom_vjp rule must see the real cotangent, not basis vectors
    entries = sum(out_specs[o].size * specs[a].size for o in main_leaves for a in floats)
    if entries > sum(specs[a].size for a in floats) + sum(out_specs[o].size for o in main_leaves):
        return None
    lin = _transform("linearize", fn, floats, has_aux)
    return lin if lin.body_for(specs) is not None else None


def _contract(lin, batch, jacobians, cotangents, out_specs):
    """``J^T c`` per argument from the stored per-element Jacobians, summed onto broadcast arguments."""
    argnums, items, _, _ = lin.layout(batch.specs)
    grads = [None] * len(batch.specs)
    nb = len(batch.batch_shape)
    for (_, o, a), jac in zip(items[len(out_specs):], jacobians):
        c = cotangents[o]
        if c is None:
            continue
        out, arg = out_specs[o], batch.specs[a]
        term = jac * c.reshape(c.shape + (1,) * len(arg.shape))
        if out.shape:
            term = term.sum(axis=tuple(range(nb, nb + len(out.shape))))
        grads[a] = term if grads[a] is None else grads[a] + term
    for a in argnums:
        shape = batch.arrays[a].shape
        grads[a] = np.zeros(shape, batch.specs[a].dtype) if grads[a] is None else unbroadcast(grads[a], shape)
    return grads


def _flatten_like(tree, value, call):
    if isinstance(tree, tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(tree):
            raise TypeError(f"{call}: the cotangent must be a tuple of {len(tree)} entries, like the outputs")
        for t, v in zip(tree, value):
            yield from _flatten_like(t, v, call)
    else:
        yield value


@taichi_callable
def hvp(f, primals, tangents):
    """Hessian-vector product per batch element, without forming the Hessian.

    Differentiates with respect to every float argument: returns
    ``(value, H @ tangents)``, the second in the structure of ``tangents``
    (a tuple, one entry per argument; ``None`` for integer arguments).

    Example:
        >>> value, hv = td.hvp(f, (x, s), (v, 0.0))
    """
    fn = as_function(f, "td.hvp")
    call = f"td.hvp({fn.name})"
    primals = _primals_tuple(primals, "primals", call)
    specs = fn.specs_for(primals)
    floats = tuple(k for k, s in enumerate(specs) if s.is_float)
    vg = value_and_grad(fn, floats)
    if ti.lang.impl.inside_kernel():
        (value, g), (dvalue, hv) = _jvp_in_kernel(vg, primals, tangents)
        return value, _by_argument(hv, floats, len(specs))
    batch = fn.read(primals, call)
    ts = _read_tangents(batch.specs, primals, batch, tangents, call)
    counter = _counter_of("hvp", fn)
    with counter.tally():
        outs, touts = vg._jvp(batch, ts, counter)
    n = len(floats)
    value = batch.wrap(outs[0])
    hv = [batch.wrap(t) for t in touts[1 : 1 + n]]
    return value, _by_argument(tuple(hv), floats, len(specs))


def _by_argument(values, floats, nargs):
    out = [None] * nargs
    for k, v in zip(floats, values):
        out[k] = v
    return tuple(out)
