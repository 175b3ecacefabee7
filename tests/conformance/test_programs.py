"""Field programs and ndarray kernels built around a generated element function, against torch.

Each example draws a scalar ``@ti.func`` ``f(a, b)`` from the grammar and
builds around it (NOTE: [Programs around a function]):

- a field program of three kernels: ``y[i] = f(x[i], w[i])`` (a struct-for; or the same through funcs
  given the fields, or ``y`` the atomic maximum or minimum of 0, ``f`` there and ``f`` of the entry before
  less / plus 0.5, or ``f`` stopped in ``w`` by ``ti.stop_grad``, or grown in a loop that breaks, or with a
  second parallel loop adding into the loss), ``z[i] = y[i] * cos(y[i + 1])`` (reads a neighbour), and
  ``loss += z[i]**2`` (an atomic sum into a scalar field); inputs ``x`` and ``w``, outputs ``loss``
  (a scalar: grad, hvp) or ``z`` (a vector: jacobian, jvp, vjp); run once, with ``y`` updated in place, or
  twice over the same fields (``PASSES``: values read, then overwritten);
- an ndarray kernel ``out[i] = f(a[i], b[i]) * sin(a[i + 1])``.

The torch twin applies the function's twin element by element.

NOTE: [Programs around a function] Field programs and ndarray kernels
differentiate in reverse with tidiff's adjoint kernels: every kernel of the
program and of its tangent program must be one the transform takes (Taichi's
``kernel.grad`` reverses none of them), rules, ``td.stop_gradient``, ``ti.tan``
and ``while`` included. Taichi's own reverse mode (the tape, ``kernel.grad``,
no tidiff) runs as a cross-check wherever it has the rules
(``known.FIELD_REVERSE_GAPS``) and reaches no custom rule: where it agrees
with torch, tidiff's gradient equals it to 1e-12 (where it does not, it is
Taichi's global data access rules broken, or one of its pitfalls). Forward
mode is tidiff's tangent program, checked always.
"""
import hypothesis.strategies as st
import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import event, given, reject
from taichi.lang import impl
from taped import tape

import tidiff as td
from tidiff._adjoint.kernels import KernelAdjoint, vjp_kernel
from tidiff._fields.twins import TREES_A_PROCESS_HOLDS

from . import budget, grammar, known, render_taichi
from .cases import Case, assume_derivatives_defined, assume_tame, draw_case, record_pitfall
from .checks import TaichiPitfall
from .compare import Mismatch, as_numpy, assert_values_close
from .crashes import TAICHI_ALONE, known_error
from .unoptimized import RecheckFailed, passes_without_optimizer

N = 4
RTOL, ATOL = 1e-8, 1e-10
# A TaichiReverseWarning fails the example: tidiff's adjoint of a program or of its tangent was checked, found wrong
# and pushed forward (issue 34: never a per-input forward fallback); right numbers by a fallback are not a pass.
NEVER_PUSHED_FORWARD = pytest.mark.filterwarnings("error::tidiff.TaichiReverseWarning")

