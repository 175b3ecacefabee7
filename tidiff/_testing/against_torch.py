"""``check_against_torch``: every transform agrees with ``torch.autograd.functional``."""
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .. import _api as T
from .._tree import flatten_like
from .evidence import Comparison, Evidence, argument_namer, entry_namer
from .problem import Problem, contract_in, in_float64, sum_to

REF = "torch"


def check_against_torch(f: Any, torch_f: Callable[..., Any], args: Sequence[Any], order: int = 2,
                        rtol: float = 1e-7, atol: float = 1e-10, seed: int = 0) -> None:
    """Check every transform of ``f`` against ``torch.autograd.functional`` on ``torch_f``.

    ``torch_f`` computes ``f`` for **one** batch element: it takes one
    torch tensor per argument, of that argument's core shape (float64; 0-d
    for scalars; integer arguments as int64 tensors), and returns a tensor
    or a (nested) tuple of tensors in ``f``'s output structure. The checker
    loops over the batch in Python, so keep batches small (a few elements
    exercise the batching as well as thousands).

    Compared, per batch element, differentiating by every float argument:
    the value; ``jacfwd``, ``jacrev`` and ``jacobian`` against
    ``torch.autograd.functional.jacobian``; ``jvp`` and ``vjp`` of the
    whole batched function against per-element ``torch...jvp``/``vjp`` with
    random tangents and cotangents (a broadcast argument's tangent applies to
    every element, its cotangent sums over them); for a scalar output
    ``grad`` and ``value_and_grad``. With ``order >= 2``: ``hessian`` and
    ``jacrev(grad(f))`` and ``hvp`` for a scalar output (against
    ``torch...hessian``), else ``jacfwd(jacrev(f))`` and
    ``jacrev(jacrev(f))`` against the Jacobian of torch's Jacobian.

    Criterion: entrywise ``|a - b| <= atol + rtol * |b|``, ``b`` torch's value.

    Args:
        f: a ``td.Function`` or ``@ti.func``.
        torch_f: the same function in torch, for one element (see above).
        args: tuple of arguments for ``f`` (batch dims allowed).
        order: 1, or 2 to check second derivatives too.
        rtol, atol: the tolerance.
        seed: seed of the random tangents and cotangents.

    Raises:
        AssertionError: naming the worst entry of the worst check: which
            transform, argument, output, index, both values and the errors.
        NotImplementedError: ``order=2`` for a function without second order.

    Example:
        >>> @ti.func
        ... def f(x: ti.math.vec3, s: ti.f64) -> ti.f64:
        ...     return s * x.dot(x) + ti.sin(x[0])
        >>> td.testing.check_against_torch(
        ...     f, lambda x, s: s * x.dot(x) + torch.sin(x[0]), (np.random.rand(4, 3), 2.0))
    """
    import torch

    call = f"check_against_torch({getattr(f, 'name', getattr(f, '__name__', f))})"
    if order not in (1, 2):
        raise ValueError(f"td.testing.check_against_torch: order must be 1 or 2, got {order!r}")
    p = Problem(f, in_float64(args, call), call)
    ref = _TorchReference(p, torch_f, torch)
    rng = np.random.default_rng(seed)
    evidence = Evidence()
    argnums = p.floats
    nb = len(p.batch)

    def jac_namer(k: int, a: int) -> Callable[[tuple[int, ...]], str]:
        return entry_namer(nb, p.out_specs[k].name, len(p.out_specs[k].shape), p.specs[a].name)

    # values
    values = p.flatten(p.fn(*p.arrays))
    for k in p.float_outs:
        evidence.add(Comparison(call, "value disagrees with torch_f", ("td", REF),
                                np.broadcast_to(values[k], ref.values[k].shape), ref.values[k],
                                where=f"output {p.out_names[k]!r}",
                                entry=entry_namer(nb, p.out_specs[k].name, len(p.out_specs[k].shape)),
                                rtol=rtol, atol=atol))
    evidence.raise_if_failed()  # wrong values make every derivative comparison meaningless
    # Jacobians
    for name in ("jacfwd", "jacrev", "jacobian"):
        blocks = p.flatten_jacobian(getattr(T, name)(p.fn, argnums)(*p.arrays))
        for k in p.float_outs:
            for j, a in enumerate(argnums):
                evidence.add(Comparison(call, f"td.{name} disagrees with torch.autograd.functional.jacobian",
                                        (f"td.{name}", REF), blocks[k, j], ref.jacobian[k, j],
                                        where=f"output {p.out_names[k]!r}, {p.arg_name(a)}", entry=jac_namer(k, a),
                                        rtol=rtol, atol=atol))
    # jvp and vjp of the whole batched function
    u, v = p.tangents(rng), p.cotangents(rng)
    _, touts = T.jvp(p.fn, tuple(p.arrays), tuple(u))
    touts = p.flatten(touts)
    expected = ref.jvp(u)
    for k in p.float_outs:
        evidence.add(Comparison(call, "td.jvp disagrees with torch.autograd.functional.jvp", ("td.jvp", REF),
                                np.broadcast_to(touts[k], expected[k].shape), expected[k],
                                where=f"output {p.out_names[k]!r}, random tangents (seed {seed})",
                                entry=entry_namer(nb, p.out_specs[k].name, len(p.out_specs[k].shape)),
                                rtol=rtol, atol=atol))
    _, vjp_fn = T.vjp(p.fn, *p.arrays)
    grads = vjp_fn(p.structure(v))
    expected = ref.vjp(v)
    for a in argnums:
        evidence.add(Comparison(call, "td.vjp disagrees with torch.autograd.functional.vjp", ("td.vjp", REF),
                                grads[a], expected[a], where=f"{p.arg_name(a)}, random cotangent (seed {seed})",
                                entry=argument_namer(p.specs[a].name), rtol=rtol, atol=atol))
    scalar = len(p.out_specs) == 1 and p.out_specs[0].shape == () and p.out_specs[0].is_float
    if scalar:
        g = T.grad(p.fn, argnums)(*p.arrays)
        value, g2 = T.value_and_grad(p.fn, argnums)(*p.arrays)
        evidence.add(Comparison(call, "td.value_and_grad's value disagrees with torch_f", ("value", REF),
                                np.broadcast_to(value, p.batch), ref.values[0], where="the value",
                                entry=entry_namer(nb, p.out_specs[0].name), rtol=rtol, atol=atol))
        for name, got in (("grad", g), ("value_and_grad", g2)):
            for j, a in enumerate(argnums):
                evidence.add(Comparison(call, f"td.{name} disagrees with torch.autograd.functional.jacobian",
                                        (f"td.{name}", REF), got[j], ref.jacobian[0, j], where=p.arg_name(a),
                                        entry=jac_namer(0, a), rtol=rtol, atol=atol))
    evidence.raise_if_failed()
    if order < 2:
        return
    try:
        if scalar:
            _second_order_scalar(p, ref, rng, evidence, rtol, atol, call)
        else:
            _second_order_jacobian(p, ref, evidence, rtol, atol, call)
    except NotImplementedError as e:
        raise NotImplementedError(
            f"td.testing.check_against_torch: order 2 cannot be checked: {e}. "
            "First derivatives passed; pass order=1 to check only those."
        ) from e
    evidence.raise_if_failed()


