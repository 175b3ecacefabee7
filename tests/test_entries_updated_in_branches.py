"""An entry an iteration sets, then updates in a branch, then reads (NOTE: [Entries set, then updated in a branch] in
tidiff/_adjoint/entry_locals.py): exact and never checked, where the adjoint read what the kernel left after the
branch, was checked, found wrong and replaced by forward pushes, one kernel run per input entry."""
import warnings

import numpy as np
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td

nd = ti.types.ndarray(dtype=ti.f64)


@ti.kernel
def clipped_then_squashed(x: nd, y: nd, z: nd):
    for i in range(x.shape[0]):
        y[i] = x[i] * 2.0
        if x[i] > 0:
            y[i] = y[i] * x[i]
        else:
            y[i] -= 0.5 * ti.sin(y[i])
        z[i] = y[i] ** 2
        y[i] = ti.tanh(y[i])


def clipped_then_squashed_torch(x):
    y = x * 2.0
    y = torch.where(x > 0, y * x, y - 0.5 * torch.sin(y))
    return torch.tanh(y), y ** 2


@ti.kernel
def rows_rescaled(x: nd, out: nd):
    for i, j in ti.ndrange(x.shape[0], x.shape[1]):
        out[i, j] = ti.exp(x[i, j])
        if out[i, j] > 1.5:  # the test reads the entry too
            out[i, j] = ti.log(out[i, j]) + 1.5
        out[i, j] = out[i, j] * x[i, j]


def rows_rescaled_torch(x):
    e = torch.exp(x)
    e = torch.where(e > 1.5, torch.log(e) + 1.5, e)
    return (e * x,)


CASES = {
    "clipped then squashed": (td.function(clipped_then_squashed, inputs=["x"],
                                          outputs={"y": lambda x: x.shape, "z": lambda x: x.shape}),
                              clipped_then_squashed_torch, lambda n: (n,)),
    "rows rescaled": (td.function(rows_rescaled, inputs=["x"], outputs={"out": lambda x: x.shape}),
                      rows_rescaled_torch, lambda n: (n, 3)),
}


@given(st.sampled_from(sorted(CASES)), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_an_entry_updated_in_a_branch_is_exact_without_a_check(case, n, seed):
    f, twin, shape = CASES[case]
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.5, 1.5, shape(n))
    xt = torch.tensor(x, requires_grad=True)
    want = twin(xt)
    cts = [rng.normal(size=tuple(w.shape)) for w in want]
    t = rng.normal(size=x.shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        outs, pull = td.vjp(f, x)
        (got,) = pull(tuple(cts) if len(cts) > 1 else cts[0])
        _, pushed = td.jvp(f, (x,), (t,))
    assert f.memo.peek("reverse verdict") is None  # exact: never checked
    outs, pushed = (outs, pushed) if len(want) > 1 else ((outs,), (pushed,))
    for o, w in zip(outs, want, strict=True):
        np.testing.assert_allclose(o, w.detach().numpy(), rtol=1e-12, atol=1e-14)
    (expected,) = torch.autograd.grad(want, xt, [torch.tensor(c) for c in cts])
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-10, atol=1e-13)
    forward = sum(np.vdot(c, p) for c, p in zip(cts, pushed, strict=True))
    np.testing.assert_allclose(forward, np.vdot(got, t), rtol=1e-9, atol=1e-12)


N = 5
xs = ti.field(ti.f64, shape=N)
ys = ti.field(ti.f64, shape=N)
total = ti.field(ti.f64, shape=())


@ti.kernel
def step():
    for i in xs:
        ys[i] = xs[i] * 2.0
        if xs[i] > 0:
            ys[i] = ys[i] * xs[i]
        total[None] += ys[i] ** 2
        ys[i] = ti.tanh(ys[i])


@ti.kernel
def finish():
    for i in ys:
        total[None] += ys[i]


def test_a_field_program_updating_an_entry_in_a_branch():
    f = td.function(lambda: (step(), finish()), inputs=[xs], outputs=[total])

    def twin(x):
        y = torch.where(x > 0, 2.0 * x * x, 2.0 * x)
        return (y ** 2 + torch.tanh(y)).sum()

    x = np.array([0.5, -0.3, 1.2, -2.0, 0.1])
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        got = td.grad(f)(x)
        hessian = td.hessian(f)(x)
    assert f.memo.peek("reverse verdict") is None
    xt = torch.tensor(x)
    np.testing.assert_allclose(got, torch.autograd.functional.jacobian(twin, xt).numpy(), rtol=1e-12)
    np.testing.assert_allclose(hessian, torch.autograd.functional.hessian(twin, xt).numpy(), rtol=1e-12,
                               atol=1e-14)
