"""A ``@ti.kernel`` over global fields -> its adjoint kernel, written by tidiff's reverse transform.

NOTE: [Reverse of a kernel] A kernel's inputs and results are global
fields, so its adjoint reads and writes their gradient fields (``x.grad``)
as a tape replays it: it runs after the kernel, with every field holding
the value the kernel left, and turns the gradients of what the kernel
wrote into gradients of what it read. Each top-level ``for`` loop is one
parallel loop in Taichi; its adjoint is a parallel loop over the same
indices whose body is the loop body reversed by the ``@ti.func`` transform
(:class:`~.transform.Reverser`), with field accesses as ops:

- a read ``t = x[i]`` is recomputed from the field; its adjoint adds the
  cotangent of ``t`` into ``x.grad[i]`` (atomically: ``+=`` on a global);
- a store ``y[i] = e`` is not done again; its adjoint reads ``y.grad[i]`` as
  the cotangent of ``e`` and clears it (the old value no longer matters);
  ``y[i] += e`` and ``ti.atomic_add(y[i], e)`` read it without clearing,
  ``-=`` and ``ti.atomic_sub`` negated;
- runtime loops, ``while``, branches, ``break`` (NOTE: [Break as a flag]), calls
  of ``@ti.func`` s and custom rules are the function transform's (NOTE:
  [Reverse control flow]); a loop
  whose iterations share no local variable is reversed once per iteration;
- a ``@ti.func`` (or a method of the object) that reads fields gets a
  reverse function whose reads add into the gradients (:class:`FieldReverser`);
- ``ti.template()`` parameters indexed as fields use ``p.grad``; a kernel of a
  ``@ti.data_oriented`` class is bound to the object it launches on;
- ``ti.stop_grad(x)`` makes ``x`` a constant in the loop it stands in, as
  Taichi defines it; integer fields carry no derivative and their writes are
  not done again.

So Taichi's global data access rules hold as for ``kernel.grad``: a value
read from a field is the value the kernel left there (the tape tells whether
a run kept them: NOTE: [Launches that keep the access rules]). Top-level
statements outside loops run serially in Taichi and are reversed in place
between the loops' adjoints.

NOTE: [Top-level values in parallel loops] A parallel loop may read a
differentiable local of the kernel's top level (``s = x[0] * 2`` before
``for i in y: y[i] = s * x[i]``): Taichi keeps it in a global temporary the
loop reads. The adjoint computes it again at its top level, as the kernel
did; its cotangent is the sum of every iteration's, so the adjoint starts a
sum ``ct_s_sum = ti.zero(s)`` before the loop's adjoint, each iteration adds
into it with ``+=`` (on a top-level local inside a parallel loop, Taichi
makes that an atomic add: its reduction idiom), and after the loop the sum
joins the cotangent of ``s`` in the top-level sweep.

NOTE: [Reductions into top-level locals] A parallel loop may sum into a
top-level local (``total = 0.0``, ``for i in x: total += e``, then ``loss[None]
= total ** 2``): Taichi's reduction idiom, an atomic add. The adjoint's top
level computes the sum again where the kernel did, with a loop of the same
iterations recomputing each ``e`` and adding it (its forward statements,
fields read as the kernel left them), so later top-level code reads the sum's
value. In the reverse loop ``e``'s cotangent is the sum's (negated for
``-=``), read where the top-level sweep left it; the sum's value before the
loop gets the same (an integer count has none). Taken where the loop
writes the local only by ``+=`` / ``-=`` and reads it nowhere else.

NOTE: [Atomic extremes in reverse] ``ti.atomic_max(y[i], e)`` leaves in
``y[i]`` the largest of its old value and every iteration's ``e``; the
derivative goes to the winner, and a tie splits it evenly, as ``max`` does
(NOTE: [Ties]). The adjoint reads ``y`` as the kernel left it (recorded as
a read, so a later write is caught: NOTE: [Launches that keep the access
rules]) in three loops: a counting loop recomputes each iteration's ``e``
and counts, per entry, the iterations where ``e`` equals ``y[i]`` (in the
field's type, as the atomic compared them; the counts are zeroed first;
the reverse loop compares the bits the counting loop kept: NOTE: [Winners
by kept values]);
the reverse loop gives each of those ``y.grad[i] / count``; then, where an
iteration won, the old value lost, so ``y.grad[i]`` becomes 0. Where none won
the old value did and keeps ``y.grad[i]``. The old value is gone when the
adjoint runs, so a tie between it and an iteration goes to the iteration
(a field filled with ``-inf`` or a bound first never ties). Taichi's own
``kernel.grad`` gives every iteration the whole gradient. ``atomic_min`` is
the same. Taken on scalar global fields inside parallel loops, the atomic's
result unused, the field written by nothing else in the kernel from that
loop on (statements and loops before it set the old value, ``peak[None] =
-1e30``: their adjoints, after the atomic's, take what the old value kept)
and read by nothing else in that loop (its iterations race the atomic;
later loops read what won). Forward mode: NOTE: [Atomic extremes forward].

A ``@ti.func`` that writes fields, or is given one, is written out in the
kernel first (NOTE: [Funcs that write fields, inlined]); so is a method of
an object that does. A kernel's final ``return e`` is left out: the number
reaches the program without a derivative. ``x[i] *= e`` is ``x[i] = x[i] * e``
(the recorder keeps the entry it overwrites). An index computed from floats
(``w[int(x[i] * n)]``) carries no derivative, as in Taichi: the adjoint
computes it again. ``ti.loop_config(...)`` goes before the adjoint's loops
too; ``assert`` and ``print`` do not run again. A kernel the transform does
not take (a loop assigning a top-level local other than by ``+=`` / ``-=``, a loop whose iterations read
what another wrote, ...: docs/limits.md) has no adjoint here:
:func:`vjp_kernel` says why, and the tape replays Taichi's ``kernel.grad``
for it, checked.

NOTE: [Writes into components] ``v[i][0] = e``, ``m[i][0, 1] = e``,
``v[i].x = e`` (and ``+=``, ``-=``, ``ti.atomic_add`` into them) write one
component of a vector or matrix field's entry. Their adjoint is a store's,
at that component of the gradient: ``v.grad[i][0]`` is ``e``'s cotangent,
and a "set" clears only it (the entry's other components keep theirs).
``v[i][0] *= e`` is ``v[i][0] = v[i][0] * e``. The launch is recorded as
writing the entry (NOTE: [Launches that keep the access rules]): the
recorder keeps the whole entry where it keeps any.

NOTE: [Reads of what the iteration wrote] The adjoint reads fields as the
kernel left them, so ``z[i] = 0.5; z[i] *= x[i]`` read back ``0.5 * x[i]``
where the kernel read 0.5, and the access log, keeping one access of each
kind per field and index, dropped the second write as a repeat and called
the launch exact: a wrong gradient without a word. Now a read of an entry
(or a component) that the same iteration stored, by "set", at the same
index, in the same block or one inside it, is the stored value itself, in
the adjoint's forward sweep and for the cotangent (which goes to the stored
value, not to the field's gradient); the log keeps every access unlike the
one before it on its field, so a store after a read is seen. Stored values
are forgotten at any other write of the field (entries may alias), around
each loop that writes the field (a later iteration may read another value),
after each branch that writes it (the code after it may read another value;
its test and sides read what was stored before it), and at the parallel
loop's ends;
float32 fields are read back (the stored value is rounded). A sum into
such an entry (``y[i] = b; y[i] += e``, ``-=``) stores the sum: a later
read (``y[i] = ti.tanh(y[i])``) sees ``b + e``, where it read the field,
the ``tanh``, and the first vjp was checked, found wrong and replaced by
forward pushes (a survey of kernels as users write them, 2026-11-30). An
entry set and then updated in a branch or a runtime loop, or summed into
and then read, is first written as a local of the iteration, or as a read
and a store (``_adjoint/entry_locals.py``). Other reads of one's own writes
read the field and are checked (NOTE: [Checking Taichi's reverse mode]).

NOTE: [Fields read by tests] A branch's test, and a loop's bounds, carry
no derivative and were copied into the adjoint as written: their reads of
fields read what the kernel left and were recorded nowhere. A ground
contact, ``x[i] += d[i]``, then ``if x[i] < 0.0: x[i] = 0.0``, tested
the clamped 0 again in the adjoint, took the other side, and the launch
was called exact: a wrong gradient without a word (a survey of kernels as
users write them). Such reads are now what any read is: the value the
iteration stored there, where it did (not in a ``while`` test, computed
again each pass), else a read of the field, recorded, so a later write of
the entry is seen (and the launch checked). The sum itself is made a
stored value (NOTE: [Sums into an owned entry, then read]).

NOTE: [Values the adjoint uses] The adjoint computes again what the kernel
computed, but uses only some of it: ``v[i] = v[i] + ti.sin(x[i]) * dt``
needs ``x[i]`` (its derivative is ``cos(x[i])``) and not ``v[i]`` (it enters
linearly). A field read whose value the adjoint does not use needs no entry
kept and no check of its launch (NOTE: [Launches that keep the access
rules]): the launch's accesses are only the loads whose variable the
adjoint uses (read by a statement with an effect, or by an assignment of
a variable it uses: one pass and a closure; Taichi drops the rest when it
compiles), with every store and every read without a variable (an
index's, a func's). So a
symplectic Euler step in one kernel (``v`` updated in place from ``x``,
then ``x`` from the new ``v``) keeps the ``x`` it overwrote and is exact,
where its loads of ``v`` (read, written, read again) made it checked and its
gradients forward pushes, one per input.

NOTE: [Gradients cleared by the program] DiffTaichi's programs clear
gradients in their forward kernels (``clear_grid`` sets ``grid_v_in[i, j]``
and ``grid_v_in.grad[i, j]`` to zero each step, for the tape's next pass).
tidiff runs the program on its own copies of the fields and zeroes every
gradient after the run, before the adjoints run, so such a write has no
effect on a derivative: the adjoint leaves it out (the kernel's other
writes are reversed as any), where Taichi's ``kernel.grad`` reversed the
kernel and left the program's accesses unknown (checked, then forward
pushes). A differentiable value written into a gradient is not taken.

NOTE: [Func reads at their indices] A ``@ti.func`` reading fields reads
them at indices made of its parameters (``wave_at(t, i, j)`` reads
``p[t, i, j]``); the launch's accesses give them in the caller's terms, the
call's arguments put for the parameters, through funcs it calls in turn
(``laplacian(t - 2, i, j)`` reads ``p[t - 2, i, j - 1]`` and four more), so
a launch of DiffTaichi's wave step, reading ``p[t - 1]`` and ``p[t - 2]``
through funcs and writing ``p[t]``, is known to read none of what it
writes: exact with no check (it was checked against forward mode on its
first call), and a later launch writing ``x[t]`` copies that entry, not the
field. An index made of the func's own locals, a parameter it assigns, or a
call with keywords is any entry.

NOTE: [Serialized kernels as one iteration] A kernel whose every loop runs
in order (``ti.loop_config(serialize=True)`` before each) is sequential code:
``h = a * h + x[i]; y[i] = h`` carries ``h`` from one iteration to the next,
``y[i] = a * y[i - 1] + x[i]`` reads what the iteration before wrote. Taken
as parallel loops, neither is reversed (a top-level variable assigned in a
loop, a serialized loop reading a field it writes: Taichi's reverse mode
refuses the kernel too). Where the kernel is not taken as written, it is taken
as the body of a parallel loop of one iteration, its loops then runtime
loops, reversed as a func's are (NOTE: [Reverse control flow]): each
iteration recomputed from the loop's start where the adjoint reads a carried
value (``n * n / 2`` runs of the body: 155 ms for 5,000 steps, 2.6 s for
20,000), the fields they write read as the loop left them under the run-time
check of such loops (NOTE: [Launches that keep the access rules]). So is a
kernel whose serialized loop stands beside parallel ones (a projection
``u[t] = w * x[t]``, then a serialized scan ``h[t] = a * h[t - 1] + u[t]``:
an ndarray kernel, which no loop-by-loop split runs, was checked, found
wrong and pushed forward; a survey of kernels as users write them): a
parallel loop's iterations are independent, so run in order they give the
values the kernel gave, and its adjoint runs on one thread (the kernel itself
still runs as written). A parallel loop over an array's indices (``for i, j
in x``) or over ``ti.ndrange`` is written as nested loops over ranges there,
which Taichi takes inside another loop (a copy, then a cumulative sum down
the rows in place, was refused and reversed by Taichi's ``kernel.grad``,
wrongly).

NOTE: [Arrays given to a kernel over fields] A kernel of a field program
may take a NumPy array or a tensor (``weighted(weights)``, the weights of a
loss). Neither is an input of the program: the array is a constant of it,
read as it is at each launch, in reverse mode (its reads are constants of
the adjoint, which takes the same array) and in forward mode (no tangent
beside it). The adjoint does not take a kernel writing into such an array
(a copy out, ``out[i] = y[i]``) and reading it: Taichi's ``kernel.grad``
reverses that, checked. A copy out the kernel does not read is left out of
the adjoint, as forward mode gives it no tangent and Taichi's reverse mode
no gradient (an array is no input or output of the program). Before, the
replay left out every launch given an external array, as it leaves out
Taichi's ``to_numpy``: the gradient through such a kernel was 0, without a
word.

NOTE: [Reverse of an ndarray kernel] A kernel over ``ti.types.ndarray()``
parameters (``td.function(k, inputs=[...], outputs={...})``) is reversed by
the same transform, each ndarray parameter taken as a ``ti.template()``
field is: a float input or output reads and adds into ``a.grad[i]``, the
gradient Taichi passes beside a tensor that requires grad (NOTE: [Gradient
aliases] in ``_kinds/ndarray.py``); an integer array, or an input frozen by
``needs_grad=False``, is a constant, its writes left out. Element types
come from the call (``vjp_ndarray_kernel(kernel, arrays)``, one adjoint
per pattern), so a float32 array's cotangent is cast to float32 as it is
added. Global fields the kernel reads are constants of its function, as
they are in its forward mode, in the kernel and in the funcs it calls
(their reverse functions are the function transform's, reading fields as
constants; a method of an object reading float fields is not taken).
The adjoint needs no values of the outputs where the kernel never reads
them, and the kernel writes none of its inputs (``td.function`` refuses
it): then it is exact, with no run-time check. A read of what the same
iteration stored is the stored value (NOTE: [Reads of what the iteration
wrote]) and needs none either. Any other read of an output gets it as the
kernel left it (the kernel runs first), which is right where no write after
the read in the kernel's code can change it (and the read is in no runtime
loop of its parallel loop): exact too. Where a later write may change it,
the kernel is reversed written with versions (NOTE: [Arrays kept by
version] in ``versions.py``), or, where it cannot be so written, its vjp is
checked against forward mode (NOTE: [Checking Taichi's reverse mode]). Atomic max /
min into a scalar output array is taken as into a field (NOTE: [Atomic
extremes in reverse]): the kernel runs first, and the adjoint reads what
won, which is exact (no check) where nothing else reads an output.

What it counts and keeps are arrays each launch allocates (NOTE: [Scratch
arrays] in ``_lang/scratch.py``).
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import itertools
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import taichi as ti
from taichi.lang import impl
from taichi.lang.field import Field, ScalarField
from taichi.types.annotations import Template
from taichi.types.ndarray_type import NdarrayType

from .._cache import ADJOINT
from .._lang import extremes
from .._lang.activity import assigned_names, integer_locals, root_names, stop_grad_arguments, stores, written_names
from .._lang.atomic_results import used_atomic_result
from .._lang.callees import transformable
from .._lang.compile import compile_source, mark
from .._lang.dead_branches import without_dead_branches
from .._lang.generate import generate, owned_cache
from .._lang.inline import DEEPEST, Renamed, inlined
from .._lang.naming import RULE_HELPERS, TAICHI, spell_taichi
from .._lang.nodes import entry_root, for_range, name, zero_of
from .._lang.objects import Unbound, bind, fields_of, is_float_field, is_method_func, method_parts, parsed_for
from .._lang.parse import MISSING, Parsed, annotation_value, hashable, parse, resolve, without_docstring
from .._lang.scratch import Scratch, holds_scalars
from .._lang.serial import FasterForm, configures, launches, serial_form, serializes
from .._lang.sym import Sym
from .._rules import helpers as rule_helpers
from . import _made, chunks, owned, read_back
from .accesses import Access, KernelAccesses
from .control import Block, Branch, Loop, Op, Store, has_effects, uses, value_reads
from .entry_locals import entries_as_locals
from .transform import NotReversible, Reverser

#: NOTE: [Constant ranges in kernels] The function transform writes out every constant range; in a kernel a
#: ``for j in range(n)`` inside a parallel loop is a runtime loop, as Taichi runs it, and the adjoint's is too
#: unless what is written out stays small: at most MOST_UNROLLED iterations of a body without loops, UNROLLED_SIZE
#: AST nodes in all (a call counts CALL_SIZE: Taichi inlines it). Written out regardless (16 by 16 cells of
#: DiffTaichi's wave.py, with a func reading five neighbours each), the adjoint took 148 s to compile where
#: Taichi's took 0.5 s. A loop whose counter picks a component of a field's entry (``v[i][k]``) is written out
#: whatever its size: Taichi indexes those by constants only.
MOST_UNROLLED = 16
UNROLLED_SIZE = 600
CALL_SIZE = 60

_ATOMICS = {"atomic_add": "add", "atomic_sub": "sub"}
_EXTREMES = {"atomic_max": "max", "atomic_min": "min"}
_INTEGER_ATOMICS = [getattr(ti, f"atomic_{op}") for op in ("add", "sub", "min", "max", "and", "or", "xor")]


class KernelAdjoint:
    """tidiff's adjoint of one kernel: ``kernel`` takes the kernel's arguments (NOTE: [Reverse of a kernel]).

    ``fields_at`` are the positions of ``ti.template()`` parameters taken for
    fields: the adjoint runs only where a launch passed float fields with
    gradients there (:meth:`takes`). ``accesses`` are the kernel's field reads
    and writes in code order, ``params`` its parameter names (NOTE: [Launches
    that keep the access rules]).
    """

    def __init__(self, kernel: Any, fields_at: list[int], accesses: list[Access], params: list[str],
                 bound: bool = False, scratch: Sequence[Scratch] = (), numbers_at: Sequence[int] = (),
                 serial: Any = None) -> None:
        self.kernel, self.fields_at, self.params = kernel, fields_at, params
        self.numbers_at = list(numbers_at)  # ti.template() parameters the kernel uses as numbers
        self.scratch = list(scratch)  # an ndarray kernel's adjoint's arrays after its parameters: NOTE: [Scratch
        # arrays]
        self.accesses = KernelAccesses(accesses, params)
        self.bound = bound  # a class kernel's: Taichi launches it with the object first
        self.serial = serial  # the same kernel, its loops serialized (NOTE: [Small loops run serially])
        # NOTE: [Number launches]: a replay launches it with numbers only
        self.launch: Callable[..., Any] = launches(kernel, serial)
        self.chunked: KernelAdjoint | None = None  # the same adjoint, its loops by chunk (NOTE: [Accumulations by
        # chunk]), and how a launch splits them
        self.chunkings: list[chunks.Chunking] = []
        self.read_back: KernelAdjoint | None = None  # the same adjoint reading back what the kernel stored into
        # the outputs ``reads_back`` names (NOTE: [Outputs read back])
        self.reads_back: list[str] = []

    def for_launch(self, arrays: dict[str, Any]) -> KernelAdjoint:
        """The form of this adjoint a launch with ``arrays`` (by parameter name) runs: by chunk on the CPU where
        every chunked loop is worth it there (NOTE: [Accumulations by chunk])."""
        if self.chunked is None or impl.current_cfg().arch not in (ti.x64, ti.arm64):
            return self
        return self.chunked if all(c.count(arrays) for c in self.chunkings) else self

    def arguments(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The adjoint's arguments for a launch of the kernel with ``args`` (a class kernel's without ``self``)."""
        return args[1:] if self.bound else args

    def takes(self, args: tuple[Any, ...]) -> bool:
        """Whether the arguments of a launch are ones the adjoint was written for."""
        args = self.arguments(args)
        return all(is_float_field(args[k]) and args[k].grad is not None for k in self.fields_at) \
            and all(isinstance(args[k], numbers.Number) for k in self.numbers_at)

    def compiles(self) -> int:
        if isinstance(self.launch, FasterForm):  # both forms (NOTE: [Small loops run serially])
            return self.launch.compiled()
        return len(self.kernel._primal.compiled_kernels)


