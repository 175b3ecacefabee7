"""Taichi's reverse mode, checked against tidiff's forward mode before it is trusted.

NOTE: [Checking Taichi's reverse mode] The reverse mode of field programs and
ndarray kernels is Taichi's (``kernel.grad``), and Taichi 1.7.4 gets some
programs silently wrong: a vector local given a new value from a field read
in each iteration of a runtime loop (``d = x[i] - x[j]`` in an n-body force
loop) gets a wrong gradient, half the right one in
tests/test_taichi_pitfalls.py (docs/limits.md lists more). The forward mode
of those kinds is tidiff's own tangent transform, an independent
computation of the same derivative, so the first vjp of each function is
checked with the identity ``<J^T c, t> == <c, J t>`` for a random cotangent
``c`` and tangent ``t``, at the call's point and at a point near it (away
from symmetric points such as zeros, where a wrong adjoint can give the
right number).

Where the two disagree beyond rounding, reverse mode is found wrong unless
central differences of the function along ``t`` side with it (ten times
closer to it than to forward mode: then forward mode is in doubt, and the
function is checked again on the next call). Before, a disagreement that
differences could not settle (a kink between the points, a value that is not
finite) used reverse mode for that call, unchecked: a net program's gradient
came out 294 off without a word. A wrong reverse mode is never used again for
that function: its vjp is pushed forward (one tangent run per input
component, ``pushed_vjp``), ``reverse_refused`` names the reason so that
Jacobians choose forward mode, and a ``TaichiReverseWarning`` says so once.
Values that are not finite leave the function unchecked, to be checked again
on the next call (``MOST_TRIES`` calls, then it is trusted).

The check costs two tangent runs (and the tangent's compile) and two
reverse passes on the first vjp of each function; later vjps cost nothing
more. It shows reverse mode right at two points along one direction each:
a miscompile is wrong almost everywhere, so they find it; one wrong only at
points never checked, or only for some cotangents, can pass.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._arrays import Batch, _torch, is_tensor, torch_dtype
from ._errors import TransformError

#: Most input components a wrong reverse mode is replaced by forward pushes for (one tangent run each).
MOST_PUSHES = 20_000
#: Checks that differences could not settle before the function is left unchecked for good.
MOST_TRIES = 3


class TaichiReverseWarning(UserWarning):
    """A checked reverse mode gave a wrong derivative (Taichi's ``kernel.grad``, or an adjoint of tidiff's reading a
    value the program overwrote); tidiff computes it by forward mode instead."""


class _Verdict:
    """Where one function stands: ``trusted`` (or unverifiable), or ``wrong`` with the reason."""

    def __init__(self) -> None:
        self.trusted = False
        self.wrong: str | None = None
        self.tries = 0


def _verdict(fn: Any) -> _Verdict:
    verdict: _Verdict = fn.memo.get("reverse verdict", _Verdict)  # tied to the Taichi runtime, as the kernels
    return verdict


def settled_right(fn: Any) -> bool:
    """Whether ``fn``'s Taichi reverse mode was checked (or left unchecked for good) and not found wrong: its vjp
    is Taichi's from now on, without another check."""
    verdict = fn.memo.peek("reverse verdict")
    return verdict is not None and verdict.trusted and verdict.wrong is None


def wrong_reverse(fn: Any) -> str | None:
    """Why ``fn``'s Taichi reverse mode is not used (it was found wrong), or None."""
    verdict = fn.memo.peek("reverse verdict")
    return None if verdict is None else verdict.wrong


def checked_vjp(fn: Any, batch: Batch, cotangents: Sequence[Any], reverse: Callable[[], list[Any]],
                what: str, exact: Callable[[], bool] | None = None) -> list[Any]:
    """``fn``'s vjp by reverse mode (``reverse()``: its kernels' adjoints, tidiff's or Taichi's), checked on first
    use (NOTE: [Checking Taichi's reverse mode]); by forward pushes where it was found wrong.
    ``fn.unchecked_vjp(batch, cotangents)`` is that reverse mode at any point; ``what`` names the function in
    messages. ``exact()``, asked after ``reverse()`` ran, says the pass just run needs no check (tidiff's own
    adjoints of launches that kept the access rules: NOTE: [Launches that keep the access rules])."""
    if exact is not None and wrong_reverse(fn) is None:
        result = reverse()
        if exact():
            return result
        wrong = verified(fn, batch, what)
        return result if wrong is None else pushed_vjp(fn, batch, cotangents, wrong)
    wrong = verified(fn, batch, what)
    if wrong is not None:
        return pushed_vjp(fn, batch, cotangents, wrong)
    return reverse()


