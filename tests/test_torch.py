"""td.torch.function: tidiff Functions as torch autograd operators (API.md 5)."""
import subprocess
import sys

import pytest
import taichi as ti
import torch

import tidiff as td

F64 = torch.float64


@ti.func
def f(x: ti.math.vec3, s: ti.f64) -> ti.f64:
    return s * x.dot(x) + ti.sin(x[0]) * ti.exp(s * x[1])


def f_torch(x, s):
    return s * (x * x).sum(-1) + torch.sin(x[..., 0]) * torch.exp(s * x[..., 1])


@ti.func
def two_outputs(x: ti.math.vec2, s: ti.f64):
    return ti.tanh(x * s), x.dot(x) * s


def two_outputs_torch(x, s):
    return torch.tanh(x * s[..., None]), (x * x).sum(-1) * s


op = td.torch.function(f)


def _rand(*shape, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, dtype=F64, generator=g).requires_grad_(grad)


def test_forward_matches_and_stays_a_tensor():
    x, s = _rand(5, 3), _rand(seed=1)
    y = op(x, s)
    assert isinstance(y, torch.Tensor) and y.shape == (5,) and y.dtype == F64 and y.device == x.device
    torch.testing.assert_close(y, f_torch(x, s), rtol=1e-12, atol=1e-12)
    assert y.requires_grad


