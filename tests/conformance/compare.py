"""Comparing tidiff's results with an oracle: structure, shape, dtype and values, with the evidence.

NOTE: [Tolerance] Entries agree when ``|got - want| <= RTOL * |want| + ATOL * scale``,
``scale = max(1, max |want|)`` over the leaf: a derivative's rounding error
grows with the magnitude of the terms summed into it, which the leaf's
largest entry bounds better than the entry itself (a Jacobian entry that is
a difference of two large terms is exact only to their size). Finite
differences are compared separately (:func:`assert_fd_close`) with their own
error estimate.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

RTOL = 1e-7
ATOL = 1e-9


class Mismatch(AssertionError):
    """tidiff and the oracle disagree; the message shows where and by how much."""


def as_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def assert_tree_close(got: Any, want: Any, what: str, path: str = "", float_dtype: Any = np.float64,
                      tensors: bool = False) -> None:
    """``got`` (tidiff's) has ``want``'s (the oracle's) tuple structure, shapes, dtype and values.

    ``tensors``: tidiff was given torch tensors, so its leaves must be tensors.
    """
    if isinstance(want, (tuple, list)):
        if not isinstance(got, tuple) or len(got) != len(want):
            kind = f"a tuple of {len(got)}" if isinstance(got, tuple) else type(got).__name__
            raise Mismatch(f"{what}{path}: expected a tuple of {len(want)}, got {kind}")
        for k, (g, w) in enumerate(zip(got, want)):
            assert_tree_close(g, w, what, f"{path}[{k}]", float_dtype, tensors)
        return
    if tensors and not isinstance(got, torch.Tensor):
        raise Mismatch(f"{what}{path}: torch tensors in should give a torch tensor out, got {type(got).__name__}")
    if not tensors and not isinstance(got, np.ndarray):
        raise Mismatch(f"{what}{path}: expected a NumPy array, got {type(got).__name__}: {got!r}")
    g, w = as_numpy(got), np.asarray(want, dtype=np.float64)
    if g.shape != w.shape:
        raise Mismatch(f"{what}{path}: shape {g.shape}, expected {w.shape}")
    if g.dtype != float_dtype:
        raise Mismatch(f"{what}{path}: dtype {g.dtype}, expected {np.dtype(float_dtype)}")
    assert_values_close(g, w, f"{what}{path}")


def assert_values_close(g: np.ndarray, w: np.ndarray, what: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Values agree (NOTE: [Tolerance]); NaN only where the oracle has NaN."""
    if w.size == 0:
        return
    finite = np.isfinite(w)
    scale = max(1.0, float(np.max(np.abs(w[finite]))) if finite.any() else 1.0)
    bad = ~(np.abs(g - w) <= rtol * np.abs(w) + atol * scale)
    bad &= ~(np.isnan(g) & np.isnan(w)) & ~((g == w) & ~finite)
    if bad.any():
        err = np.where(bad, np.abs(g - w), -1.0)
        worst = np.unravel_index(np.argmax(err), w.shape)
        raise Mismatch(
            f"{what}: {int(bad.sum())} of {w.size} entries differ; worst at {tuple(int(i) for i in worst)}: "
            f"got {g[worst]!r}, expected {w[worst]!r} (|diff| {abs(g[worst] - w[worst]):.3g}, "
            f"allowed {rtol * abs(w[worst]) + atol * scale:.3g})\n  got:      {_short(g)}\n  expected: {_short(w)}")


def _short(a: np.ndarray) -> str:
    return np.array2string(a.ravel()[:24], precision=10, separator=", ") + (" ..." if a.size > 24 else "")


def assert_fd_close(got: np.ndarray, coarse: np.ndarray, fine: np.ndarray, what: str) -> None:
    """A derivative agrees with central differences at steps h and h/2, up to their own disagreement.

    Richardson's ``(4 fine - coarse) / 3`` cancels the h^2 error term;
    ``|fine - coarse|`` bounds what is left where the function is smooth at
    that scale. Where it is not (near a singularity), the bound is wide and
    the check says little, but it never fails a correct result.
    """
    extrapolated = (4.0 * fine - coarse) / 3.0
    spread = np.abs(fine - coarse)
    scale = max(1.0, float(np.max(np.abs(extrapolated))) if extrapolated.size else 1.0)
    bad = np.abs(got - extrapolated) > spread + 1e-6 * scale
    if bad.any():
        worst = np.unravel_index(np.argmax(np.where(bad, np.abs(got - extrapolated), -1.0)), got.shape)
        raise Mismatch(f"{what} against central differences: at {tuple(int(i) for i in worst)} got {got[worst]!r}, "
                       f"differences give {extrapolated[worst]!r} (steps h, h/2: {coarse[worst]!r}, {fine[worst]!r})")
