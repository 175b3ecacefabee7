"""``FieldProgram``: value and vjp of a kernel (or kernels) over fields; its tangent program.

See the package docstring (:mod:`tidiff._fields`) for the semantics and limits.
"""
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, NamedTuple, overload

import numpy as np
from taichi.lang import impl
from taichi.lang.field import Field

from .._adjoint.kernels import KernelAdjoint, vjp_kernel
from .._adjoint.transform import NotReversible
from .._arrays import owned_copy, tensor_device, zeros
from .._cache import kernel_compiles
from .._errors import TransformError
from . import checks
from .graph import CodeGraph
from .hidden_rules import refusal_of, reverse_refused_error, rules_reached
from .parts import Part
from .rebind import Rebinder
from .tangent import TangentFields, tangent_program
from .tape import LaunchGuard, Recorder, recording
from .twins import Twins, full_shape, is_real, load, load_all, numpy_dtype, read, read_all, zero_all
from .values import value_of


class FieldSpec(NamedTuple):
    """One input or output of a program over fields: its name, NumPy shape and NumPy dtype (``_signature.ArgSpec``
    of the Function made of it, once the program is a kind)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]


#: What :meth:`FieldProgram.linearize` returns beside the outputs: cotangents -> one gradient per input.
Pullback = Callable[[Iterable[object]], list[np.ndarray | None]]


class FieldProgram:
    """A kernel, or a Python function launching kernels, as a function of some fields.

    Args:
        program: a ``@ti.kernel``, a Python function, a bound method
            (``sim.run``) or a callable object, launching kernels; it takes
            ``takes`` positional parameters (0 for ``td.function``).
        inputs: the fields (or :class:`~.parts.Part`\\ s of fields) the
            program reads as variables (float for a derivative; an integer
            field is a non-differentiable input).
        outputs: the fields (or parts) it writes as results (not overlapping
            the inputs).
        constants: more fields to twin and load as constants, for programs
            that reach them other than by name (the tangent program's
            tangent fields, passed to template kernels at launch).
        state: fields zeroed before each evaluation instead of being loaded
            with their current values (accumulators, intermediate state).
        name: the program's name; ``call`` how messages name the user's call.

    Example:
        >>> x, w = ti.field(ti.f64, shape=4), ti.field(ti.f64, shape=())
        >>> loss = ti.field(ti.f64, shape=())
        >>> @ti.kernel
        ... def energy():
        ...     for i in x:
        ...         loss[None] += w[None] * x[i] ** 2
        >>> prog = FieldProgram(energy, inputs=[x, w], outputs=[loss])
        >>> prog.primal([np.ones(4), np.array(2.0)])
        [array(8.)]
        >>> (value,), (dx, dw) = prog.vjp([np.ones(4), np.array(2.0)], [np.array(1.0)])
        >>> value, dx, dw
        (array(8.), array([4., 4., 4., 4.]), array(4.))
    """

    def __init__(self, program: Any, inputs: Iterable[Field | Part], outputs: Iterable[Field | Part],
                 constants: Iterable[Field] = (), state: Iterable[Field] = (), name: str | None = None,
                 call: str | None = None, takes: int = 0) -> None:
        self.name = name or getattr(program, "__name__", None) or type(program).__name__
        self.call = call or f"td.function({self.name})"
        program = checks.check_program(program, self.call, takes)
        self.inputs, self.outputs, self.state = checks.check_fields(inputs, outputs, self.call, state)
        self.takes = takes
        graph = CodeGraph(program)
        declared: dict[int, Any] = {}
        for p in self.inputs + self.outputs:
            declared.setdefault(id(p.field), p.field)
        reached = dict(graph.fields)
        reached.update((id(f), f) for f in list(constants) + list(self.state))
        self._state_ids = {id(f) for f in self.state}
        self._undeclared = [f for key, f in reached.items() if key not in declared]
        self._twins = Twins(list(declared.values()) + self._undeclared, self.call)
        rebinder = Rebinder(graph, self._twins.as_mapping())
        self._run = rebinder.rebuild(program)
        self._kernels = [rebinder.rebuild(k) for k in graph.kernels()]
        self._reversed = [rebinder.rebuild(k) for k in graph.reversed_kernels()]  # NOTE: [Taichi's reverse mode
        # not run]: the others are ti.ad.grad_replaced functions' primals and gradients
        self._owners = rebinder.owners
        self._guard = LaunchGuard(self._kernels, self.call)
        self._names = graph.names
        self._device: Any = None  # where this call's arrays are: None (NumPy) or the device of tensors in place
        # a field with a part declared gets its other entries from its current values (or zeros)
        self._split: dict[int, Any] = {}
        for p in self.inputs + self.outputs:
            if not p.whole:
                self._split.setdefault(id(p.field), p.field)
        self.in_specs = [self._spec(p) for p in self.inputs]
        self.out_specs = [self._spec(p) for p in self.outputs]
        self._source, self._graph = program, graph
        self._tangent: tuple[FieldProgram, TangentFields] | Exception | None = None
        self._hidden_rules: list[tuple[str, str]] | None = None
        self._not_taken: list[tuple[Any, NotReversible]] | None = None
        self._generation = 0  # how many times the twins were loaded: a pullback checks it is still its run
        self.replay_exact = False  # whether the last replay needed no check (NOTE: [Launches that keep the
        # access rules])
        self._runtime = impl.get_runtime()  # the twins live in it: a new one (ti.init, ti.reset) freed them

    def _spec(self, part: Part) -> FieldSpec:
        return FieldSpec(part.label(self._names.get(id(part.field), "")), part.shape, numpy_dtype(part.field))

    def name_of(self, field: Field) -> str:
        """The name the program uses for ``field`` ("" when it has none)."""
        return self._names.get(id(field), "")

    def twin(self, field: Field) -> Field:
        """The twin of one of the program's fields."""
        return self._twins[field]

    def compiles(self) -> int:
        """How many Taichi kernels (primal and adjoint variants, Taichi's or tidiff's) this program compiled so far."""
        return sum(kernel_compiles(k) for k in self._kernels)

    def primal(self, args: Iterable[object]) -> list[np.ndarray]:
        """The outputs at ``args`` (one array per input), as a list of arrays."""
        args = self._convert_args("primal", args)
        self._prepare(args)
        with recording(self._guard, keep=False):
            self._run()
        return self._read_outputs()

    def not_taken(self) -> list[tuple[Any, NotReversible]]:
        """``(kernel, why)`` for each kernel of the program (and object it runs on) tidiff's reverse transform does
        not take (NOTE: [Taichi's reverse mode not run]): found once."""
        if self._not_taken is None:
            self._not_taken = [(k, reason) for k in self._reversed for owner in self._owners.get(id(k), [None])
                               if isinstance(reason := vjp_kernel(k, owner), NotReversible)]
        return self._not_taken

    def refused(self) -> list[str]:
        """Each kernel :meth:`not_taken` names, and why."""
        return sorted({refusal_of(k.__name__, reason) for k, reason in self.not_taken()})

    def hidden_rules(self) -> list[tuple[str, str]]:
        """The derivative rules the program reaches through the kernels :meth:`refused` names, which Taichi's reverse
        mode could not apply either (named in the refusal; a random number or an atomic's result refuses forward
        pushes too). Found once; the tangent program has its primal program's."""
        if self._hidden_rules is None:  # walked once: the kernels tidiff reverses apply every rule themselves
            taichis = list({id(k): k for k, _ in self.not_taken()}.values())
            self._hidden_rules = rules_reached(CodeGraph(*taichis)) if taichis else []
        return self._hidden_rules

    def check_reverse(self) -> None:
        """Raise ``td.TransformError`` when a kernel of the program is one tidiff's reverse transform does not take
        (:meth:`refused`) or it reaches a struct field (:meth:`refuse_struct_fields`)."""
        self.refuse_struct_fields()
        if self.refused():
            raise reverse_refused_error(f"the field program `{self.name}`", self.refused(), self.hidden_rules())

    def refuse_struct_fields(self) -> None:
        """NOTE: [Struct fields refused] A struct field (``ti.types.struct(pos=vec2, m=f64).field()``) is not
        twinned, so a program writing one from its inputs and reading it into its outputs had its value right and
        a gradient of zeros, without a word (a survey of programs as users write them); forward mode blamed
        itself. Its derivatives are now a ``td.TransformError`` naming the field; its value still runs."""
        if self._graph.struct_fields:
            names = ", ".join(f"`{n}`" if n else "one unnamed" for n in self._graph.struct_fields.values())
            raise TransformError(f"the field program `{self.name}`: it reaches the struct field {names}, which "
                                 "tidiff does not differentiate through",
                                 hint="write one field per member (ti.Vector.field for pos, ti.field for m)")

    def vjp(self, args: Iterable[object],
            cotangents: Iterable[object]) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
        """``(outputs, grads)``: ``grads[i]`` is the cotangents pulled back to input ``i``.

        A ``None`` cotangent is a zero one; an integer input's grad is ``None``.
        """
        self.check_reverse()
        args = self._convert_args("vjp", args)
        cotangents = self._convert("vjp", "cotangents", self.outputs, cotangents, tangent=True)
        self._prepare(args)
        with recording(self._guard) as tape:
            self._run()
        outs = self._read_outputs()
        self.clear_gradients()
        self.seed(cotangents)
        tape.replay_adjoints()
        self.replay_exact = tape.exact
        return outs, self.gradients()

    def linearize(self, args: Iterable[object]) -> tuple[list[np.ndarray], Pullback]:
        """``(outputs, pullback)``: one recorded run; ``pullback(cotangents)`` replays its adjoints.

        The pullback replays the recorded launches over the twins as they
        stand when no other call loaded them since; otherwise it runs the
        program again (``vjp``). It may be called several times.
        """
        self.check_reverse()
        converted = self._convert_args("vjp", args)
        self._prepare(converted)
        generation = self._generation
        with recording(self._guard) as tape:
            self._run()
        outs = self._read_outputs()

        def pullback(cotangents: Iterable[object]) -> list[np.ndarray | None]:
            if self._generation != generation:
                return self.vjp(converted, cotangents)[1]
            cts = self._convert("vjp", "cotangents", self.outputs, cotangents, tangent=True)
            self.clear_gradients()
            self.seed(cts)
            tape.replay_adjoints()
            self.replay_exact = tape.exact
            return self.gradients()

        return outs, pullback

    def tangent(self) -> "FieldProgram":
        """The tangent program ``(x..., dx...) -> (y..., dy...)``, built once (see :mod:`.tangent`).

        ``dx`` is one tangent per float input, ``dy`` one per float output, in
        order. Its ``primal`` is a jvp; its ``vjp`` with cotangent ``e`` on
        ``dy`` gives ``sum_k e_k H_k dx`` (plus ``J^T c`` for cotangent ``c``
        on ``y``) for ``x`` and ``J^T e`` for ``dx``. Raises
        ``td.TransformError`` when a kernel cannot be transformed (and again
        on every later call, without retrying).
        """
        self._check_runtime()
        self.refuse_struct_fields()
        if self._tangent is None:
            try:
                self._tangent = tangent_program(self)
                tangent = self._tangent[0]  # its kernels' code calls the rules' tangent code, not the rules:
                # where Taichi reverses one of them, every rule the program reaches is refused
                taichis = [k for k in tangent._kernels if not isinstance(vjp_kernel(k), KernelAdjoint)]
                tangent._hidden_rules = rules_reached(self._graph) if taichis else []
            except Exception as error:  # noqa: BLE001 -- remembered, re-raised: a retry would allocate again
                self._tangent = error
        if isinstance(self._tangent, Exception):
            raise self._tangent
        return self._tangent[0]

    def close(self) -> None:
        """Free the twin fields; the program cannot be evaluated afterwards.

        Taichi recompiles every kernel of the process after a tree is freed:
        tidiff itself never calls this.
        """
        if isinstance(self._tangent, tuple):
            program, fields = self._tangent
            program.close()
            fields.destroy()
        self._twins.destroy()

    # --- the steps of a call (the time loop drives them one by one) -------------------------
    def _convert_args(self, call: str, args: Iterable[object]) -> list[np.ndarray]:
        return self._convert(call, "args", self.inputs, args)

    # as :func:`.checks.convert`: arguments are arrays, tangents and cotangents may be None
    @overload
    def _convert(self, call: str, role: str, parts: Sequence[Part], values: Iterable[object],
                 tangent: Literal[False] = False) -> list[np.ndarray]: ...

    @overload
    def _convert(self, call: str, role: str, parts: Sequence[Part], values: Iterable[object],
                 tangent: bool) -> list[np.ndarray | None]: ...

    def _convert(self, call: str, role: str, parts: Sequence[Part], values: Iterable[object],
                 tangent: bool = False) -> list[np.ndarray] | list[np.ndarray | None]:
        """One checked array per part (see :func:`.checks.convert`)."""
        values = list(values)
        if len(values) != len(parts):
            raise ValueError(f"{self.call}: expected {len(parts)} {role} (one per field), got {len(values)}")
        return [
            checks.convert(self.call, role, i, self.name_of(p.field), p, v, tangent)
            for i, (p, v) in enumerate(zip(parts, values, strict=False))
        ]

    def _prepare(self, args: Sequence[Any]) -> None:
        """Load inputs and the other fields' current values (zeros for state; the values this call took
        first under a record, NOTE: [Field values of a call] in ``values``), zero the outputs. Tensors on
        Taichi's device are loaded from where they are, and the call's results are made there (NOTE: [Tensors
        in place] in ``_arrays``)."""
        self._check_runtime()
        self._generation += 1
        self._device = device = tensor_device(args)
        loaded = [(self._twins[p.field], array) for p, array in zip(self.inputs, args, strict=False) if p.whole]
        for field in self._split.values():
            whole = zeros(full_shape(field), numpy_dtype(field), device) if id(field) in self._state_ids \
                else owned_copy(value_of(field, device))
            for p, array in zip(self.inputs, args, strict=False):
                if p.field is field:
                    whole[p.index] = array
            for p in self.outputs:
                if p.field is field:
                    whole[p.index] = 0
            loaded.append((self._twins[field], whole))
        zeroed = []
        for field in self._undeclared:
            if id(field) in self._state_ids:
                zeroed.append(self._twins[field])
            elif id(field) not in self._split:
                loaded.append((self._twins[field], value_of(field, device)))
        load_all(loaded)  # one launch each, where from_numpy and fill compile a kernel per field
        zero_all(zeroed + [self._twins[p.field] for p in self.outputs if p.whole])

    def _check_runtime(self) -> None:
        """RuntimeError where ``ti.init`` or ``ti.reset`` replaced the runtime the program's fields (the user's and
        the twins) were made in: using them crashed the process (SIGSEGV)."""
        if impl.get_runtime() is not self._runtime:
            raise RuntimeError(
                f"{self.call}: ti.init or ti.reset ran since this program was made, and freed its fields; make "
                f"the fields and td.function({self.name}, ...) again after ti.init")

    def run(self, *params: object) -> Recorder:
        """Run the rebuilt program on the twins as they are, recording its launches."""
        self._check_runtime()
        self._generation += 1  # the twins change: a pullback of an earlier run runs its program again
        with recording(self._guard) as tape:
            self._run(*params)
        return tape

    def _read_outputs(self) -> list[Any]:
        arrays = read_all([self._twins[p.field] for p in self.outputs], self._device)
        return [p.take(a) for p, a in zip(self.outputs, arrays, strict=True)]

    def clear_gradients(self, keep: Iterable[Field] = ()) -> None:
        """Zero the gradients of every twin (but those of the fields in ``keep``)."""
        kept = {id(self._twins[f]) for f in keep}
        zero_all([twin.grad for twin in self._twins.real() if id(twin) not in kept])

    def seed(self, cotangents: Iterable[np.ndarray | None]) -> None:
        """Load cotangents (``None``: zero) into the outputs' gradients."""
        for p, cotangent in zip(self.outputs, cotangents, strict=False):
            if cotangent is None:
                continue
            grad = self._twins[p.field].grad
            if p.whole:
                load(grad, cotangent)
            else:
                whole = read(grad, self._device)
                whole[p.index] = cotangent
                load(grad, whole)

    def gradients(self) -> list[np.ndarray | None]:
        """The inputs' gradients (``None`` for integer inputs)."""
        real = [p for p in self.inputs if is_real(p.field)]
        arrays = iter(read_all([self._twins[p.field].grad for p in real], self._device))
        return [p.take(next(arrays)) if is_real(p.field) else None for p in self.inputs]


__all__ = ["FieldSpec", "FieldProgram", "Part"]
