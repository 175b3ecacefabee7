"""td.scan over buffers with a time axis (NOTE: [A time loop over buffers]): the step's kernels rewritten to
read slot r and write slot r + 1, reversed by their adjoints without running forward again. Against torch
running the same steps (float64), for every checkpoint count, a pullback called again after other calls, and
steps whose kernels the rewrite does not take (they keep the program's own fields, with the same results)."""
import numpy as np
import pytest
import taichi as ti
import torch
from taichi.lang import impl

if impl.get_runtime().prog is None:
    ti.init(arch=ti.cpu, default_fp=ti.f64)

from mass_spring import MassSpring  # noqa: E402

import tidiff as td  # noqa: E402
from tidiff._scan.axis_stepper import AxisStepper  # noqa: E402
from tidiff._scan.fields import FieldStepper  # noqa: E402

N, T = 5, 11


@pytest.fixture(scope="module")
def system():
    return MassSpring(N)


@pytest.fixture(scope="module")
def step(system):
    return system.step_function(td)


def torch_vjp(system, args, cotangents, steps=T):
    """The final (x, v) and their vjp by (x0, v0, k), by torch autograd over the same steps."""
    x0, v0, k = (torch.tensor(a, requires_grad=True) for a in args)
    x, v, _ = system.torch_steps(torch, x0, v0, k, steps)
    grads = torch.autograd.grad((x, v), (x0, v0, k), [torch.tensor(c) for c in cotangents])
    return [x.detach().numpy(), v.detach().numpy()], [g.numpy() for g in grads]