class ParallelLoop:
    """A top-level ``for`` loop of a kernel: its header, its body transformed as a block, and the tie counts
    of its ``ti.atomic_max`` / ``min`` (``(counting field, target field)``)."""

    def __init__(self, node: ast.For, body: Block, ties: list[tuple[str, str]], config: ast.stmt | None = None,
                 outer: Sequence[str] = (), sums: set[str] | None = None) -> None:
        self.node, self.body, self.ties = node, body, ties
        self.sums = sums or set()  # the top-level locals it sums into (NOTE: [Reductions into top-level locals])
        self.config = config  # the ``ti.loop_config(...)`` statement before the loop: its adjoint loops run so too
        self.outer = list(outer)  # differentiable locals of the kernel's top level the body reads (NOTE: [Top-level
        # values in parallel loops])


def vjp_kernel(kernel: Any, owner: object = None, constants: frozenset[str] = frozenset()
               ) -> KernelAdjoint | NotReversible:
    """The adjoint of a ``@ti.kernel`` over fields (NOTE: [Reverse of a kernel]), or the NotReversible
    saying why the transform does not take it. Made once per kernel (and object, for a kernel of a
    ``@ti.data_oriented`` class: ``owner``, the object it is launched on) and set of ``constants``: the
    ``ti.template()`` parameters a launch gives integer fields, or fields without gradients, which the
    adjoint takes as it takes integer fields (``clear(count)`` beside ``clear(y)``).

    The adjoint takes the kernel's parameters (without ``self``); it reads
    the fields and the gradients of the float fields the kernel reaches
    (``field.grad``, which must exist) and writes only gradients.
    """
    cache = owned_cache(kernel, ADJOINT)
    key = (id(owner), constants) if constants else id(owner)
    if key not in cache:
        try:
            cache[key] = _generate(kernel, owner, constants=constants)
        except NotReversible as reason:
            cache[key] = reason
    return cache[key]