# How the kernel applying the element function reaches its fields: by name, or through @ti.funcs given them as
# ti.template() arguments (NOTE: funcs given fields are reversed by Taichi's kernel.grad, and their tangents
# write the tangent fields given beside them).
APPLY = {
    "by name": "y[i] = f(x[i], w[i])",
    "a func writing into a field given to it": "put(y, i, f(x[i], w[i]))",
    "a func reading the fields given to it": "y[i] = f(take(x, i), take(w, i))",
    # a func reading a global field, given only an index: its tangent is called with no tangent argument
    "a func reading a field by index": "y[i] = f(x[i], w[i]) + 0.25 * ti.sin(neighbour(i))",
    # y[i] = max(0, f(x[i], w[i]), f(x[i - 1], w[i - 1]) - 0.5): the derivative to the winner (NOTE: [Atomic
    # extremes in reverse]); y starts at 0
    "atomic maxima": "v = f(x[i], w[i])\n        ti.atomic_max(y[i], v)\n"
                     "        ti.atomic_max(y[(i + 1) % N], v - 0.5)",
    # y[i] = max(sin(w[i]) / 4 - 0.5, f(x[i], w[i]), f(x[i - 1], w[i - 1]) - 0.5): the old value set by an earlier
    # loop of the same kernel
    "atomic maxima over a bound set first": "y[i] = 0.25 * ti.sin(w[i]) - 0.5\n    for j in x:\n"
                                            "        v = f(x[j], w[j])\n        ti.atomic_max(y[j], v)\n"
                                            "        ti.atomic_max(y[(j + 1) % N], v - 0.5)",
    # y[i] = min(0, f(x[i], w[i]), f(x[i - 1], w[i - 1]) + 0.5)
    "atomic minima": "v = f(x[i], w[i])\n        ti.atomic_min(y[i], v)\n"
                     "        ti.atomic_min(y[(i + 1) % N], v + 0.5)",
    # a second parallel loop in the same kernel, adding to the loss what the loss kernel adds to later
    "a second loop in the kernel": "y[i] = f(x[i], w[i])\n    for j in x:\n"
                                   "        loss[None] += 0.125 * ti.sin(x[j]) * w[j]",
    # a sum into a top-level local (Taichi's reduction), then read by another loop (NOTE: [Reductions into
    # top-level locals], [Top-level values in parallel loops]): y[i] += s x[i] / 8, s = sum(sin(x) w)
    "a top-level sum": "y[i] = f(x[i], w[i])\n    s = 0.0\n    for j in x:\n        s += ti.sin(x[j]) * w[j]\n"
                       "    for j in x:\n        y[j] += 0.125 * s * x[j]",
    # w a constant in the loop, as Taichi defines ti.stop_grad: no derivative to w through y
    "w stopped by ti.stop_grad": "ti.stop_grad(w)\n        y[i] = f(x[i], w[i])",
    # y[i] read back where the iteration wrote it, then written again (NOTE: [Reads of what the iteration wrote]):
    # y = v + v**2 / 4, v = f(x[i], w[i]) / 2
    "read back where written": "y[i] = 0.5\n        y[i] *= f(x[i], w[i])\n        y[i] = y[i] + 0.25 * y[i] ** 2",
    # a second loop updating in place what the first wrote (NOTE: [Kernels run loop by loop]): y = v**2 / 2 +
    # sin(w) v, v = f(x[i], w[i])
    "updated in place by a second loop": "y[i] = f(x[i], w[i])\n    for j in x:\n"
                                         "        y[j] = y[j] * y[j] * 0.5 + ti.sin(w[j]) * y[j]",
    # the same with a top-level local between the loops, which the second loop's part assigns again (NOTE:
    # [Top-level statements of a kernel run loop by loop])
    "updated in place after a top-level local": "y[i] = f(x[i], w[i])\n    c = ti.sqrt(0.25)\n    for j in x:\n"
                                                "        y[j] = y[j] * y[j] * c + ti.sin(w[j]) * y[j]",
    # the same, then summed into a local that the statement after the summing loop reads, in that loop's part:
    # y = v + [s / 8, 0, ...], s = sum(v)
    "updated in place, then summed into a local": "y[i] = f(x[i], w[i])\n    for j in x:\n"
                                                  "        y[j] = y[j] * y[j] * 0.5 + ti.sin(w[j]) * y[j]\n"
                                                  "    s = 0.0\n    for j in x:\n        s += y[j]\n"
                                                  "    y[0] += 0.125 * s",
    # y = v / (1 + m), m = sum(v * v) / N, v = f(x, w): a sum (and a local computed from it) read by a later
    # loop, handed on in a 0-d field (NOTE: [Sums handed to a later loop])
    "normalized by a sum a later loop reads": "y[i] = f(x[i], w[i])\n    s = 0.0\n    for j in x:\n"
                                              "        s += y[j] * y[j]\n    m = s / N\n    for j in x:\n"
                                              "        y[j] = y[j] / (1.0 + m)",
    # v = f(x[i], w[i]) grown by half until past 1, at most three times (NOTE: [Break as a flag])
    "a loop that breaks": "v = f(x[i], w[i])\n        for _ in range(3):\n            if v > 1.0:\n"
                          "                break\n            v = v * 1.5\n        y[i] = v",
    # y[i] updated again in a runtime loop of the iteration (NOTE: [Entries updated in a loop, as locals]); Taichi's
    # own reverse mode is silently wrong there
    "updated again in a runtime loop": "y[i] = f(x[i], w[i])\n        for _ in range(2):\n"
                                       "            y[i] = y[i] * 0.5 + 0.25 * ti.sin(y[i])",
    # y[i] set, summed into in a runtime loop and once after it, then read (NOTE: [Reads of what the iteration
    # wrote], [Entries updated in a loop, as locals]); Taichi's own reverse mode is silently wrong there
    "summed into where set, then read": "v = f(x[i], w[i])\n        y[i] = 0.25 * w[i]\n"
                                        "        for k in range(2):\n            y[i] += 0.5 * v + 0.0625 * k\n"
                                        "        y[i] -= 0.0625 * v\n        y[i] = ti.tanh(y[i])",
    # a struct made by a func and given to one (NOTE: [Structs through funcs]): y = v (1/2 + w/4)
    "a struct through funcs": "p = weighing(f(x[i], w[i]), 0.5 + 0.25 * w[i])\n        y[i] = weighted(p)",
    # a vector built from parts and a swizzle (NOTE: [Constructors from parts]): h = (w, v, 1/2)
    "a vector built from parts": "h = ti.math.vec3(ti.math.vec2(f(x[i], w[i]), w[i]).yx, 0.5)\n"
                                 "        y[i] = 0.25 * h.dot(h) + h.z * h.y",
    # y[i] set, updated in a branch, then read and overwritten (NOTE: [Entries set, then updated in a branch]);
    # Taichi's own reverse mode is silently wrong there
    "updated in a branch, then read": "y[i] = f(x[i], w[i])\n        if y[i] > 0.25:\n            y[i] = y[i] * y[i]\n"
                                      "        else:\n            y[i] -= 0.5 * w[i]\n"
                                      "        y[i] = ti.tanh(y[i]) + 0.125 * y[i]",
}


