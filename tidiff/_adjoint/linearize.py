"""The reverse function of a ``td.custom_jvp`` function, made from its jvp rule.

NOTE: [Transposed jvp rules] A jvp rule gives ``J t`` for any tangent ``t``;
the reverse sweep needs ``J^T g``. The rule's tangent output is linear in
its tangent inputs, so entry ``e`` of an active argument's cotangent is
``<g, J basis_e>``: one push of a unit tangent per entry of each active
argument, inside a ``ti.static`` loop over the entries (their number is
known when Taichi compiles). That costs as many pushes of the rule as the
call has active input entries, at the call only: the rest of the function
stays one reverse sweep. The rule's code is what runs, as in forward mode.

NOTE: [Calls reversed by pushes] A callee the reverse transform does not take
but forward mode does (a helper looping over ``ti.static(range(n))`` with ``n``
its parameter, known only where Taichi compiles the call) is reversed the same
way, through its tangent function (``jvp_func``, taking tangents of the active
arguments only): one push per active input entry at the call, the rest of the
caller one reverse sweep, where the whole caller was pushed forward (or, in a
kernel, reversed by Taichi's ``kernel.grad``). The tangent transform lives in the
other mode's package, so the layer above both gives it here (``TANGENT_OF``).
Taken for callees whose results are not nested (nested ones would have the
pushes follow the nesting: conformance net, seed 93, a third-order
composition).
"""
import ast
import copy
from collections.abc import Callable, Sequence
from typing import Any

import taichi as ti

from .._errors import TransformError
from .._lang.compile import compile_source
from .._lang.generate import owned_cache
from .._lang.naming import RULE_HELPERS, spell_taichi
from .._lang.nodes import assign, call, for_range, function, name, taichi, unpack, zero_of
from .._lang.sym import Sym, helpers
from .._rules import helpers as rule_helpers
from .results import function_shape

TANGENT_OF: list[Callable[[Any, tuple[bool, ...]], Any]] = []
"""The tangent transform (``jvp_func(f, active)``), given by the layer above both modes (NOTE: [Calls reversed by
pushes])."""


def linearized(f: Any, rule: Any, active: Sequence[bool], n_outputs: int, every_tangent: bool = True) -> Any:
    """``f_vjp(x1, ..., xn, ct_out...) -> (out, J_k^T ct for each active k)`` for a td.custom_jvp
    function ``f`` with jvp rule ``rule`` (the calling convention of ``vjp_func``'s results); with
    ``every_tangent`` False, ``rule`` takes the tangents of the active arguments only (a tangent function)."""
    cache = owned_cache(f, "_tidiff_linearized")
    key = (tuple(bool(a) for a in active), n_outputs, every_tangent)
    if key not in cache:
        cache[key] = _compile(f, rule, key[0], n_outputs, every_tangent)
    return cache[key]


def pushed(f: Any, active: Sequence[bool], n_outputs: int) -> Any:
    """The reverse function of ``f`` by pushes of its tangent function (NOTE: [Calls reversed by pushes]), or
    None where forward mode does not take ``f`` either."""
    if not TANGENT_OF or n_outputs > 1 and function_shape(f) != (None,) * n_outputs:  # nested results (NOTE:
        # [Nested results]): not yet
        return None
    mask = tuple(bool(a) for a in active)
    try:
        tangent = TANGENT_OF[0](f, mask)
    except (TransformError, NotImplementedError, TypeError, ValueError):
        return None
    return linearized(f, tangent, mask, n_outputs, every_tangent=False)


def _compile(f: Any, rule: Any, active: tuple[bool, ...], n_outputs: int, every_tangent: bool) -> Any:
    base = "".join(c if c.isalnum() else "_" for c in getattr(f, "name", getattr(f, "__name__", "f")))
    xs = [f"x{k}" for k in range(len(active))]
    cts = ["ct_out"] if n_outputs == 1 else [f"ct_out{j}" for j in range(n_outputs)]
    zeros: list[Any] = [zero_of(x) for x in xs]

    def tangents(values: list[Any]) -> list[Any]:
        return values if every_tangent else [v for v, a in zip(values, active, strict=True) if a]

    # several outputs: the rule's ((out...), (dout...)) unpacked into two names, then read entry by entry
    outs = ["out"] if n_outputs == 1 else [f"out{j}" for j in range(n_outputs)]
    ts = ["t"] if n_outputs == 1 else [f"t{j}" for j in range(n_outputs)]

    def pushed_at(values: list[Any], targets: list[str], tangent: bool) -> list[ast.stmt]:
        pushed = call("rule", *xs, *tangents(values))
        if n_outputs == 1:
            return [unpack(["_", targets[0]] if tangent else [targets[0], "_"], pushed)]
        both = ["pushed_value", "pushed_tangent"] if not tangent else ["pushed_value_e", "pushed_tangent_e"]  # (a
        # name bound to a tuple is not bound again: the loop's own, in a scope per iteration)
        read = both[tangent]
        return [unpack(both, pushed)] + [assign(t, Sym(name(read))[j]) for j, t in enumerate(targets)]

    body: list[ast.stmt] = pushed_at(zeros, outs, tangent=False)
    results = []
    for k, x in enumerate(xs):
        if not active[k]:
            continue
        unit = helpers.basis(name(x), name("e"))
        pairing = [helpers.inner(name(ct), name(t)) for ct, t in zip(cts, ts, strict=True)]
        body += [assign(f"ct_{x}", zero_of(x)),
                 for_range("e", [helpers.size_of(name(x))],
                           [*pushed_at(zeros[:k] + [unit] + zeros[k + 1:], ts, tangent=True),
                            assign(f"ct_{x}", Sym(name(f"ct_{x}")) + unit * sum(pairing[1:], pairing[0]))],
                           static=True)]
        results.append(f"ct_{x}")
    value: ast.expr = name("out") if n_outputs == 1 else ast.Tuple([name(o) for o in outs], ast.Load())
    body.append(ast.Return(ast.Tuple([value] + [name(r) for r in results], ast.Load())))
    template = taichi("template")().node  # a tangent function's constant arguments stay constants (``n`` of
    # ``ti.static(range(n))``): passed on as given
    params = [(x, None if every_tangent or a else copy.deepcopy(template)) for x, a in zip(xs, active, strict=True)]
    fn = spell_taichi(function(f"{base}_linear_vjp", params + [(c, None) for c in cts], body, taichi("func").node),
                      "ti")
    namespace = {"ti": ti, "rule": rule, RULE_HELPERS: rule_helpers}
    return compile_source(fn, f"{base}_linear_vjp", namespace, tag="linear_vjp")
