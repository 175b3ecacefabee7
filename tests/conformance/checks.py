"""One check per transform: call tidiff on a Case, call the torch oracle, compare.

Every check runs inside ``case.checking(call)``, so a failure carries the
program, its twin, the call (transform, argnums, has_aux) and the inputs.
Semantics (API.md "Batching"): grad, value_and_grad, jac*, hessian and hvp
act per batch element; jvp and vjp linearize the whole batched function.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import reject

import tidiff as td

from . import kernels, oracle, render_taichi
from .cases import Case, nudged
from .compare import Mismatch, as_numpy, assert_fd_close, assert_tree_close, assert_values_close
from .oracle import jac, main_output, per_element, positions, with_aux
from .unoptimized import values_without_optimizer


def _compare(case: Case, got: Any, want: Any, what: str) -> None:
    assert_tree_close(got, want, what, tensors=case.use_torch)


def _compare_derivative(case: Case, got: Any, want_at: Callable[[list], Any], what: str) -> None:
    """``got`` against the oracle ``want_at(case.arrays)``; a mismatch where that oracle is rounding noise
    (NOTE: [Noise of exploded values]) rejects the draw."""
    want = want_at(case.arrays)
    try:
        _compare(case, got, want, what)
    except Mismatch:
        if oracle_is_noise(got, want, want_at(nudged(case.arrays))):
            reject()
        raise


# NOTE: [Noise of exploded values] A function can be tame in value and not in derivative: an output that is a
# normalized vector, one of whose entries is a sum cancelling to 1e-13, holds ``cos(t)`` of an intermediate
# ``t`` of 7e12 (long run, seed 30023: the while loop squared it up). The value moves by 1e-13 when the inputs
# move by 1e-12 (assume_tame passes), but the Jacobian, ``sin(t) dt/dx / |v|``, is O(1) and set by the last
# bits of ``t``, which Taichi and torch round differently: 2.474 against 2.450, central differences 6e-9.
# Rounding is 1e-16, 10^4 times below a 1e-12 nudge: where torch's own answer moves under that nudge by a
# tenth of its distance from tidiff's or more, the two differ by rounding, and the draw is rejected.
def oracle_is_noise(got: Any, want: Any, near: Any) -> bool:
    """Whether torch's answer ``want`` moves, when the inputs move by 1e-12 (``near``), by a tenth of its
    distance from tidiff's ``got`` or more; False where the trees do not even match in shape."""
    wants = oracle.leaves(want)
    pairs = list(zip(oracle.leaves(got), wants, oracle.leaves(near)))
    if len(pairs) != len(wants) or any(np.shape(as_numpy(g)) != np.shape(w) for g, w, _ in pairs):
        return False
    apart = max(float(np.max(np.abs(as_numpy(g) - np.asarray(w)), initial=0.0)) for g, w, _ in pairs)
    moved = max(float(np.max(np.abs(np.asarray(n) - np.asarray(w)), initial=0.0)) for _, w, n in pairs)
    return moved >= 0.1 * apart


def _aux_twin(case: Case, has_aux: bool):
    return main_output(case.twin) if has_aux else case.twin


class TaichiPitfall(Mismatch):
    """Taichi's own evaluation of a generated function disagrees with its torch twin: not a tidiff failure."""


# NOTE: [Taichi pitfalls] A value that differs from the twin's is tidiff's fault only if Taichi itself,
# evaluating the function in a plain kernel, agrees with the twin. Where Taichi's plain evaluation
# differs too, the case is a Taichi pitfall (a miscompile, or an op Taichi defines otherwise than the
# twin spells it): reported as TaichiPitfall, with a minimal program in tests/test_taichi_pitfalls.py
# and a line in docs/limits.md once understood. Programs calling transforms (tgrad, tjvp, thvp) run tidiff's
# code even in a plain kernel: their value is classified by tidiff's own value with Taichi's optimizer off
# (``unoptimized.py``: right there, the optimizer is at fault). So are derivatives of the field programs and
# ndarray kernels that differ from torch's (test_programs.unless_the_optimizer_is_at_fault: long run seed 93014,
# tidiff's tangent and reverse code miscompiled). A crash inside Taichi's compiler (an
# internal assertion, ``[verify.cpp...]``) is, when a plain kernel calling the function crashes alike,
# transforms in it or not: an internal assertion failing on what Taichi's frontend accepted is Taichi's.


