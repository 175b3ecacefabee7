"""``td.function`` and :class:`Function`: the differentiable functions transforms take.

Three kinds of Taichi code become a :class:`Function`:

- a ``@ti.func`` (``_pointwise.FuncFunction``): pointwise, batched over
  leading dims, one generated kernel launch per call; it has a *body*, a
  ``@ti.func`` that kernels and further transforms call;
- a kernel or Python program over global fields
  (``_programs.FieldFunction``), run on tidiff-owned twins of its fields;
- transformed functions (``_transforms.Transformed``), which have a body
  when their parent has one.

Each kind provides three engines on checked host arguments: ``_evaluate``,
``_vjp`` (reverse mode over the whole batch) and ``_jvp`` (forward mode).
Engines take the :class:`~tidiff._cache.Counter` of the function on whose
behalf they run. Every transform is a composition of these engines.
"""
import numpy as np
from taichi.lang import impl

from ._arrays import read_args
from ._cache import Counter
from ._signature import ArgSpec, default_float, default_int
from ._tree import unflatten


class _NoPrint:
    """What Taichi reads as ``obj.func.has_print`` for objects it may call in a kernel."""

    has_print = False


def taichi_callable(fn):
    """Let Taichi call ``fn`` inside a kernel (at compile time) without a warning."""
    fn._is_taichi_function = True
    fn.func = _NoPrint
    return fn


def spec_of_value(name, value):
    """The spec of one argument: from a Taichi expression inside a kernel, else from a host array."""
    from ._batch import spec_of_expr

    if hasattr(value, "ptr"):
        return spec_of_expr(name, value)
    a = value if hasattr(value, "shape") and hasattr(value, "dtype") else np.asarray(value)
    kind = getattr(a.dtype, "is_floating_point", None)
    is_float = kind if isinstance(kind, bool) else np.dtype(a.dtype).kind == "f"
    return ArgSpec(name, tuple(a.shape), default_float() if is_float else default_int())


class Function:
    """A differentiable function; call it on host arrays or inside a kernel.

    Subclasses implement ``declared_specs``, ``signature``, the engines and,
    where they can, ``body_for``.
    """

    _is_taichi_function = True  # Taichi calls it inside kernels (see call_in_kernel)
    func = _NoPrint

    def __init__(self, name, listed=True):
        self.name = name
        self._counter = Counter(self if listed else None)
        self._scalar_calls = {}  # NOTE: [Scalar calls] in _pointwise: argument types -> kernel, dtype

    def __repr__(self):
        return f"<td.Function {self.name}>"

    # -- what subclasses provide -------------------------------------------
    def declared_specs(self):
        """Input specs known without a call, or None (then each call's arguments give them)."""
        raise NotImplementedError

    def param_names(self):
        return [s.name for s in self.declared_specs()]

    def signature(self, in_specs):
        """``(out_specs, out_tree)`` for the given input specs."""
        raise NotImplementedError

    def body_for(self, in_specs):
        """The ``@ti.func`` computing this function (flat results), or None where there is none."""
        return None

    def _evaluate(self, batch, counter):
        """Flat list of outputs, each ``batch_shape + core``."""
        raise NotImplementedError

    def _vjp(self, batch, cotangents, counter):
        """``(outputs, input cotangents)``; each input cotangent has that argument's own shape
        (summed over the dims it was broadcast along), None for integer arguments."""
        raise NotImplementedError

    def _jvp(self, batch, tangents, counter):
        """``(outputs, output tangents)``; ``tangents`` one per input, None for zero."""
        raise NotImplementedError

    def _cotangents(self, batch, cotangents, counter):
        """Only the input cotangents of ``_vjp``: engines that can skip the outputs do."""
        return self._vjp(batch, cotangents, counter)[1]

    def second_order_jvp(self, derived, batch, tangents, counter):
        """The jvp of ``derived``, a transform of this function that has no body.

        Functions with a body never get here: their transforms are
        transformed as source. A field program answers for its transforms.
        """
        raise self._no_second_order(derived)

    def second_order_vjp(self, derived, batch, cotangents, counter):
        """The vjp of ``derived``, a transform of this function that has no body (see second_order_jvp)."""
        raise self._no_second_order(derived)

    def _no_second_order(self, derived):
        return NotImplementedError(
            f"{derived.name}: transforming this again needs second order of {self.name}, "
            "which tidiff does not have for this kind of function"
        )

    # -- calling -----------------------------------------------------------
    def specs_for(self, args):
        specs = self.declared_specs()
        if specs is None:
            specs = [spec_of_value(n, v) for n, v in zip(self.param_names(), args)]
        return specs

    def read(self, args, call=None):
        """Check host arguments against the specs; returns an ``ArgBatch``."""
        specs = self.specs_for(args)
        batch = read_args(specs, args, call or self.name)
        batch.specs = specs
        return batch

    def __call__(self, *args):
        if impl.inside_kernel():
            return self.call_in_kernel(*args)
        types = tuple(map(type, args))
        fast = self._scalar_calls.get(types)
        if fast is not None:  # Python numbers, seen before: one launch
            self._counter.calls += 1
            self._counter.hits += 1
            return np.asarray(fast[0](*args), fast[1])
        batch = self.read(args)
        with self._counter.tally():
            flat = self._evaluate(batch, self._counter)
        _, tree = self.signature(batch.specs)
        scalar = getattr(batch, "scalar_kernel", None)
        if scalar is not None and scalar[0] is self and all(t in (float, int) for t in types):
            self._scalar_calls[types] = (scalar[1].kernel, scalar[1].out_spec.dtype)
        return unflatten(tree, [batch.wrap(o) for o in flat])

    def call_in_kernel(self, *args):
        """Inside a kernel the body is called, and inlined, by Taichi."""
        specs = self.specs_for(args)
        body = self.body_for(specs)
        if body is None:
            raise TypeError(
                f"{self.name} cannot be called inside a kernel: only @ti.func code and its transforms can"
            )
        _, tree = self.signature(specs)
        result = body(*args)
        return unflatten(tree, list(result) if isinstance(tree, tuple) else [result])


