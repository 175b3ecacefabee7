"""The protocol between kinds of function and transforms: :class:`Function`.

Every kind of Taichi code tidiff differentiates (a ``@ti.func``, a program
over fields, a kernel over ndarrays) is a :class:`Function` implementing
four things and nothing else:

- ``signature(in_specs)``: output specs and their nesting, for given input specs;
- ``evaluate(batch)``: the outputs, flat;
- ``vjp(batch, cotangents)``: reverse mode over the whole batch, one
  cotangent per input (in the input's shape; summed over dims it was
  broadcast along);
- ``tangent()``: the function ``(x..., dx...) -> (y..., dy...)`` as a new
  Function of the same kind (``dx`` for each float input, ``dy`` for each output).

Transforms (``_transforms``, ``_api``) are written against these alone and
never ask which kind they hold: jvp is ``tangent().evaluate``, the jvp of a
vjp is a vjp of the tangent, and every order follows. A kind whose code is a
per-element ``@ti.func`` also gives ``body_for(in_specs)`` and says it is
``pointwise``: its derived functions are then generated as ``@ti.func``
source too (``_pointwise``), callable inside kernels.

Kinds register with :func:`register_kind`; :func:`function` picks one.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from taichi.lang import impl

from ._arrays import Batch, adapt, read_args
from ._cache import Counter
from ._codegen.batch import spec_of_expr
from ._derived import Arguments
from ._lang.parse import real_func_refusal
from ._signature import ArgSpec, default_float, default_int, widest_float
from ._tree import Tree, unflatten


class _NoPrint:
    """What Taichi reads as ``obj.func.has_print`` for objects it may call in a kernel."""

    has_print = False


def taichi_callable(fn: Any) -> Any:
    """Let Taichi call ``fn`` inside a kernel (at compile time) without a warning."""
    fn._is_taichi_function = True
    fn.func = _NoPrint
    return fn


class RuntimeMemo:
    """A memo dict that empties itself when the Taichi runtime changes (``ti.init``, ``ti.reset``).

    Specs (``default_fp``), generated kernels and remembered launches belong to
    the runtime they were made for; a new runtime gets new ones.
    """

    def __init__(self) -> None:
        self._runtime: Any = None
        self._data: dict[Any, Any] = {}

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        runtime = impl.get_runtime()
        if runtime is not self._runtime:
            self._data.clear()
            self._runtime = runtime
        if key not in self._data:
            self._data[key] = make()
        return self._data[key]

    def peek(self, key: Any) -> Any:
        """The entry for ``key`` if made for the current runtime, else None."""
        return self._data.get(key) if self._runtime is impl.get_runtime() else None

    def put(self, key: Any, value: Any) -> None:
        self.get(key, lambda: value)


def require_taichi(call: str) -> None:
    """A call that runs Taichi code is refused by name before ``ti.init()`` (and after ``ti.reset()``), where
    Taichi's own error names an attribute of its runtime."""
    if impl.get_runtime().prog is None:
        raise RuntimeError(f"{call}: Taichi is not initialized: call ti.init(...) first (again after ti.reset())")


def spec_of_value(name: str, value: Any) -> ArgSpec:
    """The spec of one argument of an unannotated function: a Taichi expression's inside a kernel,
    else the host value's whole shape (its dtype's kind; floats keep their precision)."""
    if hasattr(value, "ptr"):
        return spec_of_expr(name, value)
    a = value if hasattr(value, "shape") and hasattr(value, "dtype") else np.asarray(value)
    kind = getattr(a.dtype, "is_floating_point", None)
    is_float = kind if isinstance(kind, bool) else np.dtype(a.dtype).kind == "f"
    spec = ArgSpec(name, tuple(a.shape), default_float() if is_float else default_int())
    return adapt(spec, value)


