"""A generated program with its inputs, ready to check; and what a failure prints.

Inputs are drawn from a seed (uniform in [-1.5, 1.5]), not as hypothesis
floats: hypothesis favours 0.0, 1.0 and other round values, which sit on
kinks (``abs(0)``, ``min(x, x * x)`` at 1) where no two correct
implementations need agree; with random values ties have measure zero.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import hypothesis.strategies as st
import numpy as np
import taichi as ti
import torch
from hypothesis import assume, reject
from hypothesis.extra.numpy import mutually_broadcastable_shapes
from torch.overrides import TorchFunctionMode

import tidiff as td

from . import grammar, known, render_taichi, render_torch
from .compare import Mismatch, as_numpy, assert_values_close
from .crashes import CURRENT_ENV, known_error
from .grammar import Program
from .oracle import broadcast_all, leaves, per_element
from .pitfall_warning import TaichiPitfallWarning

MAX_ELEMENTS = 4
"""Batch elements per example: the oracle loops over them in Python (NOTE: [Oracle per element])."""


@dataclass
class Case:
    """One program, built for Taichi and torch, and one set of host arguments."""

    program: Program
    arrays: list  # NumPy arrays, batch + core
    as_float: list  # which arguments go in as Python floats (0-d, unbatched)
    use_torch: bool = False
    f: Any = None
    twin: Any = None
    fn: Any = None
    notes: list = field(default_factory=list)

    def __post_init__(self):
        self.f = render_taichi.build(self.program)
        self.twin = render_torch.build(self.program)
        self.fn = td.function(self.f)

    @property
    def cores(self):
        return [shape for _, shape in self.program.main.params]

    @property
    def nargs(self):
        return len(self.arrays)

    @property
    def out_shapes(self):
        return self.program.main.out_shapes

    @property
    def batch(self):
        return np.broadcast_shapes(*[a.shape[: a.ndim - len(c)] for a, c in zip(self.arrays, self.cores)])

    def host(self, arrays=None):
        """The arguments as tidiff is called with them: arrays, Python floats, or torch tensors."""
        arrays = self.arrays if arrays is None else arrays
        if self.use_torch:
            return [torch.tensor(a, dtype=torch.float64) for a in arrays]
        return [float(a) if f else a for a, f in zip(arrays, self.as_float)]

    def like_args(self, rng):
        """Random arrays of the arguments' shapes (tangents)."""
        return [rng.uniform(-1.0, 1.0, a.shape) for a in self.arrays]

    def like_outputs(self, rng, shapes=None):
        """Random cotangents for the outputs (``batch + out_core``)."""
        shapes = self.out_shapes if shapes is None else shapes
        return tuple(rng.uniform(-1.0, 1.0, self.batch + s) for s in shapes)

    def report(self, call: str) -> str:
        """Everything needed to reproduce a failure: both programs, the call and the inputs."""
        args = ", ".join(_literal(a, f) for a, f in zip(self.arrays, self.as_float))
        kind = " (as torch tensors)" if self.use_torch else ""
        return "\n".join([
            "", "=" * 30 + " generated program (Taichi) " + "=" * 30, render_taichi.source(self.program),
            "=" * 30 + " torch twin " + "=" * 30, render_torch.source(self.program),
            "=" * 30 + " call " + "=" * 30, f"args = [{args}]{kind}", call,
            *self.notes,
        ])

    @contextlib.contextmanager
    def checking(self, call: str):
        """Run a check; a failure (mismatch or exception) gets the reproduction attached. In a long run the
        reproduction of the check under way is kept in a file (``CURRENT_ENV``): a chunk killed for its time
        limit (a compile that does not end) reports it; after the check, the file holds what it held before
        (a check of Taichi alone, ``TAICHI_ALONE``, must not name what comes after it)."""
        current = os.environ.get(CURRENT_ENV)
        before = None
        if current:
            if os.path.exists(current):
                with open(current) as f:
                    before = f.read()
            with open(current, "w") as f:
                f.write(self.report(call))
        try:
            yield
        except (RuntimeError, ti.TaichiCompilationError) as e:
            known = known_error(str(e), call)
            if known is None:
                e.add_note(self.report(call))
                raise
            from .checks import TaichiPitfall

            pitfall = TaichiPitfall(f"Taichi failed in {call}: {known} (NOTE: [Taichi pitfalls]).\n{e}")
            pitfall.add_note(self.report(call))
            record_pitfall(pitfall)
            reject()
        except Exception as e:
            e.add_note(self.report(call))
            raise
        finally:
            if current:
                with open(current, "w") as f:
                    f.write(before or "")