def test_gradcheck_forward_ad_and_gradgradcheck():
    x, s = _rand(4, 3), _rand(seed=1)
    assert torch.autograd.gradcheck(op, (x, s), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(op, (x, s))


def test_two_outputs_gradcheck_and_gradgradcheck():
    g = td.torch.function(two_outputs)
    x, s = _rand(3, 2), _rand(3, seed=2)
    a, b = g(x, s)
    ra, rb = two_outputs_torch(x, s)
    torch.testing.assert_close(a, ra, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(b, rb, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(g, (x, s), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(g, (x, s))


def test_backward_counts_gradients_once_and_accumulates_like_torch():
    x, s = _rand(6, 3), _rand(seed=1)
    xr, sr = x.detach().clone().requires_grad_(), s.detach().clone().requires_grad_()
    op(x, s).sum().backward()
    f_torch(xr, sr).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s.grad, sr.grad, rtol=1e-12, atol=1e-12)
    op(x, s).sum().backward()  # a second backward adds, as torch does: exactly twice
    torch.testing.assert_close(x.grad, 2 * xr.grad, rtol=1e-12, atol=1e-12)


def test_python_number_and_float32_arguments():
    x = _rand(4, 3).float().detach().requires_grad_()
    y = op(x, 0.5)
    assert y.dtype == F64  # a @ti.func computes in the default float
    y.sum().backward()
    assert x.grad.dtype == torch.float32
    xr = x.detach().double().requires_grad_()
    f_torch(xr, torch.tensor(0.5, dtype=F64)).sum().backward()
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=1e-6, atol=1e-6)


def test_no_grad_allocates_nothing():
    x, s = _rand(4, 3), _rand(seed=1)
    with torch.no_grad():
        y = op(x, s)
    assert not y.requires_grad
    assert x.grad is None and s.grad is None


def test_inputs_are_not_mutated():
    x, s = _rand(4, 3), _rand(seed=1)
    before = x.detach().clone()
    op(x, s).sum().backward()
    assert torch.equal(x.detach(), before)


def test_torch_func_transforms():
    x, s = _rand(3, grad=False), torch.tensor(0.7, dtype=F64)
    for transform in (torch.func.grad, torch.func.jacrev, torch.func.jacfwd):
        torch.testing.assert_close(transform(op)(x, s), transform(f_torch)(x, s), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        torch.func.hessian(op)(x, s),
        torch.autograd.functional.hessian(lambda v: f_torch(v, s), x),
        rtol=1e-10, atol=1e-12,
    )
    torch.testing.assert_close(
        torch.func.jacrev(op, argnums=1)(x, s), torch.func.jacrev(f_torch, argnums=1)(x, s), rtol=1e-12, atol=1e-12
    )


def test_vmap_batches_in_one_call_and_broadcasts():
    xs, s = _rand(5, 4, 3, grad=False), torch.tensor(0.7, dtype=F64)
    torch.testing.assert_close(torch.func.vmap(op, in_dims=(0, None))(xs, s), f_torch(xs, s), rtol=1e-12, atol=1e-12)
    ss = _rand(5, grad=False, seed=3)
    x = _rand(4, 3, grad=False)
    torch.testing.assert_close(
        torch.func.vmap(op, in_dims=(None, 0))(x, ss), f_torch(x[None], ss[:, None]), rtol=1e-12, atol=1e-12
    )
    # vmap of a vjp: per-sample gradients of a broadcast argument
    per_sample = torch.func.vmap(torch.func.grad(op, argnums=1), in_dims=(0, None))(_rand(6, 3, grad=False), s)
    reference = torch.func.vmap(torch.func.grad(f_torch, argnums=1), in_dims=(0, None))(_rand(6, 3, grad=False), s)
    torch.testing.assert_close(per_sample, reference, rtol=1e-12, atol=1e-12)


def test_forward_ad():
    import torch.autograd.forward_ad as fwAD

    x, s = _rand(4, 3, grad=False), _rand(grad=False, seed=1)
    t = _rand(4, 3, grad=False, seed=5)
    with fwAD.dual_level():
        y = op(fwAD.make_dual(x, t), s)
        tangent = fwAD.unpack_dual(y).tangent
    _, reference = torch.func.jvp(lambda v: f_torch(v, s), (x,), (t,))
    torch.testing.assert_close(tangent, reference, rtol=1e-12, atol=1e-12)


def test_compiles_once_across_calls_and_batch_sizes():
    h = td.function(f, name="f_for_compile_count")
    g = td.torch.function(h)
    g(_rand(3, 3), _rand(seed=1)).sum().backward()
    before = td.cache_info()["f_for_compile_count"].compiles  # the op's forward and backward count here
    for n in (3, 7, 1, 12):
        for seed in range(5):
            g(_rand(n, 3, seed=seed), _rand(seed=seed + 1)).sum().backward()
    info = td.cache_info()["f_for_compile_count"]
    assert info.compiles == before
    assert info.calls >= 42 and info.calls - info.hits <= 2


x_field = ti.field(ti.f64, shape=4)
w_field = ti.field(ti.f64, shape=())
loss_field = ti.field(ti.f64, shape=())


@ti.kernel
def cubic_energy():
    for i in x_field:
        loss_field[None] += w_field[None] * x_field[i] ** 3


energy = td.torch.function(cubic_energy, inputs=[x_field, w_field], outputs=[loss_field])


@ti.kernel
def sin_energy():
    for i in x_field:
        loss_field[None] += w_field[None] * ti.sin(x_field[i]) * x_field[i] ** 2


@ti.kernel
def sin_energy_ndarray(x: ti.types.ndarray(), w: ti.types.ndarray(), out: ti.types.ndarray()):
    for i in x:
        out[None] += w[None] * ti.sin(x[i]) * x[i] ** 2


def _sin_energy_torch(x, w):
    return w * (torch.sin(x) * x**2).sum()


W = torch.tensor(0.7, dtype=F64)
field_energy = td.torch.function(sin_energy, inputs=[x_field, w_field], outputs=[loss_field])
ndarray_energy = td.torch.function(sin_energy_ndarray, inputs=["x", "w"], outputs={"out": ()})
KINDS = {  # one differentiable argument x (the other held): (the torch op of x, the same in torch)
    "ti.func": (lambda x: op(x, W), lambda x: f_torch(x, W)),
    "field program": (lambda x: field_energy(x, W), lambda x: _sin_energy_torch(x, W)),
    "ndarray kernel": (lambda x: ndarray_energy(x, W), lambda x: _sin_energy_torch(x, W)),
}


def _second_derivative_sum(fn, z):
    """``d/dz sum(d/dz sum(fn(z)))``: the Hessian times ones, as a function of ``z``."""
    (g,) = torch.autograd.grad(fn(z).sum(), z, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), z, create_graph=True)
    return h


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_order_of_the_torch_op(kind):
    """Backward of backward of backward, and forward over them, for every kind: each rule is the op
    of another Function (NOTE: [One recursion] in tidiff/_torch.py), so no order or kind is special."""
    fn, fn_torch = KINDS[kind]
    x = _rand(3 if kind == "ti.func" else 4)
    xr = x.detach().clone().requires_grad_(True)
    got, want = fn(x), fn_torch(xr)
    for _ in range(3):
        (got,) = torch.autograd.grad(got.sum(), x, create_graph=True)
        (want,) = torch.autograd.grad(want.sum(), xr, create_graph=True)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    t = _rand(x.shape[0], seed=4, grad=False)
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(x.detach().clone(), t).requires_grad_(True)
        tangent = torch.autograd.forward_ad.unpack_dual(_second_derivative_sum(fn, dual)).tangent
    third = torch.autograd.functional.jacobian(lambda z: _second_derivative_sum(fn_torch, z), x.detach())
    torch.testing.assert_close(tangent, third @ t, rtol=1e-10, atol=1e-12)
    # the third derivative against central differences of the second (torch's own checker)
    assert torch.autograd.gradgradcheck(lambda z: torch.autograd.grad(fn(z).sum(), z, create_graph=True)[0], (x,))


def test_field_program_gradcheck_with_forward_ad():
    x, w = _rand(4), _rand(seed=1)
    torch.testing.assert_close(energy(x, w), w * (x**3).sum(), rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(energy, (x, w), check_forward_ad=True)
    with torch.no_grad():
        energy(x, w)
    assert x.grad is None


def test_field_program_gradgradcheck():
    # double backward is the backward of the operator of the program's cotangent map (NOTE: [One recursion])
    assert torch.autograd.gradgradcheck(energy, (_rand(4), _rand(seed=1)))


def test_import_tidiff_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import tidiff as td\n"
        "try:\n    td.torch\nexcept ImportError:\n    print('lazy')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "lazy" in out.stdout


def test_repeated_calls_of_a_func_operator_take_the_launch_plan_and_stay_exact():
    """Issue 40: later calls with an earlier call's dtypes, shapes and devices launch by its plan (NOTE: [Launch
    plans] in tidiff/_torch.py): values and gradients exact for every broadcast layout and a float32 argument,
    and the inputs untouched."""
    fresh = td.torch.function(td.function(f, name="f_plans"))
    layouts = [((16, 3), (16,)), ((2, 4, 3), (1, 4)), ((5, 3), ()), ((3,), (6,))]
    for seed in range(3):
        for x_shape, s_shape in layouts:
            x, s = _rand(*x_shape, seed=seed), _rand(*s_shape, seed=seed + 7)
            before = x.detach().clone()
            out = fresh(x, s)
            torch.testing.assert_close(out, f_torch(x, s), rtol=1e-14, atol=1e-14)
            got = torch.autograd.grad(out.sum(), (x, s))
            want = torch.autograd.grad(f_torch(x, s).sum(), (x, s))
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=1e-13, atol=1e-13)
            assert torch.equal(x.detach(), before)
    x32 = _rand(4, 3, grad=False).float()
    for _ in range(2):
        out = fresh(x32, _rand(4, grad=False))
        assert out.dtype == F64  # the widest float decides
        torch.testing.assert_close(out, f_torch(x32.double(), _rand(4, grad=False)), rtol=1e-14, atol=1e-14)
