"""``check_grads``: forward mode, reverse mode and central differences agree, to any order."""
from collections.abc import Sequence
from typing import Any, TypedDict

import numpy as np

from .. import _api as T
from .evidence import Comparison, Evidence, argument_namer, entry_namer
from .problem import DEFAULT_EPS, Problem, in_float64, inner


class Tolerance(TypedDict):
    rtol: float
    atol: float


Tolerances = tuple[Tolerance, Tolerance]
"""``(against central differences, between exact derivatives)``"""

FD = "central differences"


def check_grads(f: Any, args: Sequence[Any], order: int = 2, modes: str | Sequence[str] = ("fwd", "rev"),
                eps: float | None = None, rtol: float = 1e-6, atol: float = 1e-6, ad_rtol: float = 1e-9,
                ad_atol: float = 1e-10, fast: bool = False, seed: int = 0) -> None:
    """Check that forward mode, reverse mode and central differences agree, up to ``order``.

    Order 1 checks ``f`` itself. Order 2 runs the same checks on its
    derivative as a function, ``td.grad(f, argnums)`` for a scalar output,
    else ``td.jacrev(f, argnums)`` (``td.jacfwd`` with ``modes=("fwd",)``),
    ``argnums`` being every float argument; order 3 on the derivative of
    that, and so on. Integer arguments are held fixed.

    Full checks (``fast=False``), with ``J`` the per-element Jacobian of each
    output by each float argument (``batch + out_core + in_core``):

    - ``jacfwd == jacrev`` (modes fwd and rev; exact against exact);
    - ``jacfwd == J_fd`` and ``jacrev == J_fd``, ``J_fd`` by central differences;
    - ``jvp(u) == J_fd u`` and ``vjp(v) == J_fd^T v`` (summed over the batch
      for a broadcast argument) for random ``u``, ``v``;
    - the dot-product test ``<u, vjp(v)> == <jvp(u), v>``.

    Fast checks (``fast=True``), per float argument ``a``, for one random
    ``u`` (of ``a``'s shape) and ``v`` (of the outputs' shapes): the dot-product
    test, and both sides against ``d/dt <v, f(x + t u)>`` by central
    differences. Each costs a few evaluations whatever the sizes, so this
    scales to big functions and batches.

    Criterion: entrywise ``|a - b| <= atol + rtol * |b|``, ``b`` the
    reference (central differences; the reverse side in exact-vs-exact
    checks), with ``rtol, atol`` against central differences and
    ``ad_rtol, ad_atol`` between exact derivatives. For an inner product
    ``<x, y>`` the ``|b|`` is replaced by ``<|x|, |y|>``. Central differences
    ``(f(x + h e) - f(x - h e)) / 2h`` use ``h = eps * max(1, |x|)`` with
    ``eps = eps_mach^(1/3)`` (about 6e-6) unless given; their error is then
    about 1e-11 for well-scaled functions.

    Args:
        f: a ``td.Function`` or ``@ti.func``.
        args: tuple of arguments, as for a call of ``f`` (batch dims allowed).
        order: how many derivatives deep to check.
        modes: ``("fwd", "rev")``, ``("fwd",)`` or ``("rev",)``.
        eps: relative step of central differences.
        rtol, atol: tolerance against central differences.
        ad_rtol, ad_atol: tolerance between forward and reverse mode.
        fast: check one random ``v^T J u`` per argument instead of whole Jacobians.
        seed: seed of the random directions.

    Raises:
        AssertionError: naming the worst entry of the worst check: which
            check, argument, output and index, both values and the errors.

    Example:
        >>> @ti.func
        ... def f(x: ti.math.vec3, s: ti.f64) -> ti.f64:
        ...     return s * x.dot(x) + ti.sin(x[0])
        >>> td.testing.check_grads(f, (np.random.rand(4, 3), 2.0), order=2)   # raises if a check fails

    Limitations: ``f`` must be smooth within ``h`` of ``args`` (keep kinks
    and jumps of ``abs``, ``floor``, ``select`` away). Float32 arrays and
    tensors are checked on float64 copies, with a warning; a field
    program's float32 fields are refused.
    """
    modes = _modes(modes, "td.testing.check_grads")
    if not isinstance(order, int) or order < 1:
        raise ValueError(f"td.testing.check_grads: order must be a positive int, got {order!r}")
    step = DEFAULT_EPS if eps is None else float(eps)
    rng = np.random.default_rng(seed)
    fn = f
    args = in_float64(args, "td.testing.check_grads")
    for level in range(1, order + 1):
        call = f"check_grads(order {level}" + (f", on {_name(fn)})" if level > 1 else f", {_name(fn)})")
        problem = Problem(fn, args, call)
        evidence = Evidence()
        tol = Tolerance(rtol=rtol, atol=atol), Tolerance(rtol=ad_rtol, atol=ad_atol)
        if fast:
            _fast_checks(problem, modes, step, tol, rng, evidence, seed)
        else:
            _full_checks(problem, modes, step, tol, rng, evidence, seed)
        evidence.raise_if_failed()
        if level < order:
            fn = _derivative(problem, modes)


