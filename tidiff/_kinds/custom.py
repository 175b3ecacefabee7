"""``td.custom_jvp`` and ``td.custom_vjp``: a ``@ti.func`` with a derivative rule of the user's.

A jvp rule replaces the tangent transform of the function wherever it is
called: in its own transforms, in every function that calls it, on the host
and inside kernels. A vjp rule ``bwd`` is called by the reverse transform
(``_adjoint``) with the real cotangent, so it may be nonlinear in it (JAX's
``clip_gradient``); as in JAX, forward mode of a custom_vjp function needs a
jvp rule as well (``defjvp``), else it raises ``td.TransformError``.

The function's body is a generated wrapper that calls the Function object
itself, which the transforms find in their rule tables (``CUSTOM_JVPS``,
``CUSTOM_VJPS``); inside a kernel Taichi calls the object, which runs the
user's func.
"""
from __future__ import annotations

import ast
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import taichi as ti

from .._cache import uses
from .._codegen.batch import identifier, probe_results
from .._codegen.bodies import BodyWriter, zero
from .._lang.nodes import statement
from .._lang.source import source_tree
from .._lang.sym import Sym
from .._pointwise import Pointwise
from .._protocol import require_taichi
from .._rules.calls import register_jvp, register_vjp
from .._rules.helpers import bwd_check, jvp_pair_check, zeros_like
from .._signature import ArgSpec
from .._tree import Tree
from .func import FuncFunction, python_function