class Function:
    """A differentiable function; call it on host arrays or inside a kernel (see the module docstring).

    Subclasses implement ``signature``, ``evaluate``, ``vjp``, ``tangent``
    and, where they have one, ``body_for``. Kinds implement ``param_names``
    and, where the input specs are known without a call, ``declared_specs``;
    a Function made from another one is given ``arguments`` instead (``_derived``).
    Each subclass is one way of computing (a kind, generated bodies, calls of
    other functions): what it shares with others it holds, not inherits.
    """

    _is_taichi_function = True  # Taichi calls it inside kernels (see call_in_kernel)
    func = _NoPrint
    pointwise = False  # a per-element @ti.func body; batches over leading dims (NOTE: in _pointwise)
    native_tensors = False  # evaluate/vjp take torch tensors as they are (ndarray kernels)
    tensors_in_place = False  # read keeps tensors on Taichi's device as they are (NOTE: [Tensors in place])

    def __init__(self, name: str, *, listed: bool = True, arguments: Arguments | None = None) -> None:
        self.name = name
        self.arguments = arguments  # they follow from another Function's (``_derived``), or None: its own
        self._counter = Counter(self if listed else None)
        self.memo = RuntimeMemo()
        self.derived: dict[Any, Function] = {}  # transforms of this function, made once

    def __repr__(self) -> str:
        return f"<td.Function {self.name}>"

    # -- the protocol --------------------------------------------------------
    def param_names(self) -> list[str]:
        if self.arguments is None:
            raise NotImplementedError
        return self.arguments.param_names()

    def declared_specs(self) -> list[ArgSpec] | None:
        """Input specs known without a call, or None (then each call's arguments give them)."""
        return None if self.arguments is None else self.arguments.declared_specs()

    def arity(self, args: Sequence[Any]) -> int:
        """How many arguments a call takes, told by its leading ones (values or their specs).

        The count can depend on the arguments: a cotangent map takes one
        cotangent per output of its parent, whose count may depend on the
        parent's input dtypes (a cotangent map of a cotangent map).
        """
        if self.arguments is not None:
            return self.arguments.arity(args)
        declared = self.declared_specs()
        return len(declared) if declared is not None else len(self.param_names())

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        """``(out_specs, out_tree)`` for the given input specs."""
        raise NotImplementedError

    def evaluate(self, batch: Batch) -> list[Any]:
        """Flat list of outputs, each ``batch.shape + core``."""
        raise NotImplementedError

    def vjp(self, batch: Batch, cotangents: Sequence[Any]) -> list[Any]:
        """``J^T c`` over the whole batch: one entry per input, in its own shape, None for integers.

        ``cotangents`` has one entry per output (``batch.shape + core``), None for zero.
        """
        raise NotImplementedError

    def tangent(self) -> Function:
        """``(x..., dx for each float x...) -> (y..., dy for each y...)``, a Function of the same kind."""
        raise NotImplementedError

    def reverse_refused(self) -> str | None:
        """Why :meth:`vjp` refuses this function (None: it does not). Jacobians of a function without a body
        then push tangents forward (``_modes.composed_mode``)."""
        return None

    def linearize(self, batch: Batch) -> tuple[list[Any], Callable[[Sequence[Any]], list[Any]]]:
        """``(outputs, pullback)`` with ``pullback(cotangents) == vjp(batch, cotangents)``.

        For callers that need the outputs before they know the cotangents (a
        composition). Kinds whose vjp runs the function anyway override it to
        run once; by default the function is evaluated and the vjp runs later.
        """
        return self.evaluate(batch), lambda cotangents: self.vjp(batch, cotangents)

    def body_for(self, in_specs: Sequence[ArgSpec]) -> Any:
        """The ``@ti.func`` computing this function per element (flat results), or None."""
        return None

    def launch_plan(self, batch: Batch) -> Callable[[Sequence[Any]], list[Any]] | None:
        """What :meth:`evaluate` of ``batch`` did, as a call of later tensors of the same dtypes, shapes and devices
        that only launches (NOTE: [Launch plans] in ``_torch``); None where there is none."""
        return None

    # -- arguments -------------------------------------------------------------
    def specs_for(self, args: Sequence[Any]) -> list[ArgSpec]:
        """The input specs of one call: declared core shapes, the floats in the widest precision among their
        values (NOTE: [Float precision] in ``_signature``)."""
        if self.arguments is not None:
            return self.arguments.specs_for(args)
        declared = self.declared_specs()
        if declared is None:
            names = self.param_names()
            if len(args) != len(names):  # the specs would come from the arguments given
                raise TypeError(f"{self.name}: expected {len(names)} arguments ({', '.join(names)}), got {len(args)}")
            return widest_float([spec_of_value(n, v) for n, v in zip(names, args, strict=True)])
        if len(args) != len(declared):
            return list(declared)  # read_args names the count
        return widest_float([adapt(s, v) for s, v in zip(declared, args, strict=True)])

    def param_defaults(self) -> dict[str, Any]:
        """The default values of parameters that have one (a ``@ti.func``'s, which Taichi honours)."""
        return {} if self.arguments is None else self.arguments.param_defaults()

    def bind(self, args: Sequence[Any], kwargs: dict[str, Any], call: str) -> tuple[Any, ...]:
        """Keyword arguments placed at their parameters' positions (passed through, as in JAX), and the default
        values of parameters the call leaves out (constants: never differentiated, as JAX's)."""
        names = self.param_names()
        defaults = self.param_defaults() if len(args) < len(names) else {}
        if not kwargs and not defaults:
            return tuple(args)
        bound: list[Any] = list(args) + [_MISSING] * (len(names) - len(args))
        for key, value in kwargs.items():
            if key not in names:
                raise TypeError(f"{call}: got an unexpected keyword argument {key!r}; parameters are {names}")
            k = names.index(key)
            if k < len(args):
                raise TypeError(f"{call}: got multiple values for argument {key!r}")
            bound[k] = value
        bound = [defaults.get(n, _MISSING) if v is _MISSING else v for n, v in zip(names, bound, strict=True)]
        missing = [n for n, v in zip(names, bound, strict=True) if v is _MISSING]
        if missing and kwargs:
            raise TypeError(f"{call}: missing arguments {missing}")
        return tuple(args) if missing else tuple(bound)  # too few: reading them names the count

    def read(self, args: Sequence[Any], call: str | None = None) -> Batch:
        """Check host arguments against the specs; returns a :class:`Batch`."""
        return read_args(self.specs_for(args), args, call or self.name, self.tensors_in_place)

    @property
    def __name__(self) -> str:  # Taichi names a callee by it in the error of a call in a kernel
        return self.name

    # -- calling -----------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if impl.inside_kernel():
            return self.call_in_kernel(*self.bind(args, kwargs, self.name))
        require_taichi(self.name)
        self.check_call(args, kwargs)
        args = self.bind(args, kwargs, self.name)
        batch = self.read(args)
        with self._counter.tally():
            flat = self.evaluate(batch)
        _, tree = self.signature(batch.specs)
        return unflatten(tree, [batch.wrap(o) for o in flat])

    def check_call(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """Checks a call must pass before its keyword arguments are bound (transforms check argnums)."""

    def call_in_kernel(self, *args: Any) -> Any:
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


_MISSING = object()


# -- kinds -----------------------------------------------------------------------
_KINDS: list[tuple[str, Callable[..., bool], Callable[..., Function]]] = []


def register_kind(name: str, accepts: Callable[..., bool], make: Callable[..., Function]) -> None:
    """Make ``td.function(f, **options)`` build ``make(f, **options)`` when ``accepts(f, options)``.

    Kinds are tried in the order they registered.
    """
    _KINDS.append((name, accepts, make))


def function(f: Any, **options: Any) -> Function:
    """Wrap Taichi code as a differentiable :class:`Function` (see ``td.function``'s docstring in ``_api``)."""
    if isinstance(f, Function):
        if any(v is not None for v in options.values()):
            raise TypeError(f"td.function: {f.name} is already a td.Function; options apply to Taichi code")
        return f
    for _, accepts, make in _KINDS:
        if accepts(f, options):
            return make(f, **options)
    raise TypeError(
        f"td.function: expected a @ti.func, a @ti.kernel or a Python callable, got {type(f).__name__}"
    )


def as_function(f: Any, call: str) -> Function:
    """What every transform does first: take a Function, or wrap a ``@ti.func`` (once per func)."""
    if isinstance(f, Function):
        return f
    if getattr(f, "_is_real_function", False):
        raise TypeError(f"{call}: {real_func_refusal(f)}")
    if getattr(f, "_is_taichi_function", False):
        made = getattr(f, "_tidiff_function", None)
        if made is None:
            made = function(f)
            f._tidiff_function = made  # lives as long as the func does
        return made
    if getattr(f, "_is_wrapped_kernel", False):
        advice = "wrap the kernel first: td.function(kernel, inputs=[...], outputs=[...])"
    elif callable(f):
        advice = ("transforms take Taichi code: write the function as a @ti.func (def, not lambda), or wrap a "
                  "Python program launching kernels: td.function(program, inputs=[...], outputs=[...])")
    else:
        advice = "pass a @ti.func, or a kernel or program wrapped by td.function"
    raise TypeError(f"{call}: expected a td.Function or a @ti.func, got {type(f).__name__}; {advice}")
