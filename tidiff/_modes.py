"""How each derivative is computed: forward pushes, widened pushes, or reverse calls. One place, with reasons.

NOTE: [Mode choice] For a function with a ``@ti.func`` body:

- a Jacobian body pushes basis tangents forward through the parent's tangent
  function, unless reverse calls (one per output component, through the
  parent's reverse function, ``_adjoint``) are fewer (NOTE: [Reverse
  bodies] in ``_codegen/bodies``), or forward mode is impossible: a
  ``td.custom_vjp`` function without a jvp rule has none, as in JAX, and its
  ``bwd`` must see the real cotangent. Reverse-flavoured transforms (grad,
  jacrev) reverse whenever a custom_vjp rule is reached, so a function with
  both a jvp and a vjp rule gets each in its own mode;
- pushes of a small argument are one call carrying every basis tangent
  (vector mode, ``_tangent/lanes``) while that stays cheap to compile
  (NOTE: [Vector-mode pushes]), else one push per iteration of a runtime loop;
- a cotangent-map body (vjp) reverses whenever it can, else transposes forward pushes;
- ``td.vjp`` keeps per-element Jacobians from its one launch when they are
  small (NOTE: [Linearized vjp] in ``_api``).

A function without a body (field programs, ndarray kernels) composes its
engines: its Jacobians take one tangent evaluation per input component
(forward) or one vjp per output component (reverse), whichever
``flavour`` asks, and for ``jacobian`` whichever is fewer.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._adjoint import vjp_func, why_not
from ._adjoint.linearize import TANGENT_OF
from ._errors import NoForwardRule, TransformError
from ._lang.compile import info
from ._lang.generate import owned_cache
from ._rules.calls import CUSTOM_VJPS
from ._signature import ArgSpec
from ._tangent import jvp_func
from ._tangent.fence import may_refuse

TANGENT_OF.append(jvp_func)  # NOTE: [Calls reversed by pushes]: a callee without a reverse function

# NOTE: [Vector-mode pushes] A Jacobian by an argument of n components is
# best one call of the parent's tangent function widened to carry all n
# basis tangents (see ``_tangent/lanes.py``): the primal is computed once,
# each lane is straight-line code, and Taichi folds the basis constants.
# But Taichi's compile time grows with the square of a kernel's
# straight-line size, so a push is widened only while n times the size of
# one lane (``lane_cost``) stays within LANE_BUDGET; otherwise it pushes one
# component per iteration of a runtime loop, which keeps one inlined copy
# of the tangent function. Measured on this 2-core machine, B = 1e4:
#   W1, 4x8 tanh layer, 8 lanes of cost 33:  jacfwd 2.2 -> 1.7 ms (1e6: 160 -> 106 ms)
#   W2, 3x3 Neo-Hookean, 9 lanes of cost 143: grad 1.36 -> 1.02 ms, but its
#       first call 0.4 -> 6.2 s, and the Hessian's 1.8 -> 18 s (for 10 -> 4 ms)
# Widening is done once per chain of transforms, at the innermost one: a
# widened parent widened again would hold n**2 second-order lanes.
LANE_BUDGET = 512

# NOTE: [Loops in reverse cost their square] Without a tape (``TAPE_ROWS = 0``
# in ``_adjoint/control.py``) the reverse sweep of a runtime loop recomputes
# the loop-carried values of iteration k from the loop's start: L iterations
# cost about L**2 / 2 runs of the body, where forward pushes cost L per input
# component. The trip count is a run-time value, so the cost of reverse is not
# known when the mode is chosen, and forward pushes are linear in it: a
# function whose reverse function recomputes a loop is differentiated by
# forward pushes wherever forward mode is possible (as before reverse mode took
# loops), and in reverse only where it must be (a custom_vjp rule without a
# jvp rule). E.g. a 100-iteration loop of a 3-vector: 300 body runs forward,
# about 5,000 in reverse. A loop whose adjoint reads no carried value (an
# accumulation, ``s += f(x, j)``: NOTE: [Loops whose adjoint reads no carried
# value] in ``_adjoint/control.py``) runs its body once per iteration in
# reverse too, and does not count.
LOOP_REASON = "reverse mode recomputes a runtime loop at every iteration (NOTE: [Loops in reverse cost their square])"


@dataclass(frozen=True)
class Mode:
    """A choice and why it was made (shown by ``td.source`` readers and tests)."""

    way: str  # "forward" or "reverse"
    why: str


def tangent_function(parent: Any, active: tuple[bool, ...], width: int = 1) -> Any:
    return jvp_func(parent, active, width)


def reverse_function(parent: Any, active: tuple[bool, ...], n_outputs: int) -> Any:
    """The parent's reverse function, or None where the reverse transform does not take it."""
    return vjp_func(parent, active, n_outputs)


