"""Field programs (kind 1b): values, vjp, jvp against torch and each other, through the public API."""
import numpy as np
import pytest
import taichi as ti
import torch
from taichi.lang import impl

if impl.get_runtime().prog is None:
    ti.init(arch=ti.cpu, default_fp=ti.f64)


from programs import Program, energy, loss, w, x  # noqa: E402  (energy: the API.md 1b example)

RTOL = 1e-7
rng = np.random.default_rng(0)

# -- DESIGN user story 3, three 0-D inputs ------------------------------------------
x1 = ti.field(ti.f64, shape=())
x2 = ti.field(ti.f64, shape=())
x3 = ti.field(ti.f64, shape=())
y = ti.field(ti.f64, shape=())


@ti.kernel
def poly():
    y[None] += x1[None] ** 3 + 2 * x2[None] ** 2 - 3 * x3[None] + 1


# -- vector and matrix fields, several outputs ----------------------------------------
v = ti.Vector.field(3, ti.f64, shape=5)
A = ti.Matrix.field(2, 3, ti.f64, shape=())
av = ti.Vector.field(2, ti.f64, shape=5)
gram = ti.Matrix.field(3, 3, ti.f64, shape=())
total = ti.field(ti.f64, shape=())


@ti.func
def feature(u):
    return A[None] @ ti.sin(u) + u[0] * u[1]


@ti.kernel
def linear():
    for i in v:
        av[i] = feature(v[i])
        gram[None] += v[i].outer_product(v[i]) * v[i][2]
        total[None] += (A[None] @ v[i]).norm_sqr()


def torch_linear(v, A):
    av = torch.sin(v) @ A.T + (v[:, 0] * v[:, 1])[:, None]
    return av, (v * v[:, 2:]).T @ v, ((v @ A.T) ** 2).sum()


# -- a two-kernel simulation step: intermediate field, a func reading a constant -------
N = 6
pos = ti.field(ti.f64, shape=N)
vel = ti.field(ti.f64, shape=N)
force = ti.field(ti.f64, shape=N)  # intermediate state, not declared
stiffness = ti.field(ti.f64, shape=N)  # a constant, not declared
new_pos = ti.field(ti.f64, shape=N)
new_vel = ti.field(ti.f64, shape=N)
DT = 0.1


@ti.func
def spring(i):
    j = (i + 1) % N
    return stiffness[i] * (pos[j] - pos[i]) - ti.sin(pos[i]) * vel[i]


@ti.kernel
def compute_force():
    for i in force:
        force[i] = spring(i)


@ti.kernel
def integrate():
    for i in pos:
        new_vel[i] = vel[i] + DT * force[i]
        new_pos[i] = pos[i] + DT * new_vel[i]


def step():
    compute_force()
    integrate()


def torch_step(pos, vel, stiffness):
    force = stiffness * (torch.roll(pos, -1) - pos) - torch.sin(pos) * vel
    new_vel = vel + DT * force
    return pos + DT * new_vel, new_vel


STIFFNESS = np.linspace(1.0, 2.0, N)
stiffness.from_numpy(STIFFNESS)


@pytest.fixture(scope="module")
def energy_prog():
    return Program(energy, inputs=[x, w], outputs=[loss])


@pytest.fixture(scope="module")
def poly_prog():
    return Program(poly, inputs=[x1, x2, x3], outputs=[y])


@pytest.fixture(scope="module")
def linear_prog():
    return Program(linear, inputs=[v, A], outputs=[av, gram, total])


@pytest.fixture(scope="module")
def step_prog():
    return Program(step, inputs=[pos, vel], outputs=[new_pos, new_vel])


def random_args(prog):
    return [rng.standard_normal(spec.shape) for spec in prog.in_specs]


def random_like(specs):
    return [rng.standard_normal(spec.shape) for spec in specs]


def vdot(a, b):
    return sum(float(np.vdot(p, q)) for p, q in zip(a, b))


