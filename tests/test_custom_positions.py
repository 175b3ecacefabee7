"""Calls of td.custom_jvp / td.custom_vjp functions in every syntactic position, through every transform.

A call's position (bound to a name, an augmented assignment, inside an
expression, a loop body, a branch, the return value, nested in another call,
inside a helper, tuple-unpacked) decides which path of the transforms takes
it: ``y = c(x)`` went to the widened tangent call of a tidiff Function instead
of the rule, and failed at second order (NOTE: [Custom rules wherever called]
in ``_tangent/transform``). Each position is a template over one call
``{C}...{E}`` of a custom function, rendered to a ``@ti.func`` and to its
torch twin; jvp, grad, jacfwd, jacrev and hessian are compared with
``torch.autograd.functional`` on the host, and the same transforms called
inside a kernel with the host's results.

``marked`` and ``marked3`` (custom_jvp rules giving twice the true
derivative) prove the rule is what runs: its twin is a ``torch.autograd.Function`` with the same
rule. Its second derivatives differentiate the rule's own code (as in JAX),
which its twin's backward does not repeat, so it is checked to first order.
"""

import re
import textwrap
from dataclasses import dataclass

import numpy as np
import pytest
import taichi as ti
import torch
from conformance.render_taichi import compile_text
from custom_functions import energy, energy_twin, softsign, softsign_twin, squash, squash_twin, swirl, swirl_twin

import tidiff as td

F64 = torch.float64
vec2, vec3 = ti.types.vector(2, ti.f64), ti.types.vector(3, ti.f64)


# -- the custom functions: softsign, swirl, squash, energy (custom_functions) and marked, marked3 here -----
@td.custom_jvp
@ti.func
def marked(x: ti.f64) -> ti.f64:
    return ti.sin(x)


@marked.defjvp
@ti.func
def _marked_jvp(x, dx):
    return ti.sin(x), 2.0 * ti.cos(x) * dx  # twice the true derivative: only the rule gives these numbers


@td.custom_jvp
@ti.func
def marked3(x: vec3) -> vec3:
    return ti.sin(x)


@marked3.defjvp
@ti.func
def _marked3_jvp(x, dx):
    return ti.sin(x), 2.0 * ti.cos(x) * dx


class _MarkedTwin(torch.autograd.Function):
    """``sin`` with the derivative ``2 cos``, as ``marked``'s rule says (first order)."""

    @staticmethod
    def forward(x):
        return torch.sin(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, ct):
        (x,) = ctx.saved_tensors
        return 2.0 * torch.cos(x) * ct


def _squash_matrix(s):
    return torch.stack([torch.stack([s, 0.5 + 0.0 * s]), torch.stack([-0.3 + 0.0 * s, s * s])])


TWINS = {
    "softsign": softsign_twin,
    "swirl": swirl_twin,
    "squash": squash_twin,
    "energy": energy_twin,
    "marked": _MarkedTwin.apply,
    "marked3": _MarkedTwin.apply,
    "_squash_matrix": _squash_matrix,
}


@dataclass(frozen=True)
class Custom:
    """How a position's ``{C}X{E}`` is spelled for one custom function, whose operand X has ``shape``."""

    shape: tuple
    taichi: tuple  # (before the operand, after it)
    torch: tuple
    forward: bool = True  # has a jvp rule
    second_order: bool = True  # its twin's second derivatives are the rule's


CUSTOMS = {
    "softsign": Custom((), ("softsign(", ")"), ("softsign(", ")")),
    "swirl": Custom((3,), ("swirl(", ", s)"), ("swirl(", ", s)")),
    "squash": Custom((2,), ("squash(ti.Matrix([[s, 0.5], [-0.3, s * s]]), ", ")"),
                     ("squash(_squash_matrix(s), ", ")")),
    "energy": Custom((), ("energy(ti.Vector([", ", s]), s)"), ("energy(torch.stack([", ", s]), s)"), forward=False),
    "marked": Custom((), ("marked(", ")"), ("marked(", ")"), second_order=False),
    "marked3": Custom((3,), ("marked3(", ")"), ("marked3(", ")"), second_order=False),
}