def check_value(case: Case) -> Any:
    """td.function(f)(*args) against the twin: the renderers agree before any derivative is compared."""
    with case.checking("td.function(f)(*args)"):
        got = case.fn(*case.host())
        want = per_element(case.twin, case.arrays, case.cores)
        try:
            _compare(case, got, want, "value")
        except Mismatch as mismatch:
            if {"tgrad", "tjvp", "thvp"} & case.program.ops:
                unoptimized = values_without_optimizer(render_taichi.source(case.program), case.program.main.name,
                                                       case.arrays)
                try:
                    assert_tree_close(tuple(unoptimized), tuple(oracle.leaves(want)), "value without the optimizer")
                except Mismatch:
                    raise mismatch from None
                raise TaichiPitfall(f"tidiff's value with Taichi's optimizer off (advanced_optimization=False) "
                                    f"agrees with the torch twin: Taichi's optimizer miscompiles the program "
                                    f"(NOTE: [Taichi pitfalls]; unoptimized.py).\n{mismatch}") from mismatch
            plain = kernels.plain_values(case)
            try:
                assert_tree_close(tuple(plain), tuple(oracle.leaves(want)), "plain Taichi value")
            except Mismatch as taichi:
                raise TaichiPitfall(f"Taichi's own evaluation (a plain kernel, no tidiff) disagrees with the torch "
                                    f"twin as tidiff's does: a Taichi pitfall, not a tidiff failure "
                                    f"(NOTE: [Taichi pitfalls]).\n{taichi}") from mismatch
            raise
    return want


def check_grad(case: Case, argnums: Any, has_aux: bool, kind: str = "grad") -> None:
    """td.grad / td.value_and_grad, per element."""
    transform = getattr(td, kind)
    with case.checking(f"td.{kind}(f, argnums={argnums!r}, has_aux={has_aux})(*args)"):
        got = transform(case.fn, argnums=argnums, has_aux=has_aux)(*case.host())
        if kind == "value_and_grad":
            twin = oracle.value_and_grad(case.twin, argnums, has_aux)
        else:
            twin = jac(_aux_twin(case, has_aux), argnums)
            twin = with_aux(twin, case.twin) if has_aux else twin
        _compare_derivative(case, got, lambda arrays: per_element(twin, arrays, case.cores), kind)


def check_grad_of_a_pair_refused(case: Case, argnums: Any, kind: str = "grad") -> None:
    """td.grad of a function returning a pair, without has_aux, is a TypeError suggesting td.jacobian (as JAX)."""
    with case.checking(f"td.{kind}(f, argnums={argnums!r})(*args) of a function returning a pair"):
        try:
            getattr(td, kind)(case.fn, argnums=argnums)(*case.host())
        except TypeError as e:
            if "scalar output" not in str(e) or "td.jacobian" not in str(e):
                raise Mismatch(f"td.{kind} of a pair raised a TypeError that does not say why: {e}") from e
            return
        raise Mismatch(f"td.{kind} of a function returning a pair did not raise TypeError")


def check_jacobian(case: Case, kind: str, argnums: Any, has_aux: bool) -> None:
    """td.jacfwd / td.jacrev / td.jacobian / td.hessian, per element."""
    transform = getattr(td, kind)
    with case.checking(f"td.{kind}(f, argnums={argnums!r}, has_aux={has_aux})(*args)"):
        got = transform(case.fn, argnums=argnums, has_aux=has_aux)(*case.host())
        twin = jac(_aux_twin(case, has_aux), argnums)
        if kind == "hessian":
            twin = jac(twin, argnums)
        twin = with_aux(twin, case.twin) if has_aux else twin
        _compare_derivative(case, got, lambda arrays: per_element(twin, arrays, case.cores), kind)