# How many times the program runs its kernels, and what it overwrites (NOTE: [Overwritten values kept]): "in place"
# updates y where it stands (scale reads, then writes, each entry; "in place, *=" by ``y[i] *= e``); "twice" runs
# the three kernels again over the same fields (apply and mix overwrite what mix and reduce read), so the loss
# doubles; "twice, y cleared" clears y by fill between the passes (the atomic maxima start from 0 again).
PASSES = ("once", "in place", "in place, *=", "twice", "twice, y cleared")
# statements beside a kernel's loops: Taichi's reverse mode refuses the mix
TAICHI_REFUSES = {"a top-level sum", "updated in place after a top-level local",
                  "updated in place, then summed into a local", "normalized by a sum a later loop reads"}
# Taichi's reverse mode is silently wrong there: no cross-check with it
TAICHI_WRONG = {"updated again in a runtime loop", "summed into where set, then read", "updated in a branch, then read"}


def run_passes(ns: dict, fields: dict, passes: str) -> None:
    for k in range(2 if passes.startswith("twice") else 1):
        if k and passes == "twice, y cleared":
            fields["y"].fill(0.0)
        ns["apply"]()
        if passes == "in place":
            ns["scale"]()
        elif passes == "in place, *=":
            ns["scale_by"]()
        ns["mix"]()
        ns["reduce"]()


def element_values(case: Case, variant: str, x, w):
    """The element function's value per entry, as the apply kernel sees its arguments."""
    if variant == "w stopped by ti.stop_grad":
        w = w.detach()
    return torch.stack([case.twin(x[i], w[i]) for i in range(N)])


def y_twin(variant: str, f_values, w):
    """What the apply kernel leaves in ``y``, from the element function's values (and ``w``)."""
    if variant.startswith("atomic maxima"):
        bound = torch.zeros_like(f_values) if variant == "atomic maxima" else 0.25 * torch.sin(w) - 0.5
        return torch.amax(torch.stack([bound, f_values, torch.roll(f_values, 1) - 0.5]), dim=0)
    if variant == "atomic minima":
        zero = torch.zeros_like(f_values)
        return torch.amin(torch.stack([zero, f_values, torch.roll(f_values, 1) + 0.5]), dim=0)
    if variant == "read back where written":
        return 0.5 * f_values + 0.25 * (0.5 * f_values) ** 2
    if variant in ("updated in place by a second loop", "updated in place after a top-level local"):
        return 0.5 * f_values ** 2 + torch.sin(w) * f_values
    if variant == "updated in place, then summed into a local":
        v = 0.5 * f_values ** 2 + torch.sin(w) * f_values
        return v + 0.125 * v.sum() * (torch.arange(len(v)) == 0)
    if variant == "normalized by a sum a later loop reads":
        return f_values / (1.0 + (f_values * f_values).sum() / len(f_values))
    if variant == "updated again in a runtime loop":
        v = f_values
        for _ in range(2):
            v = v * 0.5 + 0.25 * torch.sin(v)
        return v
    if variant == "summed into where set, then read":
        return torch.tanh(0.25 * w + 0.9375 * f_values + 0.0625)
    if variant == "a struct through funcs":
        return f_values * (0.5 + 0.25 * w)
    if variant == "a vector built from parts":
        return 0.25 * (w * w + f_values * f_values + 0.25) + 0.5 * f_values
    if variant == "updated in a branch, then read":
        u = torch.where(f_values > 0.25, f_values * f_values, f_values - 0.5 * w)
        return torch.tanh(u) + 0.125 * u
    if variant == "a loop that breaks":
        grown = []
        for v in f_values:
            for _ in range(3):
                if v > 1.0:
                    break
                v = v * 1.5
            grown.append(v)
        return torch.stack(grown)
    return f_values

