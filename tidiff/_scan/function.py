"""``td.scan``: a step Function applied ``length`` times, as a Function with a checkpointed vjp.

The loop is a :class:`Function` like any other (``_protocol``):

- ``evaluate`` runs the steps, keeping nothing;
- ``vjp`` runs the checkpoint schedule (NOTE: [Checkpointed pullback] in
  ``schedule``) over the step's own vjp;
- ``tangent()`` is the loop of the step's tangent: the carry grows by the
  tangents of the carried inputs, the parameters' tangents stay fixed, so
  forward mode keeps nothing. Its vjp is the checkpointed loop of the
  tangent's vjp: Hessian-vector products, and every order, follow.

A field program's step keeps its carry in fields (``fields.FieldStepper``);
any other step goes through host arrays (``host.HostStepper``).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._arrays import Batch
from .._derived import SameArguments
from .._errors import describe_shape
from .._protocol import Function, as_function
from .._reverse_check import pushed_vjp, verified, wrong_reverse
from .._signature import ArgSpec
from .._tree import Tree
from .axis_stepper import AxisStepper
from .fields import FieldStepper
from .host import HostStepper
from .schedule import Schedule, keep_checkpoints, pull_back, run


class Scan(Function):
    """``step`` applied ``length`` times (see :func:`scan`).

    ``carry[j]`` is the input of ``step`` that its output ``j`` feeds, or
    None for an output read after the last step only (the tangent of an
    integer carry).
    """

    def __init__(self, step: Function, length: int, checkpoints: int | None, carry: Sequence[int | None],
                 name: str, *, listed: bool = True, each: Sequence[bool] | None = None) -> None:
        super().__init__(name, listed=listed, arguments=SameArguments(step))
        self.step, self.length, self.checkpoints = step, length, checkpoints
        self.carry = tuple(carry)
        self.each = tuple(each) if each is not None else (False,) * len(self.carry)  # NOTE: [Per-step outputs]
        self.schedule = Schedule.of(length, checkpoints)
        self._stepper: Any = None


    def read(self, args: Sequence[Any], call: str | None = None) -> Batch:
        call = call or self.name
        return self.step.read(args, call).unbatched(call, "a time loop")

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        outs, tree = self.step.signature(in_specs)
        self.memo.get(("checked", tuple(in_specs)), lambda: _check_carry(self, in_specs, outs))
        return [ArgSpec(o.name, (self.length,) + o.shape, o.dtype) if e else o
                for o, e in zip(outs, self.each, strict=True)], tree

    def stepper(self, batch: Batch) -> Any:
        """The stepper (made once, at the first call): a field program's kernels over buffers with a time axis
        (NOTE: [A time loop over buffers]) where they take it, else the carry in the program's fields, else on
        the host."""
        if self._stepper is None:  # loops of one step and schedule share it: its kernels compile once
            key = ("time loop stepper", self.carry, self.each, self.length, self.schedule.every)
            self._stepper = self.step.memo.get(key, lambda: self._made_stepper(batch))
        return self._stepper

    def _made_stepper(self, batch: Batch) -> Any:
        stepper: Any = None
        if AxisStepper.fits(self.step):
            stepper = AxisStepper.made(self.step, self.carry, self.each, self.length, self.schedule, batch)
        if stepper is None:
            kind = FieldStepper if FieldStepper.fits(self.step) else HostStepper
            stepper = kind(self.step, self.carry, self.each, self.length)
        stepper.holder = None  # the linearization whose checkpoints the stepper holds (loops share steppers)
        return stepper

    def evaluate(self, batch: Batch) -> list[Any]:
        self.signature(batch.specs)
        stepper = self.stepper(batch)
        stepper.begin(batch, 0)
        if isinstance(stepper, AxisStepper):
            return stepper.run_loop()
        return run(stepper, self.length)

    def _wrong_reverse(self, batch: Batch) -> str | None:
        """Why the step's Taichi reverse mode, which a field stepper replays, is not used (NOTE: [Checking
        Taichi's reverse mode]); a host stepper calls the step's vjp, which is checked itself, and a loop over
        buffers whose adjoints are all tidiff's, keeping the access rules, needs no check."""
        stepper = self.stepper(batch)
        if not isinstance(stepper, FieldStepper) or isinstance(stepper, AxisStepper) and stepper.exact:
            return None
        return verified(self.step, batch, f"the step `{self.step.name}` of `{self.name}`")

    def reverse_refused(self) -> str | None:
        return wrong_reverse(self.step)  # found wrong: Jacobians push forward

    def vjp(self, batch: Batch, cotangents: Sequence[Any]) -> list[Any]:
        self.signature(batch.specs)
        wrong = self._wrong_reverse(batch)
        if wrong is not None:
            return pushed_vjp(self, batch, cotangents, wrong)
        stepper = self.stepper(batch)
        stepper.begin(batch, self.schedule.slots)
        stepper.holder = None
        if isinstance(stepper, AxisStepper):
            return stepper.pull_back_all(cotangents, kept=False)
        return pull_back(stepper, self.schedule, cotangents)

    def linearize(self, batch: Batch) -> tuple[list[Any], Callable[[Sequence[Any]], list[Any]]]:
        """One forward pass that keeps the checkpoints and gives the outputs; the pullback starts from them.

        The pullback loads the arguments again (another call may have run on
        the step's fields meanwhile) and uses the checkpoints if they are
        still this linearization's; else it takes them again.
        """
        self.signature(batch.specs)
        stepper = self.stepper(batch)
        stepper.begin(batch, self.schedule.slots)
        axis = isinstance(stepper, AxisStepper)
        outs = stepper.run_loop(keep=True) if axis else \
            keep_checkpoints(stepper, self.schedule, to_the_end=True)
        assert outs is not None
        stepper.holder = holder = object()

        def pullback(cotangents: Sequence[Any]) -> list[Any]:
            wrong = self._wrong_reverse(batch)
            if wrong is not None:
                return pushed_vjp(self, batch, cotangents, wrong)
            kept = stepper.holder is holder
            stepper.begin(batch, self.schedule.slots)
            grads = stepper.pull_back_all(cotangents, kept) if axis else \
                pull_back(stepper, self.schedule, cotangents, kept=kept)
            stepper.holder = holder
            return grads

        return outs, pullback

    def tangent(self) -> Function:
        if "tangent" not in self.derived:
            self.derived["tangent"] = Scan(self.step.tangent(), self.length, self.checkpoints,
                                           self._tangent_carry(), f"jvp({self.name})", listed=False,
                                           each=self.each + self.each)
        return self.derived["tangent"]

    def _tangent_carry(self) -> list[int | None]:
        """Outputs ``(y..., dy...)`` of the step's tangent: ``dy_j`` feeds the tangent of ``y_j``'s input."""
        specs = self.step.declared_specs()
        n = len(self.step.param_names()) if specs is None else len(specs)
        floats = [i for i in range(n) if specs is None or specs[i].is_float]
        rank = {i: n + r for r, i in enumerate(floats)}
        return list(self.carry) + [None if i is None else rank.get(i) for i in self.carry]