PITFALL_LOG_ENV = "TIDIFF_CONFORMANCE_PITFALL_LOG"


def record_pitfall(pitfall: Exception) -> None:
    """Report a Taichi pitfall: a warning (in CI's summary) and, in long runs, a line in their log."""
    text = "".join(traceback.format_exception_only(pitfall)) + "\n".join(getattr(pitfall, "__notes__", []))
    warnings.warn(TaichiPitfallWarning(text.splitlines()[0]), stacklevel=2)
    path = os.environ.get(PITFALL_LOG_ENV)
    if path:
        with open(path, "a") as log:
            log.write("=== Taichi pitfall\n" + text + "\n")


def _literal(a: np.ndarray, as_float: bool) -> str:
    if as_float:
        return repr(float(a))
    return f"np.array({a.tolist()!r})"


def all_argnums(nargs: int) -> list:
    """Every argnums for ``nargs`` arguments: ints (negatives too), then tuples of distinct positions in any order.

    Simplest first, so hypothesis shrinks towards ``argnums=0``.
    """
    ints = list(range(nargs)) + list(range(-nargs, 0))
    tuples = []
    for k in range(1, nargs + 1):
        for perm in itertools.permutations(range(nargs), k):
            for signs in itertools.product((0, 1), repeat=k):
                tuples.append(tuple(p - nargs * s for p, s in zip(perm, signs)))
    return ints + tuples


def argnums(nargs: int) -> st.SearchStrategy:
    """An int (negatives too) or a tuple of distinct positions in any order, negatives included."""
    return st.sampled_from(all_argnums(nargs))


@st.composite
def inputs(draw, cores: tuple, batched: bool = True, allow_torch: bool = True):
    """Host arrays for arguments of these core shapes: broadcastable batch shapes, seeded values."""
    n = len(cores)
    if batched:
        shapes = draw(mutually_broadcastable_shapes(num_shapes=n, max_dims=2, max_side=3).filter(
            lambda s: int(np.prod(s.result_shape)) <= MAX_ELEMENTS))
        batches = list(shapes.input_shapes)
    else:
        batches = [()] * n
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    arrays = [rng.uniform(-1.5, 1.5, tuple(b) + c) for b, c in zip(batches, cores)]
    as_float = [a.shape == () and draw(st.booleans()) for a in arrays]
    use_torch = allow_torch and draw(st.integers(0, 7)) == 0
    return arrays, as_float, use_torch


def draw_case(data, out_shapes=None, param_shapes=None, batched=True, program=None) -> Case:
    """Draw a program (unless given) and its inputs, check its value against the twin, and keep it if its
    values are tame.

    One program in four may reach a custom_vjp function without a jvp rule
    (forward mode then refuses, and only reverse-mode transforms are checked).

    Values that overflow or grow past 1e6 say nothing about derivatives (the
    guards of NOTE: [Domains] keep most programs far from there).
    """
    if program is None:
        reverse_only = data.draw(st.integers(0, 3), label="reverse_only") == 3
        program = data.draw(grammar.programs(known.grammar(reverse_only), out_shapes=out_shapes,
                                             param_shapes=param_shapes), label="program")
    cores = tuple(s for _, s in program.main.params)
    arrays, as_float, use_torch = data.draw(inputs(cores, batched=batched), label="inputs")
    case = Case(program, arrays, as_float, use_torch)
    from .checks import TaichiPitfall, check_value

    assume_tame(lambda arrays: per_element(case.twin, arrays, case.cores), case.arrays)
    try:
        check_value(case)
    except TaichiPitfall as pitfall:  # Taichi's fault, not tidiff's (NOTE: [Taichi pitfalls] in checks)
        record_pitfall(pitfall)
        reject()
    assume(_modes_agree(case))
    return case