HELPERS = '''
@ti.func
def helper(a, b):
    return a * b + a


@ti.func
def inner(x, s):
    y = {C}x{E}
    return y + x


@ti.func
def pair(x, s):
    return {C}x{E}, x * s
'''

POSITIONS = {
    # name: (body defining what the result reads, the returned expression)
    "bound": ("y = {C}x{E}\nv = y * s + x", "v"),
    "bound_twice": ("y = {C}x{E}\ny = {C}y{E}", "y"),
    "aug_add": ("v = x * s\nv += {C}x{E}", "v"),
    "aug_sub": ("v = x * s\nv -= {C}x * s{E}", "v"),
    "aug_mul": ("v = x + 0.5\nv *= {C}x{E}", "v"),
    "expression": ("", "2.0 * {C}x{E} - x * s"),
    "range_loop": ("v = x\nfor i in range(2):\n    v = {C}v{E} * (i + 1.0)", "v"),
    "static_loop": ("v = x * s\nfor i in ti.static(range(2)):\n    v += {C}v * 0.5{E}", "v"),
    "while_loop": ("v = x\nj = 0\nwhile j < 2:\n    v = {C}v{E} + x\n    j += 1", "v"),
    "branch": ("v = x * s\nif s > 0.0:\n    v = {C}x{E} * s\nelse:\n    v = {C}x * s{E}", "v"),
    "branch_else": ("v = x * s\nif s < 0.0:\n    v = x * x\nelse:\n    v = {C}v{E} + x", "v"),
    "return": ("", "{C}x * s{E}"),
    "nested_op": ("", "ti.sin({C}ti.tanh(x){E})"),
    "nested_custom": ("", "{C}{C}x{E}{E}"),
    "nested_helper": ("", "helper({C}x{E}, s)"),
    "in_helper": ("", "inner(x, s) * s"),
    "tuple_unpack": ("a, b = {C}x{E}, x * s\nv = a * b + a", "v"),
    "tuple_from_helper": ("a, b = pair(x, s)\nv = a * b", "v"),
    "tuple_swap": ("a, b = x, {C}x{E}\na, b = b, a", "a * s + b"),
}

NOT_REVERSIBLE: tuple[str, ...] = ()
"""Positions the reverse transform does not take (none since it takes branches on values and while loops):
code that reaches a custom_vjp function without a jvp rule there would have no derivative in either mode."""

WEIGHTS = {(): "1.3", (2,): "[1.3, -0.7]", (3,): "[1.3, -0.7, 0.4]"}


def _fill(template: str, spelling: tuple) -> str:
    return template.replace("{C}", spelling[0]).replace("{E}", spelling[1])


def _to_torch(text: str) -> str:
    """Taichi spelling -> torch spelling of the templates' few constructs."""
    for taichi, torch_ in (("ti.static(range(", "range(("), ("ti.sin(", "torch.sin("), ("ti.tanh(", "torch.tanh(")):
        text = text.replace(taichi, torch_)
    text = re.sub(r"^(\s*)(\w+) ([-+*])= (.*)$", r"\1\2 = \2 \3 (\4)", text, flags=re.M)  # no in-place ops
    text = text.replace(") -> ti.f64:", "):")
    return re.sub(r"^@ti\.func\n", "", text, flags=re.M)


def _source(position: str, custom: Custom, spelling: tuple, annotations: bool) -> str:
    body, result = (_fill(t, spelling) for t in POSITIONS[position])
    x_type = {(): "ti.f64", (2,): "vec2", (3,): "vec3"}[custom.shape]
    sig = f"x: {x_type}, s: ti.f64" if annotations else "x, s"
    weights = WEIGHTS[custom.shape]
    weigh = "1.3 * v" if custom.shape == () else f"v.dot(ti.Vector({weights}))"
    pad = lambda lines: textwrap.indent(lines, "    ") + "\n" if lines else ""  # noqa: E731
    return (_fill(HELPERS, spelling) + f"\n\n@ti.func\ndef weigh(v):\n    return {weigh}\n\n\n"
            f"@ti.func\ndef f({sig}):\n{pad(body)}    return {result}\n\n\n"
            f"@ti.func\ndef g({sig}) -> ti.f64:\n{pad(body)}    return weigh({result})\n")


