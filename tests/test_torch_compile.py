"""td.torch.function operators in the PyTorch 2 stack (issue 14): torch.library, torch.compile, torch.export.

One model uses an operator of every kind (a ``@ti.func``, a field program, an
ndarray kernel); compiled with ``fullgraph=True`` (a graph break is an error)
it gives the eager values and gradients. The oracle of eager itself is
tests/test_torch.py and tests/test_ndarray.py (gradcheck, torch formulas).
"""
import gc
import subprocess
import sys
import weakref

import pytest
import taichi as ti
import torch
from child_env import child_env
from ndarray_kernels import EPS, causal_conv  # the squared causal convolution
from ndarray_kernels import conv_torch as causal_torch

import tidiff as td

F64 = torch.float64


@ti.func
def energy(x: ti.math.vec3, s: ti.f64) -> ti.f64:
    return s * x.dot(x) + ti.sin(x[0]) * ti.exp(s * x[1])


def energy_torch(x, s):
    return s * (x * x).sum(-1) + torch.sin(x[..., 0]) * torch.exp(s * x[..., 1])


@ti.func
def pair(x: ti.math.vec2, s: ti.f64):
    return ti.tanh(x * s), x.dot(x) * s


field_x = ti.field(ti.f64, shape=5)
field_w = ti.field(ti.f64, shape=())
field_loss = ti.field(ti.f64, shape=())


@ti.kernel
def cubic():
    for i in field_x:
        field_loss[None] += field_w[None] * field_x[i] ** 3


energy_op = td.torch.function(energy)
pair_op = td.torch.function(pair)
cubic_op = td.torch.function(cubic, inputs=[field_x, field_w], outputs=[field_loss])
causal_op = td.torch.function(causal_conv, inputs=["k", "w"], outputs={"out": lambda k, w: k.shape},
                              constants={"eps": EPS}, name="causal")  # its own name in td.cache_info()


class Model(torch.nn.Module):
    """A linear layer feeding every kind of operator; the loss sums them."""

    def __init__(self, ops):
        super().__init__()
        self.energy, self.pair, self.cubic, self.causal = ops
        g = torch.Generator().manual_seed(0)
        self.lin = torch.nn.Linear(4, 3, dtype=F64)
        with torch.no_grad():
            self.lin.weight.copy_(0.5 * torch.randn(3, 4, dtype=F64, generator=g))
            self.lin.bias.copy_(0.1 * torch.randn(3, dtype=F64, generator=g))
        self.s = torch.nn.Parameter(torch.tensor(0.3, dtype=F64))
        self.w = torch.nn.Parameter(0.3 * torch.randn(2, 1, 5, dtype=F64, generator=g))

    def forward(self, x):
        h = torch.tanh(self.lin(x))                           # (8, 3)
        a, b = self.pair(h[:, :2], self.s)
        loss = self.energy(h, self.s).sum() + self.energy(h, 2.0).mean() + a.sum() + b.sum()
        loss = loss + self.cubic(h[:5, 0], self.s)           # no batch dims: the field's shape
        k = h[:4, :2].T.reshape(1, 2, 4).expand(2, 2, 4)
        return loss + self.causal(torch.cat([k, k[..., :1]], -1), self.w).sum()


reference_ops = (energy_torch, lambda x, s: (torch.tanh(x * s[..., None]), (x * x).sum(-1) * s),
                 lambda x, w: w * (x**3).sum(), causal_torch)


def _x(seed=1):
    return torch.randn(8, 4, dtype=F64, generator=torch.Generator().manual_seed(seed))


def _values_and_gradients(model, x):
    model.zero_grad()
    loss = model(x)
    loss.backward()
    return [loss.detach()] + [p.grad.clone() for p in model.parameters()]