def _modes(modes: str | Sequence[str], call: str) -> tuple[str, ...]:
    named = (modes,) if isinstance(modes, str) else tuple(modes)
    if not named or any(m not in ("fwd", "rev") for m in named):
        raise ValueError(f"{call}: modes must name 'fwd' and/or 'rev', got {named!r}")
    return named


def _name(fn: Any) -> str:
    return getattr(fn, "name", getattr(fn, "__name__", repr(fn)))


def _derivative(problem: Problem, modes: tuple[str, ...]) -> Any:
    """The function whose checks are the next order: the first derivative of this one."""
    scalar = len(problem.out_specs) == 1 and problem.out_specs[0].shape == ()
    argnums = problem.floats
    if "rev" in modes:
        return T.grad(problem.fn, argnums) if scalar else T.jacrev(problem.fn, argnums)
    return T.jacfwd(problem.fn, argnums)


def _full_checks(p: Problem, modes: tuple[str, ...], eps: float, tol: Tolerances, rng: np.random.Generator,
                 evidence: Evidence, seed: int) -> None:
    fd_tol, ad_tol = tol
    argnums = p.floats
    fd = p.fd_jacobian(eps)
    jac: dict[str, dict[tuple[int, int], np.ndarray]] = {}
    if "fwd" in modes:
        jac["jacfwd"] = p.flatten_jacobian(T.jacfwd(p.fn, argnums)(*p.arrays))
    if "rev" in modes:
        jac["jacrev"] = p.flatten_jacobian(T.jacrev(p.fn, argnums)(*p.arrays))
    for k in p.float_outs:
        for j, a in enumerate(argnums):
            where = f"output {p.out_names[k]!r}, {p.arg_name(a)}"
            namer = entry_namer(len(p.batch), p.out_specs[k].name, len(p.out_specs[k].shape), p.specs[a].name)
            if len(jac) == 2:
                evidence.add(Comparison(p.call, "forward mode (jacfwd) disagrees with reverse mode (jacrev)",
                                        ("jacfwd", "jacrev"), jac["jacfwd"][k, j], jac["jacrev"][k, j],
                                        where=where, entry=namer, **ad_tol))
            for name, blocks in jac.items():
                mode = "forward" if name == "jacfwd" else "reverse"
                evidence.add(Comparison(p.call, f"{mode} mode ({name}) disagrees with {FD}",
                                        (name, FD), blocks[k, j], fd[k, j], where=where, entry=namer, **fd_tol))
    u, v = p.tangents(rng), p.cotangents(rng)
    seeds = f"random tangent u and cotangent v (seed={seed})"
    if "fwd" in modes:
        _, touts = T.jvp(p.fn, tuple(p.arrays), tuple(u))
        touts = p.flatten(touts)
        expected = p.jvp_from_jacobian(fd, u)
        for k in p.float_outs:
            evidence.add(Comparison(p.call, f"jvp disagrees with {FD} (J_fd u)", ("jvp", "J_fd u"),
                                    np.broadcast_to(touts[k], expected[k].shape), expected[k],
                                    where=f"output {p.out_names[k]!r}, {seeds}",
                                    entry=entry_namer(len(p.batch), p.out_specs[k].name, len(p.out_specs[k].shape)),
                                    **fd_tol))
    if "rev" in modes:
        _, vjp_fn = T.vjp(p.fn, *p.arrays)
        grads = vjp_fn(p.structure(v))
        expected = p.vjp_from_jacobian(fd, v)
        for a in argnums:
            evidence.add(Comparison(p.call, f"vjp disagrees with {FD} (J_fd^T v)", ("vjp", "J_fd^T v"),
                                    grads[a], expected[a], where=f"{p.arg_name(a)}, {seeds}",
                                    entry=argument_namer(p.specs[a].name), **fd_tol))
    if len(modes) == 2:
        lhs, lhs_scale = _sum_inner([(u[a], grads[a]) for a in argnums])
        rhs, rhs_scale = _sum_inner([(touts[k], v[k]) for k in p.float_outs])
        evidence.add(Comparison(p.call, "dot-product test <u, vjp(v)> == <jvp(u), v> fails",
                                ("<u, vjp(v)>", "<jvp(u), v>"), lhs, rhs, scale=max(lhs_scale, rhs_scale),
                                where=f"all float arguments, {seeds}", **ad_tol))