FIELD_KERNELS = """
Weighted = ti.types.struct(v=ti.f64, m=ti.f64)


@ti.func
def weighing(v, m):
    return Weighted(v=v, m=m)


@ti.func
def weighted(p):
    return p.m * p.v


@ti.func
def put(out: ti.template(), i, v):
    out[i] = v


@ti.func
def take(src: ti.template(), i):
    return src[i]


@ti.func
def neighbour(i):
    return x[(i + 1) % N]


@ti.kernel
def apply():
    for i in x:
        {apply}


@ti.kernel
def scale():
    for i in y:
        y[i] = y[i] * 0.75 + 0.25 * ti.sin(w[i])


@ti.kernel
def scale_by():
    for i in y:
        y[i] *= 0.75 + 0.25 * ti.sin(w[i])


@ti.kernel
def mix():
    for i in range(N):
        z[i] = y[i] * ti.cos(y[(i + 1) % N])


@ti.kernel
def reduce():
    for i in z:
        loss[None] += z[i] * z[i]
"""

NDARRAY_HEADER = """
@ti.kernel
def nd(a: ti.types.ndarray(dtype=ti.f64, ndim=1), b: ti.types.ndarray(dtype=ti.f64, ndim=1),
       out: ti.types.ndarray(dtype=ti.f64, ndim=1)):
"""
NDARRAY_KERNELS = {  # the kernel's body, and its twin from the element function's values y and a
    "one loop": ("""
    for i in range(a.shape[0]):
        out[i] = f(a[i], b[i]) * ti.sin(a[(i + 1) % a.shape[0]])
""", lambda y, a: y * torch.sin(torch.roll(a, -1))),
    # overwriting what an earlier loop read (NOTE: [Arrays kept by version])
    "updated in place": ("""
    for i in range(a.shape[0]):
        out[i] = f(a[i], b[i])
    for i in range(a.shape[0]):
        out[i] = out[i] * ti.sin(a[(i + 1) % a.shape[0]])
""", lambda y, a: y * torch.sin(torch.roll(a, -1))),
    "summed, then scaled in place": ("""
    total = 0.0
    for i in range(a.shape[0]):
        out[i] = f(a[i], b[i])
        total += out[i] ** 2
    for i in out:
        out[i] = out[i] * ti.sin(a[(i + 1) % a.shape[0]]) / (1.0 + total)
""", lambda y, a: y * torch.sin(torch.roll(a, -1)) / (1.0 + (y ** 2).sum())),
    # a state carried over steps in the output, serialized (NOTE: [Loops interchanged for a carried entry],
    # [Entries read first from zeroed outputs])
    "a state carried over steps": ("""
    ti.loop_config(serialize=True)
    for t in range(2):
        for i in range(a.shape[0]):
            out[i] = out[i] * ti.sin(a[i]) + f(a[i], b[i])
""", lambda y, a: y * torch.sin(a) + y),
    # a sum into the (zeroed) output, tested in a branch, then read (NOTE: [Fields read by tests], [Sums into an
    # owned entry, then read]): the test was computed again on what the kernel left, silently
    "summed, tested in a branch, then scaled": ("""
    for i in range(a.shape[0]):
        out[i] += f(a[i], b[i])
        if out[i] < 0.25:
            out[i] = 0.5 * out[i]
        out[i] = out[i] * ti.sin(a[i])
""", lambda y, a: torch.where(y < 0.25, 0.5 * y, y) * torch.sin(a)),
}


def element_case(data) -> Case:
    g = known.grammar().without(*known.REVERSE_GAPS)  # a kernel calling code the reverse transform does not
    # take (a td.jvp call) is reversed by Taichi's kernel.grad (docs/limits.md)
    program = data.draw(grammar.programs(g, out_shapes=grammar.SCALAR_OUT, param_shapes=st.just(((), ()))),
                        label="element function")
    return draw_case_for(data, program)


