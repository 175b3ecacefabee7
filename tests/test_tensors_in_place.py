"""Tensors computed on where they are (issue 38, item 1; NOTE: [Tensors in place] in tidiff/_arrays.py).

On a CUDA runtime the pointwise kinds give CUDA tensors to their kernels as
they are. The same code runs here on CPU tensors by naming the CPU as a device
whose tensors stay in place (``IN_PLACE``), and the tensors are of a subclass
that fails on every read from the host, as reading a CUDA tensor there would
copy it: a transform that passes here makes no host copy on the GPU either.
Results are compared with the same calls on NumPy arrays (the path that has
always run) and with closed forms in torch.
"""
import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st
from in_place_functions import energy, f, g, pendulum_energy

import tidiff as td
from tidiff import _arrays


class DeviceOnly(torch.Tensor):
    """A CPU tensor that refuses to be read on the host (``.numpy()``, ``.cpu()``, ``.item()``, NumPy)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("numpy", "cpu", "item", "tolist", "__array__"):
            raise AssertionError(f"a tensor in place was read on the host: Tensor.{name}")
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.fixture
def no_host_reads(monkeypatch):
    """Every tensor refuses host reads: inside a torch operator's kernel the dispatcher hands plain tensors, not
    :class:`DeviceOnly` ones."""
    def refuse(name):
        def read(*args, **kwargs):
            raise AssertionError(f"a tensor in place was read on the host: Tensor.{name}")
        return read

    for name in ("numpy", "cpu", "item", "tolist", "__array__"):
        monkeypatch.setattr(torch.Tensor, name, refuse(name))


def device_only(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(DeviceOnly)


def plain(t):
    return t.as_subclass(torch.Tensor).detach().numpy() if isinstance(t, torch.Tensor) else t


@pytest.fixture(autouse=True)
def cpu_tensors_in_place(monkeypatch):
    monkeypatch.setattr(_arrays, "IN_PLACE", {ti.lang.impl.current_cfg().arch.name: "cpu"})


def data(batch=(4, 5)):
    gen = torch.Generator().manual_seed(0)
    return torch.randn(*batch, 3, dtype=torch.float64, generator=gen), torch.tensor(0.7, dtype=torch.float64)


def assert_same(ours, reference):
    assert isinstance(ours, torch.Tensor), type(ours)
    np.testing.assert_allclose(plain(ours), reference, rtol=1e-12, atol=1e-14)


def test_the_switch_keeps_tensors_and_numpy_is_unchanged():
    x, s = data()
    batch = td.function(f).read([device_only(x), device_only(s)])
    assert all(isinstance(a, DeviceOnly) for a in batch.arrays)
    assert batch.shape == (4, 5)
    assert all(isinstance(a, np.ndarray) for a in td.function(f).read([x.numpy(), 0.7]).arrays)


@pytest.mark.parametrize("transform", ["jacfwd", "jacrev", "hessian"])
def test_jacobians_and_hessians(transform):
    x, s = data()
    ours = getattr(td, transform)(f, argnums=(0, 1))(device_only(x), device_only(s))
    reference = getattr(td, transform)(f, argnums=(0, 1))(x.numpy(), 0.7)
    for o, r in zip(ours if transform != "hessian" else [v for row in ours for v in row],
                    reference if transform != "hessian" else [v for row in reference for v in row], strict=True):
        assert_same(o, r)


def test_hessian_written_by_a_blocks_kernel():
    F = torch.eye(3, dtype=torch.float64) + 0.1 * torch.randn(6, 3, 3, dtype=torch.float64,
                                                              generator=torch.Generator().manual_seed(1))
    H = td.hessian(energy)(device_only(F))
    assert H.shape == (6, 3, 3, 3, 3)
    assert_same(H, td.hessian(energy)(F.numpy()))
    value, grads = td.value_and_grad(energy)(device_only(F))
    assert_same(grads, td.grad(energy)(F.numpy()))


def test_grad_value_and_grad_against_torch():
    x, s = data()
    dx, ds = td.grad(f, argnums=(0, 1))(device_only(x), device_only(s))
    ref_dx = 2 * 0.7 * x + torch.nn.functional.pad(torch.cos(x[..., :1]), (0, 2))
    assert_same(dx, ref_dx.numpy())
    assert_same(ds, (x * x).sum(-1).numpy())  # s is broadcast: its gradient per element, as td.grad gives
    value, grads = td.value_and_grad(f)(device_only(x), device_only(s))
    assert_same(value, (0.7 * (x * x).sum(-1) + torch.sin(x[..., 0])).numpy())
    assert_same(grads, ref_dx.numpy())


def test_jvp_vjp_hvp_with_broadcast_arguments():
    x, s = data()
    tx, ts = torch.randn_like(x), torch.tensor(0.3, dtype=torch.float64)
    y, ty = td.jvp(f, (device_only(x), device_only(s)), (device_only(tx), device_only(ts)))
    ry, rty = td.jvp(f, (x.numpy(), 0.7), (tx.numpy(), 0.3))
    assert_same(y, ry)
    assert_same(ty, rty)
    out, vjp_fn = td.vjp(g, device_only(x))
    c = torch.randn(4, 5, 2, dtype=torch.float64)
    (ct,) = vjp_fn(device_only(c))
    rout, rvjp = td.vjp(g, x.numpy())
    assert_same(out, rout)
    assert_same(ct, rvjp(c.numpy())[0])
    y, vjp_f = td.vjp(f, device_only(x), device_only(s))  # a linearized vjp (NOTE: [Linearized vjp])
    dx, ds = vjp_f(device_only(torch.ones(4, 5, dtype=torch.float64)))
    assert_same(ds, (x * x).sum().reshape(()).numpy())  # summed onto the broadcast scalar
    value, (hx, hs) = td.hvp(f, (device_only(x), device_only(s)), (device_only(tx), device_only(ts)))
    rvalue, (rhx, rhs) = td.hvp(f, (x.numpy(), 0.7), (tx.numpy(), 0.3))
    for o, r in ((value, rvalue), (hx, rhx), (hs, rhs)):
        assert_same(o, r)


def test_calls_without_batch_dims_and_float32():
    x = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float32)
    dx = td.grad(f)(device_only(x), device_only(torch.tensor(2.0, dtype=torch.float32)))
    assert dx.dtype == torch.float32 and dx.shape == (3,)
    assert_same(dx, (4 * x + torch.tensor([np.cos(0.5), 0.0, 0.0])).numpy().astype(np.float32))


def test_torch_operator_forward_backward_jvp_and_double_backward(monkeypatch, request):
    x, s = data()
    op = td.torch.function(f)
    xr, sr = device_only(x).requires_grad_(), device_only(s).requires_grad_()
    results = []
    request.getfixturevalue("no_host_reads")
    for _ in range(2):  # the second call runs the launch plan (NOTE: [Launch plans] in tidiff/_torch.py)
        y = op(xr, sr)
        gx, gs = torch.autograd.grad(y.sum(), (xr, sr), create_graph=True)
        results.append((y.detach(), gx.detach(), gs.detach()))
    (gxx,) = torch.autograd.grad(gx.sum(), xr)  # double backward: d/dx of sum(2 s x + cos(x0) e0)
    _, ty = torch.func.jvp(lambda x: op(x, s), (x,), (torch.ones_like(x),))
    monkeypatch.undo()  # the checks below read the results on the host
    for y, gx, gs in results:
        assert_same(y, (0.7 * (x * x).sum(-1) + torch.sin(x[..., 0])).numpy())
        assert_same(gx, (1.4 * x + torch.nn.functional.pad(torch.cos(x[..., :1]), (0, 2))).numpy())
        assert_same(gs, (x * x).sum().reshape(()).numpy())
    assert_same(gxx, (1.4 - torch.nn.functional.pad(torch.sin(x[..., :1]), (0, 2))).numpy())
    assert_same(ty, td.jvp(f, (x.numpy(), 0.7), (np.ones((4, 5, 3)), 0.0))[1])


def test_gradcheck_of_the_operator_in_place():
    op = td.torch.function(g)
    x = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: op(x), (x,))
    assert torch.autograd.gradgradcheck(lambda x: op(x), (x,))


@st.composite
def broadcasting(draw):
    """Batch shapes of x and s that broadcast: s's dims each 1 or x's, right-aligned, possibly fewer."""
    batch = draw(st.lists(st.integers(1, 3), max_size=3))
    keep = draw(st.integers(0, len(batch)))
    s_batch = [draw(st.sampled_from([1, n])) for n in batch[len(batch) - keep:]]
    return tuple(batch), tuple(s_batch)


@given(broadcasting(), st.sampled_from(["jacrev", "jvp", "vjp", "hvp"]))
def test_broadcast_shapes_against_the_numpy_path(shapes, transform):
    x_batch, s_batch = shapes
    gen = torch.Generator().manual_seed(len(x_batch) * 10 + len(s_batch))
    x = torch.randn(x_batch + (3,), dtype=torch.float64, generator=gen)
    s = torch.rand(s_batch, dtype=torch.float64, generator=gen) + 0.5
    tx, ts = torch.randn_like(x), torch.randn_like(s)
    if transform == "jacrev":
        ours, reference = td.jacrev(f, argnums=(0, 1))(device_only(x), device_only(s)), \
            td.jacrev(f, argnums=(0, 1))(x.numpy(), s.numpy())
    elif transform == "jvp":
        ours, reference = td.jvp(f, (device_only(x), device_only(s)), (device_only(tx), device_only(ts))), \
            td.jvp(f, (x.numpy(), s.numpy()), (tx.numpy(), ts.numpy()))
    elif transform == "vjp":
        y, vjp_fn = td.vjp(f, device_only(x), device_only(s))
        c = torch.randn(y.shape, dtype=torch.float64, generator=gen)
        ry, rvjp = td.vjp(f, x.numpy(), s.numpy())
        ours, reference = (y, *vjp_fn(device_only(c))), (ry, *rvjp(c.numpy()))
    else:
        value, hv = td.hvp(f, (device_only(x), device_only(s)), (device_only(tx), device_only(ts)))
        rvalue, rhv = td.hvp(f, (x.numpy(), s.numpy()), (tx.numpy(), ts.numpy()))
        ours, reference = (value, *hv), (rvalue, *rhv)
    for o, r in zip(ours, reference, strict=True):
        assert tuple(o.shape) == np.shape(r)
        assert_same(o, r)


# -- field programs: loaded from the tensors and read into tensors on the device, no NumPy -----------------------
xf = ti.field(ti.f64, shape=16)
wf = ti.field(ti.f64, shape=())
target = ti.field(ti.f64, shape=16)  # read by the program besides its inputs
loss = ti.field(ti.f64, shape=())
pos = ti.Vector.field(2, ti.f64, shape=(3, 4))  # an input that is a part of a field: pos[0]
spread = ti.field(ti.f64, shape=())


@ti.kernel
def energy_of_fields():
    for i in xf:
        loss[None] += wf[None] * (xf[i] - target[i]) ** 2 + ti.sin(xf[i]) * wf[None] ** 2


@ti.kernel
def spread_of_rows():
    for j in range(4):
        spread[None] += (pos[0, j] - pos[1, j]).norm_sqr()


E = td.function(energy_of_fields, inputs=[xf, wf], outputs=[loss])
S = td.function(spread_of_rows, inputs=[td.part(pos, 0)], outputs=[spread])


def test_field_programs_on_tensors_in_place():
    target.from_numpy(np.linspace(-1.0, 1.0, 16))
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(16, dtype=torch.float64, generator=gen), torch.tensor(0.8, dtype=torch.float64)
    tx, tw = torch.randn_like(x), torch.tensor(0.3, dtype=torch.float64)
    xn, wn, txn, twn = x.numpy(), w.numpy(), tx.numpy(), tw.numpy()
    on, of = (device_only(x), device_only(w)), (xn, wn)
    pairs = [
        (E(*on), E(*of)),
        *zip(td.grad(E, argnums=(0, 1))(*on), td.grad(E, argnums=(0, 1))(*of), strict=True),
        (td.hessian(E)(*on), td.hessian(E)(*of)),
        *zip(td.jvp(E, on, (device_only(tx), device_only(tw))), td.jvp(E, of, (txn, twn)), strict=True),
        *zip(td.hvp(E, on, (device_only(tx), device_only(tw)))[1], td.hvp(E, of, (txn, twn))[1], strict=True),
    ]
    y, vjp_fn = td.vjp(E, *on)
    ry, rvjp = td.vjp(E, *of)
    pairs += [(y, ry), *zip(vjp_fn(device_only(torch.tensor(2.0, dtype=torch.float64))), rvjp(np.array(2.0)),
                            strict=True)]
    rows = torch.randn(4, 2, dtype=torch.float64, generator=gen)
    pos.from_numpy(np.arange(24.0).reshape(3, 4, 2) / 10)
    pairs += [(td.grad(S)(device_only(rows)), td.grad(S)(rows.numpy()))]
    for ours, reference in pairs:
        assert_same(ours, reference)


def test_field_program_operator_on_tensors_in_place(monkeypatch, request):
    target.from_numpy(np.zeros(16))
    op = td.torch.function(E)
    x = device_only(torch.linspace(-1.0, 1.0, 16, dtype=torch.float64)).requires_grad_()
    w = device_only(torch.tensor(0.5, dtype=torch.float64)).requires_grad_()
    request.getfixturevalue("no_host_reads")
    results = [torch.autograd.grad(op(x, w), (x, w)) for _ in range(2)]
    monkeypatch.undo()
    xd = x.detach()
    for gx, gw in results:
        assert_same(gx, plain(2 * 0.5 * xd + torch.cos(xd) * 0.25))
        assert_same(gw, plain(((xd ** 2).sum() + 2 * 0.5 * torch.sin(xd).sum()).reshape(())))


# -- time loops: the carry moves between fields; arguments and results are tensors on the device ----------------
@ti.func
def damped(x: ti.math.vec2, k: ti.f64) -> ti.math.vec2:
    return ti.Vector([x[0] + 0.01 * x[1], x[1] - 0.01 * k * ti.sin(x[0])])


def test_time_loops_on_tensors_in_place():
    F = pendulum_energy(4, length=50)
    x0, v0, k = torch.linspace(0.1, 1.0, 4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64), \
        torch.tensor(2.0, dtype=torch.float64)
    td.value_and_grad(F, argnums=(0, 2))(x0, v0, k)  # the first vjp checks the step's reverse mode on the host, once
    value, grads = td.value_and_grad(F, argnums=(0, 2))(device_only(x0), device_only(v0), device_only(k))
    rvalue, rgrads = td.value_and_grad(F, argnums=(0, 2))(x0.numpy(), v0.numpy(), 2.0)
    pairs = [(value, rvalue), *zip(grads, rgrads, strict=True)]
    loop = td.scan(td.function(damped), length=30)
    state = torch.tensor([0.3, -0.5], dtype=torch.float64)
    td.jacrev(loop)(state, k)
    pairs += [(loop(device_only(state), device_only(k)), loop(state.numpy(), 2.0)),
              (td.jacrev(loop)(device_only(state), device_only(k)), td.jacrev(loop)(state.numpy(), 2.0))]
    for ours, reference in pairs:
        assert_same(ours, reference)
