"""The reverse function of a ``td.custom_jvp`` function, made from its jvp rule.

NOTE: [Transposed jvp rules] A jvp rule gives ``J t`` for any tangent ``t``;
the reverse sweep needs ``J^T g``. The rule's tangent output is linear in
its tangent inputs, so entry ``e`` of an active argument's cotangent is
``<g, J basis_e>``: one push of a unit tangent per entry of each active
argument, inside a ``ti.static`` loop over the entries (their number is
known when Taichi compiles). That costs as many pushes of the rule as the
call has active input entries, at the call only: the rest of the function
stays one reverse sweep. The rule's code is what runs, as in forward mode.
"""
from collections.abc import Sequence
from typing import Any

import taichi as ti

from .._lang.compile import compile_source
from .._lang.generate import owned_cache
from .._lang.naming import RULE_HELPERS
from .._rules import helpers as rule_helpers


def linearized(f: Any, rule: Any, active: Sequence[bool], n_outputs: int) -> Any:
    """``f_vjp(x1, ..., xn, ct_out...) -> (out, J_k^T ct for each active k)`` for a td.custom_jvp
    function ``f`` with jvp rule ``rule`` (the calling convention of ``vjp_func``'s results)."""
    cache = owned_cache(f, "_tidiff_linearized")
    key = (tuple(bool(a) for a in active), n_outputs)
    if key not in cache:
        cache[key] = _compile(f, rule, key[0], n_outputs)
    return cache[key]


def _compile(f: Any, rule: Any, active: tuple[bool, ...], n_outputs: int) -> Any:
    base = "".join(c if c.isalnum() else "_" for c in getattr(f, "name", "f"))
    xs = [f"x{k}" for k in range(len(active))]
    cts = ["ct_out"] if n_outputs == 1 else [f"ct_out{j}" for j in range(n_outputs)]
    zeros = [f"ti.zero({x})" for x in xs]
    lines = ["@ti.func", f"def {base}_linear_vjp({', '.join(xs + cts)}):",
             f"    out, _ = rule({', '.join(xs + zeros)})"]
    results = []
    for k, x in enumerate(xs):
        if not active[k]:
            continue
        tangents = zeros[:k] + [f"{RULE_HELPERS}.basis({x}, e)"] + zeros[k + 1:]
        pairing = " + ".join(
            f"{RULE_HELPERS}.inner({ct}, t)" if n_outputs == 1 else f"{RULE_HELPERS}.inner({ct}, t[{j}])"
            for j, ct in enumerate(cts))
        lines += [f"    ct_{x} = ti.zero({x})",
                  f"    for e in ti.static(range({RULE_HELPERS}.size_of({x}))):",
                  f"        _, t = rule({', '.join(xs + tangents)})",
                  f"        ct_{x} = ct_{x} + {RULE_HELPERS}.basis({x}, e) * ({pairing})"]
        results.append(f"ct_{x}")
    lines.append(f"    return {', '.join(['out'] + results)}")
    namespace = {"ti": ti, "rule": rule, RULE_HELPERS: rule_helpers}
    g = compile_source("\n".join(lines) + "\n", f"{base}_linear_vjp", namespace, tag="linear_vjp")
    return g