def vjp_ndarray_kernel(kernel: Any, arrays: dict[str, Any],
                       zeroed: Sequence[str] = ()) -> KernelAdjoint | NotReversible:
    """The adjoint of a ``@ti.kernel`` over ndarray parameters (NOTE: [Reverse of an ndarray kernel]), or the
    NotReversible saying why the transform does not take it. ``arrays`` gives each ndarray parameter's element
    type where it carries a derivative (a float input or output: ``ti.f64``, ``ti.f32``), None where it does
    not (integer arrays, frozen inputs); ``zeroed``: the arrays holding zeros whenever the kernel starts (the
    outputs tidiff allocates); made once per kernel and pattern."""
    cache = owned_cache(kernel, ADJOINT)
    key = ("ndarray", tuple(sorted((p, str(t)) for p, t in arrays.items())), tuple(sorted(zeroed)))
    if key not in cache:
        try:
            cache[key] = _generate(kernel, None, arrays, {n: arrays.get(n) for n in zeroed})
        except NotReversible as reason:
            cache[key] = reason
    return cache[key]


def in_one_iteration(tree: ast.FunctionDef, namespace: dict[str, Any]) -> ast.FunctionDef | None:
    """A kernel with a serialized loop, its statements as the body of a parallel loop of one iteration, its
    loops runtime loops (NOTE: [Serialized kernels as one iteration]); None for any other kernel."""
    body = without_docstring(tree.body)
    last = body[-1:] if body and isinstance(body[-1], ast.Return) else []
    body = body[:len(body) - len(last)]

    loops = [k for k, stmt in enumerate(body) if isinstance(stmt, ast.For)]
    if not any(k > 0 and serializes(body[k - 1], namespace) for k in loops):
        return None
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    counter = next(f"_once{k}" for k in itertools.count() if f"_once{k}" not in names)
    arrays = {a.arg for a in tree.args.args if isinstance(annotation_value(a.annotation, namespace), NdarrayType)}
    once = ast.For(ast.Name(counter, ast.Store()), ast.Call(ast.Name("range", ast.Load()), [ast.Constant(1)], []),
                   [_as_ranges(stmt, arrays, namespace) for stmt in body if not configures(stmt, namespace)], [])
    wrapped = copy.copy(tree)
    wrapped.body = [once, *last]
    return ast.fix_missing_locations(copy.deepcopy(wrapped))


def _as_ranges(stmt: ast.stmt, arrays: set[str], namespace: dict[str, Any]) -> ast.stmt:
    """A loop over an ndarray's indices (``for i, j in x``) or over ``ti.ndrange(n, m)``, which a loop inside
    another cannot be in Taichi, as nested loops over ranges (NOTE: [Serialized kernels as one iteration]); any
    other statement as it is."""
    if not (isinstance(stmt, ast.For) and not stmt.orelse):
        return stmt
    counters = stmt.target.elts if isinstance(stmt.target, ast.Tuple) else [stmt.target]
    if not all(isinstance(c, ast.Name) for c in counters):
        return stmt
    over = stmt.iter
    if isinstance(over, ast.Name) and over.id in arrays:
        extents: list[list[ast.expr]] = [[ast.Subscript(ast.Attribute(ast.Name(over.id, ast.Load()), "shape",
                                                                      ast.Load()), ast.Constant(k), ast.Load())]
                                         for k in range(len(counters))]
    elif isinstance(over, ast.Call) and not over.keywords and resolve(over.func, namespace) is ti.ndrange \
            and len(over.args) == len(counters) and not any(isinstance(a, ast.Starred) for a in over.args):
        extents = [list(a.elts) if isinstance(a, ast.Tuple) else [a] for a in over.args]
    else:
        return stmt
    body = stmt.body
    for counter, bounds in reversed(list(zip(counters, extents, strict=True))):
        assert isinstance(counter, ast.Name)
        body = [for_range(counter.id, bounds, body)]
    return ast.copy_location(body[0], stmt)


def _field_made(f: Any, active: Sequence[bool], n_outputs: int) -> Any:
    """The reverse function of a callee (or the NotReversible saying why there is none): with field accesses
    where it reaches fields (made once, kept on ``f``), else the function transform's."""
    fn, owner = method_parts(f)  # a func of an object (self.shape): its reverse function is made for it
    if owner is None and not _touches_fields(f):
        return _made(f, active, n_outputs)
    cache = owned_cache(fn, "_tidiff_field_vjps")
    key = (tuple(bool(a) for a in active), n_outputs, id(owner))
    if key not in cache:
        try:
            make = lambda parsed, act: FieldReverser(bind(parsed, owner), act, n_outputs)  # noqa: E731
            cache[key] = generate(fn, key[0], make, tag="vjp", namespace={RULE_HELPERS: rule_helpers})
        except NotReversible as reason:
            cache[key] = reason
    return cache[key]


def _generate(kernel: Any, owner: object, arrays: dict[str, Any] | None = None,
              zeroed: dict[str, Any] | None = None, constants: frozenset[str] = frozenset()) -> KernelAdjoint:
    bound = getattr(kernel, "_is_classkernel", False)
    if bound and owner is None:
        raise NotReversible("a kernel of a @ti.data_oriented class, without the object it runs on")
    # attribute chains named (NOTE: [Fields through objects]), then funcs writing fields written out (NOTE: [Funcs
    # that write fields, inlined])
    parsed = inlined(bind(parse(Unbound(kernel)), owner) if bound else bind(parse(kernel), None))
    if _draws_random(parsed):  # NOTE: [Random numbers in reverse]
        raise NotReversible("a call of `ti.random` or `ti.randn` (an adjoint computes the kernel's values again, "
                            "and would draw other numbers)")
    if (atomic := used_atomic_result(parsed.tree, lambda node: resolve(node, parsed.namespace))) is not None:
        raise NotReversible(f"the value `{ast.unparse(atomic)}` returns (NOTE: [Atomic results])")
    parsed = entries_as_locals(parsed, _touches_fields, zeroed)  # NOTE: [Entries updated in a loop, as locals]
    pristine = copy.deepcopy(parsed.tree)
    try:
        reverser = KernelReverser(parsed, kernel, bound, arrays, constants)
        tree = reverser.run()
    except NotReversible as reason:  # NOTE: [Serialized kernels as one iteration]
        once = in_one_iteration(pristine, parsed.namespace)
        if once is None:
            raise
        try:
            in_order = entries_as_locals(dataclasses.replace(parsed, tree=once), _touches_fields, zeroed)
            reverser = KernelReverser(in_order, kernel, bound, arrays, constants)
            tree = reverser.run()
        except NotReversible:
            raise reason from None
    scope = {**parsed.namespace, **reverser.helpers, RULE_HELPERS: rule_helpers, reverser.taichi_name: ti}
    params = [a.arg for a in parsed.tree.args.args]
    used = used_names(tree, reverser.taichi_name)  # NOTE: [Values the adjoint uses]
    won = {id(a) for a in reverser.extremes if a.kind == "load"}  # what won, read as the kernel left it: after
    # every access of the kernel, where its place in the code would put it between an atomic's writes
    accesses = [a for a in reverser.accesses if id(a) not in won and (a.value is None or a.value.id in used)]
    accesses += [a for a in reverser.accesses if id(a) in won]
    fields_at, numbers_at = [params.index(p) for p in reverser.template_fields], [params.index(
        p) for p in reverser.number_templates]

    def made(tree: ast.FunctionDef, chunked: ast.FunctionDef | None) -> KernelAdjoint:
        serial = serial_form(tree, reverser.taichi_name, scope) if arrays is None else None  # NOTE: [Small loops run
        # serially]
        adjoint = KernelAdjoint(_compiled(tree, scope, reverser), fields_at, accesses, params, bound, reverser.scratch,
                                numbers_at, None if serial is None else _compiled(serial, scope, reverser))
        if chunked is not None:  # NOTE: [Accumulations by chunk]
            adjoint.chunked = KernelAdjoint(_compiled(chunked, scope, reverser), fields_at, accesses, params, bound,
                                            reverser.chunked_scratch(), numbers_at)
            adjoint.chunkings = [chunking for _, _, chunking in reverser.chunk_forms.values()]
        return adjoint

    adjoint = made(tree, reverser.chunked)
    taken = reverser.readable()  # NOTE: [Outputs read back]
    back = read_back.read_back(tree, taken) if taken else None
    if back is not None:
        chunked = None if reverser.chunked is None else read_back.read_back(reverser.chunked, taken)
        adjoint.read_back = made(back[0], None if chunked is None else chunked[0])
        adjoint.reads_back = back[1]
    return adjoint


def _compiled(tree: ast.FunctionDef, scope: dict[str, Any], reverser: KernelReverser) -> Any:
    adjoint = compile_source(tree, tree.name, dict(scope), tag="adjoint-kernel")
    mark(adjoint, reverse=True, uses_bwd=reverser.uses_bwd, recomputes=reverser.recomputes)
    return adjoint


def used_names(tree: ast.FunctionDef, taichi_name: str) -> set[str]:
    """The variables whose values the adjoint ``tree`` uses (NOTE: [Values the adjoint uses]): those read by a
    statement with an effect (a gradient's update, a branch's test, a loop's range, a call of a func), and,
    through assignments of values made with Taichi's functions and the rule helpers only, what those read.
    ``taichi_name``: what the code calls the Taichi module."""
    modules = {taichi_name, RULE_HELPERS}
    made_of: dict[str, set[str]] = {}  # a variable -> what the values assigned to it read
    read: set[str] = set()  # what the statements with effects read

    def pure(value: ast.expr) -> bool:  # no call of a func (a reverse function adding into gradients), no atomic
        return all(isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                   and n.func.value.id in modules and not n.func.attr.startswith("atomic")
                   for n in ast.walk(value) if isinstance(n, ast.Call))

    def visit(stmts: list[ast.stmt]) -> None:
        for stmt in stmts:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                    and pure(stmt.value):
                made_of.setdefault(stmt.targets[0].id, set()).update(value_reads(stmt.value))
            elif isinstance(stmt, (ast.For, ast.While, ast.If)):
                read.update(value_reads(stmt.iter if isinstance(stmt, ast.For) else stmt.test))
                visit(stmt.body)
                visit(stmt.orelse)
            elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                read.update(value_reads(stmt.value), {stmt.target.id})
            else:
                read.update(value_reads(stmt))

    visit(tree.body)
    used, todo = set(), list(read)
    while todo:
        variable = todo.pop()
        if variable not in used:
            used.add(variable)
            todo.extend(made_of.get(variable, ()))
    return used