class CustomFunction(Pointwise):
    """A ``@ti.func`` whose tangent (``td.custom_jvp``) or cotangent map (``td.custom_vjp``) is given by a
    rule of the user's; its arguments and outputs are those of the plain function (``plain``)."""

    rule: Any = None
    bwd: Any = None

    def __init__(self, tifunc: Any, form: str) -> None:
        self.plain = FuncFunction(tifunc, listed=False)
        super().__init__(self.plain.name)
        self.plain._counter = self._counter  # the kernels probing its outputs are this function's
        self.tifunc, self.form = tifunc, form
        self.__signature__ = inspect.signature(python_function(tifunc))
        w = BodyWriter(identifier(self.name), self.param_names())
        self._wrapper = w.compile([w.callee(self, identifier(self.name) + "_custom")(*w.args())], single=True,
                                  tag="custom")

    def param_names(self) -> list[str]:
        return self.plain.param_names()

    def param_defaults(self) -> dict[str, Any]:
        return self.plain.param_defaults()

    def declared_specs(self) -> list[ArgSpec] | None:
        return self.plain.declared_specs()

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        return self.plain.signature(in_specs)

    def defjvp(self, rule: Any) -> Any:
        """Attach the rule: a ``@ti.func`` ``(*primals, *tangents) -> (out, tangent_out)``.

        Every primal gets a tangent (zeros for those not differentiated).
        Returns ``rule``, so it can be used as a decorator.
        """
        if not getattr(rule, "_is_taichi_function", False):
            raise TypeError(f"{self.name}.defjvp: the rule must be a @ti.func, got {type(rule).__name__}")
        self.rule = rule
        register_jvp(self, self._checked_jvp(rule))
        return rule

    def _checked_jvp(self, rule: Any) -> Any:
        """``rule`` returning its pair through a check, made as Taichi compiles each call, that it is a pair and
        the tangent has the output's shape: Taichi would broadcast a scalar tangent of a vector output silently."""
        names = self.param_names()
        w = BodyWriter(identifier(self.name) + "_checked_jvp", names + [f"d{n}" for n in names])
        pair = w.let("pair", w.callee(rule, identifier(self.name) + "_jvp_rule")(*w.args()))
        check = w.callee(jvp_pair_check(f"the jvp rule `{getattr(rule, '__name__', rule)}` of `{self.name}`"),
                         "check")
        w.stmts.append(statement(w.callee(ti.static, "static")(check(pair))))
        return w.compile([pair[0], pair[1]], single=False, tag="jvp")

    def defvjp(self, bwd: Any) -> Any:
        """Attach the rule: a ``@ti.func`` ``(*primals, *cotangents) -> tuple of primal cotangents``.

        One cotangent per output comes in; a tuple with one entry per primal
        (in the primal's shape; anything for integer primals) goes out, as in
        JAX. Returns ``bwd``, so it can be used as a decorator.
        """
        call = f"{self.name}.defvjp"
        require_taichi(call)
        if self.form != "td.custom_vjp":
            raise TypeError(f"{call}: {self.name} is a {self.form} function, whose rule is a jvp (defjvp); "
                            "a vjp rule is for td.custom_vjp functions")
        if not getattr(bwd, "_is_taichi_function", False):
            raise TypeError(f"{call}: the rule must be a @ti.func, got {type(bwd).__name__}")
        specs = self.declared_specs()
        if specs is None:  # shapes are known only as Taichi compiles each call: checked then
            self.bwd = bwd
            register_vjp(self, self._checked_bwd(bwd, call))
            return bwd
        out_specs, _ = self.signature(specs)
        cts = [ArgSpec(f"ct_{o.name}", o.shape, o.dtype) for o in out_specs]
        got, is_tuple, kernel = probe_results(bwd, specs + cts, identifier(self.name) + "_bwd", allow_none=True)
        self._counter.add(kernel)
        uses(kernel)
        shapes = [s.shape for s in specs]
        if not is_tuple or [s.shape if g is None else g.shape for g, s in zip(got, specs, strict=False)] != shapes:
            returned = [None if g is None else g.shape for g in got] if is_tuple else got[0] and got[0].shape
            raise TypeError(
                f"{call}: the rule must return a tuple with one cotangent per primal (None for a zero one), "
                f"shaped {shapes}; it returned {'a tuple shaped ' if is_tuple else 'a single value shaped '}{returned}"
            )
        self.bwd = bwd
        zeros = {k: zero(s.shape, s.dtype) for k, (g, s) in enumerate(zip(got, specs, strict=True)) if g is None}
        register_vjp(self, self._with_zeros(bwd, len(cts), zeros) if zeros else bwd)
        return bwd

    def _checked_bwd(self, bwd: Any, call: str) -> Any:
        """``bwd`` of a function without annotations, its result checked as Taichi compiles each call (a tuple with
        one cotangent per primal, in its shape), each None it returns a zero shaped like its primal.

        NOTE: [None cotangents without shapes] Where bwd returns None is read from its source (``return (None,
        None, ti.math.clamp(g, lo, hi))``, JAX's tutorial): a None assigned in Taichi code becomes a value of no
        type, which no check made while compiling can tell from a cotangent.
        """
        names = self.param_names()
        parameters = inspect.signature(python_function(bwd)).parameters.values()
        if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters) \
                or len(parameters) <= len(names):
            raise TypeError(f"{call}: the rule takes the {len(names)} primals, then one cotangent per output, as named "
                            f"parameters; {getattr(bwd, '__name__', bwd)} has {len(parameters)} parameters")
        check = bwd_check(f"the bwd rule `{getattr(bwd, '__name__', bwd)}` of `{self.name}`")
        zero = {k: None for k in none_positions(python_function(bwd), call)}  # zeros like the primals, as compiled
        return self._with_zeros(bwd, len(parameters) - len(names), zero, check)

    def _with_zeros(self, bwd: Any, n_cotangents: int, zero: Mapping[int, Sym | None], check: Any = None) -> Any:
        """The rule the transforms call: ``bwd`` with its None at each position ``k`` of ``zero`` (a zero
        cotangent, as in JAX) replaced by ``zero[k]``, or where that is None a zero made like the primal as Taichi
        compiles; ``check`` (a helper of ``(returned, positions, *primals)``) runs then too."""
        names = self.param_names()
        w = BodyWriter(identifier(self.name) + "_bwd", names + [f"ct{k}" for k in range(n_cotangents)])
        returned = w.let("returned", w.callee(bwd, identifier(self.name) + "_bwd_rule")(*w.args()))
        primals = w.args(0, len(names))
        if check is not None:
            checked = w.callee(check, "check")(returned, tuple(sorted(zero)), *primals)
            w.stmts.append(statement(w.callee(ti.static, "static")(checked)))
        like = w.callee(zeros_like, "zeros_like")
        return w.compile([(like(p) if zero[k] is None else zero[k]) if k in zero else returned[k]
                          for k, p in enumerate(primals)], single=False, tag="bwd")

    def body_for(self, in_specs: Sequence[ArgSpec]) -> Any:
        if self.rule is None and self.bwd is None:
            attach = "defvjp(bwd)" if self.form == "td.custom_vjp" else "defjvp(rule)"
            raise TypeError(f"{self.name} is a {self.form} function without a rule: call {self.name}.{attach} first")
        return self._wrapper

    def call_in_kernel(self, *args: Any) -> Any:
        return self.tifunc(*args)

    @property
    def _tidiff_derivative_rule(self) -> str:
        """The rule this function stands for (``RULE_ATTRIBUTE``: NOTE: [Taichi's reverse mode not run]
        in ``_fields/hidden_rules``)."""
        return f"the {'td.custom_vjp' if self.bwd is not None else 'td.custom_jvp'} function `{self.name}`"