def _fast_checks(p: Problem, modes: tuple[str, ...], eps: float, tol: Tolerances, rng: np.random.Generator,
                 evidence: Evidence, seed: int) -> None:
    fd_tol, ad_tol = tol
    v = p.cotangents(rng)
    grads = None
    if "rev" in modes:
        _, vjp_fn = T.vjp(p.fn, *p.arrays)
        grads = vjp_fn(p.structure(v))
    for a in p.floats:
        u = rng.standard_normal(p.arrays[a].shape)
        where = f"{p.arg_name(a)}, random u of its shape and v of the outputs' (seed={seed})"
        fd = p.fd_directional(a, u, v, eps)
        rev = fwd = None
        if grads is not None:
            rev, rev_scale = inner(u, grads[a])
            evidence.add(Comparison(p.call, f"reverse mode (vjp) disagrees with {FD}",
                                    ("<u, vjp(v)>", FD + " of <v, f(x + t u)>"), rev, fd, scale=rev_scale,
                                    where=where, **fd_tol))
        if "fwd" in modes:
            tangents: list[np.ndarray | None] = [None] * len(p.arrays)
            tangents[a] = u
            _, touts = T.jvp(p.fn, tuple(p.arrays), tuple(tangents))
            touts = p.flatten(touts)
            fwd, fwd_scale = _sum_inner([(touts[k], v[k]) for k in p.float_outs])
            evidence.add(Comparison(p.call, f"forward mode (jvp) disagrees with {FD}",
                                    ("<jvp(u), v>", FD + " of <v, f(x + t u)>"), fwd, fd, scale=fwd_scale,
                                    where=where, **fd_tol))
        if rev is not None and fwd is not None:
            evidence.add(Comparison(p.call, "dot-product test <u, vjp(v)> == <jvp(u), v> fails",
                                    ("<u, vjp(v)>", "<jvp(u), v>"), rev, fwd, scale=max(rev_scale, fwd_scale),
                                    where=where, **ad_tol))


def _sum_inner(pairs: Sequence[tuple[Any, Any]]) -> tuple[float, float]:
    total = scale = 0.0
    for x, y in pairs:
        value, s = inner(np.broadcast_to(x, np.broadcast_shapes(np.shape(x), np.shape(y))), y)
        total, scale = total + value, scale + s
    return total, scale