def _torch_weigh(shape):
    if shape == ():
        return lambda v: 1.3 * v
    w = torch.tensor(eval(WEIGHTS[shape]), dtype=F64)
    return lambda v: (v * w).sum()


def build(position: str, name: str):
    """(f, g, f_twin, g_twin) for a position and a custom function."""
    custom = CUSTOMS[name]
    ns = {"ti": ti, "td": td, "vec2": vec2, "vec3": vec3, "softsign": softsign, "swirl": swirl, "squash": squash,
          "energy": energy, "marked": marked, "marked3": marked3}
    text = _source(position, custom, custom.taichi, annotations=True)
    compile_text(text, "f", ns, f"position-{position}-{name}")
    twin_ns = {"torch": torch, **TWINS}
    twin_text = _to_torch(_source(position, custom, custom.torch, annotations=False))
    compile_text(twin_text, "f", twin_ns, f"position-twin-{position}-{name}")
    twin_ns["weigh"] = _torch_weigh(custom.shape)  # replaces the Taichi spelling's weigh
    return ns["f"], ns["g"], twin_ns["f"], twin_ns["g"]


# -- the oracle ---------------------------------------------------------------------------------


def _t(a):
    return torch.tensor(np.asarray(a, dtype=np.float64), dtype=F64)


def _np(tree):
    if isinstance(tree, (tuple, list)):
        return tuple(_np(t) for t in tree)
    return tree.detach().numpy()


def _close(got, want, what):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), f"{what}: structure {got!r}"
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            _close(g, w, f"{what}[{k}]")
        return
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-12, err_msg=what)


def _inputs(custom: Custom):
    rng = np.random.default_rng(7)
    x = rng.uniform(-0.9, 0.9, custom.shape)
    return x, 0.6, rng.uniform(-1.0, 1.0, custom.shape), -0.4


def _host_results(f, g, x, s, dx, ds):
    """What each transform gives on the host (a TransformError in place of a result where it raises)."""
    results = {}
    calls = {
        "jvp": lambda: td.jvp(f, (x, s), (dx, ds)),
        "jacfwd": lambda: td.jacfwd(f, argnums=(0, 1))(x, s),
        "jacrev": lambda: td.jacrev(f, argnums=(0, 1))(x, s),
        "grad": lambda: td.grad(g, argnums=(1, 0))(x, s),
        "hessian": lambda: td.hessian(g, argnums=(0, 1))(x, s),
    }
    for kind, call in calls.items():
        try:
            results[kind] = call()
        except td.TransformError as e:
            results[kind] = e
    return results


def _torch_results(f_twin, g_twin, x, s, dx, ds):
    xt, st_ = _t(x), _t(s)
    jvp = torch.autograd.functional.jvp(f_twin, (xt, st_), (_t(dx), _t(ds)))
    jac = torch.autograd.functional.jacobian(f_twin, (xt, st_))
    gx, gs = torch.autograd.functional.jacobian(g_twin, (xt, st_))
    hess = torch.autograd.functional.hessian(g_twin, (xt, st_))
    return {"jvp": _np(jvp), "jacfwd": _np(tuple(jac)), "jacrev": _np(tuple(jac)), "grad": _np((gs, gx)),
            "hessian": _np(tuple(tuple(row) for row in hess))}


FORWARD_KINDS = ("jvp", "jacfwd")  # hessian pushes tangents through the gradient's code (as in JAX): defined


def _expected_error(name: str, position: str, kind: str) -> bool:
    """Whether the transform must refuse (td.TransformError) rather than give a number."""
    custom = CUSTOMS[name]
    if custom.forward:
        return False
    return kind in FORWARD_KINDS or position in NOT_REVERSIBLE


CASES = [(p, c) for p in POSITIONS for c in CUSTOMS]