def assert_all_close(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=1e-12)


def to_torch(arrays):
    return tuple(torch.tensor(a, dtype=torch.float64) for a in arrays)


def to_numpy(tensors):
    return [t.detach().numpy() for t in tensors]


# -- the two stories ---------------------------------------------------------------------


def test_api_example_value_and_grads(energy_prog):
    args = [np.ones(16), np.array(2.0)]
    (value,) = energy_prog.primal(args)
    assert value.shape == () and value == 32.0
    (value,), (dx, dw) = energy_prog.vjp(args, [np.array(1.0)])
    assert value == 32.0
    np.testing.assert_array_equal(dx, np.full(16, 4.0))
    assert dw.shape == () and dw == 16.0


def test_api_example_specs(energy_prog):
    assert [tuple(s) for s in energy_prog.in_specs] == [("x", (16,), np.float64), ("w", (), np.float64)]
    assert [tuple(s) for s in energy_prog.out_specs] == [("loss", (), np.float64)]


def test_three_input_polynomial_both_modes(poly_prog):
    args = [np.array(1.0), np.array(2.0), np.array(3.0)]
    (value,), grads = poly_prog.vjp(args, [np.array(1.0)])
    assert value == 1 + 8 - 9 + 1
    assert [float(g) for g in grads] == [3.0, 8.0, -3.0]
    for i, expected in enumerate([3.0, 8.0, -3.0]):
        tangents = [np.array(float(i == j)) for j in range(3)]
        _, (dy,) = poly_prog.jvp(args, tangents)
        assert float(dy) == expected


# -- against torch -----------------------------------------------------------------------

PROGRAMS = {
    "energy": ("energy_prog", lambda x, w: ((w * x**2).sum(),)),
    "poly": ("poly_prog", lambda a, b, c: (a**3 + 2 * b**2 - 3 * c + 1,)),
    "linear": ("linear_prog", torch_linear),
    "step": ("step_prog", lambda p, q: torch_step(p, q, torch.tensor(STIFFNESS))),
}


@pytest.fixture(params=sorted(PROGRAMS))
def case(request):
    fixture, torch_f = PROGRAMS[request.param]
    return request.getfixturevalue(fixture), torch_f


def test_primal_matches_torch(case):
    prog, torch_f = case
    args = random_args(prog)
    assert_all_close(prog.primal(args), to_numpy(torch_f(*to_torch(args))))


def test_vjp_matches_torch(case):
    prog, torch_f = case
    args, cotangents = random_args(prog), random_like(prog.out_specs)
    outs, grads = prog.vjp(args, cotangents)
    expected_outs, expected_grads = torch.autograd.functional.vjp(
        lambda *a: tuple(torch_f(*a)), to_torch(args), to_torch(cotangents)
    )
    assert_all_close(outs, to_numpy(expected_outs))
    assert_all_close(grads, to_numpy(expected_grads))


def test_jvp_matches_torch(case):
    prog, torch_f = case
    args, tangents = random_args(prog), random_like(prog.in_specs)
    outs, out_tangents = prog.jvp(args, tangents)
    expected_outs, expected_tangents = torch.autograd.functional.jvp(
        lambda *a: tuple(torch_f(*a)), to_torch(args), to_torch(tangents)
    )
    assert_all_close(outs, to_numpy(expected_outs))
    assert_all_close(out_tangents, to_numpy(expected_tangents))


def test_jacobian_by_vjp_rows_matches_torch(case):
    """Every cotangent basis vector: the full Jacobian, row by row, no stale gradient between rows."""
    prog, torch_f = case
    args = random_args(prog)
    expected = torch.autograd.functional.jacobian(lambda *a: tuple(torch_f(*a)), to_torch(args))
    for k, spec in enumerate(prog.out_specs):
        for index in np.ndindex(*spec.shape):
            cotangents = [np.zeros(s.shape) for s in prog.out_specs]
            cotangents[k][index] = 1.0
            _, grads = prog.vjp(args, cotangents)
            rows = [expected[k][i][index].numpy() for i in range(len(prog.in_specs))]
            assert_all_close(grads, rows)


