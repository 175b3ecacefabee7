"""The public transforms: grad, value_and_grad, jvp, vjp, jacfwd, jacrev, jacobian, hessian, hvp; and td.function.

Each is a short composition over the protocol (``_protocol``): the
Jacobian family are Functions made by ``_transforms.transform``; ``jvp`` is
``f.tangent().evaluate``; ``vjp`` is ``f.evaluate`` now and ``f.vjp`` later;
``hessian`` is ``jacfwd(jacrev(f))``; ``hvp`` is the jvp of ``value_and_grad``.
Derivatives are per batch element (as ``vmap`` of the transform) except
``jvp`` and ``vjp``, which linearize the whole batched function.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import taichi as ti

from . import _modes
from ._arrays import Batch, is_tensor, owned_copy, read_args, tensor_device, unbroadcast, zeros
from ._cache import Counter
from ._derived import like
from ._fields.values import reading, record
from ._protocol import Function, as_function, require_taichi, taichi_callable
from ._protocol import function as _function
from ._signature import ArgSpec
from ._transforms import non_scalar, split_aux, transform
from ._tree import flatten_like, leaves, unflatten


def function(f: Any, *, inputs: Any = None, outputs: Any = None, signature: Any = None, name: str | None = None,
             constants: dict[str, Any] | None = None, state: Any = None) -> Function:
    """Wrap Taichi code as a differentiable :class:`Function`.

    Args:
        f: a ``@ti.func`` (annotated or not); a ``@ti.kernel`` or Python
            callable over global fields (then ``inputs`` and ``outputs`` are
            required); a kernel over ``ti.types.ndarray()`` parameters; or a
            ``Function``, returned as it is.
        inputs, outputs: the fields a field program reads as variables and
            writes as results; for a kernel over ``ti.types.ndarray()``
            parameters, parameter *names*: ``inputs=["k", "w"]`` and
            ``outputs={"out": lambda k, w: k.shape}`` (each output's shape as
            a tuple, or a callable of the inputs' ``.shape/.ndim/.dtype``;
            see docs/torch.md).
        constants: for an ndarray kernel, the values of its other parameters
            (``{"eps": 1e-3}``), fixed for every call.
        signature: for a ``@ti.func``, the core type of each parameter,
            overriding annotations: a sequence in parameter order, or a dict
            by name, of Taichi types (``ti.math.vec3``, ``ti.f64``) or shape
            tuples (``(3,)``, ``(2, 2)``, ``()`` for float values).
        name: the name ``td.cache_info()`` and error messages use.
        state: for a field program, fields it writes as it runs
            (accumulators, intermediate state) that are zeroed before each
            call instead of being loaded with their current values.
            ``inputs``/``outputs`` may also name part of a field along its
            leading axes: ``td.part(v, 0)`` (see docs/kernel-programs.md).

    Returns:
        A :class:`Function`: call it on host arrays (NumPy, torch, Python
        numbers) or inside a kernel (``@ti.func`` code and its transforms).

    Example:
        >>> @ti.func
        ... def f(x, s):                                    # no annotations: a signature gives core shapes
        ...     return s * x.dot(x)
        >>> F = td.function(f, signature=[(3,), ()])
        >>> F(np.ones((4, 3)), 2.0)
        array([6., 6., 6., 6.])
        >>> x, loss = ti.field(ti.f64, shape=3), ti.field(ti.f64, shape=())
        >>> @ti.kernel
        ... def energy():
        ...     for i in x:
        ...         loss[None] += x[i] ** 2
        >>> E = td.function(energy, inputs=[x], outputs=[loss])   # a program over fields
        >>> td.grad(E)(np.array([1.0, 2.0, 3.0]))
        array([2., 4., 6.])
    """
    options = {} if state is None else {"state": state}  # only field programs take it
    return _function(f, inputs=inputs, outputs=outputs, signature=signature, name=name, constants=constants,
                     **options)


@taichi_callable
def grad(f: Any, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Function:
    """Gradient of a scalar-output function, per batch element.

    Args:
        f: a ``td.Function`` or ``@ti.func``; its (first) output must be a
            float scalar per batch element.
        argnums: which argument(s) to differentiate: an int, or a tuple in any
            order (then the gradient is a tuple in that order); negatives count
            from the end.
        has_aux: ``f`` returns the pair ``(out, aux)``; aux is returned beside the gradient.

    Returns:
        A ``td.Function`` giving ``d out / d args[argnums]`` in the shape of
        that argument (``batch + core``), or ``(grad, aux)``. It is callable
        on the host and inside kernels. Keyword arguments of a call are passed
        through, not differentiated.

    Example:
        >>> @ti.func
        ... def p(x: ti.f64) -> ti.f64:
        ...     return x ** 3 + 2 * x ** 2 - 3 * x + 1
        >>> dfdx = td.grad(p)
        >>> dfdx(1.0)
        array(4.)
    """
    return transform("grad", as_function(f, "td.grad"), argnums, has_aux)


@taichi_callable
def value_and_grad(f: Any, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Function:
    """Like :func:`grad`, returning ``(value, grad)`` (``((value, aux), grad)`` with aux).

    Example:
        >>> @ti.func
        ... def p(x: ti.f64) -> ti.f64:
        ...     return x ** 3 + 2 * x ** 2 - 3 * x + 1
        >>> td.value_and_grad(p)(1.0)
        (array(1.), array(4.))
    """
    return transform("value_and_grad", as_function(f, "td.value_and_grad"), argnums, has_aux)


@taichi_callable
def jacfwd(f: Any, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Function:
    """Jacobian by forward mode, per batch element: shape ``batch + out_core + in_core``.

    Several outputs or a tuple ``argnums`` give nested tuples (outputs outer);
    with ``has_aux`` the result is ``(jacobian, aux)``.

    Example:
        >>> @ti.func
        ... def f(x: ti.math.vec3, s: ti.f64) -> ti.math.vec2:
        ...     return ti.Vector([s * x.dot(x), ti.sin(x[0])])
        >>> td.jacfwd(f)(np.ones((5, 3)), 2.0).shape       # batch + out_core + in_core
        (5, 2, 3)
    """
    return transform("jacfwd", as_function(f, "td.jacfwd"), argnums, has_aux)


@taichi_callable
def jacrev(f: Any, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Function:
    """Jacobian by reverse mode; same shapes as :func:`jacfwd`.

    Straight-line ``@ti.func`` code takes one call of its reverse function per
    output component; other code (and Jacobians whose forward pushes are one
    widened call) is computed by forward pushes, with the same result.
    """
    return transform("jacrev", as_function(f, "td.jacrev"), argnums, has_aux)


@taichi_callable
def jacobian(f: Any, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Function:
    """Jacobian, by forward mode when the inputs are no larger than the outputs, else reverse."""
    return transform("jacobian", as_function(f, "td.jacobian"), argnums, has_aux)


@taichi_callable
def hessian(f: Any, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Function:
    """Hessian of a scalar function: ``jacfwd(jacrev(f, argnums), argnums)``.

    Shape ``batch + in_core + in_core``; a tuple ``argnums`` gives the nested
    block matrix; with ``has_aux`` the result is ``(hessian, aux)``.

    Example:
        >>> @ti.func
        ... def f(x: ti.math.vec3, s: ti.f64) -> ti.f64:
        ...     return s * x.dot(x) + ti.sin(x[0])
        >>> H = td.hessian(f)(np.zeros((5, 3)), 2.0)       # batch + in_core + in_core
        >>> H.shape, H[0]
        ((5, 3, 3), array([[4., 0., 0.],
               [0., 4., 0.],
               [0., 0., 4.]]))
    """
    return jacfwd(jacrev(f, argnums, has_aux), argnums, has_aux)


# -- jvp, vjp, hvp ------------------------------------------------------------------
class _Calls:
    """Names the cache_info entry of a call-style transform (``jvp(f)``, ``vjp(f)``, ``hvp(f)``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._counter = Counter(self)


def _counter_of(kind: str, fn: Function) -> Counter:
    key = ("calls", kind)
    if key not in fn.derived:
        fn.derived[key] = _Calls(f"{kind}({fn.name})")  # type: ignore[assignment]
    return fn.derived[key]._counter


def _as_tuple(values: Any, name: str, call: str) -> tuple[Any, ...]:
    if not isinstance(values, (tuple, list)):
        raise TypeError(f"{call}: {name} must be a tuple with one entry per argument, got {type(values).__name__}")
    return tuple(values)


def _primals_and_tangents(f: Any, primals: Any, tangents: Any,
                          transform: str) -> tuple[Function, str, tuple[Any, ...], tuple[Any, ...]]:
    """What ``td.jvp`` and ``td.hvp`` check first: the Function, the call's name, and one tangent per primal."""
    fn = as_function(f, transform)
    call = f"{transform}({fn.name})"
    require_taichi(call)
    primals = _as_tuple(primals, "primals", call)
    tangents = _as_tuple(tangents, "tangents", call)
    if len(tangents) != len(primals):
        raise TypeError(f"{call}: got {len(primals)} primals but {len(tangents)} tangents")
    return fn, call, *_with_defaults(fn, primals, tangents, call)


def _with_defaults(fn: Function, primals: tuple[Any, ...], tangents: tuple[Any, ...],
                   call: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The primals with the defaults of parameters left out, which take zero tangents (constants, as in JAX)."""
    full = fn.bind(primals, {}, call)
    extra = full[len(primals):]
    zeros = tuple(0 * d if ti.lang.impl.inside_kernel() else None for d in extra)
    return full, tangents + zeros


def _with_tangents(batch: Batch, tangents: Sequence[Any], call: str, what: str = "tangents") -> tuple[Any, ...]:
    """One array per float primal: its tangent (None: zeros), checked to have the primal's shape."""
    out = []
    for k, (spec, primal, t) in enumerate(zip(batch.specs, batch.arrays, tangents, strict=True)):
        if not spec.is_float:
            continue
        shape = tuple(np.shape(primal))
        if t is None:
            out.append(like(None, ArgSpec(spec.name, shape, spec.dtype), batch))
            continue
        arr = read_args([ArgSpec(f"{what}[{k}]", spec.shape, spec.dtype)], [t], call, holds_tensors(batch)).arrays[0]
        if tuple(arr.shape) != shape:
            raise ValueError(f"{call}: {what}[{k}] must have the shape of primals[{k}] ({spec.name!r}), "
                             f"{shape}; got {arr.shape}")
        out.append(like(t, ArgSpec(spec.name, shape, spec.dtype), batch) if holds_tensors(batch) else arr)
    return tuple(out)


def holds_tensors(batch: Batch) -> bool:
    """Whether the engines were given tensors (kinds that take them as they are): extra arrays follow."""
    return any(is_tensor(a) for a in batch.arrays)


def _tangent_batch(fn: Function, batch: Batch, tangents: Sequence[Any], call: str) -> tuple[Function, Batch]:
    T = fn.tangent()
    arrays = list(batch.arrays) + list(_with_tangents(batch, tangents, call))
    return T, batch.but(arrays, T.specs_for(arrays))


@taichi_callable
def jvp(f: Any, primals: Sequence[Any], tangents: Sequence[Any], has_aux: bool = False) -> Any:
    """Forward-mode Jacobian-vector product of the whole (batched) function.

    Args:
        f: a ``td.Function`` or ``@ti.func``.
        primals: tuple of arguments.
        tangents: tuple of tangents, each of its primal's shape (a broadcast
            argument's tangent applies to every element). Integer arguments
            take ``None`` or zeros.
        has_aux: ``f`` returns the pair ``(out, aux)``.

    Returns:
        ``(primals_out, tangents_out)`` in the structure of ``f``'s outputs;
        ``(primals_out, tangents_out, aux)`` with ``has_aux``.

    Example:
        >>> @ti.func
        ... def p(x: ti.f64) -> ti.f64:
        ...     return x ** 3 + 2 * x ** 2 - 3 * x + 1
        >>> td.jvp(p, (1.0,), (1.0,))
        (array(1.), array(4.))
    """
    fn, call, primals, tangents = _primals_and_tangents(f, primals, tangents, "td.jvp")
    if ti.lang.impl.inside_kernel():
        outs, touts, tree = _jvp_in_kernel(fn, primals, tangents)
    else:
        batch = fn.read(primals, call)
        T, tbatch = _tangent_batch(fn, batch, tangents, call)
        with _counter_of("jvp", fn).tally():
            flat = T.evaluate(tbatch)
        _, tree = fn.signature(batch.specs)
        m = len(flat) // 2
        outs = [batch.wrap(o) for o in flat[:m]]
        touts = [batch.wrap(np.broadcast_to(t, np.shape(o)) if not is_tensor(t) else t)
                 for o, t in zip(flat[:m], flat[m:], strict=True)]
    if has_aux:
        main, aux = split_aux(tree, call)
        return unflatten(main, outs), unflatten(main, touts), unflatten(aux, outs)
    return unflatten(tree, outs), unflatten(tree, touts)


def _jvp_in_kernel(fn: Function, primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[list[Any], list[Any], Any]:
    specs = fn.specs_for(primals)
    args = list(primals) + [t for t, s in zip(tangents, specs, strict=True) if s.is_float]
    T = fn.tangent()
    body = T.body_for(T.specs_for(args))
    if body is None:
        raise TypeError(
            f"td.jvp({fn.name}) cannot be called inside a kernel: only @ti.func code and its transforms can"
        )
    flat = list(body(*args))
    _, tree = fn.signature(specs)
    m = len(flat) // 2
    return flat[:m], flat[m:], tree


def vjp(f: Any, *primals: Any, has_aux: bool = False) -> Any:
    """Reverse-mode vector-Jacobian product of the whole (batched) function.

    Returns:
        ``(primals_out, vjp_fn)``, or ``(primals_out, vjp_fn, aux)`` with
        ``has_aux``; ``vjp_fn(cotangent)`` takes a cotangent in the structure
        and shapes of ``primals_out`` and returns a tuple with one entry per
        primal, in that primal's shape (summed over the batch for a
        broadcast argument; ``None`` for an integer argument). Everything
        ``vjp_fn`` needs is taken when ``vjp`` returns: changing the primals,
        or fields the function reads, afterwards changes nothing.

    Example:
        >>> @ti.func
        ... def f(x: ti.math.vec3, s: ti.f64) -> ti.f64:
        ...     return s * x.dot(x)
        >>> y, vjp_fn = td.vjp(f, np.ones((4, 3)), 2.0)
        >>> dx, ds = vjp_fn(np.ones(y.shape))
        >>> dx[0], ds                                   # ds: summed over the batch (s was broadcast)
        (array([4., 4., 4.]), array(12.))
    """
    fn = as_function(f, "td.vjp")
    call = f"td.vjp({fn.name})"
    if ti.lang.impl.inside_kernel():
        raise TypeError(f"{call}: td.vjp returns a Python function, so it is not offered in Taichi scope (a kernel or "
                        "a @ti.func); there td.grad, td.value_and_grad, td.jacrev, td.jacfwd, td.jacobian, td.hessian, "
                        "td.jvp and td.hvp are (docs/in-kernel.md)")
    require_taichi(call)
    given = len(primals)  # vjp_fn returns their cotangents, not those of defaults filled in
    batch = fn.read(fn.bind(primals, {}, call), call)
    out_specs, tree = fn.signature(batch.specs)
    main, aux = split_aux(tree, call) if has_aux else (tree, None)
    main_leaves = leaves(main)
    counter = _counter_of("vjp", fn)
    lin = _linearization(fn, batch.specs, out_specs, main_leaves, has_aux)
    if lin is None:  # vjp_fn runs at the primals as they are now, whatever the caller does to them later
        batch = Batch(tuple(owned_copy(a) for a in batch.arrays), batch.specs, batch.shape, batch.device)
    values = record()  # the fields it reads besides its arguments, kept too (NOTE: [Field values of a call])
    with counter.tally(), reading(values):
        flat = (lin or fn).evaluate(batch)
    outs, jacobians = flat[: len(out_specs)], flat[len(out_specs):]

    def vjp_fn(*cotangent_args: Any) -> tuple[Any, ...]:
        if len(cotangent_args) != 1:  # as JAX: one cotangent, in the structure of the outputs
            raise TypeError(f"{call}: vjp_fn takes one cotangent, in the structure of the outputs (a tuple for "
                            f"several), got {len(cotangent_args)} arguments")
        (cotangent,) = cotangent_args
        cts: list[Any] = [None] * len(out_specs)
        for leaf, c in zip(main_leaves, flatten_like(main, cotangent, call), strict=True):
            expected = batch.shape + out_specs[leaf].shape
            spec = ArgSpec("cotangent", out_specs[leaf].shape, out_specs[leaf].dtype)
            arr = read_args([spec], [c], call, holds_tensors(batch)).arrays[0]
            if tuple(arr.shape) != expected:
                raise ValueError(f"{call}: the cotangent must have the output's shape {expected}, got {arr.shape}")
            cts[leaf] = like(c, ArgSpec(spec.name, expected, spec.dtype), batch) if holds_tensors(batch) else arr
        if not any(s.is_float for s in batch.specs):
            return tuple(None for _ in batch.specs[:given])
        with counter.tally(), reading(values):
            grads = _contract(lin, batch, jacobians, cts, out_specs) if lin is not None else fn.vjp(batch, cts)
        return tuple(batch.wrap(g) for g in grads[:given])

    wrapped = [batch.wrap(o) for o in outs]
    if aux is not None:
        return unflatten(main, wrapped), vjp_fn, unflatten(aux, wrapped)
    return unflatten(tree, wrapped), vjp_fn


# NOTE: [Linearized vjp] When a pointwise function has per-element Jacobians
# no larger than its inputs and outputs together (elementwise maps, scalar
# energies), td.vjp computes the outputs and those Jacobians in its one
# launch, as JAX keeps residuals, and vjp_fn contracts them with the
# cotangent in NumPy: a memory-bound pass instead of a second launch that
# recomputes the primal and its tangents. W3 (sin(x) x^2 + exp(-x), n = 1e7)
# went from 166 ms + 235 ms to about 250 ms + 30 ms. Not for code reaching a
# custom_vjp rule, which must see the real cotangent.


def _linearization(fn: Function, specs: Sequence[ArgSpec], out_specs: Sequence[ArgSpec], main_leaves: list[int],
                   has_aux: bool) -> Function | None:
    """The ``linearize`` transform of ``fn`` for td.vjp, or None (see NOTE: [Linearized vjp])."""
    floats = tuple(k for k, s in enumerate(specs) if s.is_float)
    if not floats or not fn.pointwise or not all(out_specs[o].is_float for o in main_leaves):
        return None
    if not _modes.forward_possible(fn.body_for(specs), tuple(s.is_float for s in specs)):
        return None
    entries = sum(out_specs[o].size * specs[a].size for o in main_leaves for a in floats)
    if entries > sum(specs[a].size for a in floats) + sum(out_specs[o].size for o in main_leaves):
        return None
    return transform("linearize", fn, floats, has_aux)


def _contract(lin: Any, batch: Batch, jacobians: Sequence[Any], cotangents: Sequence[Any],
              out_specs: Sequence[ArgSpec]) -> list[Any]:
    """``J^T c`` per argument from the stored per-element Jacobians, summed onto broadcast arguments."""
    lay = lin.layout(batch.specs)
    grads: list[Any] = [None] * len(batch.specs)
    nb = len(batch.shape)
    for (_, o, a), jac in zip(lay.items[len(out_specs):], jacobians, strict=True):
        c = cotangents[o]
        if c is None:
            continue
        out, arg = out_specs[o], batch.specs[a]
        term = jac * c.reshape(c.shape + (1,) * len(arg.shape))
        if out.shape:
            term = term.sum(axis=tuple(range(nb, nb + len(out.shape))))
        grads[a] = term if grads[a] is None else grads[a] + term
    for a in lay.argnums:
        shape = tuple(np.shape(batch.arrays[a]))
        grads[a] = zeros(shape, batch.specs[a].dtype, tensor_device(batch.arrays)) if grads[a] is None \
            else unbroadcast(grads[a], shape)
    return grads


@taichi_callable
def hvp(f: Any, primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[Any, tuple[Any, ...]]:
    """Hessian-vector product per batch element, without forming the Hessian.

    Differentiates with respect to every float argument: returns
    ``(value, H @ tangents)``, the second in the structure of ``tangents``
    (a tuple, one entry per argument; ``None`` for integer arguments).

    Example:
        >>> @ti.func
        ... def f(x: ti.math.vec3, s: ti.f64) -> ti.f64:
        ...     return s * x.dot(x)
        >>> value, (hv_x, hv_s) = td.hvp(f, (np.ones(3), 2.0), (np.array([1.0, 0.0, 0.0]), 0.0))
        >>> value, hv_x, hv_s
        (array(6.), array([4., 0., 0.]), array(2.))
    """
    given = len(primals) if isinstance(primals, (tuple, list)) else 1
    fn, call, primals, tangents = _primals_and_tangents(f, primals, tangents, "td.hvp")
    specs = fn.specs_for(primals)
    floats = tuple(k for k, s in enumerate(specs) if s.is_float)
    if not floats:
        raise TypeError(f"{call}: {fn.name} has no float arguments; there is nothing to differentiate")
    out_specs, tree = fn.signature(specs)
    shape = non_scalar(tree, out_specs)
    if shape is not None:
        raise TypeError(f"{call}: a Hessian-vector product needs a scalar output (per batch element); {fn.name}'s "
                        f"output has core shape {shape}. Use td.jvp of td.jacrev for vector outputs")
    vg = value_and_grad(fn, floats)
    if ti.lang.impl.inside_kernel():
        outs, touts, _ = _jvp_in_kernel(vg, primals, tangents)
        return outs[0], by_argument(touts[1:], floats, len(specs))[:given]
    batch = vg.read(primals, call)
    T, tbatch = _tangent_batch(vg, batch, tangents, call)
    with _counter_of("hvp", fn).tally():
        flat = T.evaluate(tbatch)
    n = len(floats)
    value = batch.wrap(flat[0])
    hv = [batch.wrap(t) for t in flat[2 + n: 2 + 2 * n]]
    return value, by_argument(hv, floats, len(specs))[:given]


def by_argument(values: Sequence[Any], floats: Sequence[int], nargs: int) -> tuple[Any, ...]:
    """One entry per argument: ``values`` at the float ones, None at the others (as td.hvp returns)."""
    out: list[Any] = [None] * nargs
    for k, v in zip(floats, values, strict=True):
        out[k] = v
    return tuple(out)


__all__: list[str] = ["function", "grad", "value_and_grad", "jacfwd", "jacrev", "jacobian", "hessian", "jvp",
                      "vjp", "hvp"]
