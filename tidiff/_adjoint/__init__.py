"""Source-to-source reverse mode for ``@ti.func`` code: ``vjp_func(f, active, n_outputs)``."""
from collections.abc import Sequence
from typing import Any

from .._lang.generate import generate, owned_cache
from .._lang.naming import RULE_HELPERS
from .._rules import helpers as rule_helpers
from .transform import NotReversible, Reverser


def _made(f: Any, active: Sequence[bool], n_outputs: int) -> Any:
    """The reverse function of ``f`` for this pattern, or the NotReversible saying why there is none
    (made once, kept on ``f``)."""
    cache = owned_cache(f, "_tidiff_vjps")
    key = (tuple(bool(a) for a in active), n_outputs)
    if key not in cache:
        try:
            make = lambda parsed, act: Reverser(parsed, act, n_outputs, _made)  # noqa: E731
            cache[key] = generate(f, key[0], make, tag="vjp", namespace={RULE_HELPERS: rule_helpers})
        except NotReversible as reason:
            cache[key] = reason
    return cache[key]


def vjp_func(f: Any, active: Sequence[bool], n_outputs: int = 1) -> Any:
    """The reverse function of a ``@ti.func``, or None when the reverse transform does not take ``f``.

    Args:
        f: a ``@ti.func`` (or one tidiff generated, or a plain Python helper).
        active: one bool per parameter: which get a cotangent.
        n_outputs: how many values ``f`` returns (a tuple of that many when > 1).

    Returns:
        A ``@ti.func`` ``f_vjp(p1, ..., pn, ct_1, ..., ct_m)`` taking every
        parameter, then one cotangent per output, and returning the flat tuple
        ``(out, ct_a1, ..., ct_ak)``: ``f``'s result, then ``J^T ct`` for each
        active parameter. None when ``f`` has no reverse function (see
        :func:`why_not`); derivatives then come from forward pushes.

    Example:
        >>> @ti.func
        ... def f(x, y):
        ...     return ti.sin(x) * y
        >>> g = vjp_func(f, (True, False))            # a cotangent for x only
        >>> @ti.kernel
        ... def at(x: ti.f64, y: ti.f64) -> ti.math.vec2:
        ...     out, ct_x = g(x, y, 1.0)
        ...     return ti.Vector([out, ct_x])
        >>> at(0.0, 3.0)                              # sin(0) * 3 and d/dx = cos(0) * 3
        [0. 3.]
    """
    found = _made(f, active, n_outputs)
    return None if isinstance(found, NotReversible) else found


def why_not(f: Any, active: Sequence[bool], n_outputs: int = 1) -> str | None:
    """Why ``f`` has no reverse function for this pattern (a sentence), or None when it has one."""
    found = _made(f, active, n_outputs)
    return str(found) if isinstance(found, NotReversible) else None