def _second_order_scalar(p: Problem, ref: "_TorchReference", rng: np.random.Generator, evidence: Evidence,
                         rtol: float, atol: float, call: str) -> None:
    argnums, nb = p.floats, len(p.batch)
    hes = ref.hessian()
    for label, transform in (("td.hessian", T.hessian(p.fn, argnums)),
                             ("td.jacrev(td.grad(f))", T.jacrev(T.grad(p.fn, argnums), argnums))):
        got = transform(*p.arrays)
        for i, a in enumerate(argnums):
            for j, b in enumerate(argnums):
                evidence.add(Comparison(call, f"{label} disagrees with torch.autograd.functional.hessian",
                                        (label, REF), got[i][j], hes[i, j],
                                        where=f"block ({p.specs[a].name!r}, {p.specs[b].name!r})",
                                        entry=_second_namer(p, 0, a, b), rtol=rtol, atol=atol))
    tangents = p.tangents(rng)
    _, hv = T.hvp(p.fn, tuple(p.arrays), tuple(tangents))
    for i, a in enumerate(argnums):
        expected = sum(contract_in(hes[i, j], tangents[b], p.batch, p.specs[b].shape) for j, b in enumerate(argnums))
        evidence.add(Comparison(call, "td.hvp disagrees with torch's Hessian times the tangents", ("td.hvp", REF),
                                hv[a], expected, where=f"{p.arg_name(a)}, random tangents",
                                entry=entry_namer(nb, f"(H t)[{p.specs[a].name}]", len(p.specs[a].shape)),
                                rtol=rtol, atol=atol))


