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
import ast
from collections.abc import Sequence
from typing import Any

import taichi as ti

from .._lang.compile import compile_source
from .._lang.generate import owned_cache
from .._lang.naming import RULE_HELPERS, spell_taichi
from .._lang.nodes import assign, call, for_range, function, name, taichi, unpack, zero_of
from .._lang.sym import Sym, helpers
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
    zeros = [zero_of(x) for x in xs]
    body: list[ast.stmt] = [unpack(["out", "_"], call("rule", *xs, *zeros))]
    results = []
    for k, x in enumerate(xs):
        if not active[k]:
            continue
        unit = helpers.basis(name(x), name("e"))
        t = Sym(name("t"))
        pairing = [helpers.inner(name(ct), t if n_outputs == 1 else t[j]) for j, ct in enumerate(cts)]
        body += [assign(f"ct_{x}", zero_of(x)),
                 for_range("e", [helpers.size_of(name(x))],
                           [unpack(["_", "t"], call("rule", *xs, *zeros[:k], unit, *zeros[k + 1:])),
                            assign(f"ct_{x}", Sym(name(f"ct_{x}")) + unit * sum(pairing[1:], pairing[0]))],
                           static=True)]
        results.append(f"ct_{x}")
    body.append(ast.Return(ast.Tuple([name(r) for r in ["out"] + results], ast.Load())))
    fn = spell_taichi(function(f"{base}_linear_vjp", [(p, None) for p in xs + cts], body, taichi("func").node), "ti")
    namespace = {"ti": ti, "rule": rule, RULE_HELPERS: rule_helpers}
    return compile_source(fn, f"{base}_linear_vjp", namespace, tag="linear_vjp")