class FieldReverser(Reverser):
    """The reverse transform with field reads and writes as ops (NOTE: [Reverse of a kernel]): the reverse
    function of a ``@ti.func`` that reads fields (its reads' adjoints add into their gradients), and the base
    of a kernel's. A func that writes fields is not taken: its forward sweep, run again in the caller's
    adjoint, would write them again."""

    stores = False  # whether field writes are taken (a kernel's are; a func's are not)
    arrays: dict[str, Any] | None = None  # an ndarray kernel's arrays: element type where differentiable, or None
    array_params: frozenset[str] = frozenset()  # the names of those arrays (parameters, so locals of the code)
    depth = 0  # how deep in a kernel's loops the statement being transformed stands (a func's: 0)
    parallel_loop: ast.For | None = None  # the kernel's parallel loop being transformed
    repeated = 0  # how many runtime loops (not the parallel one) stand around it
    reductions: dict[str, str] = {}  # in a parallel loop: top-level locals it sums into -> their SSA names
    config: ast.Expr | None = None  # a kernel's ``ti.loop_config(...)`` waiting for its parallel loop

    def __init__(self, parsed: Parsed, active: Sequence[bool], n_outputs: int) -> None:
        super().__init__(parsed, active, n_outputs, _field_made if self.arrays is None else _made)
        self.template_fields: list[str] = []
        self.ties: list[tuple[str, str]] = []  # a kernel's parallel loop's (tie counts, field) of atomic max / min
        self.kept_made: set[str] = set()  # the fields keeping atomics' values (NOTE: [Winners by kept values])
        self.extremes: list[Access] = []  # the accesses of atomic max / min
        self.ties_made: list[tuple[str, str]] = []  # (tie counts, field) of every parallel loop
        self.extremes_from: dict[str, int] = {}  # a field atomic max / min write -> where in ``accesses`` the
        # first parallel loop holding one starts
        self.forwarded: dict[tuple[str, str], ast.expr] = {}  # NOTE: [Reads of what the iteration wrote]
        self.scratch: list[Scratch] = []  # NOTE: [Scratch arrays]
        self.external_written: set[str] = set()  # arrays a kernel over fields writes (a copy out), the writes
        # left out (NOTE: [Arrays given to a kernel over fields])
        self.find_fields()

    def find_fields(self) -> None:
        """The global fields the code names: float ones get their gradient field's name, integer ones are
        constants."""
        self.gradients: dict[str, ast.expr] = {}  # a float field's name -> its gradient field (a global's by a
        # name of its own, a template parameter's as ``p.grad``)
        self.constant_fields: set[str] = set()
        self.accesses: list[Access] = []  # field reads and writes, in the order of the code
        self.stopped: set[str] = set()  # fields under ti.stop_grad in the loop being transformed: constants
        self.narrow: dict[str, bool] = {}  # a global float field's name -> whether it is narrower than float64
        # (a template parameter's type is known only at launch: cast as if it were)
        self.touching: dict[int, bool] = {}
        self.types: dict[str, ast.expr] = {}  # a float array's element type, where a gradient's is not at hand
        self.containers: dict[str, Any] = {}  # a name of a list, tuple or dict of fields -> it
        self.entries_named: dict[int, str] = {}  # a field reached as an entry of one -> the adjoint's name for it
        local = {n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for identifier in sorted({n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name)} - local):
            obj = resolve(ast.Name(identifier, ast.Load()), self.parsed.namespace)
            if isinstance(obj, Field):
                self.take_field(identifier, obj)
            elif self.arrays is None and isinstance(obj, (list, tuple, dict)) and fields_of(obj):
                self.containers[identifier] = obj  # ``xs[k][i]``, ``k`` a constant: the field by its entry
            elif fields_of(obj):
                raise NotReversible(f"the fields reached through `{identifier}`")

    def take_field(self, identifier: str, obj: Field) -> None:
        """A global field named ``identifier``: a float one gets its gradient field's name, an integer one (or
        any in an ndarray kernel, whose fields are constants of its function) is a constant."""
        if self.arrays is not None or not is_float_field(obj):
            self.constant_fields.add(identifier)
            return
        if obj.grad is None:
            raise NotReversible(f"the float field `{identifier}` without a gradient field")
        gradient = self.namer.fresh(identifier + "_grad")
        self.helpers[gradient] = obj.grad
        self.gradients[identifier] = name(gradient)
        self.narrow[identifier] = obj.dtype != ti.f64

    def entry_field(self, node: ast.Subscript) -> str | None:
        """``xs[k]`` of a list (or tuple) of fields at a constant ``k`` (a static loop's counter): a name of the
        adjoint's own for that field (taken as a field by name), or None where ``node`` is no such entry."""
        if not (isinstance(node.value, ast.Name) and node.value.id in self.containers and node.value.id not in
                self.env):
            return None
        key = self._static(node.slice)  # constants, static loops' counters: as Taichi evaluates it
        container = self.containers[node.value.id]
        try:
            field = container[key]
        except (KeyError, IndexError, TypeError):
            raise NotReversible(f"the field `{ast.unparse(node)}`, at an index not known when the kernel is "
                                "transformed") from None
        if id(field) not in self.entries_named:
            entry = self.namer.fresh(f"{node.value.id}_entry")
            self.helpers[entry] = field
            self.take_field(entry, field)
            self.entries_named[id(field)] = entry
        return self.entries_named[id(field)]

    def field_name(self, node: ast.expr) -> str | None:
        """The global name of a float field with a gradient that ``node`` names (``xs[k]`` of a list of fields:
        the adjoint's name for it), else None."""
        if isinstance(node, ast.Subscript):
            entry = self.entry_field(node)
            return entry if entry is not None and entry in self.gradients else None
        if isinstance(node, ast.Name) and node.id in self.gradients and node.id not in self.stopped and \
                (node.id not in self.env or node.id in self.template_fields):
            return node.id
        return None

    def reads_active(self, node: ast.expr) -> bool:
        """Whether ``node`` reads a differentiable local, a float field, or calls a func that reaches fields or is
        given one (whose call the transform then refuses)."""
        for n in ast.walk(node):
            if isinstance(n, ast.Subscript) and self.field_name(n.value) is not None:
                return True
            if isinstance(n, ast.Call) and self.arrays is None and not self._is_local(n.func) \
                    and self.touches(n.func):  # (in an ndarray kernel the fields it reads are constants)
                return True
            if isinstance(n, ast.Call) and any(isinstance(a, ast.Name) and self.field_name(a) is not None
                                               for a in n.args + [k.value for k in n.keywords]):
                return True  # a float field passed to a func (its call is then refused: Taichi reverses the kernel)
        return super().reads_active(node)

    def field_index(self, node: ast.Subscript) -> ast.expr:
        """The index of a field access, as the adjoint computes it again. An index computed from differentiable
        values (``w[int(x[i] * n)]``) is an integer: no derivative flows through it, as in Taichi; the fields it
        reads are recorded as read anywhere (NOTE: [Launches that keep the access rules])."""
        if any(isinstance(n, ast.Slice) for n in ast.walk(node.slice)):
            raise NotReversible(f"the field access `{ast.unparse(node)}` with a slice")
        if super().reads_active(node.slice) or self.reads_active(node.slice):
            for sub in ast.walk(node.slice):
                if isinstance(sub, ast.Call) and not self._is_local(sub.func) and self.touches(sub.func):
                    raise NotReversible(f"the field access `{ast.unparse(node)}` at an index a func reading fields "
                                        "computes")
                if isinstance(sub, ast.Subscript) and (field := self.field_name(sub.value)) is not None:
                    self.accesses.append(Access("load", self.field_key(field), None, (), self.looped()))
        return self.rename(node.slice)

    def expr_Subscript(self, node: ast.Subscript) -> ast.expr:
        component = self.component_of(node)
        if component is not None and (found := self.forwarded.get(self.written_key(*component))) is not None:
            return copy.deepcopy(found)
        field = self.field_name(node.value)
        if field is None:
            return super().expr_Subscript(node)
        if (found := self.forwarded.get(self.written_key(node))) is not None:
            return copy.deepcopy(found)
        index = self.field_index(node)
        gradient = self.gradients[field]

        def effect(ct: ast.expr) -> list[ast.stmt]:
            at = ast.Subscript(copy.deepcopy(gradient), copy.deepcopy(index), ast.Store())
            if self.narrow.get(field, True):  # a float32 field: the cotangent (maybe float64) in its type
                dtype = self.types.get(field) or ast.Attribute(copy.deepcopy(gradient), "dtype", ast.Load())
                ct = ast.Call(ast.Attribute(name(TAICHI), "cast", ast.Load()), [ct, copy.deepcopy(dtype)], [])
            return [ast.AugAssign(at, ast.Add(), ct)]

        read = ast.Subscript(name(field), index, ast.Load())
        access = Access("load", self.field_key(field), index, self.scalar_params(), self.looped())
        self.accesses.append(access)
        target = self.op(None, read, [], f"{field}_at")
        self.last_op().effect = effect
        assigned = self.forward[-1]
        if isinstance(assigned, ast.Assign) and isinstance(assigned.targets[0], ast.Name):
            access.value = assigned.targets[0]  # its id becomes the variable's own name where one is bound to it
        return target

    def store(self, target: ast.Subscript, value: ast.expr, kind: str,
              component: tuple[ast.expr | str, ...] = ()) -> None:
        field = self.field_name(target.value)
        assert field is not None
        if not self.stores:
            raise NotReversible(f"the write `{ast.unparse(target)}` into a field inside a @ti.func")
        index = self.field_index(target)
        stored = self.operand(value)
        self.accesses.append(Access("store", self.field_key(field), index, self.scalar_params(), self.looped()))
        self.ops.append(Store(self.gradients[field], index, stored, kind, component=component))
        self.forget({field})
        if kind == "set" and not self.narrow.get(field, True):  # NOTE: [Reads of what the iteration wrote]
            self.forwarded[self.written_key(target, component)] = stored

    def control_value(self, node: ast.expr, again: bool = False) -> ast.expr:
        """A branch's test or a loop's bounds: the entries of float fields it reads are read as the adjoint
        computes them again (NOTE: [Fields read by tests]): what the iteration stored there, where it did
        (not in a while loop's test, computed again each pass), else the field, a read recorded."""
        placeholders: dict[str, ast.expr] = {}
        reverser = self

        class Reads(ast.NodeTransformer):
            def visit_Subscript(self, sub: ast.Subscript) -> ast.AST:
                component = reverser.component_of(sub)
                entry = component[0] if component is not None else sub
                if component is None and reverser.field_name(sub.value) is None:
                    self.generic_visit(sub)
                    return sub
                found = None if again else reverser.forwarded.get(reverser.written_key(*component) if component
                                                                  else reverser.written_key(sub))
                if found is None and component is not None and not again \
                        and reverser.written_key(entry) in reverser.forwarded:
                    self.generic_visit(sub)  # a component of an entry stored whole: the stored value's
                    return sub
                if found is not None:  # the value stored there
                    placeholder = f"__tidiff_stored_{len(placeholders)}"
                    placeholders[placeholder] = found
                    return ast.copy_location(ast.Name(placeholder, ast.Load()), sub)
                field = reverser.field_name(entry.value)
                assert field is not None
                reverser.accesses.append(Access("load", reverser.field_key(field), reverser.field_index(entry),
                                                reverser.scalar_params(), reverser.looped()))
                return sub

        written = Reads().visit(copy.deepcopy(node))
        renamed = self.rename(written)

        class Stored(ast.NodeTransformer):
            def visit_Name(self, name_node: ast.Name) -> ast.AST:
                found = placeholders.get(name_node.id)
                return name_node if found is None else copy.deepcopy(found)

        return Stored().visit(renamed) if placeholders else renamed

    def written_key(self, entry: ast.Subscript, component: tuple[ast.expr | str, ...] = ()) -> tuple[str, str]:
        """What names an entry (or a component of one) of a field for NOTE: [Reads of what the iteration wrote]:
        the field and the index as the adjoint computes it."""
        field = self.field_name(entry.value)
        assert field is not None
        index = self.rename(entry.slice)
        return field, ast.dump(index) + "".join(p if isinstance(p, str) else ast.dump(p) for p in component)

    def forget(self, fields: set[str] | None) -> None:
        """Stored values of these fields (None: of every field) are no longer what a read gives (a write of any
        entry may alias)."""
        self.forwarded = {k: v for k, v in self.forwarded.items() if fields is not None and k[0] not in fields}

    def nested(self, stmts: list[ast.stmt]) -> Block:
        """A branch side or loop body: reads there may see values stored before it; what it stores stays in it
        (NOTE: [Reads of what the iteration wrote])."""
        outer = dict(self.forwarded)
        try:
            return super().nested(stmts)
        finally:
            self.forwarded = outer

    def statement(self, node: ast.stmt) -> None:
        """A loop may read, in a later pass, what it writes: its fields' stored values are forgotten before and
        after it; a branch's after it (its test and its sides read what was stored before it: NOTE: [Reads of
        what the iteration wrote])."""
        written = self.fields_written(node) if isinstance(node, (ast.If, ast.For, ast.While)) else set()
        if not isinstance(node, ast.If):
            self.forget(written)
        super().statement(node)
        self.forget(written)

    def fields_written(self, node: ast.AST) -> set[str] | None:
        """The fields a statement may write: targets of assignments, first arguments of calls (atomics), by the
        names the code gives them; None where that is not known yet (an entry of a list of fields at a static
        loop's counter)."""
        found = set()
        for sub in ast.walk(node):
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] \
                if isinstance(sub, (ast.AugAssign, ast.AnnAssign)) else sub.args[:1] if isinstance(sub, ast.Call) \
                else []
            for target in targets:
                root = target
                while isinstance(root, (ast.Subscript, ast.Attribute)):
                    try:
                        field = self.field_name(root.value) if isinstance(root, ast.Subscript) else None
                    except NotReversible:
                        return None
                    if field is not None:
                        found.add(field)
                    root = root.value
        return found

    def component_of(self, target: ast.expr | None) -> tuple[ast.Subscript, tuple[ast.expr | str, ...]] | None:
        """``v[i][0]``, ``m[i][0, 1]``, ``v[i].x`` of a float field: the entry ``v[i]`` and the component's indices
        (computed again as the kernel computed them) or attribute, outermost first (NOTE: [Writes into
        components]); None for any other target."""
        path: list[ast.expr | str] = []
        node = target
        while isinstance(node, (ast.Subscript, ast.Attribute)):
            if isinstance(node, ast.Subscript) and self.field_name(node.value) is not None:
                return (node, tuple(reversed(path))) if path else None
            if isinstance(node, ast.Attribute):
                if node.attr not in ("x", "y", "z", "w"):
                    return None
                path.append(node.attr)
            else:
                if any(isinstance(n, ast.Slice) for n in ast.walk(node.slice)) or self.reads_active(node.slice):
                    return None
                path.append(self.rename(node.slice))
            node = node.value
        return None

    def extreme(self, target: ast.Subscript, value: ast.expr, kind: str) -> None:
        """``ti.atomic_max(y[i], e)`` (or min) in a parallel loop (NOTE: [Atomic extremes in reverse])."""
        field = self.field_name(target.value)
        assert field is not None
        array = field in self.array_params
        obj = None if array else resolve(ast.Name(field, ast.Load()), self.parsed.namespace)
        if not self.stores or self.depth == 0 or not (isinstance(obj, ScalarField) or array and self.scalar_array(
                field)):
            raise NotReversible(f"`ti.atomic_{kind}` into `{ast.unparse(target)}` (a scalar global field or ndarray, "
                                "in a parallel loop of the kernel)")
        index = self.field_index(target)
        stored = self.operand(value)
        ties = next((t for t, f in self.ties if f == field), None)  # one count of winners per field and loop
        if ties is None:
            ties = self.namer.fresh(f"{field}_ties")
            if array:  # NOTE: [Scratch arrays]
                self.scratch.append(Scratch(ties, ti.i32, field))
            else:
                assert obj is not None
                self.helpers[ties] = extremes.own_field(ti.i32, obj.shape)
            self.ties.append((ties, field))
            self.ties_made.append((ties, field))
        at = ast.Subscript(name(field), copy.deepcopy(index), ast.Load())
        kept = self.kept(obj, field)
        if kept is not None:  # NOTE: [Winners by kept values]
            self.forward.append(kept.store(stored))  # run by the counting loop only, as the count
        dtype = self.types.get(field, extremes.type_of(field)) if not array else \
            self.types.get(field, ast.Attribute(name(TAICHI), "f64", ast.Load()))
        self.forward.append(extremes.counted(stored, dtype, at, ties, kept))
        won = extremes.won(stored, dtype, at) if kept is None else kept.won(at)
        key = self.field_key(field)
        winner = Access("load", key, index, self.scalar_params(), self.looped())  # the adjoint reads what won
        winner.won = True
        self.extremes += [Access("store", key, index, self.scalar_params(), self.looped()), winner]
        self.accesses += self.extremes[-2:]
        self.ops.append(Store(self.gradients[field], index, stored, kind, won, ties))

    def kept(self, target: Any, field: str) -> extremes.Kept | None:
        """Where the counting loop keeps this atomic's values for the reverse loop (NOTE: [Winners by kept
        values]): for an atomic in no runtime loop of a parallel loop whose iterations are known (for an ndarray,
        known at each launch: an array the launch allocates, NOTE: [Scratch arrays])."""
        if self.repeated or self.parallel_loop is None:
            return None
        if target is None:  # an ndarray's atomic
            assert self.arrays is not None
            extents = extremes.array_extents(self.parallel_loop, set(self.arrays), self.parsed.namespace)
            index = extremes.loop_index(self.parallel_loop)
            dtype = self.arrays[field]
            bits = extremes.bits_of(dtype)
            if extents is None or isinstance(extents, str) and not self.scalar_array(extents) or index is None \
                    or bits is None:
                return None
            param = self.namer.fresh(f"{field}_kept")
            self.scratch.append(Scratch(param, bits, extents if isinstance(extents, str) else tuple(extents)))
            kept: extremes.Kept | None = extremes.Kept(param, index, str(dtype), str(bits))
        else:
            kept = extremes.kept_field(self.parallel_loop, self.parsed.namespace, target, self.helpers, self.namer,
                                       f"{field}_kept")
        if kept is not None:
            self.kept_made.add(kept.field)
        return kept

    def scalar_array(self, param: str) -> bool:
        """Whether the ndarray parameter ``param`` holds scalars."""
        kernel = getattr(self, "kernel", None)
        return kernel is not None and holds_scalars(inspect.signature(kernel.__wrapped__).parameters[param].annotation)

    def looped(self) -> bool:
        """Whether the statement being transformed stands in a runtime loop of a kernel (not its parallel loop:
        it may run many times, in any order with the others there)."""
        return self.stores and self.repeated > 0

    def scalar_params(self) -> list[str]:
        """The kernel's number parameters still holding their values (a func's: none; its calls vary them)."""
        if not self.stores:
            return []
        params = [a.arg for a in self.tree.args.args]
        return [p for p in params if p not in self.template_fields and self.env.get(p) == p]

    def field_key(self, field: str) -> Field | int:
        """What a field's name stands for: a global field, or the position of a template parameter."""
        if field in self.template_fields or field in self.array_params:
            return [a.arg for a in self.tree.args.args].index(field)
        found = self.helpers[field] if field in self.helpers else resolve(ast.Name(field, ast.Load()),
                                                                          self.parsed.namespace)
        assert isinstance(found, Field)  # find_fields names fields only
        return found

    def stmt_Assign(self, node: ast.Assign) -> None:
        target = node.targets[0] if len(node.targets) == 1 else None
        if isinstance(target, ast.Subscript) and self.field_name(target.value) is not None:
            return self.store(target, node.value, "set")
        if (component := self.component_of(target)) is not None:
            return self.store(component[0], node.value, "set", component[1])
        if self.integer_store(target) or self.gradient_store(target, node.value):
            return None
        self.refuse_field_writes(node.targets)
        super().stmt_Assign(node)

    def gradient_store(self, target: ast.expr | None, value: ast.expr) -> bool:
        """``x.grad[i] = 0`` of a kernel's float field: clearing a gradient for a tape, as DiffTaichi's clear kernels
        do. Left out of the adjoint: tidiff clears every gradient after the program ran, before its adjoints run
        (NOTE: [Gradients cleared by the program])."""
        root = target
        while isinstance(root, ast.Subscript):
            root = root.value
        if not (self.stores and isinstance(root, ast.Attribute) and root.attr == "grad"
                and isinstance(root.value, ast.Name) and root.value.id in self.gradients):
            return False
        if self.reads_active(value):
            raise NotReversible(f"the write `{ast.unparse(root)}[...]` of a differentiable value into a gradient")
        return True

    def integer_store(self, target: ast.expr | None) -> bool:
        """A write into an integer field by a kernel: no derivative, and the adjoint must not write it again;
        recorded (NOTE: [Launches that keep the access rules]) and left out."""
        if not (self.stores and isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                and target.value.id in self.constant_fields and self.is_global(target.value.id)):
            return self.stores and isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) \
                and target.value.id in self.external_written  # a copy out: left out (NOTE: [Arrays given to ...])
        self.accesses.append(Access("store", self.field_key(target.value.id), None, ()))
        return True

    def stmt_AugAssign(self, node: ast.AugAssign) -> None:
        target = node.target
        if self.integer_store(target) or self.reduce(node):
            return None
        component = self.component_of(target)
        if isinstance(target, ast.Subscript) and self.field_name(target.value) is not None or component is not None:
            kinds = {ast.Add: "add", ast.Sub: "sub"}
            entry, path = component or (target, ())
            assert isinstance(entry, ast.Subscript)
            if type(node.op) not in kinds or self.forwarded.get(self.written_key(entry, path)) is not None:
                # ``x[i] *= e`` reads the entry, then writes it: ``x[i] = x[i] * e``; so does ``x[i] += e`` where the
                # iteration stored the entry before (NOTE: [Reads of what the iteration wrote]): the sum is stored
                read = copy.deepcopy(target)
                read.ctx = ast.Load()
                return self.store(entry, ast.BinOp(read, node.op, node.value), "set", path)
            return self.store(entry, node.value, kinds[type(node.op)], path)
        self.refuse_field_writes([target])
        super().stmt_AugAssign(node)

    def reduce(self, node: ast.AugAssign) -> bool:
        """``total += e`` in a parallel loop, ``total`` a local of the kernel's top level: an atomic add in
        Taichi (NOTE: [Reductions into top-level locals]). Done again in the adjoint's recomputing loop only;
        ``e``'s cotangent is the sum's."""
        target = node.target
        if not (isinstance(target, ast.Name) and target.id in self.reductions):
            return False
        total, value = self.reductions[target.id], self.operand(node.value)
        self.forward.append(ast.AugAssign(ast.Name(total, ast.Store()), copy.deepcopy(node.op), value))
        if self.is_active(value):
            self.ops.append(Op(total, _added if isinstance(node.op, ast.Add) else _subtracted, [value]))
            self.active.add(total)
        return True

    def stmt_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.refuse_field_writes([node.target])
        super().stmt_AnnAssign(node)

    def refuse_field_writes(self, targets: list[ast.expr]) -> None:
        """A write into a field other than ``x[i] = e`` (an entry ``x[i][0] = e``, an integer field): the
        adjoint kernel must not write fields, and the transform does not follow these."""
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Name) and self.is_global(sub.id) and \
                        (sub.id in self.gradients or sub.id in self.constant_fields):
                    raise NotReversible(f"the write `{ast.unparse(target)}` into a field")

    def carried(self, stmts: list[ast.stmt]) -> list[str]:
        """Variables a branch or loop carries out, without the field and array parameters whose entries it writes
        (``out[b, c, t] += ...`` in a runtime loop writes the array, not a local) and the top-level locals a
        parallel loop sums into (NOTE: [Reductions into top-level locals])."""
        return [v for v in super().carried(stmts) if v not in self.template_fields and v not in self.array_params
                and v not in self.reductions]

    def is_global(self, identifier: str) -> bool:
        """Whether ``identifier`` names a global (a field) or an ndarray parameter, not a local."""
        return identifier not in self.env or identifier in self.array_params

    def stmt_Expr(self, node: ast.Expr) -> None:
        value = node.value
        if isinstance(value, ast.Call):
            callee = resolve(value.func, self.parsed.namespace) if not self._is_local(value.func) else MISSING
            kind = next((k for op, k in _ATOMICS.items() if callee is getattr(ti, op)), None)
            kind = kind or next((k for op, k in _EXTREMES.items() if callee is getattr(ti, op)), None)
            if kind is not None and len(value.args) == 2 and not value.keywords \
                    and isinstance(value.args[0], ast.Subscript) and self.field_name(value.args[0].value):
                if kind in ("max", "min"):
                    return self.extreme(value.args[0], value.args[1], kind)
                return self.store(value.args[0], value.args[1], kind)
            if kind in ("add", "sub") and len(value.args) == 2 and not value.keywords \
                    and (component := self.component_of(value.args[0])) is not None:  # ti.atomic_add(v[i][0], e)
                return self.store(component[0], value.args[1], kind, component[1])
            if callee in _INTEGER_ATOMICS and value.args and self.integer_store(value.args[0]):
                return None
            if self.is_stop_grad(value.func) and self.depth > 0:  # taken by the loop it stands in (``parallel``)
                return None
            if callee is print:  # the adjoint does not print again
                return None
            if callee is ti.loop_config and self.stores and self.depth == 0:  # for the next parallel loop
                self.config = node
                return None
        if not self.compile_time_statement(node):  # any other statement may write a field
            raise NotReversible(f"the statement `{ast.unparse(node)}`")
        super().stmt_Expr(node)

    def stmt_Assert(self, node: ast.Assert) -> None:
        """An ``assert`` checks the kernel's values (in debug mode); the adjoint does not check them again."""

    def is_stop_grad(self, func: ast.expr) -> bool:
        return not self._is_local(func) and resolve(func, self.parsed.namespace) is ti.stop_grad

    def _is_local(self, node: ast.expr) -> bool:
        """Local values, including elements of fields (``x[i].norm()`` is a method on a value)."""
        root, subscripted = entry_root(node)
        if not isinstance(root, ast.Name):
            return True
        return root.id in self.env or (subscripted and (root.id in self.gradients or root.id in self.constant_fields))

    def touches(self, func: ast.expr) -> bool:
        """Whether the global ``func`` names a func that reaches fields (found once per callee)."""
        obj = resolve(func, self.parsed.namespace)
        if id(obj) not in self.touching:
            self.touching[id(obj)] = _touches_fields(obj)
        return self.touching[id(obj)]

    def classify(self, node: ast.Call) -> Any:
        """What a call goes to; a call passing a field on is not taken (the callee would index it as a value)."""
        for arg in node.args + [k.value for k in node.keywords]:
            if isinstance(arg, ast.Name) and (self.field_name(arg) or arg.id in self.constant_fields):
                raise NotReversible(f"the call `{ast.unparse(node)}`, passing the field `{arg.id}` on")
        if not self._is_local(node.func) and self.touches(node.func):  # a func reading fields (it writes none)
            callee = resolve(node.func, self.parsed.namespace)
            reached = _fields_reached(callee)
            if self.arrays is not None and method_parts(callee)[1] is not None and any(map(is_float_field, reached)):
                raise NotReversible(f"the call `{ast.unparse(node)}` of a method reading float fields, in an "
                                    "ndarray kernel (its fields are constants there)")
            reads = _reads_at(callee, [self.rename(a) for a in node.args] if not node.keywords else None)
            self.accesses += [Access("load", f, index, self.scalar_params(), self.looped())
                              for f, index in reads]  # NOTE: [Func reads at their indices]
        return super().classify(node)