def _second_order_jacobian(p: Problem, ref: "_TorchReference", evidence: Evidence, rtol: float, atol: float,
                           call: str) -> None:
    argnums = p.floats
    second = ref.second_jacobian()
    for label, outer, inner in (("td.jacfwd(td.jacrev(f))", T.jacfwd, T.jacrev),
                                ("td.jacrev(td.jacrev(f))", T.jacrev, T.jacrev)):
        got = outer(inner(p.fn, argnums), argnums)(*p.arrays)
        for k, per_arg in enumerate(
            flatten_like(p.tree, got, "td.testing", "a result")
        ):  # output k, then d/d argnums[j], then d/d argnums[i]
            if k not in p.float_outs:
                continue
            for j, a in enumerate(argnums):
                for i, b in enumerate(argnums):
                    evidence.add(
                        Comparison(
                            call,
                            f"{label} disagrees with torch's Jacobian of its Jacobian",
                            (label, REF),
                            per_arg[j][i],
                            second[k, j, i],
                            where=f"output {p.out_names[k]!r}, d/d {p.specs[a].name!r} then d/d {p.specs[b].name!r}",
                            entry=_second_namer(p, k, a, b),
                            rtol=rtol,
                            atol=atol,
                        )
                    )


def _second_namer(p: Problem, k: int, a: int, b: int) -> Callable[[tuple[int, ...]], str]:
    nb, no, na = len(p.batch), len(p.out_specs[k].shape), len(p.specs[a].shape)

    def name(index: tuple[int, ...]) -> str:
        batch, rest = index[:nb], index[nb:]
        o, i, j = rest[:no], rest[no:no + na], rest[no + na:]
        what = (f"d2 {p.out_specs[k].name}{list(o) if o else ''} / d {p.specs[a].name}{list(i) if i else ''} "
                f"d {p.specs[b].name}{list(j) if j else ''}")
        return f"batch element {batch}, {what}" if nb else what

    return name