def _modes_agree(case: Case) -> bool:
    """Whether torch's forward and reverse mode give the twin's Jacobian alike, at the first batch element.

    Where they do not, the derivative is a difference of terms far larger than itself, rounded otherwise by
    each order of summation, and no comparison with either means anything (long run, seed 10506: torch's
    reverse mode -4.5e-4, its forward mode 0, tidiff's both modes 0, central differences 0: a saturated
    ``tanh`` behind ``t[1, 1] - t`` of a matrix of equal entries). A twin torch's forward mode cannot run
    (a custom rule without one, a transform inside) says nothing: kept.
    """
    if not all(np.issubdtype(np.asarray(a).dtype, np.floating) for a in case.arrays):
        return True
    batch, full = broadcast_all(case.arrays, case.cores)
    first = tuple(torch.tensor(np.array(a[(0,) * len(batch)]), dtype=torch.float64) for a in full)
    try:
        forward = torch.func.jacfwd(case.twin, argnums=tuple(range(len(first))))(*first)
    except Exception:  # noqa: BLE001 - any op torch's forward mode does not take
        return True
    reverse = torch.autograd.functional.jacobian(case.twin, first)
    try:
        for f, r in zip(leaves(forward), leaves(reverse), strict=True):
            assert_values_close(as_numpy(f), as_numpy(r), "twin's Jacobian by forward and by reverse mode")
    except Mismatch:
        return False
    return True


def assume_tame(twin: Callable[[list], Any], arrays: list) -> None:
    """Reject inputs at which ``twin``'s values say nothing about derivatives.

    - values that overflow or grow past 1e6;
    - an inf or NaN anywhere inside, or a value past 1e100 (``_Watch``);
    - values that move by more than 1e-9 (relative) when the inputs move by
      1e-12: near a jump (a floor, a %, a branch) or after values exploded,
      implementations that round differently give visibly different values,
      and no comparison at rtol 1e-7 means anything (long run, seeds 9810:
      three compilers, three values 7e-5 apart; 9811: a value that grew to
      1e150 and back; 10115: a field program around a function that is tame
      where it was drawn but reaches 1e27 at the program's inputs, where
      ``cos`` of it is noise);
    - a jump (``%``, ``floor``, an integer cast, a branch's comparison with
      its threshold) whose operand is within rounding of it
      (``_Watch.at_a_jump``).
    """
    with _Watch() as watch:  # an inf inside: 1.7 / (inf + 1) is a tame 0, its derivative 0 * inf
        want = twin(arrays)
    values = np.concatenate([np.ravel(as_numpy(v)) for v in leaves(want)])
    assume(np.all(np.isfinite(values)) and np.max(np.abs(values), initial=0.0) < 1e6)
    assume(not watch.seen and not watch.at_a_jump)
    near = twin(nudged(arrays))
    assume(all(np.allclose(as_numpy(n), as_numpy(w), rtol=1e-9, atol=1e-12)
               for n, w in zip(leaves(near), leaves(want), strict=True)))


def assume_derivatives_defined(twin: Callable[..., Any], arrays: list) -> None:
    """Reject inputs at which torch's Jacobian of ``twin`` (a function of float64 tensors) has an inf or a NaN
    while its values are tame: there torch's derivatives say nothing a comparison could use (long run of
    2026-11-29, a field program: torch's derivative of the element function NaN where central differences give
    -0.357, reverse and forward mode alike, probably a ``torch.where`` whose untaken side has an infinite
    derivative; tidiff's a number)."""
    tensors = tuple(torch.tensor(a, dtype=torch.float64) for a in arrays)
    jacobians = torch.autograd.functional.jacobian(twin, tensors)
    assume(all(bool(torch.isfinite(j).all()) for j in _flat(jacobians)))


def _flat(tree: Any) -> list:
    return [leaf for part in tree for leaf in _flat(part)] if isinstance(tree, (tuple, list)) else [tree]


def nudged(arrays: list) -> list:
    """The inputs moved by 1e-12 (relative): 10^4 times rounding, far below any step a derivative sees."""
    return [a * (1.0 + 1e-12) if np.issubdtype(np.asarray(a).dtype, np.floating) else a for a in arrays]


EXPLODED = 1e100
"""An intermediate past this is exploded, however tame the output (long run, seed 12107: 1e129 inside
``atan2(y, x**2 + 0.5)``, a value of 4e-130): its second and third derivatives pass float64's range
(1e258, 1e387), and whether a mode gets inf, NaN or a number depends on the order of its operations
(torch's Hessian 1e-126, tidiff's forward-over-forward inf, both by IEEE rules)."""