def draw_case_for(data, program) -> Case:
    """The program's case with unbatched scalar inputs (its value checked against its twin on the way)."""
    return draw_case(data, out_shapes=st.just(program.main.out_shapes), param_shapes=st.just(((), ())),
                     batched=False, program=program)


_FIELDS: dict[str, dict] = {}


def program_fields(role: str, needs_grad: bool = False) -> dict:
    """The fields x, w, y, z and loss of the programs of one role, made once a process and zeroed for each case:
    Taichi 1.7.4 holds 512 trees of fields a process (NOTE: [Trees a process holds] in tidiff/_fields/twins.py),
    and tidiff's twins of each case's programs take two to four already."""
    if role not in _FIELDS:
        fields = {name: ti.field(ti.f64, shape=N, needs_grad=needs_grad) for name in ("x", "w", "y", "z")}
        fields["loss"] = ti.field(ti.f64, shape=(), needs_grad=needs_grad)
        _FIELDS[role] = fields
    for field in _FIELDS[role].values():
        field.fill(0.0)
    return _FIELDS[role]


def room_for_trees() -> None:
    """Reject the example where the process is near Taichi's limit of trees of fields (tidiff would refuse the
    next program: the rest of the run's examples are rejected, and run_long.py's chunks keep clear of it)."""
    if impl.get_runtime().prog.get_snode_tree_size() > TREES_A_PROCESS_HOLDS - 16:
        reject()


def field_program(case: Case, variant: str, passes: str):
    """(F scalar loss, G vector z) over the fields of this role, and the torch twin of both."""
    fields = program_fields("tidiff")
    ns = dict(render_taichi.namespace(), f=case.f, N=N, **fields)
    render_taichi.compile_text(FIELD_KERNELS.format(apply=APPLY[variant]), "apply", ns, "fields")

    def program():
        run_passes(ns, fields, passes)

    F = td.function(program, inputs=[fields["x"], fields["w"]], outputs=[fields["loss"]])
    G = td.function(program, inputs=[fields["x"], fields["w"]], outputs=[fields["z"]])

    def z_twin(x, w):
        y = y_twin(variant, element_values(case, variant, x, w), w)
        if variant == "a top-level sum":
            y = y + 0.125 * (torch.sin(x) * w).sum() * x
        elif variant == "a func reading a field by index":
            y = y + 0.25 * torch.sin(torch.roll(x, -1))
        if passes == "in place":
            y = y * 0.75 + 0.25 * torch.sin(w)
        elif passes == "in place, *=":
            y = y * (0.75 + 0.25 * torch.sin(w))
        return y * torch.cos(torch.roll(y, -1))

    times = 2 if passes.startswith("twice") else 1

    def loss_twin(x, w):
        loss = (z_twin(x, w) ** 2).sum()
        if variant == "a second loop in the kernel":
            loss = loss + 0.125 * (torch.sin(x) * w).sum()
        return times * loss

    return F, G, loss_twin, z_twin


def taichi_reverses(case: Case) -> bool:
    """Whether Taichi's reverse mode has a rule for everything the element function uses, and does not end the
    process on it (``Program.writes_at_runtime_indices``)."""
    features = case.program.features
    return not any(gap in features or f"loop:{gap}" in features for gap in known.FIELD_REVERSE_GAPS) \
        and not case.program.writes_at_runtime_indices


def taichi_alone(case: Case, what: str, run):
    """Taichi's own reverse mode, no tidiff, as a cross-check (run first: a process it ends died of Taichi); None
    where Taichi raises an error it is known for, and the example goes on without the cross-check."""
    call = f"{TAICHI_ALONE} {what}"
    with case.checking(call):
        try:
            return run()
        except (RuntimeError, ti.TaichiCompilationError) as e:
            if known_error(str(e), call) is None:
                raise
            return None


def agrees(got, want) -> bool:
    return all(np.allclose(g, as_numpy(w), rtol=RTOL, atol=ATOL) for g, w in zip(got, want, strict=True))


def same_as_taichi(got, taichi_says, want) -> None:
    """Where Taichi's own reverse mode agrees with torch, tidiff's gives the same numbers."""
    if taichi_says is not None and agrees(taichi_says, want):
        for g, t in zip(got, taichi_says, strict=True):
            np.testing.assert_allclose(g, t, rtol=1e-12, atol=1e-12)