def verified(fn: Any, batch: Batch, what: str) -> str | None:
    """Check ``fn``'s Taichi reverse mode at ``batch`` unless done; why it is wrong, or None."""
    verdict = _verdict(fn)
    if verdict.wrong is None and not verdict.trusted:
        verdict.tries += 1
        settled = _check(fn, batch, what, verdict)
        verdict.trusted = settled or verdict.tries >= MOST_TRIES
    return verdict.wrong


def _as_numpy(a: Any) -> np.ndarray:
    if is_tensor(a):
        return a.detach().cpu().double().numpy()
    return np.asarray(a, dtype=np.float64)


def _like(value: np.ndarray, template: Any, dtype: Any) -> Any:
    """``value`` in ``dtype``, a tensor on the template's device where the template is a tensor."""
    if is_tensor(template):  # then torch is imported
        return _torch().from_numpy(np.array(value)).to(template.device, torch_dtype(dtype))
    return np.array(value, dtype=dtype)  # a copy, contiguous, and 0-d stays 0-d


def _tangent_outputs(fn: Any, batch: Batch, tangents: list[Any], n_out: int) -> list[np.ndarray]:
    """``J t``: one array per output, by ``fn``'s tangent function."""
    tangent = fn.tangent()
    outs = tangent.evaluate(tangent.read(list(batch.arrays) + tangents))
    return [_as_numpy(o) for o in outs[n_out: 2 * n_out]]


def _pairing(cotangents: Sequence[Any], dys: list[np.ndarray]) -> tuple[float, float]:
    """``(<c, dy>, sum |c| |dy|)``."""
    total, scale = 0.0, 0.0
    for c, dy in zip(cotangents, dys, strict=True):
        if c is not None:
            c = np.broadcast_to(_as_numpy(c), dy.shape)
            total += float(np.sum(c * dy))
            scale += float(np.sum(np.abs(c) * np.abs(dy)))
    return total, scale


def _nearby(batch: Batch, floats: list[int], rng: np.random.Generator) -> Batch:
    """The call's point moved by up to 10% in each float entry: away from the symmetric points (zeros, equal
    entries) where a wrong adjoint can give the right number."""
    arrays = list(batch.arrays)
    for k in floats:
        a = _as_numpy(arrays[k])
        moved = a + 0.1 * (np.abs(a) + 0.1) * rng.uniform(-1.0, 1.0, a.shape)
        arrays[k] = _like(moved, arrays[k], batch.specs[k].dtype)
    return Batch(tuple(arrays), batch.specs, batch.shape, batch.device)