def check_jvp(case: Case, rng: np.random.Generator, has_aux: bool, fd: bool) -> None:
    """td.jvp of the whole batched function; central differences of td.function as a second oracle."""
    tangents = case.like_args(rng)
    case.notes.append(f"tangents = {[t.tolist() for t in tangents]!r}")
    with case.checking(f"td.jvp(f, args, tangents, has_aux={has_aux})"):
        got = td.jvp(case.fn, tuple(case.host()), tuple(case.host(tangents)), has_aux=has_aux)
        if has_aux and len(got) != 3:
            raise Mismatch(f"jvp with has_aux: expected (out, tangent_out, aux), got {len(got)} entries")

        def want_at(arrays: list) -> tuple:
            out, tout = oracle.jvp(case.twin, case.cores, arrays, tangents)
            return (out[0], tout[0], out[1]) if has_aux else (out, tout)
        _compare_derivative(case, got, want_at, "jvp")
        if fd:
            coarse, fine = _directional_differences(case, tangents, 1e-3)
            main = oracle.leaves(got[1])
            for k, (g, c, f) in enumerate(zip(main, coarse, fine)):
                assert_fd_close(np.asarray(g), c, f, f"jvp output {k}")


def _directional_differences(case: Case, tangents: list, h: float) -> tuple[list, list]:
    """Central differences of td.function(f) along ``tangents`` at steps h and h/2, in one launch."""
    batch, full = oracle.broadcast_all(case.arrays, case.cores)
    _, dirs = oracle.broadcast_all(tangents, case.cores)
    points = [np.stack([x + h * t, x - h * t, x + h / 2 * t, x - h / 2 * t]) for x, t in zip(full, dirs)]
    outs = oracle.leaves(case.fn(*points))
    coarse = [(o[0] - o[1]) / (2 * h) for o in outs]
    fine = [(o[2] - o[3]) / h for o in outs]
    return coarse, fine


def _reject_if_torch_modes_differ(case: Case, twin: Any, ct: Any, grads: Any, want: tuple,
                                  mismatch: Mismatch) -> None:
    """tidiff's cotangents differ from torch's reverse mode ``want``: no oracle (the draw rejected) where torch's
    own forward mode gives other cotangents, which tidiff's agree with; else tidiff's failure.

    Long run, seed 10829: an output ``cross(c * (1, 1, 1), (1, 1, 1))``, zero whatever c, whose cotangent
    reaches c as ``sum(cross((1, 1, 1), ct))``: exactly 0 for a unit cotangent (so the Jacobians by both of
    torch's modes are 0, and ``_modes_agree`` passes), a rounding error of 1e-17 for a random one, times a
    derivative of c near 1e12 from the program before it: torch's reverse mode 9e-5, its forward mode 0,
    tidiff 0. The same kind of oracle failure as seed 10506 (``_modes_agree`` in cases.py), met only with
    the vjp's random cotangent."""
    try:
        forward = oracle.forward_cotangents(twin, case.cores, case.arrays, ct)
    except Exception:  # noqa: BLE001 - any op torch's forward mode does not take: no second opinion
        raise mismatch from None
    try:
        assert_tree_close(forward, want, "twin's cotangents by torch's forward and reverse mode")
    except Mismatch:
        _compare(case, grads, forward, "vjp cotangents against torch's forward mode (its reverse mode differs)")
        reject()
    raise mismatch