def test_eager_model_matches_torch_formulas():
    ours, theirs = Model((energy_op, pair_op, cubic_op, causal_op)), Model(reference_ops)
    for a, b in zip(_values_and_gradients(ours, _x()), _values_and_gradients(theirs, _x()), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_model_fullgraph_matches_eager(backend):
    model = Model((energy_op, pair_op, cubic_op, causal_op))
    eager = _values_and_gradients(model, _x())
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    for seed in (1, 2):  # a second call reuses the compiled graph
        for a, b in zip(_values_and_gradients(compiled, _x(seed)), _values_and_gradients(model, _x(seed)),
                        strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert eager[0] == _values_and_gradients(compiled, _x())[0]


def test_compiled_graph_holds_one_node_per_call():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(lambda x, s: energy_op(x, s).sum() + energy_op(x, s).mean(), backend=backend,
                             fullgraph=True)
    x = torch.randn(6, 3, dtype=F64)
    torch.testing.assert_close(compiled(x, torch.tensor(0.5, dtype=F64)),
                               energy_torch(x, 0.5).sum() + energy_torch(x, 0.5).mean(), rtol=1e-12, atol=1e-12)
    (gm,) = graphs
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is energy_op.op]
    assert len(calls) == 2


def test_export_forward_pass():
    model = Model((energy_op, pair_op, cubic_op, causal_op))
    x = _x()
    exported = torch.export.export(model, (x,))
    targets = {n.target for n in exported.graph.nodes if n.op == "call_function"}
    assert {energy_op.op, pair_op.op, cubic_op.op, causal_op.op} <= targets
    torch.testing.assert_close(exported.module()(_x(3)), model(_x(3)), rtol=1e-12, atol=1e-12)


def test_fake_kernel_gives_shapes_and_dtypes_without_taichi():
    from torch._subclasses.fake_tensor import FakeTensorMode

    calls = td.cache_info()[causal_op.fn.name].calls
    with FakeTensorMode():
        k, w = torch.empty(3, 2, 7, dtype=torch.float32), torch.empty(2, 1, 7, dtype=torch.float32)
        (out,) = causal_op.op([k, w])
        x32 = torch.empty(9, 1, 3, dtype=torch.float32)
        (e,) = energy_op.op([x32, torch.empty(1, 4, dtype=torch.float32)])
    assert out.shape == (3, 2, 7) and out.dtype == torch.float32
    assert e.shape == (9, 4) and e.dtype == torch.float32
    assert td.cache_info()[causal_op.fn.name].calls == calls


@pytest.mark.parametrize("which", ["pointwise", "two outputs", "field program", "ndarray kernel"])
def test_opcheck(which):
    """torch.library.opcheck: schema, fake kernel against the real one, autograd registration, AOT dispatch."""
    g = torch.Generator().manual_seed(4)

    def r(*shape):
        return torch.randn(shape, dtype=F64, generator=g).requires_grad_()

    op, args = {
        "pointwise": (energy_op, [r(4, 3), r()]),
        "two outputs": (pair_op, [r(3, 2), r(3)]),
        "field program": (cubic_op, [r(5), r()]),
        "ndarray kernel": (causal_op, [r(2, 2, 5), r(2, 1, 5)]),
    }[which]
    torch.library.opcheck(op.op, (args,))


def test_dynamic_shapes():
    """Batch dims of a pointwise operator stay symbolic; an ndarray kernel's shapes are specialized
    (NOTE: [Symbolic shapes] in tidiff/_torch.py): both give the right values at every size."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, k, w: (energy_op(x, 0.5), causal_op(k, w)), backend="aot_eager",
                             fullgraph=True, dynamic=True)
    for n in (3, 5, 8):
        x = torch.randn(n, 2, 3, dtype=F64)
        k, w = torch.randn(2, 3, n, dtype=F64), torch.randn(3, 1, n, dtype=F64)
        e, c = compiled(x, k, w)
        torch.testing.assert_close(e, energy_torch(x, 0.5), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(c, causal_torch(k, w), rtol=1e-12, atol=1e-12)


def _throwaway_operator(i):
    import types

    def template(x: ti.f64, y: ti.f64) -> ti.f64:
        return ti.sin(x) * y + x * x

    fresh = types.FunctionType(template.__code__, globals(), f"throwaway_op_{i}")
    fresh.__annotations__ = dict(template.__annotations__)
    return td.torch.function(ti.func(fresh))


def test_operators_live_as_long_as_their_function():
    """NOTE: [Operator lifetime]: the dispatcher holds kernels, not the Function; once the Function is
    gone its operator is deregistered. (A Function that ran keeps living in the kernels Taichi
    compiled, which Taichi keeps for the life of the process.)"""
    ops = [_throwaway_operator(i) for i in range(20)]
    names = [f"tidiff::{op.operator.name}" for op in ops]
    refs = [weakref.ref(op.fn) for op in ops]
    assert all(_registered(name) for name in names)
    del ops
    gc.collect()
    assert not any(ref() is not None for ref in refs)
    assert not any(_registered(name) for name in names)


def _registered(qualname):
    try:
        torch._C._dispatch_find_schema_or_throw(qualname, "")
    except RuntimeError:
        return False
    return True


CACHED_COMPILE = """
import taichi as ti, torch
ti.init(arch=ti.cpu, default_fp=ti.f64, offline_cache=True, log_level=ti.ERROR)
import tidiff as td

@ti.func
def f(x: ti.math.vec3, s: ti.f64) -> ti.f64:
    return s * x.dot(x) + ti.sin(x[0])

op = td.torch.function(f)
compiled = torch.compile(lambda x: op(x, 0.5).sum(), backend="inductor", fullgraph=True)
x = torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(4, 3).requires_grad_()
compiled(x).backward()
expected = 0.5 * 2 * x.detach()
expected[:, 0] += torch.cos(x.detach()[:, 0])
torch.testing.assert_close(x.grad, expected, rtol=1e-12, atol=1e-12)
print("ok")
"""


def test_compiled_graphs_are_not_loaded_from_another_process(tmp_path):
    """NOTE: [Operator names]: a second process with the same Inductor cache compiles its own graph,
    whose backward names its own operators (with names reused across processes it died with
    "'_OpNamespace' 'tidiff' object has no attribute 'vjp_fn_..."')."""
    env = child_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path))
    script = tmp_path / "cached_compile.py"  # Taichi reads a @ti.func's source from its file
    script.write_text(CACHED_COMPILE)
    for _ in range(2):
        run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
        assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-3000:]