def assert_reversed_by_tidiff(F) -> None:
    """Every kernel of a field program and of its tangent program has tidiff's adjoint (NOTE: [Reverse of a
    kernel]): Taichi's kernel.grad reverses none of them."""
    for program in (F.program, F.program.tangent()):
        for k in program._kernels:
            adjoint = vjp_kernel(k)
            assert isinstance(adjoint, KernelAdjoint), f"tidiff's adjoint transform refused `{k.__name__}`: {adjoint}"


def taichi_tape_gradient(case: Case, x, w, variant: str, passes: str):
    """The gradient of the loss by Taichi's own ``ti.ad.Tape`` over fields of the user's own, no tidiff."""
    fields = program_fields("tape", needs_grad=True)
    ns = dict(render_taichi.namespace(), f=case.f, N=N, **fields)
    render_taichi.compile_text(FIELD_KERNELS.format(apply=APPLY[variant]), "apply", ns, "tape")
    fields["x"].from_numpy(x)
    fields["w"].from_numpy(w)
    with tape(fields["loss"], *fields.values()):
        run_passes(ns, fields, passes)
    return fields["x"].grad.to_numpy(), fields["w"].grad.to_numpy()


def plain_field_loss(case: Case, x, w, variant: str, passes: str):
    """The field program's loss run by Taichi alone, on fields of its own (no tidiff)."""
    fields = program_fields("plain")
    ns = dict(render_taichi.namespace(), f=case.f, N=N, **fields)
    render_taichi.compile_text(FIELD_KERNELS.format(apply=APPLY[variant]), "apply", ns, "fields-plain")
    fields["x"].from_numpy(x)
    fields["w"].from_numpy(w)
    run_passes(ns, fields, passes)
    return fields["loss"].to_numpy()


def plain_ndarray_out(case: Case, a, b, variant: str):
    """The ndarray kernel run by Taichi alone (no tidiff)."""
    ns = dict(render_taichi.namespace(), f=case.f)
    nd = render_taichi.compile_text(NDARRAY_HEADER + NDARRAY_KERNELS[variant][0], "nd", ns, "ndarray-plain")
    out = np.zeros(N)
    nd(np.ascontiguousarray(a), np.ascontiguousarray(b), out)
    return out


def check_program_value(case: Case, got, want, plain, what):
    """A program's value against its twin's; where they differ, a Taichi pitfall (recorded, the example
    rejected) if Taichi alone, ``plain()``, computes the same value (NOTE: [Taichi pitfalls] in checks: its
    kernels miscompile the element function there), else tidiff's failure."""
    try:
        close(got, want)
    except AssertionError as mismatch:
        if not np.allclose(np.asarray(got), plain(), rtol=RTOL, atol=ATOL):
            raise
        pitfall = TaichiPitfall(f"Taichi alone (the {what}'s kernels without tidiff) computes the same wrong "
                                f"value: a Taichi pitfall, not a tidiff failure.\n{mismatch}")
        pitfall.add_note(case.report(f"{what}: value against Taichi alone and torch"))
        record_pitfall(pitfall)
        reject()


def taichi_ndarray_gradient(case: Case, a, b, c):
    """The ndarray kernel's input cotangents by Taichi's own ``kernel.grad``, no tidiff."""
    ns = dict(render_taichi.namespace(), f=case.f)
    nd = render_taichi.compile_text(NDARRAY_HEADER + NDARRAY_KERNELS["one loop"][0], "nd", ns, "ndarray-plain")
    arrays = [ti.ndarray(ti.f64, N, needs_grad=True) for _ in range(3)]
    for array, values in zip(arrays, (a, b, np.zeros(N)), strict=True):
        array.from_numpy(values)
    nd(*arrays)
    arrays[2].grad.from_numpy(c)
    nd.grad(*arrays)
    return arrays[0].grad.to_numpy(), arrays[1].grad.to_numpy()


def ndarray_kernel(case: Case, variant: str = "one loop"):
    ns = dict(render_taichi.namespace(), f=case.f)
    body, twin_of = NDARRAY_KERNELS[variant]
    nd = render_taichi.compile_text(NDARRAY_HEADER + body, "nd", ns, "ndarray")
    K = td.function(nd, inputs=["a", "b"], outputs={"out": lambda a, b: a.shape})

    def twin(a, b):
        return twin_of(torch.stack([case.twin(a[i], b[i]) for i in range(N)]), a)

    return K, twin


