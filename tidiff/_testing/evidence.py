"""Comparisons of derivatives, and the failure message that shows the worst one.

Every check reduces to comparing an array ``a`` (the value under test) with a
reference ``b`` entrywise under the criterion

    |a - b| <= atol + rtol * s,    s = |b| (or a given scale, see below),

and the *badness* of an entry is ``|a - b| / (atol + rtol * s)``: the check
fails where it exceeds 1. For inner products ``<x, y>`` the scale ``s`` is
``<|x|, |y|>``, the size of the rounding errors a sum of products makes.
A NaN against a number fails; NaN against NaN passes (NumPy's equal_nan).
"""
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Comparison:
    """One check: ``actual`` (labelled ``labels[0]``) against ``reference`` (``labels[1]``)."""

    call: str
    check: str
    labels: tuple[str, str]
    actual: Any  # array-like; a float64 array after __post_init__
    reference: Any  # array-like; a float64 array after __post_init__
    rtol: float
    atol: float
    where: str = ""
    entry: Callable[[tuple[int, ...]], str] | None = None  # index -> readable description of that entry
    scale: Any = None  # an array-like of |b|'s stand-ins, or None for |b|
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.actual = np.asarray(self.actual, dtype=np.float64)
        self.reference = np.asarray(self.reference, dtype=np.float64)
        self.shape_error: str | None = None
        if self.actual.shape != self.reference.shape:
            self.shape_error = f"shape {self.actual.shape} where {self.labels[1]} has shape {self.reference.shape}"
            self.badness = np.array([np.inf])
            return
        scale = np.abs(self.reference) if self.scale is None else np.asarray(self.scale, dtype=np.float64)
        allowed = self.atol + self.rtol * scale
        diff = np.abs(self.actual - self.reference)
        with np.errstate(divide="ignore", invalid="ignore"):
            badness = np.where(diff == 0, 0.0, diff / allowed)
        a_nan, b_nan = np.isnan(self.actual), np.isnan(self.reference)
        badness = np.where(a_nan & b_nan, 0.0, np.where(a_nan | b_nan, np.inf, badness))
        # inf - inf of the same sign is a match, not NaN
        same_inf = np.isinf(self.actual) & (self.actual == self.reference)
        self.badness = np.where(same_inf, 0.0, badness)

    @property
    def worst(self) -> float:
        return float(np.max(self.badness)) if self.badness.size else 0.0

    @property
    def failed(self) -> bool:
        return self.worst > 1.0

    def describe(self) -> str:
        """The evidence: which check, where, the worst entry, both values, the errors."""
        head = f"{self.call}: {self.check}"
        lines = [head]
        if self.where:
            lines.append(f"  {self.where}")
        if self.shape_error is not None:
            lines.append(f"  {self.labels[0]} has {self.shape_error}")
            return "\n".join(lines + [f"  {n}" for n in self.notes])
        flat = int(np.argmax(self.badness))
        index = tuple(int(i) for i in np.unravel_index(flat, self.badness.shape)) if self.badness.ndim else ()
        a, b = float(self.actual[index]), float(self.reference[index])
        if self.badness.ndim:
            described = self.entry(index) if self.entry is not None else f"index {index}"
            lines.append(f"  worst entry: {described}")
        width = max(len(self.labels[0]), len(self.labels[1])) + 1
        lines.append(f"    {self.labels[0] + ':':<{width}} {a!r}")
        lines.append(f"    {self.labels[1] + ':':<{width}} {b!r}")
        err = abs(a - b)
        scale = abs(b) if self.scale is None else float(np.asarray(self.scale, dtype=np.float64)[index])
        rel = err / abs(b) if b != 0 else float("inf")
        allowed = self.atol + self.rtol * scale
        lines.append(
            f"    abs error {err:.3e}, rel error {rel:.3e}; allowed |a - b| <= atol + rtol * "
            f"{'|b|' if self.scale is None else 's'} = {self.atol:g} + {self.rtol:g} * {scale:.3e} = {allowed:.3e}"
        )
        failing = int(np.sum(self.badness > 1.0))
        if self.badness.size > 1:
            lines.append(f"  {failing} of {self.badness.size} entries fail")
        lines.extend(f"  {n}" for n in self.notes)
        return "\n".join(lines)


class Evidence:
    """Collects comparisons; ``raise_if_failed`` reports the worst failing one in full."""

    def __init__(self) -> None:
        self.comparisons: list[Comparison] = []

    def add(self, comparison: Comparison) -> Comparison:
        self.comparisons.append(comparison)
        return comparison

    def raise_if_failed(self) -> None:
        failed = [c for c in self.comparisons if c.failed]
        if not failed:
            return
        failed.sort(key=lambda c: -c.worst)
        message = failed[0].describe()
        if len(failed) > 1:
            others = "; ".join(f"{c.check} [{c.where}] ({_times(c.worst)})" for c in failed[1:6])
            more = f" and {len(failed) - 6} more" if len(failed) > 6 else ""
            message += f"\n  other failing checks: {others}{more}"
        failed_checks = {c.check for c in failed}
        passed = list(dict.fromkeys(_short(c.check) for c in self.comparisons if c.check not in failed_checks))
        if passed:
            message += f"\n  passing checks: {'; '.join(passed)}"
        raise AssertionError(message)


def _short(check: str) -> str:
    return check.replace(" disagrees with ", " vs ").replace(" fails", "")


def _times(badness: float) -> str:
    return "error inf x allowed" if not np.isfinite(badness) else f"error {badness:.3g}x allowed"


def entry_namer(nbatch: int, out_name: str | None = None, out_ndim: int = 0,
                in_name: str | None = None) -> Callable[[tuple[int, ...]], str]:
    """Reads an index of a ``batch + out_core [+ in_core]`` array as the derivative it holds."""

    def name(index: tuple[int, ...]) -> str:
        batch, rest = index[:nbatch], index[nbatch:]
        out_idx, in_idx = rest[:out_ndim], rest[out_ndim:]
        what = f"{out_name}{list(out_idx) if out_idx else ''}"
        if in_name is not None:
            what = f"d {what} / d {in_name}{list(in_idx) if in_idx else ''}"
        return f"batch element {batch}, {what}" if nbatch else what

    return name


def argument_namer(name: str) -> Callable[[tuple[int, ...]], str]:
    """Reads an index of an array shaped like argument ``name`` as that argument's entry."""
    return lambda index: f"{name}{list(index)}"