def check_vjp(case: Case, rng: np.random.Generator, has_aux: bool) -> None:
    """td.vjp of the whole batched function; and the dot-product test against td.jvp where forward mode exists."""
    n_main = 1 if has_aux else len(case.out_shapes)
    cts = case.like_outputs(rng, case.out_shapes[:n_main])
    ct = cts if len(case.out_shapes) > 1 and not has_aux else cts[0]
    case.notes.append(f"cotangent = {oracle.tree_map(lambda c: c.tolist(), ct)!r}")
    with case.checking(f"out, vjp_fn = td.vjp(f, *args, has_aux={has_aux}); vjp_fn(cotangent)"):
        result = td.vjp(case.fn, *case.host(), has_aux=has_aux)
        if has_aux and len(result) != 3:
            raise Mismatch(f"vjp with has_aux: expected (out, vjp_fn, aux), got {len(result)} entries")
        to_host = (lambda c: case.host([c])[0]) if case.use_torch else (lambda c: c)
        grads = result[1](oracle.tree_map(to_host, ct))
        twin = _aux_twin(case, has_aux)
        out, want = oracle.vjp(twin, case.cores, case.arrays, ct)
        _compare(case, result[0], out, "vjp primal out")
        if has_aux:
            _compare(case, result[2], per_element(case.twin, case.arrays, case.cores)[1], "vjp aux")
        try:
            _compare(case, grads, tuple(want), "vjp cotangents")
        except Mismatch as mismatch:
            if oracle_is_noise(grads, tuple(want), tuple(oracle.vjp(twin, case.cores, nudged(case.arrays), ct)[1])):
                reject()  # NOTE: [Noise of exploded values]
            _reject_if_torch_modes_differ(case, twin, ct, grads, tuple(want), mismatch)
    if case.program.forward_ok:
        tangents = case.like_args(rng)
        case.notes.append(f"dot-product test tangents = {[t.tolist() for t in tangents]!r}")
        with case.checking("dot-product test: <t, vjp_fn(c)> == <jvp(f, args, t), c>"):
            _, touts = td.jvp(case.fn, tuple(case.arrays), tuple(tangents), has_aux=has_aux)[:2]
            grads = td.vjp(case.fn, *case.arrays, has_aux=has_aux)[1](ct)
            left = [np.asarray(t) * np.asarray(g) for t, g in zip(tangents, grads)]
            right = [np.asarray(t) * c for t, c in zip(oracle.leaves(touts), cts)]
            size = sum(np.abs(x).sum() for x in left + right)
            # where the derivative is zero up to rounding (seed 9960: 1e-16 both ways), the products are
            # rounding too: a floor of 1e-12 per unit of tangent and cotangent (entries elsewhere allow 1e-9)
            floor = sum(np.abs(t).sum() for t in tangents) * sum(np.abs(c).sum() for c in cts)
            lhs, rhs = sum(x.sum() for x in left), sum(x.sum() for x in right)
            assert_values_close(np.array(lhs), np.array(rhs), "<t, vjp(c)> against <jvp(t), c>",
                                atol=1e-12 * (size + floor))


def check_hvp(case: Case, rng: np.random.Generator, fd: bool) -> None:
    """td.hvp per element; the quadratic form <t, H t> against second central differences."""
    tangents = case.like_args(rng)
    case.notes.append(f"tangents = {[t.tolist() for t in tangents]!r}")
    with case.checking("td.hvp(f, args, tangents)"):
        got = td.hvp(case.fn, tuple(case.host()), tuple(case.host(tangents)))
        hvp_twin = oracle.hvp_elementwise(case.twin)
        _compare_derivative(case, got, lambda arrays: per_element(hvp_twin, arrays + tangents, case.cores * 2),
                            "hvp")
        if fd:
            batch, dirs = oracle.broadcast_all(tangents, case.cores)
            quad = sum((np.asarray(h) * t).reshape(batch + (-1,)).sum(-1) for h, t in zip(got[1], dirs))
            coarse, fine = _second_differences(case, tangents, 4e-3)
            assert_fd_close(np.asarray(quad), coarse, fine, "<t, hvp(t)>")


def _second_differences(case: Case, tangents: list, h: float) -> tuple[np.ndarray, np.ndarray]:
    _, full = oracle.broadcast_all(case.arrays, case.cores)
    _, dirs = oracle.broadcast_all(tangents, case.cores)
    points = [np.stack([x + h * t, x - h * t, x + h / 2 * t, x - h / 2 * t, x]) for x, t in zip(full, dirs)]
    o = np.asarray(oracle.leaves(case.fn(*points))[0])
    return (o[0] - 2 * o[4] + o[1]) / h**2, (o[2] - 2 * o[4] + o[3]) / (h / 2) ** 2


