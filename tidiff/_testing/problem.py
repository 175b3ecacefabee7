"""A function and its arguments, read once, and the plain-NumPy references the checkers need.

Nothing here uses tidiff's derivative code: central differences call the
function itself, and sums over broadcast dims are written out again, so
they stay an independent reference.
"""
import inspect
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import taichi as ti

from .._arrays import is_tensor, torch_module
from .._kinds.func import python_function
from .._protocol import as_function
from .._tree import flatten_like, leaves, unflatten

# NOTE: [Step of central differences] The error of (f(x+h) - f(x-h)) / 2h is
# about h^2 |f'''| / 6 (truncation) plus eps_mach |f| / h (rounding); the sum
# is smallest near h = eps_mach^(1/3) (6e-6 in float64), scaled by
# max(1, |x|) so large arguments get a step they can resolve. Both errors
# are then near 1e-11 (|f'''| + |f|): tolerances of 1e-6 leave a wide margin.
DEFAULT_EPS = float(np.finfo(np.float64).eps ** (1.0 / 3.0))


def in_float64(args: Any, call: str) -> Any:
    """``args`` with float32 (and float16) arrays and tensors as float64 copies, saying so in a warning
    (issue 35: a check of float32 data raised): central differences resolve 1e-6 only in float64. A field
    program's float32 fields cannot take a copy; :class:`Problem` refuses those by name."""
    if not isinstance(args, (tuple, list)):
        return args  # Problem names the mistake
    out, widened = [], []
    for k, a in enumerate(args):
        dtype = getattr(a, "dtype", None)
        if is_tensor(a) and a.dtype.is_floating_point and a.dtype != torch_module().float64:
            out.append(a.detach().double())
            widened.append(k)
        elif isinstance(dtype, np.dtype) and dtype.kind == "f" and dtype != np.float64:
            out.append(np.asarray(a, np.float64))
            widened.append(k)
        else:
            out.append(a)
    if widened:
        warnings.warn(f"{call}: arguments {widened} (argnums) checked on float64 copies of their float32 values: "
                      "central differences resolve 1e-6 only in float64", stacklevel=3)
    return type(args)(out)


def _narrow_scalar_annotations(fn: Any) -> list[str]:
    """The parameters of a ``@ti.func`` annotated ``ti.f32`` or ``ti.f16``: such a scalar annotation casts inside
    the function (NOTE: [Float precision] in ``_signature``), so a float64 value is computed in float32."""
    tifunc = getattr(fn, "tifunc", None)
    if tifunc is None:
        return []
    parameters = inspect.signature(python_function(tifunc)).parameters
    return [repr(name) for name, p in parameters.items() if p.annotation in (ti.f32, ti.f16)]