def none_positions(bwd: Any, call: str) -> set[int]:
    """The positions where every ``return`` of ``bwd`` gives a literal None (NOTE: [None cotangents without
    shapes]); a TypeError where its returns disagree."""
    tree, _, _ = source_tree(bwd)
    found: list[set[int]] = []
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue  # a nested function's returns are its own
        if isinstance(node, ast.Return):
            elements = node.value.elts if isinstance(node.value, (ast.Tuple, ast.List)) else []
            found.append({k for k, e in enumerate(elements) if isinstance(e, ast.Constant) and e.value is None})
        pending.extend(ast.iter_child_nodes(node))
    if any(f != found[0] for f in found[1:]):
        raise TypeError(f"{call}: {bwd.__name__} returns None (a zero cotangent) at different positions in different "
                        "returns; return zeros of the primal's shape instead (ti.zero(x))")
    return found[0] if found else set()


def custom_vjp(f: Any) -> CustomFunction:
    """Give a ``@ti.func`` a cotangent rule of your own (JAX's ``jax.custom_vjp``).

    Args:
        f: a ``@ti.func`` (annotated or not: without annotations the rule is checked as each call compiles).

    Returns:
        A ``td.Function`` that calls ``f``; attach the rule with ``defvjp``.
        The rule takes all primals, then one cotangent per output, and
        returns a tuple with one cotangent per primal (JAX's ``bwd``, without
        residuals: per-element code recomputes what it needs).

    Reverse-mode transforms (``grad``, ``vjp``, ``jacrev``, the torch
    backward) call the rule with the real cotangent. As in JAX, forward mode
    (``jvp``, ``jacfwd``, ``hessian``) needs a jvp rule too: give one with
    ``defjvp`` or it raises ``td.TransformError``. Reverse over reverse
    (``td.grad(td.grad(f))``) differentiates ``bwd``'s own code.

    Example:
        >>> @td.custom_vjp
        ... @ti.func
        ... def clip_grad(x: ti.f64) -> ti.f64:
        ...     return x
        >>> @clip_grad.defvjp
        ... @ti.func
        ... def clip_grad_bwd(x, ct):
        ...     return (ti.math.clamp(ct, -1.0, 1.0),)
        >>> @ti.func
        ... def ten_clipped(x: ti.f64) -> ti.f64:
        ...     return 10.0 * clip_grad(x)
        >>> td.grad(ten_clipped)(3.0)                 # the cotangent 10 clipped to 1
        array(1.)
    """
    if not getattr(f, "_is_taichi_function", False):
        raise TypeError(f"td.custom_vjp: expected a @ti.func, got {type(f).__name__}")
    return CustomFunction(f, "td.custom_vjp")


def custom_jvp(f: Any) -> CustomFunction:
    """Give a ``@ti.func`` a derivative rule of your own (JAX's ``jax.custom_jvp``).

    Args:
        f: a ``@ti.func``.

    Returns:
        A ``td.Function`` that calls ``f``; attach the rule with ``defjvp``.
        The rule is a ``@ti.func`` taking all primals, then one tangent per
        primal, and returning ``(out, tangent_out)`` (JAX passes tuples;
        Taichi functions take flat arguments).

    Example:
        >>> @td.custom_jvp
        ... @ti.func
        ... def safe_log(x: ti.f64) -> ti.f64:
        ...     return ti.log(x)
        >>> @safe_log.defjvp
        ... @ti.func
        ... def safe_log_jvp(x, dx):
        ...     return ti.log(x), dx / ti.max(x, 1e-12)
        >>> td.grad(safe_log)(np.array([2.0, 0.0]))   # finite at 0, where 1 / x is not
        array([5.e-01, 1.e+12])
    """
    if not getattr(f, "_is_taichi_function", False):
        raise TypeError(f"td.custom_jvp: expected a @ti.func, got {type(f).__name__}")
    return CustomFunction(f, "td.custom_jvp")