class _TorchReference:
    """``torch_f`` evaluated and differentiated element by element, stacked into ``batch + ...`` arrays."""

    def __init__(self, p: Problem, torch_f: Callable[..., Any], torch: Any) -> None:
        self.p, self.torch_f, self.torch = p, torch_f, torch
        self.af = torch.autograd.functional
        self.elements = list(np.ndindex(*p.batch))
        self.full = [np.broadcast_to(x, p.batch + s.shape) for x, s in zip(p.arrays, p.specs, strict=False)]
        per = [self._at(idx) for idx in self.elements]
        self.values = [self._stack([r[0][k] for r in per], p.out_specs[k].shape) for k in range(len(p.out_specs))]
        self.jacobian = {
            (k, j): self._stack([r[1][k][j] for r in per], p.out_specs[k].shape + p.specs[a].shape)
            for k in p.float_outs for j, a in enumerate(p.floats)
        }

    def _inputs(self, idx: tuple[int, ...]) -> tuple[tuple[Any, ...], Callable[..., tuple[Any, ...]]]:
        t = self.torch
        xs = [t.tensor(np.array(x[idx]), dtype=t.float64 if s.is_float else t.int64)
              for x, s in zip(self.full, self.p.specs, strict=False)]
        floats = tuple(xs[a] for a in self.p.floats)

        def g(*fl: Any) -> tuple[Any, ...]:
            args = list(xs)
            for a, x in zip(self.p.floats, fl, strict=False):
                args[a] = x
            out = self.torch_f(*args)
            return tuple(o if isinstance(o, t.Tensor) else t.as_tensor(o, dtype=t.float64)
                         for o in _flatten_torch(out))

        return floats, g

    def _at(self, idx: tuple[int, ...]) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
        floats, g = self._inputs(idx)
        values = [o.detach().numpy() for o in g(*floats)]
        jac = self.af.jacobian(g, floats)
        return values, [
            [np.asarray(jac[k][j].detach().numpy()) for j in range(len(floats))] for k in range(len(values))
        ]

    def _stack(self, arrays: Sequence[Any], core: tuple[int, ...]) -> np.ndarray:
        return np.stack([np.asarray(a, dtype=np.float64).reshape(core) for a in arrays]).reshape(self.p.batch + core) \
            if arrays else np.zeros(self.p.batch + core)

    def jvp(self, tangents: Sequence[Any]) -> dict[int, np.ndarray]:
        p, t = self.p, self.torch
        full_t = {a: np.broadcast_to(tangents[a], p.batch + p.specs[a].shape) for a in p.floats}
        per = []
        for idx in self.elements:
            floats, g = self._inputs(idx)
            ts = tuple(t.tensor(np.array(full_t[a][idx])) for a in p.floats)
            per.append([o.detach().numpy() for o in self.af.jvp(g, floats, ts)[1]])
        return {k: self._stack([r[k] for r in per], p.out_specs[k].shape) for k in p.float_outs}

    def vjp(self, cotangents: Sequence[Any]) -> dict[int, np.ndarray]:
        p, t = self.p, self.torch
        per = []
        for idx in self.elements:
            floats, g = self._inputs(idx)
            vs = tuple(t.tensor(np.array(cotangents[k][idx]), dtype=t.float64) for k in range(len(p.out_specs)))
            grads = self.af.vjp(g, floats, vs)[1]
            grads = grads if isinstance(grads, tuple) else (grads,)
            per.append([gr.detach().numpy() for gr in grads])
        out: dict[int, np.ndarray] = {}
        for j, a in enumerate(p.floats):
            full = self._stack([r[j] for r in per], p.specs[a].shape)
            out[a] = sum_to(full, p.arrays[a].shape)
        return out

    def hessian(self) -> dict[tuple[int, int], np.ndarray]:
        p = self.p
        per = []
        for idx in self.elements:
            floats, g = self._inputs(idx)
            h = self.af.hessian(_first_output(g), floats)
            per.append(h)
        return {
            (i, j): self._stack(
                [np.asarray(h[i][j].detach().numpy()) for h in per], p.specs[a].shape + p.specs[b].shape
            )
            for i, a in enumerate(p.floats)
            for j, b in enumerate(p.floats)
        }

    def second_jacobian(self) -> dict[tuple[int, int, int], np.ndarray]:
        p, af = self.p, self.af
        per = []
        for idx in self.elements:
            floats, g = self._inputs(idx)

            def first(*xs: Any, g: Callable[..., tuple[Any, ...]] = g) -> tuple[Any, ...]:
                jac = af.jacobian(g, xs, create_graph=True)
                return tuple(jac[k][j] for k in range(len(p.out_specs)) for j in range(len(p.floats)))

            per.append(af.jacobian(first, floats))
        out: dict[tuple[int, int, int], np.ndarray] = {}
        n = len(p.floats)
        for k in p.float_outs:
            for j, a in enumerate(p.floats):
                for i, b in enumerate(p.floats):
                    core = p.out_specs[k].shape + p.specs[a].shape + p.specs[b].shape
                    out[k, j, i] = self._stack([np.asarray(r[k * n + j][i].detach().numpy()) for r in per], core)
        return out


def _first_output(g: Callable[..., tuple[Any, ...]]) -> Callable[..., Any]:
    """``g``'s first output alone (``torch.autograd.functional.hessian`` needs a single one)."""
    return lambda *xs: g(*xs)[0]


def _flatten_torch(out: Any) -> Iterator[Any]:
    if isinstance(out, (tuple, list)):
        for o in out:
            yield from _flatten_torch(o)
    else:
        yield out
