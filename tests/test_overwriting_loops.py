"""Kernels drawn as sequences of loops that overwrite, sum and read back what earlier loops wrote, as an ndarray
kernel (reversed with arrays by version, NOTE: [Arrays kept by version]) and as a kernel over fields (run loop by
loop, sums handed on: NOTE: [Sums handed to a later loop]): values, vjp and jvp equal to the same steps in torch,
float64, with no check of reverse mode and no warning."""
import itertools
import linecache
import warnings

import numpy as np
import taichi as ti
import torch
from hypothesis import given, reject
from hypothesis import strategies as st
from taichi.lang import impl

import tidiff as td
from tidiff._fields.twins import TREES_A_PROCESS_HOLDS

N = 6
fx, fy, fz = (ti.field(ti.f64, shape=N) for _ in range(3))

#: One loop each: its body (``{c}`` a constant, ``{s}`` the latest sum), what it does to torch's ``y, z`` (``s`` the
#: latest sum), and whether it needs a sum before it. "sum" starts a new top-level sum.
STEPS = {
    "update": ("y[i] = y[i] * x[i] + {c}", lambda x, y, z, s, c: (y * x + c, z), False),
    "augment": ("y[i] += ti.cos(x[i]) * {c}", lambda x, y, z, s, c: (y + torch.cos(x) * c, z), False),
    "sum": ("{s} += y[i] * y[i] * {c}", None, False),
    "scale": ("y[i] = y[i] / (1.0 + {s})", lambda x, y, z, s, c: (y / (1.0 + s), z), True),
    "neighbour": ("z[i] = z[i] + y[(i + 1) % {n}] * x[i] * {c}",
                  lambda x, y, z, s, c: (y, z + torch.roll(y, -1) * x * c), False),
    "pairs": ("y[2 * i] = y[2 * i] * y[2 * i + 1] + {c}", None, False),  # over half the entries
}
_files = itertools.count()


def render(steps, consts, kind):
    """The kernel's text: an ndarray kernel ``k(x, y, z)`` or a kernel ``k()`` over the fields fx, fy, fz."""
    names = {"x": "x", "y": "y", "z": "z"} if kind == "ndarray" else {"x": "fx", "y": "fy", "z": "fz"}
    sums = [f"s{k}" for k, step in enumerate(steps) if step == "sum"]
    head = ("def k(x: ti.types.ndarray(), y: ti.types.ndarray(), z: ti.types.ndarray()):" if kind == "ndarray"
            else "def k():")
    lines = ["@ti.kernel", head] + [f"    {s} = 0.0" for s in sums]
    lines += ["    for i in range(" + str(N) + "):", "        y[i] = ti.sin(x[i])", "        z[i] = 0.0"]
    latest = None
    for k, (step, c) in enumerate(zip(steps, consts, strict=True)):
        latest = f"s{k}" if step == "sum" else latest
        stop = N // 2 if step == "pairs" else N
        body = STEPS[step][0].format(c=c, s=latest, n=N)
        lines += [f"    for i in range({stop}):", f"        {body}"]
    text = "\n".join(lines) + "\n"
    for name, field in names.items():
        text = text.replace(f"{name}[", f"{field}[")
    return text


def compiled(text, ns):
    filename = f"<overwriting-loops-{next(_files)}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    exec(compile(text, filename, "exec", dont_inherit=True), ns)
    return ns["k"]


def twin(steps, consts):
    def run(x):
        y, z, s = torch.sin(x), torch.zeros_like(x), None
        for step, c in zip(steps, consts, strict=True):
            if step == "sum":
                s = (y * y * c).sum()
            elif step == "pairs":
                even = y[0::2] * y[1::2] + c
                y = torch.stack([even, y[1::2]], 1).reshape(-1)
            else:
                y, z = STEPS[step][1](x, y, z, s, c)
        return torch.cat([y, z])
    return run


@st.composite
def kernels(draw):
    steps = draw(st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=5))
    seen_sum = False
    for k, step in enumerate(steps):  # a scale reads the latest sum: one must come before it
        if STEPS[step][2] and not seen_sum:
            steps[k] = "sum"
        seen_sum |= steps[k] == "sum"
    consts = [draw(st.sampled_from([0.25, 0.5, 1.5])) for _ in steps]
    return steps, consts


def check(f, steps, consts, x, c, t, split):
    reference = twin(steps, consts)
    xt = torch.tensor(x, requires_grad=True)
    want = reference(xt)
    want_vjp = torch.autograd.grad(want, xt, torch.tensor(c))[0].numpy()
    want_jvp = torch.autograd.functional.jvp(reference, xt.detach(), torch.tensor(t))[1].numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        y, pull = td.vjp(f, x)
        got_vjp = pull(split(c))[0]
        _, got_jvp = td.jvp(f, (x,), (t,))
    np.testing.assert_allclose(np.concatenate(y), want.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_vjp, want_vjp, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.concatenate(got_jvp), want_jvp, rtol=1e-10, atol=1e-12)


def halves(c):
    return (c[:N], c[N:])


@given(kernels(), st.integers(0, 2**32 - 1))
def test_ndarray_kernels_overwriting_their_loops_equal_torch(drawn, seed):
    steps, consts = drawn
    k = compiled(render(steps, consts, "ndarray"), {"ti": ti})
    f = td.function(k, inputs=["x"], outputs={"y": lambda x: x.shape, "z": lambda x: x.shape})
    rng = np.random.default_rng(seed)
    x, t = rng.uniform(-1.0, 1.0, N), rng.uniform(-1.0, 1.0, N)
    check(f, steps, consts, x, rng.uniform(-1.0, 1.0, 2 * N), t, halves)
    versions = f.by_version()
    assert (versions[0] if versions else f).memo.peek("reverse verdict") is None


@given(kernels(), st.integers(0, 2**32 - 1))
def test_field_kernels_overwriting_their_loops_equal_torch(drawn, seed):
    if impl.get_runtime().prog.get_snode_tree_size() > TREES_A_PROCESS_HOLDS - 16:
        reject()  # each program holds trees of its own (NOTE: [Trees a process holds])
    steps, consts = drawn
    k = compiled(render(steps, consts, "fields"), {"ti": ti, "fx": fx, "fy": fy, "fz": fz})
    f = td.function(k, inputs=[fx], outputs=[fy, fz])
    rng = np.random.default_rng(seed)
    x, t = rng.uniform(-1.0, 1.0, N), rng.uniform(-1.0, 1.0, N)
    check(f, steps, consts, x, rng.uniform(-1.0, 1.0, 2 * N), t, halves)
    assert f.memo.peek("reverse verdict") is None