def _check(fn: Any, batch: Batch, what: str, verdict: _Verdict) -> bool:
    """Check Taichi's reverse mode against forward mode at the call's point and near it, with a random
    cotangent and tangent; True when settled (agreeing, or not checkable)."""
    floats = [k for k, s in enumerate(batch.specs) if s.is_float]
    out_specs = fn.signature(batch.specs)[0]
    if not floats or not any(s.is_float for s in out_specs):
        return True
    rng = np.random.default_rng(7)
    template = batch.arrays[floats[0]]
    for point in (batch, _nearby(batch, floats, rng)):
        cotangents = [_like(rng.uniform(-1.0, 1.0, s.shape), template, s.dtype) if s.is_float else None
                      for s in out_specs]
        directions = {k: rng.uniform(-1.0, 1.0, batch.specs[k].shape) for k in floats}
        tangents = [_like(directions[k], point.arrays[k], batch.specs[k].dtype) for k in floats]
        grads = fn.unchecked_vjp(point, cotangents)  # first: where Taichi's reverse mode is refused, that is the error
        try:
            dys = _tangent_outputs(fn, point, tangents, len(out_specs))
        except Exception:  # noqa: BLE001 -- no tangent function (TransformError, or Taichi cannot compile it)
            return True  # nothing to check against
        forward, forward_scale = _pairing(cotangents, dys)
        pairs = [(_as_numpy(grads[k]), directions[k]) for k in floats if grads[k] is not None]
        reverse = sum(float(np.sum(g * t)) for g, t in pairs)
        reverse_scale = sum(float(np.sum(np.abs(g * t))) for g, t in pairs)
        if not np.isfinite(forward + reverse + forward_scale + reverse_scale):
            return False
        single = any(np.dtype(batch.specs[k].dtype).itemsize < 8 for k in floats)
        rtol = 1e-3 if single else 1e-7
        if abs(forward - reverse) <= rtol * (forward_scale + reverse_scale) + 1e-300:
            continue
        differences = _differences(fn, point, cotangents, directions, single)
        if differences is not None and abs(reverse - differences) * 10 < abs(forward - differences):
            return False  # differences side with reverse mode: forward mode is in doubt
        said = "not finite" if differences is None else f"{differences:.6g}"
        verdict.wrong = (f"the reverse mode of {what} is wrong (an adjoint reading a value the program overwrote, "
                         "tidiff's or Taichi's kernel.grad, or Taichi's kernel.grad getting a kernel wrong): "
                         f"<J^T c, t> = {reverse:.6g} where tidiff's forward mode gives "
                         f"<c, J t> = {forward:.6g} and central differences {said} (NOTE: [Checking "
                         "Taichi's reverse mode])")
        warnings.warn(f"{verdict.wrong}; tidiff computes its reverse-mode derivatives by forward mode instead, one "
                      "tangent run per input component (docs/limits.md)", TaichiReverseWarning, stacklevel=3)
        return True
    return True


def _differences(fn: Any, batch: Batch, cotangents: Sequence[Any], directions: dict[int, np.ndarray],
                 single: bool) -> float | None:
    """``<c, (f(x + h t) - f(x - h t)) / 2h>``, or None where a value is not finite."""
    size = max(float(np.max(np.abs(_as_numpy(batch.arrays[k])), initial=0.0)) for k in directions)
    h = (1e-2 if single else 1e-5) * max(1.0, size)
    ends = []
    for sign in (1.0, -1.0):
        arrays = [(_like(_as_numpy(a) + sign * h * directions[k], a, s.dtype) if k in directions else a)
                  for k, (a, s) in enumerate(zip(batch.arrays, batch.specs, strict=True))]
        outs = fn.evaluate(Batch(tuple(arrays), batch.specs, batch.shape, batch.device))
        ends.append(_pairing(cotangents, [_as_numpy(o) for o in outs])[0])
    value = (ends[0] - ends[1]) / (2 * h)
    return value if np.isfinite(value) else None


def pushed_vjp(fn: Any, batch: Batch, cotangents: Sequence[Any], why: str) -> list[Any]:
    """``J^T c`` by forward mode: component ``k`` of an input's cotangent is ``<c, J e_k>``; ``why`` says why
    reverse mode is not used."""
    floats = [k for k, s in enumerate(batch.specs) if s.is_float]
    count = sum(int(np.prod(batch.specs[k].shape)) for k in floats)
    if count > MOST_PUSHES:
        raise TransformError(
            f"{why}; computing its vjp by forward mode would take {count} tangent runs (one per "
            f"input component; tidiff does it for at most {MOST_PUSHES})",
            hint="use forward mode (td.jvp, td.jacfwd), or restructure the kernel as docs/limits.md shows")
    zeros = {k: np.zeros(batch.specs[k].shape) for k in floats}
    grads: list[Any] = [None] * len(batch.specs)
    for k in floats:
        spec = batch.specs[k]
        flat = np.zeros(int(np.prod(spec.shape)))
        for i in range(flat.size):
            unit = np.zeros(flat.size)
            unit[i] = 1.0
            directions = {**zeros, k: unit.reshape(spec.shape)}
            tangents = [_like(directions[j], batch.arrays[j], batch.specs[j].dtype) for j in floats]
            flat[i] = _pairing(cotangents, _tangent_outputs(fn, batch, tangents, len(cotangents)))[0]
        grads[k] = _like(flat.reshape(spec.shape), batch.arrays[k], spec.dtype)
    return grads
