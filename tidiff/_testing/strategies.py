"""Hypothesis strategies: arguments valid for a function's signature, and batch shapes."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._protocol import Function, as_function
from .._signature import spec_from_annotation

if TYPE_CHECKING:  # hypothesis is a test dependency, imported where a strategy is made
    from hypothesis.strategies import SearchStrategy


def batch_shapes(min_dims: int = 0, max_dims: int = 2, min_side: int = 1,
                 max_side: int = 3) -> SearchStrategy[tuple[int, ...]]:
    """Batch shapes: tuples of ``min_dims`` to ``max_dims`` sides in ``[min_side, max_side]``.

    Example:
        >>> @given(td.testing.batch_shapes(max_dims=3))
        ... def test_shapes(batch):
        ...     assert len(batch) <= 3 and all(1 <= side <= 3 for side in batch)
        >>> test_shapes()
    """
    from hypothesis.extra import numpy as hnp

    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def arguments(f: Any, *, batch_shapes: SearchStrategy[tuple[int, ...]] | None = None,
              elements: SearchStrategy[float] | dict[str, SearchStrategy[float]] | None = None,
              integers: SearchStrategy[int] | dict[str, SearchStrategy[int]] | None = None,
              broadcast: bool = True, signature: Sequence[Any] | None = None
              ) -> SearchStrategy[tuple[np.ndarray, ...]]:
    """A strategy for tuples of arguments of ``f``: NumPy arrays of each argument's core shape.

    A batch shape is drawn once per example; each argument gets that batch
    shape, or (with ``broadcast=True``) one drawn by hypothesis's
    ``mutually_broadcastable_shapes`` against it, with at most as many dims
    (leading dims dropped, sides of 1): the arguments broadcast together.
    Field programs take no batch dims.

    Args:
        f: a ``td.Function`` or ``@ti.func``. Annotations (or the fields of
            a field program) give the core shapes; a function without them
            needs ``signature``.
        batch_shapes: a strategy for batch shapes; default
            :func:`batch_shapes` (``()`` for field programs).
        elements: strategy for float entries (default floats in [-2, 2]),
            or a dict ``{argument name: strategy}`` (others get the default).
        integers: the same for integer arguments (default integers in [-3, 3]).
        broadcast: let arguments take broadcastable, smaller batch shapes.
        signature: core types per parameter, as for ``td.function``:
            shape tuples such as ``(3,)`` or ``()`` for floats, or Taichi
            types (``ti.math.vec3``, ``ti.i32``).

    Returns:
        A strategy of tuples, one array per argument.

    Example:
        >>> @ti.func
        ... def f(x: ti.math.vec3, s: ti.f64) -> ti.f64:
        ...     return s * ti.log(x).sum()
        >>> @settings(deadline=None, max_examples=10)        # first calls compile
        ... @given(td.testing.arguments(f, elements=st.floats(0.5, 2.0)))
        ... def test_f(args):
        ...     td.testing.check_grads(f, args)
        >>> test_f()
    """
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp

    fn = as_function(f, "td.testing.arguments")
    declared = fn.declared_specs()
    if signature is not None:
        names = fn.param_names() if declared is not None else _names(fn, len(signature))
        specs = [spec_from_annotation(n, s) for n, s in zip(names, signature, strict=False)]
    elif declared is None:
        raise TypeError(
            f"td.testing.arguments: {fn.name} has parameters without annotations; give their core "
            "types: td.testing.arguments(f, signature=[(3,), ()]) or annotate them"
        )
    else:
        specs = declared
    if batch_shapes is None:  # only pointwise functions (@ti.func code) map over leading batch dims
        batch_shapes = globals()["batch_shapes"]() if fn.pointwise else st.just(())
    float_default = st.floats(-2.0, 2.0, allow_nan=False, allow_infinity=False, allow_subnormal=False)
    int_default = st.integers(-3, 3)

    def pick(given: Any, default: SearchStrategy[Any], name: str) -> SearchStrategy[Any]:
        if given is None:
            return default
        if isinstance(given, dict):
            unknown = set(given) - {s.name for s in specs}
            if unknown:
                raise ValueError(f"td.testing.arguments: no parameters named {sorted(unknown)}; "
                                 f"parameters are {[s.name for s in specs]}")
            return given.get(name, default)
        return given

    @st.composite
    def draw_args(draw: st.DrawFn) -> tuple[np.ndarray, ...]:
        batch = tuple(draw(batch_shapes))
        if batch and not fn.pointwise:
            raise ValueError(f"td.testing.arguments: {fn.name} is a field program; it takes no batch dims")
        owns: Sequence[tuple[int, ...]] = [batch] * len(specs)
        if broadcast and batch:
            owns = draw(hnp.mutually_broadcastable_shapes(num_shapes=len(specs), base_shape=batch,
                                                          max_dims=len(batch), max_side=max(batch))).input_shapes
        out = []
        for spec, own in zip(specs, owns, strict=True):
            strategy = (
                pick(elements, float_default, spec.name) if spec.is_float else pick(integers, int_default, spec.name)
            )
            out.append(draw(hnp.arrays(spec.dtype, tuple(own) + tuple(spec.shape), elements=strategy)))
        return tuple(out)

    return draw_args()


def _names(fn: Function, n: int) -> list[str]:
    try:
        return fn.param_names()
    except Exception:
        return [f"arg{k}" for k in range(n)]