class Problem:
    """``f`` at ``args``: specs, own copies of the arrays, float arguments, flat outputs."""

    def __init__(self, f: Any, args: Sequence[Any], call: str) -> None:
        fn = as_function(f, call)
        if not isinstance(args, (tuple, list)):
            raise TypeError(f"{call}: args must be a tuple with one entry per argument, got {type(args).__name__}")
        batch = fn.read(tuple(args), call)
        self.fn, self.call = fn, call
        self.specs = list(batch.specs)
        self.arrays = [np.array(a, copy=True) for a in batch.arrays]  # the user's inputs stay untouched
        self.batch = tuple(batch.shape)
        self.floats = tuple(k for k, s in enumerate(self.specs) if s.is_float)
        if not self.floats:
            raise TypeError(f"{call}: {fn.name} has no float arguments; there is nothing to differentiate")
        narrow = _narrow_scalar_annotations(fn)
        if narrow:
            raise TypeError(
                f"{call}: {fn.name} annotates {', '.join(narrow)} with a float32 (or float16) scalar type, so it "
                "computes in that precision whatever the values; derivative checks need float64 code, where central "
                "differences resolve 1e-6 (annotate ti.f64)"
            )
        for k in self.floats:
            if self.specs[k].dtype != np.float64:  # a field program's float32 fields: no float64 copy to make
                raise TypeError(
                    f"{call}: argument {self.specs[k].name!r} is {self.specs[k].dtype}; derivative checks "
                    "need float64 (ti.init(default_fp=ti.f64)), where central differences resolve 1e-6"
                )
        out_specs, self.tree = fn.signature(self.specs)
        self.out_specs = [out_specs[i] for i in leaves(self.tree)]  # in the order flatten() gives
        self.out_names = [s.name if len(self.out_specs) == 1 else f"{s.name} (output {k})"
                          for k, s in enumerate(self.out_specs)]
        self.float_outs = [k for k, s in enumerate(self.out_specs) if s.is_float]

    # -- outputs -------------------------------------------------------------
    def flatten(self, value: Any) -> list[np.ndarray]:
        """The outputs of one call in order (nested tuples flattened depth first)."""
        return [np.asarray(v) for v in flatten_like(self.tree, value, "td.testing", "a result")]

    def flatten_jacobian(self, value: Any) -> dict[tuple[int, int], np.ndarray]:
        """``{(k, j): block}`` from a transform with ``argnums=self.floats``: output k, float argument j."""
        return {
            (k, j): np.asarray(block)
            for k, blocks in enumerate(flatten_like(self.tree, value, "td.testing", "a result"))
            for j, block in enumerate(blocks)
        }

    def structure(self, flat: Sequence[Any]) -> Any:
        """Nest a flat list of per-output values as the function's outputs are nested."""
        by_leaf: list[Any] = [None] * (max(leaves(self.tree)) + 1)
        for k, leaf in enumerate(leaves(self.tree)):
            by_leaf[leaf] = flat[k]
        return unflatten(self.tree, by_leaf)

    def evaluate(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        return [
            np.broadcast_to(o, self.batch + s.shape)
            for o, s in zip(self.flatten(self.fn(*arrays)), self.out_specs, strict=False)
        ]

    # -- names ---------------------------------------------------------------
    def arg_name(self, a: int) -> str:
        return f"argument {self.specs[a].name!r} (argnums {a})"

    # -- references ----------------------------------------------------------
    def fd_jacobian(self, eps: float) -> dict[tuple[int, int], np.ndarray]:
        """Per-element Jacobian blocks ``{(k, j): batch + out_core + in_core}`` by central differences.

        One pair of evaluations per core component of each float argument;
        batch elements are independent, so every element's column comes from
        the same pair (see NOTE: [Step of central differences]).
        """
        blocks: dict[tuple[int, int], np.ndarray] = {}
        for j, a in enumerate(self.floats):
            x, core = self.arrays[a], self.specs[a].shape
            n = self.specs[a].size
            flat = x.reshape(x.shape[: x.ndim - len(core)] + (n,))
            cols: dict[int, list[np.ndarray]] = {k: [] for k in self.float_outs}
            for p in range(n):
                h = eps * np.maximum(1.0, np.abs(flat[..., p]))
                plus, minus = flat.copy(), flat.copy()
                plus[..., p] += h
                minus[..., p] -= h
                step = plus[..., p] - minus[..., p]  # the step the arithmetic really took
                f_plus = self.evaluate(self._with(a, plus.reshape(x.shape)))
                f_minus = self.evaluate(self._with(a, minus.reshape(x.shape)))
                for k in self.float_outs:
                    out_core = self.out_specs[k].shape
                    s = step.reshape(step.shape + (1,) * len(out_core))
                    cols[k].append((f_plus[k] - f_minus[k]) / s)
            for k in self.float_outs:
                stacked = np.stack([np.broadcast_to(c, self.batch + self.out_specs[k].shape) for c in cols[k]], -1)
                blocks[k, j] = stacked.reshape(self.batch + self.out_specs[k].shape + core)
        return blocks

    def fd_directional(self, a: int, u: np.ndarray, v: Sequence[np.ndarray], eps: float) -> float:
        """``d/dt <v, f(x + t u)>`` at 0 by central differences, ``u`` a direction for argument ``a``."""
        x = self.arrays[a]
        h = eps * max(1.0, float(np.max(np.abs(x), initial=0.0))) / max(float(np.max(np.abs(u), initial=0.0)), 1e-300)
        plus, minus = x + h * u, x - h * u
        phi_plus = sum(
            float(np.sum(v[k] * o))
            for k, o in zip(self.float_outs, _pick(self.evaluate(self._with(a, plus)), self.float_outs), strict=False)
        )
        phi_minus = sum(
            float(np.sum(v[k] * o))
            for k, o in zip(self.float_outs, _pick(self.evaluate(self._with(a, minus)), self.float_outs), strict=False)
        )
        return (phi_plus - phi_minus) / (2 * h)

    def jvp_from_jacobian(self, blocks: dict[tuple[int, int], np.ndarray],
                          tangents: Sequence[Any]) -> dict[int, np.ndarray]:
        """Per output, ``sum_j J[k, j] . u_j`` per element: what jvp of the batched function is."""
        result = {}
        for k in self.float_outs:
            total = np.zeros(self.batch + self.out_specs[k].shape)
            for j, a in enumerate(self.floats):
                total = total + contract_in(blocks[k, j], tangents[a], self.batch, self.specs[a].shape)
            result[k] = total
        return result

    def vjp_from_jacobian(self, blocks: dict[tuple[int, int], np.ndarray],
                          cotangents: Sequence[Any]) -> dict[int, np.ndarray]:
        """Per float argument, ``sum_k J[k, j]^T v_k`` summed back onto the argument's own shape."""
        result = {}
        for j, a in enumerate(self.floats):
            total = np.zeros(self.batch + self.specs[a].shape)
            for k in self.float_outs:
                total = total + contract_out(blocks[k, j], cotangents[k], self.batch, self.out_specs[k].shape)
            result[a] = sum_to(total, self.arrays[a].shape)
        return result

    # -- random directions ---------------------------------------------------
    def tangents(self, rng: np.random.Generator) -> list[np.ndarray | None]:
        return [
            rng.standard_normal(x.shape) if s.is_float else None for x, s in zip(self.arrays, self.specs, strict=False)
        ]

    def cotangents(self, rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.standard_normal(self.batch + s.shape) if s.is_float else np.zeros(self.batch + s.shape, s.dtype)
                for s in self.out_specs]

    def _with(self, a: int, value: np.ndarray) -> list[np.ndarray]:
        arrays = list(self.arrays)
        arrays[a] = value
        return arrays


def _pick(values: Sequence[np.ndarray], ks: Sequence[int]) -> list[np.ndarray]:
    return [values[k] for k in ks]


def contract_in(block: np.ndarray, u: Any, batch: tuple[int, ...], in_core: tuple[int, ...]) -> np.ndarray:
    """``block`` (batch + O + I) times ``u`` (broadcastable to batch + I), summed over I."""
    u = np.broadcast_to(u, batch + in_core)
    nb, ni = len(batch), len(in_core)
    out_ndim = block.ndim - nb - ni
    u = u.reshape(batch + (1,) * out_ndim + in_core)
    return np.sum(block * u, axis=tuple(range(block.ndim - ni, block.ndim)))


def contract_out(block: np.ndarray, v: Any, batch: tuple[int, ...], out_core: tuple[int, ...]) -> np.ndarray:
    """``v`` (batch + O) times ``block`` (batch + O + I), summed over O."""
    nb, no = len(batch), len(out_core)
    in_ndim = block.ndim - nb - no
    v = np.broadcast_to(v, batch + out_core).reshape(batch + out_core + (1,) * in_ndim)
    return np.sum(block * v, axis=tuple(range(nb, nb + no)))


def sum_to(array: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Sum ``array`` over the dims along which ``shape`` was broadcast to it (NumPy broadcasting reversed)."""
    lead = array.ndim - len(shape)
    if lead:
        array = array.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and array.shape[i] != 1)
    return array.sum(axis=axes, keepdims=True) if axes else array


def inner(x: Any, y: Any) -> tuple[float, float]:
    """``<x, y>`` and ``<|x|, |y|>`` (the scale of its rounding error)."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    return float(np.sum(a * b)), float(np.sum(np.abs(a) * np.abs(b)))