@pytest.mark.parametrize("position,name", CASES, ids=[f"{p}-{c}" for p, c in CASES])
def test_custom_call_position_on_the_host(position, name):
    f, g, f_twin, g_twin = build(position, name)
    x, s, dx, ds = _inputs(CUSTOMS[name])
    got = _host_results(f, g, x, s, dx, ds)
    want = _torch_results(f_twin, g_twin, x, s, dx, ds)
    _close(td.function(f)(x, s), want["jvp"][0], "value")
    for kind in got:
        if _expected_error(name, position, kind):
            assert isinstance(got[kind], td.TransformError), f"{kind}: expected a td.TransformError, got {got[kind]!r}"
            continue
        if isinstance(got[kind], Exception):
            raise got[kind]
        if kind == "hessian" and not CUSTOMS[name].second_order:
            continue
        _close(got[kind], want[kind], kind)


# -- inside a kernel ----------------------------------------------------------------------------

KERNEL_CALLS = {
    "jvp": "td.jvp(f, (x[b], s[b]), (dx[b], ds[b]))",
    "jacfwd": "td.jacfwd(f, argnums=(0, 1))(x[b], s[b])",
    "jacrev": "td.jacrev(f, argnums=(0, 1))(x[b], s[b])",
    "grad": "td.grad(g, argnums=(1, 0))(x[b], s[b])",
    "hessian": "td.hessian(g, argnums=(0, 1))(x[b], s[b])",
}


def _leaves(tree, path=()):
    if isinstance(tree, tuple):
        return [leaf for k, t in enumerate(tree) for leaf in _leaves(t, path + (k,))]
    return [(path, np.asarray(tree))]


def _ndarray_type(shape):
    element = ti.f64 if shape == () else (ti.types.vector(shape[0], ti.f64) if len(shape) == 1
                                          else ti.types.matrix(*shape, ti.f64))
    return ti.types.ndarray(dtype=element, ndim=1)


def _kernel(kinds, want, x_shape):
    """A kernel applying each transform per element and writing every leaf of its result to an ndarray."""
    ns = {"ti": ti, "td": td}
    params, lines = [], []
    for name, shape in (("x", x_shape), ("s", ()), ("dx", x_shape), ("ds", ())):
        ns[f"T_{name}"] = _ndarray_type(shape)
        params.append(f"{name}: T_{name}")
    outputs = []
    for kind in kinds:
        lines.append(f"        r_{kind} = {KERNEL_CALLS[kind]}")
        for path, leaf in _leaves(want[kind]):
            out = f"o{len(outputs)}"
            ns[f"T_{out}"] = _ndarray_type(leaf.shape)
            params.append(f"{out}: T_{out}")
            lines.append(f"        {out}[b] = r_{kind}" + "".join(f"[{k}]" for k in path))
            outputs.append((kind, path, leaf.shape))
    text = "\n".join(["@ti.kernel", f"def run({', '.join(params)}):", "    for b in range(x.shape[0]):", *lines])
    return text + "\n", ns, outputs


@pytest.mark.parametrize("position,name", CASES, ids=[f"{p}-{c}" for p, c in CASES])
def test_custom_call_position_in_a_kernel(position, name):
    """Every transform the host takes, called per element inside one kernel, against torch per element."""
    f, g, f_twin, g_twin = build(position, name)
    custom = CUSTOMS[name]
    rng = np.random.default_rng(11)
    points = [(rng.uniform(-0.9, 0.9, custom.shape), s, rng.uniform(-1, 1, custom.shape), ds)
              for s, ds in ((0.6, -0.4), (-0.5, 0.3))]
    kinds = [k for k in KERNEL_CALLS if not _expected_error(name, position, k)
             and (k != "hessian" or custom.second_order)]
    if not kinds:
        return
    wants = [_torch_results(f_twin, g_twin, *p) for p in points]
    text, ns, outputs = _kernel(kinds, wants[0], custom.shape)
    ns.update(f=f, g=g)
    run = compile_text(text, "run", ns, f"position-kernel-{position}-{name}")
    columns = [np.stack([np.asarray(p[k], dtype=np.float64) for p in points]) for k in range(4)]
    results = [np.zeros((len(points),) + shape) for _, _, shape in outputs]
    run(*columns, *results)
    for (kind, path, _), got in zip(outputs, results, strict=True):
        for b, want in enumerate(wants):
            leaf = dict(_leaves(want[kind]))[path]
            _close(got[b], leaf, f"in-kernel {kind}{list(path)} at element {b}")