class _Watch(TorchFunctionMode):
    """Notes whether the twin computes an inf or a NaN anywhere (long run, seed 9711: a value overflowing
    to inf inside, a tame output; forward mode's tangent is 0 * inf = NaN where torch's reverse pass
    drops it at a floor: both right by IEEE rules, neither a derivative worth comparing), or a value past
    ``EXPLODED``; and whether an operand is at a jump (NOTE: [Values at a jump])."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False
        self.at_a_jump = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.seen and isinstance(out, torch.Tensor) and out.is_floating_point() \
                and not bool((out.abs() < EXPLODED).all()):
            self.seen = True
        if func in _JUMPS and not self.at_a_jump:
            self.at_a_jump = _at_a_jump(func, args)
        if func in _BRANCHES and isinstance(args[1], float) and not self.at_a_jump:
            self.at_a_jump = _at_a_branch(args[0], args[1])
        if func in _EXTREMES and not self.at_a_jump:
            self.at_a_jump = _near_tie(func, args, kwargs or {})
        return out


# NOTE: [Values at a jump] Ties of a jump have measure zero with random inputs, but not a value that is zero
# up to rounding by construction (long run, seed 11364: the third entry of cos(v) x normalized(w) with
# v[0] = v[1] and w[0] = w[1], then % 1.3): torch rounds it to -3e-18 and takes 1.3 - 3e-18, tidiff to 0
# and takes 0, both right to the last bit. An operand within 1e-9 of a jump rejects the inputs. A branch is
# such a jump: an `if` or a select comparing a value with its threshold (the grammar's `c > 0.0`) whose value
# is the threshold up to rounding by construction (long run, seed 34229: the determinant of a matrix with two
# proportional rows, exactly 0 in torch, which skips the branch, and a few ulps above 0 in Taichi, which
# takes it: the value 1e-3 apart). A comparison of two values (the twin's min and max) is not one: its ties,
# exact in both, are conventions the net checks (NOTE: [Ties]); two values within rounding of each other but not
# equal are a jump (long run, seed 6002 at 99050c0: the atomic minima of 0 and a 2-D cross product of proportional
# vectors, 0 up to rounding by construction: torch's 5.6e-17 kept 0 where Taichi's value won, jvps 0.77 apart).
_JUMPS = (torch.remainder, torch.floor, torch.trunc, torch.Tensor.__mod__, torch.Tensor.remainder,
          torch.Tensor.floor, torch.Tensor.trunc)
_BRANCHES = (torch.Tensor.__gt__, torch.Tensor.gt, torch.gt, torch.Tensor.__lt__, torch.Tensor.lt, torch.lt)

_EXTREMES = (torch.minimum, torch.maximum, torch.amin, torch.amax, torch.Tensor.amin, torch.Tensor.amax)


def _near_tie(func, args, kwargs) -> bool:
    """Whether two values ``func`` compares are within rounding (1e-9 of their size) of each other, not equal."""
    if func in (torch.minimum, torch.maximum):
        a, b = (np.asarray(as_numpy(v), dtype=np.float64) for v in args[:2])
        values = np.stack(np.broadcast_arrays(a, b))
    else:
        values = np.asarray(as_numpy(args[0]), dtype=np.float64)
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        values = values.reshape(-1) if dim is None or dim == () else np.moveaxis(values, dim, 0)
    if values.ndim == 0 or values.shape[0] < 2:
        return False
    ordered = np.sort(values, axis=0)
    apart = ordered[1:] != ordered[:-1]  # an exact tie is a convention (NOTE: [Ties]), not a jump
    return _within_rounding(ordered[1:][apart], ordered[:-1][apart])


def _at_a_jump(func, args) -> bool:
    """Whether ``func(*args)``'s operand is within rounding (1e-9 of its size) of a jump of ``func``."""
    y = np.asarray(as_numpy(args[0]), dtype=np.float64)
    if func in (torch.remainder, torch.Tensor.__mod__, torch.Tensor.remainder):
        y = y / float(as_numpy(args[1]))
    return _within_rounding(y, np.round(y))


def _at_a_branch(value, threshold: float) -> bool:
    """Whether a value compared with a constant ``threshold`` is within rounding (1e-9 of its size) of it."""
    return _within_rounding(np.asarray(as_numpy(value), dtype=np.float64), threshold)


def _within_rounding(y: np.ndarray, jump) -> bool:
    """Whether some entry of ``y`` is within 1e-9 of its size (at least 1) of ``jump`` (a value, or one per
    entry)."""
    return bool(np.any(np.abs(y - jump) <= 1e-9 * np.maximum(1.0, np.abs(y))))