def check_forward_refused(case: Case) -> None:
    """Forward mode of code reaching a custom_vjp function without a jvp rule is a td.TransformError (as in
    JAX) where the rule's derivative is needed. Where the function's value only feeds a condition or a
    stop_gradient (found by the long run, seed 9202), tidiff's tangent transform does not need it (JAX
    refuses even then): the jvp must then be right."""
    with case.checking("td.jvp(f, args, args) on code reaching a custom_vjp without a jvp rule"):
        try:
            got = td.jvp(case.fn, tuple(case.host()), tuple(case.host()))
        except td.TransformError:
            return
        out, tout = oracle.jvp(case.twin, case.cores, case.arrays, list(case.arrays))
        _compare(case, got, (out, tout), "jvp of code whose custom_vjp value carries no derivative")


# -- compositions -------------------------------------------------------------------------------


def chain_sizes(chain: list, cores: list) -> list | None:
    """Leaf sizes of ``chain`` applied to a scalar function of arguments with these cores; None if invalid.

    grad and hessian need a single scalar output; every step multiplies each
    leaf by the sizes of the arguments it differentiates.
    """
    sizes, single_scalar = [1], True
    for kind, argnums in chain:
        where = positions(argnums, len(cores))
        if kind in ("grad", "hessian") and not single_scalar:
            return None
        arg_sizes = [int(np.prod(cores[k])) for k in where]
        if kind == "hessian":
            sizes = [s * a * b for s in sizes for a in arg_sizes for b in arg_sizes]
        else:
            sizes = [s * a for s in sizes for a in arg_sizes]
        single_scalar = single_scalar and isinstance(argnums, int) and cores[where[0]] == ()
    return sizes


def chain_twin(twin: Any, chain: list, forward: bool = False) -> Any:
    """The twin of a composition: torch's reverse mode at every step, or with ``forward`` its forward mode."""
    for kind, argnums in chain:
        twin = jac(twin, argnums, forward)
        if kind == "hessian":
            twin = jac(twin, argnums, forward)
    return twin


def chain_modes_agree(twin: Any, chain: list, arrays: list, cores: list) -> bool:
    """Whether torch's reverse-mode and forward-mode twins of ``chain`` agree at every element; True where
    torch's forward mode cannot run the twin (it then says nothing).

    NOTE: [Noise of high derivatives] A derivative that is zero, or small, as a difference of terms far
    larger than itself is rounding noise, and each order of differentiation sums the terms otherwise
    (long run, seed 11386: a fourth derivative through ``normalize([x, x] + 0.7391)`` at ``x = -0.73``,
    where ``|v|`` is 0.0085: torch's reverse mode 9.5e-7, its forward mode 2.5e-6, tidiff's 2.4e-6, and a
    1e-9 move of x flips every sign). Where torch's two modes disagree, no comparison means anything.
    """
    try:
        forward = per_element(chain_twin(twin, chain, forward=True), arrays, cores)
    except Exception:  # noqa: BLE001 - any op or control flow torch's forward mode does not take
        return True
    try:
        assert_tree_close(forward, per_element(chain_twin(twin, chain), arrays, cores), "the chain's twin by modes")
    except Mismatch:
        return False
    return True


def check_chain(case: Case, chain: list) -> None:
    """A composition such as ``td.jacfwd(td.jacrev(td.grad(f, 0), 1), (1, 0))``, per element."""
    call = "f"
    for kind, argnums in chain:
        call = f"td.{kind}({call}, argnums={argnums!r})"
    with case.checking(call + "(*args)"):
        g = case.fn
        for kind, argnums in chain:
            g = getattr(td, kind)(g, argnums=argnums)
        got = g(*case.host())
        twin = chain_twin(case.twin, chain)
        try:
            _compare_derivative(case, got, lambda arrays: per_element(twin, arrays, case.cores), call)
        except Mismatch:
            if not chain_modes_agree(case.twin, chain, case.arrays, case.cores):
                reject()  # torch's own modes disagree: rounding noise, nothing to compare (NOTE above)
            raise
