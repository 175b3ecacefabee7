"""Tangent ``FunctionDef`` -> source text -> a live ``@ti.func``, cached and keeping its source."""
import ast
import copy
import functools
from collections.abc import Callable, Sequence
from typing import Any

import taichi as ti

from .._lang.activity import assignments
from .._lang.compile import compile_source, wrap_long_lines
from .._lang.naming import RULE_HELPERS
from .._lang.parse import Parsed, parse, python_function
from .._rules import helpers as rule_helpers
from .transform import Transformer


def owned_cache(f: Any, name: str) -> dict[Any, Any]:
    """A dict stored on ``f`` itself: what is generated from ``f`` lives as long as ``f`` does."""
    cache = f.__dict__.get(name)
    if cache is None:
        cache = f.__dict__[name] = {}
    return cache


REVERSE = "_tidiff_reverse"
"""Set on reverse functions (``_adjoint``) and the tangent functions made from them: their tangents go
through custom_vjp functions' code.

NOTE: [Forward mode of a gradient's code] Forward mode of a function reaching
a ``td.custom_vjp`` function without a jvp rule is refused, as in JAX. But a
derivative of its gradient (``hessian`` = jacfwd of jacrev, ``jacfwd(grad(f))``,
``hvp``) pushes tangents through the *reverse function*, whose code calls the
bwd rule and the custom function for its value; JAX differentiates the fwd
rule there, which is plain code. tidiff's custom_vjp function has no fwd rule
but its own code, so the tangent of a reverse function, and of every function
transformed for it (helpers its forward sweep calls, callees' reverse
functions), differentiates that code instead of refusing: the same numbers as
JAX. A tangent function made in this mode is marked as a reverse function is,
so its own tangent (a third order, ``td.jacfwd(td.hessian(f, argnums=0),
argnums=1)``) goes through that code too: the reverse function keeps a call
that does not depend on its active arguments as written, and a push by another
argument reaches it there (long run, seed 34308). Transforms in this mode are
cached apart from the ordinary ones, so a jvp of the function itself still
refuses. A Jacobian by arguments that do not reach the rule (its forward mode
by them is defined) is built on the reverse function all the same where
forward mode by the others is refused (``_modes._refused_by_other_arguments``):
a derivative by those can follow (``td.jacfwd(td.jacrev(f, argnums=0),
argnums=1)``), whatever the sizes.
"""


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

    Example::

        @ti.func
        def f(x):
            return ti.sin(x) * x

        g = jvp_func(f)          # in a kernel: y, dy = g(x, dx)
    """
    fn = python_function(f)
    n = fn.__code__.co_argcount
    pattern = (True,) * n if active is None else tuple(bool(a) for a in active)
    if len(pattern) != n:
        raise ValueError(f"jvp_func(f, active): f takes {n} parameters, active has {len(pattern)} entries")
    through = bool(getattr(f, REVERSE, False)) if through_vjp_rules is None else through_vjp_rules
    cache = owned_cache(f, "_tidiff_jvps")  # each pattern is transformed once (per mode: see the NOTE)
    key = (pattern, width, through)
    if key not in cache:
        jvp_of = functools.partial(jvp_func, through_vjp_rules=True) if through else jvp_func
        cache[key] = generate(
            f, pattern, lambda parsed, act: Transformer(parsed, act, jvp_of, width, through_vjp_rules=through))
        if through:
            setattr(cache[key], REVERSE, True)
    return cache[key]


def generate(f: Any, active: tuple[bool, ...], make: Callable[[Parsed, tuple[bool, ...]], Any],
             tag: str = "jvp") -> Any:
    """Transform ``f`` with ``make(parsed, active)`` (a :class:`Transformer`, or the reverse
    transform's ``Reverser``) and compile; ``tag`` names the generator in the file name."""
    parsed = parse(f)
    transformer = make(parsed, active)
    tree = transformer.run()
    if parsed.kind == "helper":
        _by_reference(tree, transformer.taichi_name)
    text = wrap_long_lines(ast.unparse(ast.Module([tree], [])))
    namespace = dict(parsed.namespace)
    namespace.update(transformer.helpers)
    namespace[transformer.taichi_name] = ti
    namespace[RULE_HELPERS] = rule_helpers
    g = compile_source(text + "\n", tree.name, namespace, tag=tag)
    g._tidiff_primal = f
    if tag == "vjp":
        setattr(g, REVERSE, True)
    if hasattr(transformer, "lane_cost"):
        g._tidiff_lane_cost = transformer.lane_cost
    if getattr(transformer, "uses_bwd", False):
        g._tidiff_uses_bwd = True
    if getattr(transformer, "recomputes", False):
        g._tidiff_recomputes = True
    return g


def _by_reference(tree: ast.FunctionDef, taichi: str) -> None:
    """Parameters the body never writes become ``ti.template()``, the rest plain (NOTE: [Python helpers])."""
    writes, loop_vars = assignments(tree.body)
    written = loop_vars | {name for names, _ in writes for name in names}
    template = ast.Call(ast.Attribute(ast.Name(taichi, ast.Load()), "template", ast.Load()), [], [])
    for arg in tree.args.args:
        arg.annotation = None if arg.arg in written else copy.deepcopy(template)
    ast.fix_missing_locations(tree)


def source(g: Any) -> str:
    """The generated Python/Taichi source of a function made by :func:`jvp_func`."""
    text = getattr(g, "_tidiff_source", None)
    if text is None:
        raise TypeError(f"source(g): g must be a function generated by tidiff, got {g!r}")
    return text
