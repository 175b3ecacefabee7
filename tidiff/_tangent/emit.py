"""The tangent function of a ``@ti.func``: transformed once per activity pattern, compiled, cached on it."""
import functools
from collections.abc import Sequence
from typing import Any

from .._lang.compile import info
from .._lang.generate import generate, owned_cache
from .._lang.naming import RULE_HELPERS
from .._lang.parse import python_function
from .._rules import helpers as rule_helpers
from .transform import Transformer

# Reverse functions (``_adjoint``) and the tangent functions made from them are marked ``reverse`` in their
# record (``_lang/compile.info``): their tangents go through custom_vjp functions' code.
#
# NOTE: [Forward mode of a gradient's code] Forward mode of a function reaching
# a ``td.custom_vjp`` function without a jvp rule is refused, as in JAX. But a
# derivative of its gradient (``hessian`` = jacfwd of jacrev, ``jacfwd(grad(f))``,
# ``hvp``) pushes tangents through the *reverse function*, whose code calls the
# bwd rule and the custom function for its value; JAX differentiates the fwd
# rule there, which is plain code. tidiff's custom_vjp function has no fwd rule
# but its own code, so the tangent of a reverse function, and of every function
# transformed for it (helpers its forward sweep calls, callees' reverse
# functions), differentiates that code instead of refusing: the same numbers as
# JAX. A tangent function made in this mode is marked as a reverse function is,
# so its own tangent (a third order, ``td.jacfwd(td.hessian(f, argnums=0),
# argnums=1)``) goes through that code too: the reverse function keeps a call
# that does not depend on its active arguments as written, and a push by another
# argument reaches it there (long run, seed 34308). Transforms in this mode are
# cached apart from the ordinary ones, so a jvp of the function itself still
# refuses. A Jacobian by arguments that do not reach the rule (its forward mode
# by them is defined) is built on the reverse function all the same where
# forward mode by the others is refused (``_modes._refused_by_other_arguments``):
# a derivative by those can follow (``td.jacfwd(td.jacrev(f, argnums=0),
# argnums=1)``), whatever the sizes.


def jvp_func(f: Any, active: Sequence[bool] | None = None, width: int = 1, *,
             through_vjp_rules: bool | None = None) -> Any:
    """Forward-mode (tangent) transform of a ``@ti.func`` or a plain Python helper.

    Args:
        f: a ``@ti.func``, a function this returned (for higher orders), or a
            plain Python function or lambda whose body is Taichi code
            (NOTE: [Python helpers] in ``_lang/callees.py``).
        active: one bool per parameter of ``f``; only active parameters get a
            tangent parameter, the others have zero tangent. Default: all.
        width: how many tangent directions one call carries (vector mode,
            see ``lanes.py``).
        through_vjp_rules: differentiate the code of a ``td.custom_vjp``
            function without a jvp rule instead of refusing it (NOTE: [Forward
            mode of a gradient's code]); default: whether ``f`` is a reverse
            function, and so for every function transformed for one.

    Returns:
        A ``@ti.func`` ``g(p1, ..., pn, dp_a1, ..., dp_ak)`` taking every primal
        parameter, then one tangent per active parameter, and returning
        ``(out, dout)``: ``f``'s result and its tangent, in the same structure.
        With ``width`` k > 1 it takes k tangents per active parameter, lane by
        lane, and returns ``(out, dout_0, ..., dout_{k-1})``.

    Example:
        >>> @ti.func
        ... def f(x):
        ...     return ti.sin(x) * x
        >>> g = jvp_func(f)
        >>> @ti.kernel
        ... def at(x: ti.f64, dx: ti.f64) -> ti.math.vec2:
        ...     y, dy = g(x, dx)
        ...     return ti.Vector([y, dy])
        >>> at(0.0, 1.0)                              # sin(0) * 0 and its derivative (sin x + x cos x)(0)
        [0. 0.]
    """
    fn = python_function(f)
    n = fn.__code__.co_argcount
    pattern = (True,) * n if active is None else tuple(bool(a) for a in active)
    if len(pattern) != n:
        raise ValueError(f"jvp_func(f, active): f takes {n} parameters, active has {len(pattern)} entries")
    through = info(f).reverse if through_vjp_rules is None else through_vjp_rules
    cache = owned_cache(f, "_tidiff_jvps")  # each pattern is transformed once (per mode: see the NOTE)
    key = (pattern, width, through)
    if key not in cache:
        jvp_of = functools.partial(jvp_func, through_vjp_rules=True) if through else jvp_func
        cache[key] = generate(f, pattern, lambda parsed, act: Transformer(parsed, act, jvp_of, width, through),
                              tag="jvp", namespace={RULE_HELPERS: rule_helpers})
    return cache[key]


def source(g: Any) -> str:
    """The generated Python/Taichi source of a function made by :func:`jvp_func`."""
    text = info(g).source
    if text is None:
        raise TypeError(f"source(g): g must be a function generated by tidiff, got {g!r}")
    return text