class KernelReverser(FieldReverser):
    """The adjoint of one kernel over fields (NOTE: [Reverse of a kernel])."""

    stores = True

    def __init__(self, parsed: Parsed, kernel: Any, bound: bool = False, arrays: dict[str, Any] | None = None,
                 constants: frozenset[str] = frozenset()) -> None:
        self.kernel, self.bound = kernel, bound  # bound: a class kernel, its ``self`` bound by ``objects.bind``
        self.arrays = arrays
        self.constant_templates = constants  # ti.template() parameters given integer fields (see vjp_kernel)
        self.array_params = frozenset(arrays or ()) | constants  # (taken as constant arrays are)
        super().__init__(parsed, (False,) * len(parsed.tree.args.args), 0)
        self.depth = 0  # how deep in loops the statement being transformed stands (0: the kernel's top level)
        self.accumulators: dict[str, str] = {}  # top-level local -> its cotangent's sum over a parallel loop
        self.number_templates: list[str] = []  # ti.template() parameters used as numbers only
        self.external: set[str] = set()  # array parameters of a kernel over fields
        self.chunk_forms: dict[int, tuple[list[ast.stmt], list[chunks.Part], chunks.Chunking]] = {}  # an adjoint
        # loop (by id) -> its chunked form, the copies it takes, how a launch splits it (NOTE: [Accumulations by
        # chunk])
        self.chunked: ast.FunctionDef | None = None  # the adjoint with every such loop in its chunked form
        self.stored: list[read_back.Stored] = []  # what iterations store whole into arrays (NOTE: [Outputs read
        # back])
        self.counters: list[str] = []  # the parallel loop's counters
        self.own_statements: set[int] = set()  # the statements of its body itself (ids)
        self.template_fields = self._template_fields()
        for p in self.template_fields:
            self.gradients[p] = ast.Attribute(name(p), "grad", ast.Load())
        for p, dtype in (arrays or {}).items():
            if dtype is None:
                self.constant_fields.add(p)
            elif dtype != ti.f64:
                self.narrow[p] = True
                helper = self.namer.fresh(f"{p}_type")
                self.helpers[helper] = dtype
                self.types[p] = name(helper)
            else:
                self.narrow[p] = False

    def stmt_Assign(self, node: ast.Assign) -> None:
        before = len(self.ops)
        super().stmt_Assign(node)
        if self.arrays is None or id(node) not in self.own_statements or len(self.ops) == before:
            return
        store = self.ops[-1]  # a statement of the iteration itself: maybe read back (NOTE: [Outputs read back])
        target = node.targets[0]
        if isinstance(store, Store) and store.kind == "set" and not store.component and self.is_active(store.value) \
                and isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) \
                and self.arrays.get(target.value.id) is not None:
            found = read_back.stored(store.value, target.value.id, store.index, self.counters, self.forward)
            self.stored += [found] if found is not None else []

    def readable(self) -> list[read_back.Stored]:
        """The stores whose values an adjoint may read back (NOTE: [Outputs read back])."""
        positions = {p: k for k, p in enumerate(a.arg for a in self.tree.args.args)}
        return read_back.readable(self.stored, self.accesses, positions, self.arrays or {}, self.integral)

    def refuse_external_writes(self) -> None:
        """An array given to a kernel over fields and written is not read there (NOTE: [Arrays given to a kernel
        over fields])."""
        written = {name for _, target in stores(self.tree) for name in root_names(target)[:1]} & self.external
        read = next((n for n in ast.walk(self.tree) if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load)
                     and isinstance(n.value, ast.Name) and n.value.id in written), None)
        if read is not None:
            raise NotReversible(f"the read `{ast.unparse(read)}` of an array the kernel writes, given to a kernel "
                                "over fields")
        self.external_written = written

    def run(self) -> ast.FunctionDef:
        body = without_docstring(self.tree.body)
        body = self.without_return(body)
        self.refuse_external_writes()
        updated = {id(n.target) for n in ast.walk(self.tree) if isinstance(n, ast.AugAssign)}
        read = sorted({n.value.id for n in ast.walk(self.tree) if isinstance(n, ast.Subscript)  # a store alone
                       and (isinstance(n.ctx, ast.Load) or id(n) in updated)  # (``count[i] = i``) reads nothing
                       and isinstance(n.value, ast.Name) and n.value.id in self.constant_fields - self.external})
        own = [f for f in read if extremes.is_own(self.field_key(f))]  # NOTE: [Counts read after the kernel]
        self.accesses += [Access("load", self.field_key(f), None, (), anywhere=True) for f in read if f not in own]
        # integer fields: any entry, anywhere in the launch
        for stmt in body:
            self.statement(stmt)
        self.accesses += [Access("load", self.field_key(f), None, ()) for f in own]
        self.alone_in_extremes(self.accesses, self.ties_made, "store", self.extremes_from)
        self.straight = not _has_blocks(self.ops)
        self.sweep_ops(self.ops)
        self.flush()
        if self.chunk_forms:  # NOTE: [Accumulations by chunk]
            backward = [s for stmt in self.backward for s in (self.chunk_forms[id(stmt)][0] if id(
                stmt) in self.chunk_forms else [stmt])]
            self.chunked = self.function(copy.deepcopy(self.forward + backward), self.chunked_scratch(), "_chunked")
        return self.function(self.forward + self.backward, self.scratch)

    def chunked_scratch(self) -> list[Scratch]:
        """The scratch arrays of the chunked form: the adjoint's own, then the chunks' copies."""
        return [*self.scratch, *(p for _, parts, _ in self.chunk_forms.values() for p in parts)]

    def function(self, stmts: list[ast.stmt], scratch: Sequence[Scratch], suffix: str = "") -> ast.FunctionDef:
        """The adjoint kernel of these statements, taking the kernel's parameters, then ``scratch``."""
        args = copy.deepcopy(self.tree.args)
        args.args += [s.parameter(self.helpers, self.namer) for s in scratch]  # NOTE: [Scratch arrays]
        body = without_dead_branches(self.tree, stmts, self.parsed.namespace)
        fn = ast.FunctionDef(self.namer.fresh(self.tree.name + "_adjoint" + suffix), args, body or [ast.Pass()],
                             [ast.Attribute(name(TAICHI), "kernel", ast.Load())], None)
        return ast.fix_missing_locations(spell_taichi(fn, self.taichi_name))

    def alone_in_extremes(self, accesses: list[Access], ties: list[tuple[str, str]], kind: str,
                          start: dict[str, int] | None = None) -> None:
        """A field ``ti.atomic_max`` (or min) writes is written by nothing else in the kernel from the first
        parallel loop holding such an atomic on (``kind`` "store"; ``start``: the field's first such loop's first
        access, where earlier writes, ``m[None] = -1e9``, give the old value) and read by nothing else in the
        parallel loop holding the atomic ("load"), whose iterations race it: the adjoint reads what won from the
        field as the kernel left it (later loops read it too)."""
        own = {id(a) for a in self.extremes}
        targets = {id(self.field_key(field)): field for _, field in ties}
        for at, access in enumerate(accesses):
            if access.kind == kind and id(access) not in own and id(access.field) in targets \
                    and at >= (start or {}).get(targets[id(access.field)], 0):
                raise NotReversible(f"the field `{targets[id(access.field)]}`, read or written besides "
                                    "ti.atomic_max / ti.atomic_min in one kernel")

    def _template_fields(self) -> list[str]:
        """The ``ti.template()`` parameters the kernel indexes or loops over: fields, float ones with gradients
        at launch (``template_fields``: the launch checks)."""
        found = []
        for p in list(inspect.signature(self.kernel.__wrapped__).parameters.values())[self.bound:]:
            if isinstance(p.annotation, NdarrayType) and self.arrays is not None:
                if p.name not in self.arrays:
                    raise NotReversible(f"the ndarray parameter `{p.name}`, neither an input nor an output")
                if self.arrays[p.name] is not None:
                    found.append(p.name)
            elif isinstance(p.annotation, Template) or p.annotation is ti.template:
                used = any(isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == p.name
                           or isinstance(n, ast.For) and isinstance(n.iter, ast.Name) and n.iter.id == p.name
                           for n in ast.walk(self.tree))
                if used and p.name in self.constant_templates:
                    self.constant_fields.add(p.name)
                elif used:
                    found.append(p.name)
                elif any(isinstance(n, ast.Call) and any(isinstance(a, ast.Name) and a.id == p.name for a in n.args)
                         or isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == p.name
                         for n in ast.walk(self.tree)):
                    raise NotReversible(f"the ti.template() parameter `{p.name}`, given to a call or read for an "
                                        "attribute but not indexed as a field")
                else:  # a number Taichi specializes the kernel on (``compute_p(t, k: ti.template())``); the launch
                    self.number_templates.append(p.name)  # checks it is one
            elif isinstance(p.annotation, NdarrayType):  # a NumPy array or tensor given to a kernel over fields
                # (NOTE: [Arrays given to a kernel over fields]): a constant of the program, read only
                self.external.add(p.name)
                self.constant_fields.add(p.name)
            elif not (p.annotation in (int, float) or isinstance(p.annotation, type(ti.f64))):
                raise NotReversible(f"the parameter `{p.name}` (numbers, arrays and ti.template() fields only)")
        return found

    def without_return(self, body: list[ast.stmt]) -> list[ast.stmt]:
        """The kernel's statements without its final ``return e``: what a kernel returns reaches the program as a
        Python number, which carries no derivative (as a number passed to a kernel does not); the adjoint
        reverses what the kernel writes. A return elsewhere, or one whose value makes an atomic update, is not
        taken."""
        last = body[-1] if body and isinstance(body[-1], ast.Return) else None
        if any(isinstance(node, ast.Return) and node is not last for node in ast.walk(ast.Module(body, []))):
            raise NotReversible("a `return` before the kernel's last statement")
        if last is None:
            return body
        if any(isinstance(node, ast.Call) and getattr(resolve(node.func, self.parsed.namespace), "__name__",
                                                      "").startswith("atomic_") for node in ast.walk(last)):
            raise NotReversible(f"the return `{ast.unparse(last)}`, which updates a field")
        return body[:-1]

    # --- loops --------------------------------------------------------------------
    def stmt_For(self, node: ast.For) -> None:
        if self.depth == 0:
            return self.parallel(node)
        static = isinstance(node.iter, ast.Call) and resolve(node.iter.func, self.parsed.namespace) is ti.static
        values = None if static else self.constant(node.iter, "range")
        if static or values is not None and self.unrolled(node, len(values)):
            return super().stmt_For(node)
        bounds = self.runtime_range(node.iter)
        if bounds is None or not isinstance(node.target, ast.Name) or node.orelse:
            raise NotReversible(f"a `For` statement over `{ast.unparse(node.iter)}`")
        self.depth += 1
        self.repeated += 1
        try:
            self.loop(node, node.target.id, bounds)
        finally:
            self.depth -= 1
            self.repeated -= 1

    def unrolled(self, node: ast.For, count: int) -> bool:
        """Whether a loop over a constant range of ``count`` values is written out (NOTE: [Constant ranges in
        kernels])."""
        counter = node.target.id if isinstance(node.target, ast.Name) else None
        if any(isinstance(n, ast.Subscript) and isinstance(n.value, ast.Subscript) and self.field_name(n.value.value)
               and counter in {m.id for m in ast.walk(n.slice) if isinstance(m, ast.Name)}
               for s in node.body for n in ast.walk(s)):
            return True
        if count > MOST_UNROLLED or any(isinstance(n, (ast.For, ast.While)) for s in node.body for n in ast.walk(s)):
            return False
        size = sum(CALL_SIZE if isinstance(n, ast.Call) else 1 for s in node.body for n in ast.walk(s))
        return count * size <= UNROLLED_SIZE

    def stmt_While(self, node: ast.While) -> None:
        self.depth += 1
        self.repeated += 1
        try:
            super().stmt_While(node)
        finally:
            self.depth -= 1
            self.repeated -= 1

    def parallel(self, node: ast.For) -> None:
        """A top-level loop: its body is a block of its own, reversed as one parallel loop (NOTE above)."""
        if node.orelse:
            raise NotReversible("a loop with an `else` block")
        counters = [n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)]
        if self.reads_active(node.iter) and not self.over_indices(node.iter):
            raise NotReversible(f"the loop over `{ast.unparse(node.iter)}`")
        body = ast.Module(node.body, [])
        written = written_names(body) | {  # entries too (``v[0] = e``, ``v.x += e``), and inner loops' counters
            n.id for n in ast.walk(body) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        shared = sorted(v for v in written if v in self.env and v not in counters and v not in self.template_fields
                        and v not in self.array_params and v not in self.external)
        self.reductions = {}
        for v in shared:  # NOTE: [Reductions into top-level locals]
            ssa = self.env[v]
            if not _reduced(v, node.body) or not isinstance(ssa, str):
                raise NotReversible(f"the parallel loop assigning `{v}`, a variable of the kernel's top level (only "
                                    "+= and -=, read nowhere else in the loop)")
            self.reductions[v] = ssa
        header = ast.For(node.target, self.rename(node.iter), [], [])
        env = dict(self.env)
        for c in counters:
            self.env[c] = c
            self.defined.add(c)
        self.integral |= integer_locals(ast.FunctionDef("body", ast.arguments([], [], None, [], [], None, []),
                                                        node.body, [], None))
        self.stopped = self.stopped_fields(node.body)
        self.depth += 1
        self.ties = []
        self.parallel_loop, self.counters, self.own_statements = node, counters, {id(s) for s in node.body}
        start = len(self.accesses)
        self.forwarded = {}  # an iteration reads what it wrote itself, never what the kernel's top level did
        try:
            block = self.nested(node.body)
        finally:
            self.depth -= 1
            self.stopped = set()
            self.parallel_loop, self.counters, self.own_statements = None, [], set()
            self.forwarded = {}
        self.alone_in_extremes(self.accesses[start:], self.ties, "load")
        for _, field in self.ties:
            self.extremes_from.setdefault(field, start)
        if not self.single(node):  # one iteration (``for _ in range(1)``, as DiffTaichi writes a step) chains none
            self.no_chain(self.accesses[start:])
        self.env = env
        sums = set(self.reductions.values())
        if self.reductions:  # the sums' values, for the adjoint's top level (NOTE: [Reductions into top-level
            # locals])
            if self.ties:
                raise NotReversible("a parallel loop summing into a top-level local beside ti.atomic_max / min")
            again = copy.deepcopy(header)
            again.body = copy.deepcopy(block.forward) or [ast.Pass()]
            self.forward += ([copy.deepcopy(self.config)] if self.config is not None else []) + [again]
            self.reductions = {}
        outer = sorted(n for n in uses(block.ops) - block.defined - set(counters) if self.is_active(name(n)))
        config, self.config = self.config, None
        if config is not None and self.serialized(config):
            self.in_order(self.accesses[start:])
        if has_effects(block.ops):
            self.ops.append(ParallelLoop(header, block, self.ties, config, outer, sums))  # type: ignore[arg-type]

    def serialized(self, config: ast.Expr) -> bool:
        """Whether ``ti.loop_config(...)`` asks for a serial loop (its ``serialize`` a constant true, or unknown)."""
        assert isinstance(config.value, ast.Call)
        for keyword in config.value.keywords:
            if keyword.arg == "serialize":
                return not (isinstance(keyword.value, ast.Constant) and not keyword.value.value)
        return False

    def in_order(self, accesses: list[Access]) -> None:
        """A serialized loop's iterations may read what earlier ones wrote into a field (``y[i] = y[i - 1] * e``),
        which the adjoint, reading the field as the kernel left it, cannot know: not taken where it reads a field
        it writes."""
        written = {a.field_key() for a in accesses if a.kind == "store"}
        if any(a.kind == "load" and a.field_key() in written for a in accesses):
            raise NotReversible("a serialized loop (ti.loop_config(serialize=True)) reading a field it writes")

    def over_indices(self, over: ast.expr) -> bool:
        """``ti.grouped(x)`` of a field (or array) by name: the loop runs over its indices, reading no value."""
        return isinstance(over, ast.Call) and len(over.args) == 1 and not over.keywords \
            and not self._is_local(over.func) and resolve(over.func, self.parsed.namespace) is ti.grouped \
            and isinstance(over.args[0], ast.Name) and (self.field_name(over.args[0]) is not None
                                                        or over.args[0].id in self.constant_fields)

    def single(self, loop: ast.For) -> bool:
        """Whether a parallel loop runs one iteration (its iterations known when the kernel is transformed)."""
        space = extremes.iterations(loop, self.parsed.namespace)
        return space is not None and all(n == 1 for n in space[0])

    def no_chain(self, accesses: list[Access]) -> None:
        """A parallel loop that writes one entry in every iteration (``y[None] = y[None] * e``) and reads the
        field too chains its iterations: each reads what the one before wrote, which the adjoint, reading the
        field as the kernel left it, cannot know. Not taken (an atomic max / min is checked apart)."""
        extremes = {id(a) for a in self.extremes}
        read = {a.field_key() for a in accesses if a.kind == "load" and id(a) not in extremes}
        for a in accesses:
            if a.kind == "store" and id(a) not in extremes and a.index is not None and None not in a.index \
                    and a.field_key() in read:
                raise NotReversible("a parallel loop reading a field and writing an entry of it that is the same "
                                    "in every iteration (each iteration reads what another wrote)")

    def stopped_fields(self, body: list[ast.stmt]) -> set[str]:
        """The fields ``ti.stop_grad(x)`` names in a loop body: Taichi stops their gradient in that whole loop
        (its offloaded task), so the adjoint reads them as constants there."""
        found = set()
        for arg in stop_grad_arguments(body, self.is_stop_grad):
            if not (isinstance(arg, ast.Name) and arg.id in self.gradients):
                raise NotReversible(f"ti.stop_grad of `{ast.unparse(arg)}` (a float field by name only)")
            found.add(arg.id)
        return found

    def sweep_ops(self, ops: list[Any]) -> None:
        """Top-level parallel loops reverse into loops of their own, last first; the rest as in functions."""
        pieces: list[list[Any]] = [[]]
        for op in ops:
            if isinstance(op, ParallelLoop):
                pieces += [[op], []]
            else:
                pieces[-1].append(op)
        for piece in reversed(pieces):
            if piece and isinstance(piece[0], ParallelLoop):
                self.reverse_parallel(piece[0])
            elif piece:
                super().sweep_ops(piece)

    def reverse_parallel(self, loop: ParallelLoop) -> None:
        self.flush()
        for variable in loop.outer:  # NOTE: [Top-level values in parallel loops]
            self.accumulators[variable] = self.namer.fresh(f"ct_{variable}_sum")
            self.backward.append(ast.Assign([ast.Name(self.accumulators[variable], ast.Store())],
                                            zero_of(variable)))
        body = copy.deepcopy(loop.body.forward) + self.emitted(lambda: super(KernelReverser, self).sweep_ops(
            loop.body.ops))
        if loop.sums:  # done by the recomputing loop (NOTE: [Reductions into top-level locals])
            body = [stmt for stmt in map(_WithoutSums(loop.sums).visit, body) if stmt is not None]
        sums, self.accumulators = self.accumulators, {}
        header = copy.deepcopy(loop.node)
        header.body = body or [ast.Pass()]
        if self.arrays is None:  # NOTE: [Owned gradient entries]
            owned.plain_adds(header, self.gradient_fields(), self.reached_by_calls(header))
        config = [copy.deepcopy(loop.config)] if loop.config is not None else []
        if not loop.ties:
            self.backward += config + [header]
            if self.arrays is not None and not (config or sums or loop.sums):
                self.chunk(header)
        else:
            self.reverse_extremes(loop, config, header)
        for variable, total in sums.items():
            self.add(variable, Sym(name(total)))

    def gradient_fields(self) -> dict[str, int]:
        """The names the adjoint gives gradient fields of its own -> the fields (by id)."""
        return {g.id: id(self.helpers[g.id]) for g in self.gradients.values() if isinstance(g, ast.Name)}

    def reached_by_calls(self, loop: ast.For) -> set[int]:
        """The fields (by id) the funcs the adjoint loop ``loop`` calls reach (a reverse function's gradients
        among them)."""
        scope = {**self.parsed.namespace, **self.helpers}
        callees = [resolve(n.func, scope) for n in ast.walk(loop) if isinstance(n, ast.Call)]
        return {id(f) for callee in callees if callee is not MISSING for f in _fields_reached(callee)}

    def chunk(self, header: ast.For) -> None:
        """The chunked form of an ndarray kernel's adjoint loop, where it has one (NOTE: [Accumulations by
        chunk])."""
        assert self.arrays is not None
        over = header.iter
        if isinstance(over, ast.Call) and resolve(over.func, self.parsed.namespace) is ti.grouped:
            return
        extents = extremes.array_extents(header, set(self.arrays), self.parsed.namespace)
        gradients = {p: self.scalar_array(p) for p, dtype in self.arrays.items() if dtype is not None}
        made = None if extents is None else chunks.chunked(header, extents, gradients, self.namer.fresh)
        if made is not None:
            self.chunk_forms[id(header)] = made

    def declare(self, names: set[str]) -> None:
        """Zero cotangents for a block's names, but a top-level local's a parallel loop's adjoint adds into: its
        contributions go to its sum, and a zero declared inside the loop would be gone after it, where the sum
        joins the cotangent (a matrix read in a runtime loop of the loop: a name Taichi did not know)."""
        super().declare({n for n in names if n not in self.accumulators})

    def add(self, variable: str, contribution: Sym) -> None:
        """A contribution to the cotangent of a top-level local, from inside a parallel loop's adjoint, adds into
        its sum atomically (``+=`` on a top-level local is a reduction in Taichi)."""
        total = self.accumulators.get(variable)
        if total is None:
            return super().add(variable, contribution)
        self.backward.append(ast.AugAssign(ast.Name(total, ast.Store()), ast.Add(), contribution.node))

    def reverse_extremes(self, loop: ParallelLoop, config: list[ast.stmt], header: ast.For) -> None:
        """The reverse of a parallel loop with atomic max / min: counts, the counting loop, the reverse loop, the
        lost old values (NOTE: [Atomic extremes in reverse])."""
        counting = copy.deepcopy(loop.node)  # NOTE: [Atomic extremes in reverse]
        counting.body = copy.deepcopy(loop.body.forward)
        counted = {ties for ties, _ in loop.ties}
        for ties, _ in loop.ties:
            self.backward += extremes.zeroed(ties, extremes.counts_ndim(self.helpers, ties), self.namer.fresh)
        self.backward += config + [counting] + copy.deepcopy(config)
        self.backward.append(_WithoutCounts(counted, self.kept_made).visit(header))
        for ties, field in loop.ties:
            self.backward += extremes.lost(ties, extremes.counts_ndim(self.helpers, ties), self.namer.fresh,
                                           self.gradients[field])



class _WithoutSums(ast.NodeTransformer):
    """A parallel loop's reverse without its sums into top-level locals (NOTE: [Reductions into top-level
    locals])."""

    def __init__(self, sums: set[str]) -> None:
        self.sums = sums

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AST | None:
        return None if isinstance(node.target, ast.Name) and node.target.id in self.sums else node

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        if isinstance(node, (ast.If, ast.For, ast.While)) and not node.body:
            node.body = [ast.Pass()]
        return node


class _WithoutCounts(ast.NodeTransformer):
    """The reverse loop's code without the statements counting ties and keeping values (they run in the counting
    loop only)."""

    def __init__(self, counted: set[str], kept: set[str]) -> None:
        self.counted, self.kept = counted, kept

    def visit_Assign(self, node: ast.Assign) -> ast.AST | None:
        target = node.targets[0]
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id in self.kept:
            return None
        return node

    def visit_If(self, node: ast.If) -> ast.AST | None:
        first = node.body[0] if len(node.body) == 1 else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Call) and first.value.args and \
                isinstance(target := first.value.args[0], ast.Subscript) and isinstance(target.value, ast.Name) \
                and target.value.id in self.counted:
            return None
        self.generic_visit(node)
        if not node.body:
            node.body = [ast.Pass()]
        return node