def _check_carry(loop: Scan, in_specs: Sequence[ArgSpec], out_specs: Sequence[ArgSpec]) -> bool:
    """Each carried output has its input's shape and kind of dtype."""
    for j, i in enumerate(loop.carry):
        if i is None:
            continue
        o, s = out_specs[j], in_specs[i]
        if o.shape != s.shape or o.is_float != s.is_float:
            raise ValueError(
                f"td.scan({loop.step.name}): output {j} ({o.name!r}, {describe_shape(o.shape)} of {o.dtype}) "
                f"is the next value of input {i} ({s.name!r}, {describe_shape(s.shape)} of {s.dtype}) and must "
                "have its shape and kind of dtype: a step's outputs are the new carry, in the order of its "
                "first inputs"
            )
    return True


def _positive(value: Any, name: str, call: str, allow_none: bool = False) -> int:
    """``value`` as an int, else an error naming it (``allow_none``: the message says None is allowed too)."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)) or value < 1:
        raise (TypeError if not isinstance(value, (int, np.integer)) else ValueError)(
            f"{call}: {name} must be a positive integer{' or None' if allow_none else ''}, got {value!r}")
    return int(value)


def scan(step: Any, length: int, checkpoints: int | None = None, name: str | None = None, *,
         per_step: int = 0) -> Function:
    """A differentiable time loop: ``step`` applied ``length`` times, gradients by checkpointing.

    As ``jax.lax.scan`` over ``jax.checkpoint``-ed segments, for a step whose
    outputs are its new state: ``step(c, p) -> c'`` where ``c`` are the
    step's first ``m`` inputs (``m`` outputs, each of its input's shape) and
    ``p`` the rest, parameters held fixed over the loop.

    Args:
        step: a ``td.Function`` (a field program from ``td.function(kernel,
            inputs=[x, v, k], outputs=[x_next, v_next])``, a ``@ti.func``, any
            Function). Outputs are the carry, in the order of the first inputs.
            A step index is an integer carry (``t_next = t + 1``).
        length: the number of steps (``T``), at least 1.
        checkpoints: how many carries the forward pass of reverse mode keeps
            (``K``, from 1 to ``length``; default ``ceil(sqrt(length))``). The
            reverse pass recomputes each segment of ``ceil(length / K)`` steps
            from its checkpoint: memory ``K + ceil(length / K) - 2`` carries,
            about ``2 sqrt(T)`` by default; ``length`` keeps every carry.
        name: the name ``td.cache_info()`` and error messages use.
        per_step: how many of the step's outputs, its last ones, are read at
            every step rather than carried (``jax.lax.scan``'s ``ys``: an
            energy, a position to follow): the loop returns each stacked over
            the steps, shape ``(length,) + shape``, and they are
            differentiable like the final state (a loss over the whole
            trajectory needs no accumulator field). The outputs before them
            are the carry.

    Returns:
        A ``td.Function`` ``(c0, p) -> (c_T, ys)`` with the step's inputs and
        outputs: every transform takes it (``grad``, ``vjp``, ``jvp``,
        ``hessian``, ``hvp``). Forward mode carries tangents beside the
        state and keeps nothing.

    Example:
        >>> @ti.func
        ... def step(x: ti.f64, v: ti.f64, k: ti.f64):      # a spring: the carry (x, v), the stiffness k
        ...     return x + 0.01 * v, v - 0.01 * k * x
        >>> sim = td.scan(step, length=1000)
        >>> xT, vT = sim(1.0, 0.0, 4.0)
        >>> (xT, vT), vjp_fn = td.vjp(sim, 1.0, 0.0, 4.0)
        >>> dx0, dv0, dk = vjp_fn((1.0, 0.0))                  # d xT by x0, v0 and k
        >>> np.round([xT, vT, dx0, dv0, dk], 4)
        array([ 0.5014, -2.2274,  0.5014,  0.5568, -2.7581])

        A per-step output: the position at every step, and the gradient of
        its mean square by the stiffness.

        >>> @ti.func
        ... def step_and_read(x: ti.f64, v: ti.f64, k: ti.f64):
        ...     return x + 0.01 * v, v - 0.01 * k * x, x
        >>> path = td.scan(step_and_read, length=1000, per_step=1)
        >>> xT, vT, xs = path(1.0, 0.0, 4.0)
        >>> xs.shape, bool(xs[0] == 1.0)
        ((1000,), True)
        >>> _, vjp_fn = td.vjp(path, 1.0, 0.0, 4.0)
        >>> dk = vjp_fn((0.0, 0.0, 2 * xs / 1000))[2]          # d mean(x_t^2) / d k
        >>> step_k = 1e-6
        >>> fd = (np.mean(path(1.0, 0.0, 4.0 + step_k)[2] ** 2) - np.mean(path(1.0, 0.0, 4.0 - step_k)[2] ** 2))
        >>> bool(abs(dk - fd / (2 * step_k)) < 1e-6)
        True

    Limitations:
        A field program's fields are loaded once per call; before each step
        its outputs and ``state`` fields are zeroed and every other field its
        kernels write is reset to its value at the start, so each step is one
        call of ``step``. The loop takes no batch dims.
    """
    call = "td.scan(step, length, checkpoints)"
    fn = as_function(step, call)
    call = f"td.scan({fn.name})"
    length = _positive(length, "length", call)
    checkpoints = None if checkpoints is None else _positive(checkpoints, "checkpoints", call, allow_none=True)
    if checkpoints is not None and checkpoints > length:
        raise ValueError(f"{call}: checkpoints must be at most length ({length}), got {checkpoints}")
    specs = fn.declared_specs()
    n = len(specs) if specs is not None else len(fn.param_names())
    outs = fn.signature(list(specs))[0] if specs is not None else None
    if outs is None:
        raise TypeError(f"{call}: the step's inputs must be known without a call; give them annotations "
                        "(or td.function(f, signature=...))")
    if isinstance(per_step, bool) or not isinstance(per_step, (int, np.integer)):
        raise TypeError(f"{call}: per_step must be an integer (how many of the step's last outputs are read at "
                        f"every step), got {per_step!r}")
    if not 0 <= per_step <= len(outs):
        raise ValueError(f"{call}: per_step must be an integer from 0 to the step's {len(outs)} outputs (how many "
                         f"of its last outputs are read at every step), got {per_step!r}")
    m = len(outs) - per_step
    if m > n:
        raise ValueError(f"{call}: the step has {m} outputs but {n} inputs; its outputs are the new values of "
                         f"its first inputs, one per output (and per_step={per_step} outputs read at every step)")
    loop = Scan(fn, length, checkpoints, list(range(m)) + [None] * per_step, name or f"scan({fn.name})",
                each=[False] * m + [True] * per_step)
    if specs is not None:
        loop.signature(specs)
    return loop