@pytest.mark.parametrize("checkpoints", [None, 1, 2, 4, T - 1, T], ids=lambda k: f"K={k}")
def test_the_loop_over_buffers_is_torch_s_loop(system, step, checkpoints):
    sim = td.scan(step, T, checkpoints=checkpoints)
    args = system.arguments(1)
    rng = np.random.default_rng(2)
    cts = (rng.normal(size=(N, 2)), rng.normal(size=(N, 2)))
    outs, vjp_fn = td.vjp(sim, *args)
    assert isinstance(sim._stepper, AxisStepper)
    expected_outs, expected = torch_vjp(system, args, cts)
    for got, want in zip(outs, expected_outs, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    for got, want in zip(vjp_fn(cts), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    for got, want in zip(td.vjp(sim, *args)[1](cts), expected, strict=True):  # vjp without linearize's run
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_a_pullback_called_again_after_other_calls(system, step):
    """The slots hold the last segment only right after the run that kept the checkpoints: a second pullback,
    and one after another call of the loop, refill it."""
    sim = td.scan(step, T, checkpoints=3)
    args, other = system.arguments(3), system.arguments(4)
    cts = (np.ones((N, 2)), np.zeros((N, 2)))
    _, expected = torch_vjp(system, args, cts)
    _, vjp_fn = td.vjp(sim, *args)
    first = vjp_fn(cts)
    second = vjp_fn(cts)
    sim(*other)
    td.vjp(sim, *other)[1](cts)
    third = vjp_fn(cts)
    for grads in (first, second, third):
        for got, want in zip(grads, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_the_loop_keeps_sqrt_t_carries(system, step):
    """T = 400 steps, 20 checkpoints: the checkpoints, then 21 carries and 20 forces of one segment, each with
    its gradient; the stored trajectory would keep 400 of each."""
    long, k = 400, 20
    sim = td.scan(step, long)
    td.vjp(sim, *system.arguments())[1]((np.ones((N, 2)), np.ones((N, 2))))
    carry, force = 2 * N * 2 * 8, N * 2 * 8  # (x, v) and the force, float64
    assert sim._stepper.kept_bytes() == k * carry + (k + 1) * carry * 2 + k * force * 2


# --- funcs reaching carried fields, and steps the rewrite does not take ---------------------------------------

x = ti.field(ti.f64, 4)
x_next = ti.field(ti.f64, 4)
rate = ti.field(ti.f64, ())


@ti.func
def read_x(i):
    return x[i]


@ti.kernel
def through_a_func():
    for i in x:
        x_next[i] = ti.sin(read_x(i)) * rate[None] + x[i]


@ti.kernel
def given_fields(src: ti.template(), dst: ti.template()):
    for i in src:
        dst[i] = ti.sin(src[i]) * rate[None] + src[i]


def template_step():
    given_fields(x, x_next)


@pytest.mark.parametrize("program, kind", [(through_a_func, AxisStepper), (template_step, FieldStepper)],
                         ids=["a func reading x, inlined", "template kernel"])
def test_funcs_reading_carried_fields_are_inlined_and_template_kernels_keep_the_fields(program, kind):
    sim = td.scan(td.function(program, inputs=[x, rate], outputs=[x_next]), 6, checkpoints=2)
    x0, r = np.linspace(0.2, 1.1, 4), 0.3
    xs = torch.tensor(x0, requires_grad=True)
    rs = torch.tensor(r, dtype=torch.float64, requires_grad=True)
    y = xs
    for _ in range(6):
        y = torch.sin(y) * rs + y
    ct = np.array([1.0, -2.0, 0.5, 3.0])
    gx, gr = torch.autograd.grad(y, (xs, rs), torch.tensor(ct))
    out, vjp_fn = td.vjp(sim, x0, r)
    assert type(sim._stepper) is kind
    np.testing.assert_allclose(out, y.detach().numpy(), rtol=1e-13)
    got_x, got_r = vjp_fn(ct)
    np.testing.assert_allclose(got_x, gx.numpy(), rtol=1e-10)
    np.testing.assert_allclose(got_r, gr.numpy(), rtol=1e-10)


# --- what DiffTaichi kernels use, over buffers ---------------------------------------------------------------

@ti.data_oriented
class Grid:
    """A 2-D heat-like step as a class: struct-fors over a 2-D field, ti.grouped, x.shape, a float parameter,
    a state field it accumulates into and a per-step output."""

    def __init__(self, n, m):
        self.u = ti.field(ti.f64, (n, m))
        self.u_next = ti.field(ti.f64, (n, m))
        self.flux = ti.field(ti.f64, (n, m))
        self.c = ti.field(ti.f64, ())
        self.total = ti.field(ti.f64, ())

    @ti.kernel
    def diffuse(self, rate: ti.f64):
        for i, j in self.u:
            left = self.u[(i + self.u.shape[0] - 1) % self.u.shape[0], j]
            self.flux[i, j] += rate * self.c[None] * (left - self.u[i, j])
        for at in ti.grouped(self.u_next):
            self.u_next[at] = self.u[at] + self.flux[at] + 0.01 * ti.sin(self.u[at])
            self.total[None] += self.u_next[at] ** 2

    def step(self):
        self.diffuse(0.3)


def torch_grid(u, c, steps):
    totals = []
    for _ in range(steps):
        flux = 0.3 * c * (torch.roll(u, 1, 0) - u)
        u = u + flux + 0.01 * torch.sin(u)
        totals.append((u ** 2).sum())
    return u, torch.stack(totals)


def test_class_kernels_struct_fors_and_shapes_run_over_buffers():
    grid = Grid(4, 3)
    steps = 7
    sim = td.scan(td.function(grid.step, inputs=[grid.u, grid.c], outputs=[grid.u_next, grid.total],
                              state=[grid.flux]), steps, checkpoints=3, per_step=1)
    u0, c = np.random.default_rng(5).normal(size=(4, 3)), 0.7
    (uT, totals), vjp_fn = td.vjp(sim, u0, c)
    assert isinstance(sim._stepper, AxisStepper)
    us = torch.tensor(u0, requires_grad=True)
    cs = torch.tensor(c, dtype=torch.float64, requires_grad=True)
    want_u, want_totals = torch_grid(us, cs, steps)
    np.testing.assert_allclose(uT, want_u.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(totals, want_totals.detach().numpy(), rtol=1e-12)
    cu, ct = np.random.default_rng(6).normal(size=(4, 3)), np.random.default_rng(7).normal(size=steps)
    gu, gc = torch.autograd.grad((want_u, want_totals), (us, cs), (torch.tensor(cu), torch.tensor(ct)))
    got_u, got_c = vjp_fn((cu, ct))
    np.testing.assert_allclose(got_u, gu.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got_c, gc.numpy(), rtol=1e-9)
    _, (du, dtotals) = td.jvp(sim, (u0, c), (cu, 1.0))  # forward mode against the vjp: <c, J t> = <J^T c, t>
    assert np.isclose(np.sum(du * cu) + np.sum(dtotals * ct), np.sum(got_u * cu) + got_c, rtol=1e-9)


xs = [ti.field(ti.f64, 3), ti.field(ti.f64, 3)]
xs_next = [ti.field(ti.f64, 3), ti.field(ti.f64, 3)]


@ti.kernel
def through_a_list():
    for i in range(3):
        for k in ti.static(range(2)):
            xs_next[k][i] = xs[k][i] + 0.1 * ti.sin(xs[1 - k][i])


def test_fields_in_a_list_keep_the_program_fields():
    """``xs[k][i]`` in a static loop reaches the field, not its buffer: the loop keeps the program's fields."""
    sim = td.scan(td.function(through_a_list, inputs=xs, outputs=xs_next), 5, checkpoints=2)
    a, b = np.array([0.1, 0.5, 0.9]), np.array([-0.3, 0.2, 0.7])
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    ya, yb = ta, tb
    for _ in range(5):
        ya, yb = ya + 0.1 * torch.sin(yb), yb + 0.1 * torch.sin(ya)
    (got_a, got_b), vjp_fn = td.vjp(sim, a, b)
    assert type(sim._stepper) is FieldStepper
    np.testing.assert_allclose(got_a, ya.detach().numpy(), rtol=1e-13)
    np.testing.assert_allclose(got_b, yb.detach().numpy(), rtol=1e-13)
    seeds = (torch.ones(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))
    ga, gb = torch.autograd.grad((ya, yb), (ta, tb), seeds)
    for got, want in zip(vjp_fn((np.ones(3), np.zeros(3))), (ga, gb), strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-10)