def test_dot_product_forward_against_reverse(case):
    """<t, vjp(c)> == <jvp(t), c>."""
    prog, _ = case
    args = random_args(prog)
    tangents, cotangents = random_like(prog.in_specs), random_like(prog.out_specs)
    _, grads = prog.vjp(args, cotangents)
    _, out_tangents = prog.jvp(args, tangents)
    lhs, rhs = vdot(tangents, grads), vdot(out_tangents, cotangents)
    assert lhs == pytest.approx(rhs, rel=RTOL)


# -- state between calls -------------------------------------------------------------------


def test_repeated_calls_give_the_same_answer(case):
    prog, _ = case
    args, tangents, cotangents = random_args(prog), random_like(prog.in_specs), random_like(prog.out_specs)
    first = prog.vjp(args, cotangents), prog.jvp(args, tangents), prog.primal(args)
    second = prog.vjp(args, cotangents), prog.jvp(args, tangents), prog.primal(args)
    for a, b in zip(first[:2], second[:2]):
        assert_all_close(a[0] + a[1], b[0] + b[1])
    assert_all_close(first[2], second[2])


def test_a_zero_or_missing_cotangent_gives_zero_grads(step_prog):
    args = random_args(step_prog)
    step_prog.vjp(args, random_like(step_prog.out_specs))
    _, grads = step_prog.vjp(args, [None, None])
    assert all(not g.any() for g in grads)
    _, out_tangents = step_prog.jvp(args, [None, np.zeros(N)])
    assert all(not t.any() for t in out_tangents)


def test_user_fields_are_untouched(case):
    prog, _ = case
    touched = [x, w, loss, x1, x2, x3, y, v, A, av, gram, total, pos, vel, force, new_pos, new_vel]
    for field in touched:
        field.fill(7.5)
    before = [f.to_numpy() for f in touched + [stiffness]]
    args = random_args(prog)
    prog.primal(args)
    prog.vjp(args, random_like(prog.out_specs))
    prog.jvp(args, random_like(prog.in_specs))
    for field, old in zip(touched + [stiffness], before):
        np.testing.assert_array_equal(field.to_numpy(), old)


def test_compiles_once(case):
    prog, _ = case
    args = random_args(prog)
    prog.primal(args), prog.vjp(args, random_like(prog.out_specs)), prog.jvp(args, random_like(prog.in_specs))
    own = prog.compiles()
    everything = sum(len(k.compiled_kernels) for k in impl.get_runtime().kernels)
    args = random_args(prog)
    prog.primal(args), prog.vjp(args, random_like(prog.out_specs)), prog.jvp(args, random_like(prog.in_specs))
    assert prog.compiles() == own
    assert sum(len(k.compiled_kernels) for k in impl.get_runtime().kernels) == everything


def test_compile_count_covers_every_variant(step_prog):
    args = random_args(step_prog)
    step_prog.primal(args), step_prog.vjp(args, random_like(step_prog.out_specs))
    step_prog.jvp(args, random_like(step_prog.in_specs))
    assert step_prog.compiles() == 2 * 2  # two kernels: primal and adjoint
    import tidiff as td

    assert td.cache_info()["jvp(step)"].compiles == 2  # and the tangent kernel of each


def test_constants_are_read_at_call_time(step_prog):
    args = random_args(step_prog)
    try:
        stiffness.from_numpy(3 * STIFFNESS)
        outs = step_prog.primal(args)
        expected = torch_step(*to_torch(args), torch.tensor(3 * STIFFNESS))
        assert_all_close(outs, to_numpy(expected))
    finally:
        stiffness.from_numpy(STIFFNESS)