def _added(g: Sym, out: Sym, e: Sym) -> list[Sym | None]:
    return [g]


def _subtracted(g: Sym, out: Sym, e: Sym) -> list[Sym | None]:
    return [-g]


def _reduced(variable: str, body: list[ast.stmt]) -> bool:
    """Whether a loop body writes ``variable`` only by ``+=`` / ``-=`` and reads it nowhere else."""
    sums = [n for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.AugAssign)
            and isinstance(n.target, ast.Name) and n.target.id == variable]
    if not sums or not all(isinstance(n.op, (ast.Add, ast.Sub)) for n in sums):
        return False
    targets = {id(n.target) for n in sums}
    return not any(isinstance(n, ast.Name) and n.id == variable and id(n) not in targets
                   for stmt in body for n in ast.walk(stmt))


def _has_blocks(ops: list[Any]) -> bool:
    """Whether a branch or runtime loop stands among ``ops`` or in a parallel loop's body."""
    return any(isinstance(op, (Branch, Loop)) or (isinstance(op, ParallelLoop) and _has_blocks(op.body.ops))
               for op in ops)


def _reads_at(callee: Any, args: list[ast.expr] | None, depth: int = 0) -> list[tuple[Field, ast.expr | None]]:
    """The global fields a call of the ``@ti.func`` ``callee`` with ``args`` (the caller's expressions, None where
    not known) reads, each at every index it reads in the caller's terms (None: any entry), once per index (NOTE:
    [Func reads at their indices])."""
    try:
        parsed = parsed_for(callee) if depth < DEEPEST and not is_method_func(callee) else None
    except (TypeError, OSError):
        parsed = None
    if parsed is None:
        return [(f, None) for f in _fields_reached(callee)]
    params = [a.arg for a in parsed.tree.args.args]
    known = dict(zip(params, args, strict=True)) if args is not None and len(args) == len(params) \
        and not assigned_names(parsed.tree.body) & set(params) else {}

    def substituted(node: ast.expr) -> ast.expr | None:
        if any(isinstance(n, ast.Name) and n.id not in known for n in ast.walk(node)):
            return None  # a local or a global of the func's (a global named as a kernel parameter is not one)
        return Renamed(known).visit(copy.deepcopy(node))

    found: list[tuple[Field, ast.expr | None]] = []
    for node in ast.walk(parsed.tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            field = resolve(node.value, parsed.namespace)
            if isinstance(field, Field) and node.value.id not in known:
                found.append((field, substituted(node.slice)))
        elif isinstance(node, ast.Call):
            inner = resolve(node.func, parsed.namespace)
            if inner is not MISSING and _touches_fields(inner):
                inner_args = [substituted(a) for a in node.args]
                found += _reads_at(inner, None if node.keywords or None in inner_args else
                                   [a for a in inner_args if a is not None], depth + 1)
    seen = {id(f) for f, _ in found}
    found += [(f, None) for f in _fields_reached(callee) if id(f) not in seen]  # (through objects' methods)
    unique = {(id(f), None if index is None else ast.dump(index)): (f, index) for f, index in found}
    return list(unique.values())


def _draws_random(parsed: Parsed, seen: set[int] | None = None) -> bool:
    """Whether the code calls ``ti.random`` or ``ti.randn``, directly or through the funcs it calls.

    NOTE: [Random numbers in reverse] A kernel's adjoint computes the values the kernel computed again, and so
    does Taichi's ``kernel.grad``: a ``ti.random`` in the kernel (dropout: ``ti.select(ti.random() > p, x[i] / (1
    - p), 0.0)``) draws other numbers there, so the gradient was that of another mask, without a word (a survey
    of kernels as users write them: 26 entries kept, 38 with a gradient). Such a kernel is not taken by the
    transform, and reverse mode of a program or kernel reaching it is refused by name (NOTE: [Rules Taichi's
    reverse mode cannot see]); forward mode draws once, for the value and its tangent together.
    """
    seen = set() if seen is None else seen
    for node in ast.walk(parsed.tree):
        if not isinstance(node, (ast.Name, ast.Attribute)):
            continue
        value = resolve(node, parsed.namespace)
        if value is ti.random or value is ti.randn:
            return True
        if id(value) in seen or not (is_method_func(value) or hashable(value) and transformable(value)):
            continue
        seen.add(id(value))
        try:
            callee = parsed_for(value)
        except (TypeError, OSError):
            continue
        if _draws_random(callee, seen):
            return True
    return False


def _touches_fields(obj: object) -> bool:
    """Whether a ``@ti.func`` (or helper) reads or writes global fields, directly or through its callees."""
    return bool(_fields_reached(obj))


def _fields_reached(obj: object, seen: set[int] | None = None) -> list[Field]:
    """The global fields a ``@ti.func`` (or helper) names, directly or through its callees."""
    seen = set() if seen is None else seen
    if id(obj) in seen or not (is_method_func(obj) or hashable(obj) and transformable(obj)):
        return []
    seen.add(id(obj))
    try:
        parsed = parsed_for(obj)
    except (TypeError, OSError):
        return []
    found: list[Field] = []
    for identifier in sorted({n.id for n in ast.walk(parsed.tree) if isinstance(n, ast.Name)}):
        value = resolve(ast.Name(identifier, ast.Load()), parsed.namespace)
        if value is not MISSING:
            found += [*fields_of(value), *_fields_reached(value, seen)]
    return found