def tensors(*arrays):
    return tuple(torch.tensor(a, dtype=torch.float64) for a in arrays)


def close(got, want):
    """Entries agree up to the leaf-scaled tolerance (NOTE: [Tolerance]); ``want`` may be a tensor still on a
    graph (a twin calling a transform keeps create_graph)."""
    g, w = np.asarray(got, dtype=np.float64), as_numpy(want).astype(np.float64)
    assert g.shape == w.shape, f"shape {g.shape}, expected {w.shape}"
    assert_values_close(g, w, "result", rtol=RTOL, atol=ATOL)


@NEVER_PUSHED_FORWARD
@budget.examples(ci=2, share=0.05)
@given(st.data())
def test_field_programs(data):
    room_for_trees()
    case = element_case(data)
    variant = data.draw(st.sampled_from(sorted(APPLY)), label="apply kernel")
    passes = data.draw(st.sampled_from(PASSES), label="passes")
    F, G, loss_twin, z_twin = field_program(case, variant, passes)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    x, w, dx, dw, c = (rng.uniform(-1.5, 1.5, N) for _ in range(5))
    assume_tame(lambda arrays: z_twin(*tensors(*arrays)), [x, w])
    assume_derivatives_defined(z_twin, [x, w])
    with case.checking("field program: value, grad, vjp, jvp, jacobian, hvp"):
        check_program_value(case, F(x, w), loss_twin(*tensors(x, w)),
                            lambda: plain_field_loss(case, x, w, variant, passes), "field program")
        assert_reversed_by_tidiff(F)
        tape = None
        if taichi_reverses(case) and not case.program.reaches_rules \
                and variant not in TAICHI_REFUSES | TAICHI_WRONG:  # Taichi alone first: a crash is Taichi's
            tape = taichi_alone(case, "ti.ad.Tape of the field program",
                                lambda: taichi_tape_gradient(case, x, w, variant, passes))
        arrays = (x, w, dx, dw, c)
        gx, gw, want = unless_the_optimizer_is_at_fault(
            case, lambda: field_program_derivatives((F, G, loss_twin, z_twin), *arrays),
            "field_program_rechecked", variant, passes, *arrays)
        same_as_taichi((gx, gw), tape, want)


def field_program_derivatives(built, x, w, dx, dw, c):
    """Every derivative of a field program against torch's; its gradient and torch's, for the tape's cross-check."""
    F, G, loss_twin, z_twin = built
    _, dz = td.jvp(G, (x, w), (dx, dw))
    close(dz, torch.autograd.functional.jvp(z_twin, tensors(x, w), tensors(dx, dw))[1])
    close(td.jacfwd(G)(x, w), torch.autograd.functional.jacobian(lambda x_: z_twin(x_, tensors(w)[0]), tensors(x)[0]))
    gx, gw = td.grad(F, argnums=(0, 1))(x, w)
    want = torch.autograd.functional.jacobian(loss_twin, tensors(x, w))
    close(gx, want[0])
    close(gw, want[1])
    z, vjp_fn = td.vjp(G, x, w)
    close(z, z_twin(*tensors(x, w)))
    for got, want_c in zip(vjp_fn(c), torch.autograd.functional.vjp(z_twin, tensors(x, w), tensors(c)[0])[1],
                           strict=True):
        close(got, want_c)
    close(td.jacobian(G)(x, w), torch.autograd.functional.jacobian(lambda x_: z_twin(x_, tensors(w)[0]),
                                                                   tensors(x)[0]))
    _, hv = td.hvp(F, (x, w), (dx, dw))
    want_hv = torch.autograd.functional.hvp(loss_twin, tensors(x, w), tensors(dx, dw))[1]
    close(hv[0], want_hv[0])
    close(hv[1], want_hv[1])
    return gx, gw, want


def field_program_rechecked(case: Case, variant: str, passes: str, *arrays) -> None:
    """:func:`field_program_derivatives` of the program built anew (in a process with Taichi's optimizer off)."""
    field_program_derivatives(field_program(case, variant, passes), *arrays)