def function(f, *, inputs=None, outputs=None, signature=None, name=None, constants=None):
    """Wrap Taichi code as a differentiable :class:`Function`.

    Args:
        f: a ``@ti.func`` (annotated or not); a ``@ti.kernel`` or Python
            callable over global fields (then ``inputs`` and ``outputs`` are
            required); or a ``Function``, returned as it is.
        inputs, outputs: the fields a field program reads as variables and
            writes as results; for a kernel over ``ti.types.ndarray()``
            parameters, parameter *names*: ``inputs=["k", "w"]`` and
            ``outputs={"out": lambda k, w: k.shape}`` (each output's shape as
            a tuple, or a callable of the inputs' ``.shape/.ndim/.dtype``;
            see ``_ndarrays`` and docs/torch.md).
        constants: for an ndarray kernel, the values of its other parameters
            (``{"eps": 1e-3}``), fixed for every call.
        signature: for a ``@ti.func``, the core type of each parameter,
            overriding annotations: a sequence in parameter order, or a dict
            by name, of Taichi types (``ti.math.vec3``, ``ti.f64``) or shape
            tuples (``(3,)``, ``(2, 2)``, ``()`` for float values).
        name: the name ``td.cache_info()`` and error messages use.

    Returns:
        A :class:`Function`.

    Example:
        >>> E = td.function(energy, inputs=[x, w], outputs=[loss])
        >>> F = td.function(f, signature=[(3,), ()])
        >>> conv = td.function(conv_kernel, inputs=["k", "w"], outputs={"out": lambda k, w: k.shape})
    """
    from ._pointwise import FuncFunction
    from ._programs import FieldFunction

    if isinstance(f, Function):
        return f
    if getattr(f, "_is_wrapped_kernel", False) and (
        isinstance(inputs, str) or (inputs is not None and all(isinstance(n, str) for n in inputs))
    ):
        from ._ndarrays import NdarrayFunction

        if outputs is None:
            raise TypeError(
                f"td.function: {getattr(f, '__name__', f)!r} is an ndarray kernel; name its outputs and "
                "their shapes: outputs={'out': lambda k, w: k.shape}"
            )
        return NdarrayFunction(f, inputs, outputs, constants=constants, name=name)
    if constants is not None:
        raise TypeError("td.function: constants= is for kernels over ndarrays (inputs named by parameter)")
    if getattr(f, "_is_taichi_function", False):
        if inputs is not None or outputs is not None:
            raise TypeError(
                "td.function: inputs=/outputs= are for kernels over fields; "
                "a @ti.func takes its values as arguments"
            )
        return FuncFunction(f, signature=signature, name=name)
    if callable(f):
        if inputs is None or outputs is None:
            raise TypeError(
                f"td.function: {getattr(f, '__name__', f)!r} is a kernel or Python program; declare "
                "the fields it reads and writes: td.function(f, inputs=[...], outputs=[...])"
            )
        if signature is not None:
            raise TypeError("td.function: signature= is for @ti.func; a field program's shapes come from its fields")
        return FieldFunction(f, inputs, outputs, name=name)
    raise TypeError(f"td.function: expected a @ti.func, a @ti.kernel or a Python callable, got {type(f).__name__}")


_wrapped = {}


def as_function(f, call):
    """What every transform does first: take a Function, or wrap a ``@ti.func`` (once)."""
    if isinstance(f, Function):
        return f
    if getattr(f, "_is_taichi_function", False):
        entry = _wrapped.get(id(f))
        if entry is None or entry[0] is not f:
            entry = _wrapped[id(f)] = (f, function(f))
        return entry[1]
    raise TypeError(
        f"{call}: expected a td.Function or a @ti.func, got {type(f).__name__}; wrap a kernel "
        "over fields first: td.function(kernel, inputs=[...], outputs=[...])"
    )