def lane_cost(parent: Any, active: tuple[bool, ...]) -> int:
    """The size of one lane of ``parent``'s tangent function (NOTE: [Vector-mode pushes])."""
    cost = info(tangent_function(parent, active)).lane_cost
    assert cost is not None  # every tangent function has one
    return cost


def forward_possible(parent: Any, active: tuple[bool, ...]) -> bool:
    """Whether ``parent`` has a tangent function: not when it reaches a custom_vjp rule without a jvp rule.

    Told without transforming where ``parent`` reaches none (NOTE: [Modes chosen without transforming] in
    ``_tangent/fence.py``); else its tangent function is made (and cached for use)."""
    if not may_refuse(parent):
        return True
    try:
        tangent_function(parent, active)
    except NoForwardRule:
        return False
    return True


def widens(parent: Any, active: tuple[bool, ...], size: int) -> bool:
    """Whether pushing ``size`` basis tangents is one widened call (NOTE: [Vector-mode pushes])."""
    if info(parent).wide or size == 1:
        return size == 1
    return size * lane_cost(parent, active) <= LANE_BUDGET


def jacobian_mode(parent: Any, active: tuple[bool, ...], in_specs: Sequence[ArgSpec], argnums: Sequence[int],
                  out_specs: Sequence[ArgSpec], wanted: Sequence[int], flavour: str) -> Mode:
    """How a Jacobian body computes its blocks; ``flavour`` is "forward" (jacfwd), "reverse" (grad, jacrev) or
    "auto".

    Decided once per parent and question (kept on the parent: a nested Jacobian asks for its inner one's
    mode, and the inner body asks again when it is built)."""
    key = (tuple(active), tuple(in_specs), tuple(argnums), tuple(out_specs), tuple(wanted), flavour)
    cache = owned_cache(parent, "_tidiff_modes")
    if key not in cache:
        cache[key] = _jacobian_mode(parent, active, in_specs, argnums, out_specs, wanted, flavour)
    return cache[key]


def _jacobian_mode(parent: Any, active: tuple[bool, ...], in_specs: Sequence[ArgSpec], argnums: Sequence[int],
                   out_specs: Sequence[ArgSpec], wanted: Sequence[int], flavour: str) -> Mode:
    if flavour == "forward":
        return Mode("forward", "td.jacfwd pushes tangents forward")
    forward = forward_possible(parent, active)
    n_in = sum(in_specs[a].size for a in argnums)
    n_out = sum(out_specs[o].size for o in wanted)
    sizes = Mode("forward", f"{n_in} input components, {n_out} output components")
    if forward and flavour == "auto" and n_out >= n_in and not _refused_by_other_arguments(parent, active, in_specs):
        return sizes  # what follows could only choose forward too: the reverse function is not made
    reverse = reverse_function(parent, active, len(out_specs))
    if not forward:
        if reverse is None:
            raise neither_way(parent, active, len(out_specs))
        return Mode("reverse", "forward mode reaches a custom_vjp rule without a jvp rule")
    if reverse is None:
        return Mode("forward", f"the reverse transform does not take {why_not(parent, active, len(out_specs))}")
    if flavour == "reverse" and info(reverse).uses_bwd:
        return Mode("reverse", "a reverse-mode transform reaches a custom_vjp rule")
    if _refused_by_other_arguments(parent, active, in_specs):
        return Mode("reverse", "forward mode by the other arguments reaches a custom_vjp rule without a jvp rule")
    if info(reverse).recomputes:
        return Mode("forward", LOOP_REASON)
    if n_out >= n_in:
        return sizes
    if n_out > 1 and all(widens(parent, active, in_specs[a].size) for a in argnums):
        return Mode("forward", "the forward pushes are one widened call")
    return Mode("reverse", f"{n_out} output components, fewer than {n_in} input components")