def unless_the_optimizer_is_at_fault(case: Case, check, again: str, *args):
    """``check()``'s result; where it finds a derivative that differs from torch's, the example is a Taichi pitfall
    (recorded, rejected) if ``again(case, *args)``, a function of this module, agrees with torch with Taichi's
    optimizer off (``unoptimized.py``; long run seed 93014: tidiff's tangent and reverse code of a field program
    miscompiled, right there), else tidiff's failure."""
    try:
        return check()
    except Mismatch as mismatch:
        try:
            agrees = passes_without_optimizer(__name__, again, case, *args)
        except RecheckFailed as failed:
            mismatch.add_note(f"Not rechecked: {failed}")
            raise mismatch from None
        if not agrees:
            raise
        pitfall = TaichiPitfall(f"tidiff's derivatives with Taichi's optimizer off (advanced_optimization=False) "
                                f"agree with torch's: Taichi's optimizer miscompiles the program (NOTE: [Taichi "
                                f"pitfalls] in checks).\n{mismatch}")
        pitfall.add_note(case.report(f"{again}: derivatives with and without the optimizer"))
        record_pitfall(pitfall)
        reject()


@NEVER_PUSHED_FORWARD
@budget.examples(ci=2, share=0.05)
@given(st.data())
def test_ndarray_kernels(data):
    case = element_case(data)
    variant = data.draw(st.sampled_from(sorted(NDARRAY_KERNELS)), label="ndarray kernel")
    K, twin = ndarray_kernel(case, variant)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    a, b, da, db, c = (rng.uniform(-1.5, 1.5, N) for _ in range(5))
    assume_tame(lambda arrays: twin(*tensors(*arrays)), [a, b])
    assume_derivatives_defined(twin, [a, b])
    with case.checking("ndarray kernel: value, jvp, vjp, jacobian, second derivatives"):
        check_program_value(case, K(a, b), twin(*tensors(a, b)), lambda: plain_ndarray_out(case, a, b, variant),
                            "ndarray kernel")
        assert K.adjoint_for(K.specs_for([a, b])) is not None, "tidiff's adjoint transform refused the kernel"
        plain = None
        if taichi_reverses(case) and not case.program.reaches_rules and variant == "one loop":  # Taichi alone
            # first: a crash is Taichi's (its reverse mode of the others breaks its global data access rules)
            plain = taichi_alone(case, "kernel.grad of the ndarray kernel",
                                 lambda: taichi_ndarray_gradient(case, a, b, c))
        arrays = (a, b, da, db, c)
        cts, wants = unless_the_optimizer_is_at_fault(case, lambda: ndarray_kernel_derivatives((K, twin), *arrays),
                                                      "ndarray_kernel_rechecked", variant, *arrays)
        same_as_taichi(cts, plain, wants)


def ndarray_kernel_derivatives(built, a, b, da, db, c):
    """Every derivative of an ndarray kernel against torch's; its vjp and torch's, for kernel.grad's cross-check."""
    K, twin = built
    _, dout = td.jvp(K, (a, b), (da, db))
    close(dout, torch.autograd.functional.jvp(twin, tensors(a, b), tensors(da, db))[1])
    _, vjp_fn = td.vjp(K, a, b)
    cts = vjp_fn(c)
    wants = torch.autograd.functional.vjp(twin, tensors(a, b), tensors(c)[0])[1]
    for got, want in zip(cts, wants, strict=True):
        close(got, want)
    batch = K.read([a, b])  # a torch operator's first-order backward: what the kernel stored read back (NOTE:
    # [Outputs read back])
    event(f"ndarray kernel: outputs read back: {K.read_back_for(batch.specs) is not None}")
    for got, want in zip(K.vjp_from_outputs(batch, K.evaluate(batch), [c]), wants, strict=True):
        close(got, want)
    versions = K.by_version()
    assert (versions[0] if versions else K).memo.peek("reverse verdict") is None, "reverse mode was checked"
    # Jacobians, and second order: the adjoint of the tangent kernel
    jac = td.jacobian(K, argnums=(1, 0))(a, b)
    want = torch.autograd.functional.jacobian(twin, tensors(a, b))
    close(jac[0], want[1])
    close(jac[1], want[0])
    second = td.jacfwd(td.jacrev(K, argnums=0), argnums=0)(a, b)
    bt = tensors(b)[0]
    want = torch.autograd.functional.jacobian(
        lambda a_: torch.autograd.functional.jacobian(lambda a__: twin(a__, bt), a_, create_graph=True),
        tensors(a)[0])
    close(second, want)
    return cts, wants


def ndarray_kernel_rechecked(case: Case, variant: str, *arrays) -> None:
    """:func:`ndarray_kernel_derivatives` of the kernel built anew (in a process with Taichi's optimizer off)."""
    ndarray_kernel_derivatives(ndarray_kernel(case, variant), *arrays)