def _refused_by_other_arguments(parent: Any, active: tuple[bool, ...], in_specs: Sequence[ArgSpec]) -> bool:
    """Whether forward mode by every float argument reaches a custom_vjp rule without a jvp rule that forward
    mode by ``active`` alone does not (its arguments do not depend on them).

    A Jacobian body built on ``parent``'s tangent function could then not be differentiated again by those
    arguments (``td.jacfwd(td.jacrev(f, argnums=0), argnums=1)``: long run, seed 20133), where a body built on
    its reverse function can (NOTE: [Forward mode of a gradient's code] in ``_tangent/emit.py``; JAX refuses it).
    """
    everywhere = tuple(s.is_float for s in in_specs)
    if everywhere == tuple(active) or not CUSTOM_VJPS:  # no custom_vjp function in this process: none refuses
        return False
    try:
        return not forward_possible(parent, everywhere)
    except TransformError:  # forward mode by those arguments fails for another reason: not this question
        return False


def cotangent_mode(parent: Any, active: tuple[bool, ...], n_outputs: int) -> Mode:
    """How a cotangent-map (vjp) body computes ``J^T c``: one reverse call whenever there is a reverse function,
    unless it would recompute a runtime loop where forward pushes are possible (NOTE: [Loops in reverse cost
    their square])."""
    reverse = reverse_function(parent, active, n_outputs)
    if reverse is not None and not info(reverse).recomputes:
        return Mode("reverse", "one reverse call, whatever the sizes")
    forward = forward_possible(parent, active)
    if reverse is not None and not forward:
        return Mode("reverse", "one reverse call, whatever the sizes")
    if not forward:
        raise neither_way(parent, active, n_outputs)
    if reverse is not None:
        return Mode("forward", LOOP_REASON)
    return Mode("forward", "no reverse function: forward pushes, transposed")


def composed_mode(flavour: str, n_in: int, n_out: int, reverse_refused: str | None = None) -> Mode:
    """How a function without a body gets a Jacobian: tangent evaluations or vjps (tangent evaluations
    whenever its vjp is refused, ``Function.reverse_refused``)."""
    if flavour == "forward":
        return Mode("forward", "td.jacfwd pushes tangents forward")
    if reverse_refused is not None:
        return Mode("forward", reverse_refused)
    if flavour == "reverse":
        return Mode("reverse", "a reverse-mode transform")
    if n_in <= n_out:
        return Mode("forward", f"{n_in} input components, {n_out} output components")
    return Mode("reverse", f"{n_out} output components, fewer than {n_in} input components")


def neither_way(parent: Any, active: tuple[bool, ...], n_outputs: int) -> TransformError:
    """The error for a parent that has no reverse function and reaches a custom_vjp rule without a jvp rule."""
    try:
        tangent_function(parent, active)
    except NoForwardRule as raised:
        error = raised
    name = getattr(parent, "__name__", "the function")
    construct = why_not(parent, active, n_outputs)
    return TransformError(
        f"`{name}`: reverse mode cannot handle {construct}, and forward mode "
        f"reaches `{error.function}`, a td.custom_vjp function without a jvp rule",
        error.filename, error.lineno,
        f"give {error.function} a jvp rule with {error.function}.defjvp(...), or write what reverse mode "
        "cannot handle another way (docs/limits.md lists what it takes)",
    )
