"""The tangent transform of kernels over global fields (and over ndarrays: the same transformer),
through the public API.

Each program's tangent program (every kernel replaced by its tangent kernel,
tidiff._fields.tangent) must give ``td.jvp`` equal to reverse mode by the
dot-product test ``<t, vjp(c)> == <jvp(t), c>`` (reverse mode is Taichi's
own adjoint kernels, replayed as ti.ad.Tape does) and to central
differences; one test drives ti.ad.FwdMode by hand on the user's own fields.
"""
import numpy as np
import pytest
import taichi as ti
from programs import M, Program, energy_out, mid, out, s0, s3, simulate, stage_two, u

from tidiff._errors import TransformError
from tidiff._tangent import FieldTangents, jvp_kernel, source

RTOL = 1e-12


def assert_tangents_match_reverse(program, args, seed=0, eps=1e-6):
    """td.jvp's outputs are the primal's; its tangents pass the dot-product test and central differences."""
    rng = np.random.default_rng(seed)
    tangents = [rng.standard_normal(np.shape(a)) for a in args]
    cotangents = [rng.standard_normal(s.shape) for s in program.out_specs]
    outs, out_tangents = program.jvp(args, tangents)
    for actual, expected in zip(outs, program.primal(args)):
        np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=1e-13)
    _, grads = program.vjp(args, cotangents)
    lhs = sum(float(np.vdot(t, g)) for t, g in zip(tangents, grads))
    rhs = sum(float(np.vdot(t, c)) for t, c in zip(out_tangents, cotangents))
    assert lhs == pytest.approx(rhs, rel=1e-10, abs=1e-12)
    plus = program.primal([a + eps * t for a, t in zip(args, tangents)])
    minus = program.primal([a - eps * t for a, t in zip(args, tangents)])
    for actual, p, m in zip(out_tangents, plus, minus):
        np.testing.assert_allclose(actual, (p - m) / (2 * eps), rtol=1e-6, atol=1e-7)
    assert any(np.abs(t).max() > 0 for t in out_tangents)


# --- scalar fields, 0-D fields, += accumulation, funcs reading fields ----------------------------
x = ti.field(ti.f64, shape=8)
w = ti.field(ti.f64, shape=())
loss = ti.field(ti.f64, shape=())


@ti.func
def weighted(i):
    return w[None] * ti.sin(x[i]) * x[i]


@ti.kernel
def energy():
    for i in x:
        loss[None] += weighted(i) + ti.exp(0.1 * x[i]) / x.shape[0]


def test_scalar_fields_and_a_func_reading_fields():
    program = Program(energy, inputs=[x, w], outputs=[loss])
    assert_tangents_match_reverse(program, [np.linspace(-1, 1, 8), np.array(1.7)])


def test_against_fwdmode_on_the_users_own_fields():
    """jvp_kernel on fields the user allocated, against ti.ad.FwdMode with a scalar param."""
    a = ti.field(ti.f64, shape=5, needs_dual=True)
    out = ti.field(ti.f64, shape=(), needs_dual=True)
    da = ti.field(ti.f64, shape=5)
    dout = ti.field(ti.f64, shape=())

    @ti.kernel
    def k():
        for i in a:
            out[None] += ti.tanh(a[i]) * a[(i + 1) % 5]

    a.from_numpy(np.linspace(0.1, 0.9, 5))
    seed = [0.3, -1.0, 0.5, 2.0, 0.1]
    with ti.ad.FwdMode(loss=out, param=a, seed=seed):
        k()
    expected = out.dual[None]
    out[None] = 0.0
    da.from_numpy(np.array(seed))
    jvp_kernel(k, FieldTangents([(a, da), (out, dout)]))()
    np.testing.assert_allclose(dout[None], expected, rtol=1e-6)  # FwdMode stores its seed in float32
    a64 = np.linspace(0.1, 0.9, 5)
    exact = np.sum((1 - np.tanh(a64) ** 2) * np.array(seed) * np.roll(a64, -1) + np.tanh(a64) * np.roll(seed, -1))
    np.testing.assert_allclose(dout[None], exact, rtol=1e-14)


# --- vector and matrix fields, 2-D struct-for, stores, a void func writing a field -------------
F = ti.Matrix.field(2, 2, ti.f64, shape=(2, 3))
b = ti.Vector.field(2, ti.f64, shape=(2, 3))
strain = ti.field(ti.f64, shape=(2, 3))
y = ti.Vector.field(2, ti.f64, shape=(2, 3))


@ti.func
def store_response(i, j, r):
    y[i, j] = r + b[i, j] * strain[i, j]


@ti.kernel
def mechanics():
    for i, j in F:
        m = F[i, j]
        strain[i, j] = (m.transpose() @ m).trace() + ti.log(ti.abs(m.determinant()))
        store_response(i, j, m @ b[i, j])


def test_vector_matrix_fields_and_a_void_func():
    program = Program(mechanics, inputs=[F, b], outputs=[strain, y])
    rng = np.random.default_rng(1)
    Fs = np.eye(2) + 0.3 * rng.standard_normal((2, 3, 2, 2))
    assert_tangents_match_reverse(program, [Fs, rng.standard_normal((2, 3, 2))])


# --- range, ti.ndrange, ti.static, ti.atomic_add, branches on field values, an index field -------
grid = ti.field(ti.f64, shape=(3, 4))
index = ti.field(ti.i32, shape=4)
total = ti.field(ti.f64, shape=())
rows = ti.field(ti.f64, shape=3)


@ti.kernel
def reductions():
    for i, j in ti.ndrange(3, 4):
        v = grid[i, index[j]]
        if v > 0:
            ti.atomic_add(total[None], v * v)
        else:
            total[None] += ti.cos(v)
    for i in range(3):
        acc = 0.0
        for j in ti.static(range(4)):
            acc += grid[i, j] * (j + 1)
        rows[i] = acc * acc


def test_loops_atomics_branches_and_index_fields():
    index.from_numpy(np.array([3, 2, 1, 0], dtype=np.int32))
    program = Program(reductions, inputs=[grid], outputs=[total, rows])
    assert_tangents_match_reverse(program, [np.random.default_rng(2).standard_normal((3, 4))])


# --- a Python program: two kernels through an intermediate field (stage_two: tests/programs.py) ------
@ti.kernel
def neighbours_to_mid():
    for i in u:
        mid[i] = ti.Vector([ti.sin(u[i]), u[i] * u[(i + 1) % 4]])


def step():
    neighbours_to_mid()
    stage_two()


def test_python_program_with_an_intermediate_field():
    program = Program(step, inputs=[u], outputs=[out])
    assert_tangents_match_reverse(program, [np.linspace(0.2, 1.1, 4)])
    # the intermediate's tangent starts from zero on every run: a second run gives the same
    assert_tangents_match_reverse(program, [np.linspace(0.2, 1.1, 4)])


# --- template kernels: fields passed as ti.template() arguments, double buffers (tests/programs.py)
def test_template_kernels_get_their_tangent_fields_at_launch():
    program = Program(simulate, inputs=[s0], outputs=[s3, energy_out])
    assert_tangents_match_reverse(program, [np.linspace(-1, 1, M)])
    text = source(program.fn.program.tangent()._source.__globals__["advance"])
    assert "def advance_jvp(h: ti.f64, src: ti.template(), dst: ti.template(), dsrc: ti.template(), " \
           "ddst: ti.template()):" in text
    assert "return advance_jvp(h, src, dst, tangent_of(src), tangent_of(dst))" in text


# --- the generated source --------------------------------------------------------------------
GOLDEN = '''\
@ti.kernel
def energy_jvp():
    for i in x:
        weighted_i, dweighted_i = weighted_jvp(i)
        mul = 0.1 * x[i]
        dmul = 0.1 * dx[i]
        exp_mul = ti.exp(mul)
        div = exp_mul / x.shape[0]
        ddiv = dmul * exp_mul / x.shape[0]
        add = weighted_i + div
        dadd = dweighted_i + ddiv
        dloss[None] += dadd
        loss[None] += add
'''


def test_golden_source():
    tangents = FieldTangents([(f, ti.field(ti.f64, shape=f.shape)) for f in (x, w, loss)])
    k = jvp_kernel(energy, tangents)
    assert source(k) == GOLDEN
    assert jvp_kernel(energy, tangents) is k  # generated once per pairing


# --- errors ----------------------------------------------------------------------------------
Weights = ti.types.struct(a=ti.f64, b=ti.f64)


@ti.kernel
def struct_kernel(p: Weights):  # (an ndarray parameter is a constant of the program: NOTE: [Arrays given to a
    # kernel over fields])
    for i in x:
        loss[None] += p.a * x[i] + p.b


@ti.kernel
def reads_grad():
    for i in x:
        loss[None] += x.grad[i]


@ti.kernel
def atomic_max():
    for i in x:
        ti.atomic_max(loss[None], x[i] * loss[None])  # read where iterations race the atomic


@pytest.mark.parametrize("kernel, construct", [
    (struct_kernel, "the kernel parameter `p` of kind StructType"),
    (reads_grad, "the attribute `x.grad`"),
    (atomic_max, "the field `loss`, read or written besides ti.atomic_max"),
])
def test_unsupported_constructs_name_file_line(kernel, construct):
    tangents = FieldTangents([(f, ti.field(ti.f64, shape=f.shape)) for f in (x, loss)])
    with pytest.raises(TransformError) as info:
        jvp_kernel(kernel, tangents)
    assert construct in str(info.value)
    assert "test_tangent_kernels.py:" in str(info.value) and info.value.lineno is not None


# --- kernels over ndarrays: the same transformer, paired by parameter ------------------------------
scale = ti.field(ti.f64, shape=4)  # a global field an ndarray kernel reads: a constant


@ti.func
def scaled_sin(a, i):
    return scale[i] * ti.sin(a)


@ti.kernel
def through_a_field_reading_func(a: ti.types.ndarray(), out: ti.types.ndarray()):
    for i in a:
        out[None] += scaled_sin(a[i], i) * a[i]


def test_an_ndarray_kernel_calls_a_func_that_reads_a_constant_field():
    """A @ti.func reaching a global field is transformed with field accesses in an ndarray kernel too."""
    import torch

    import tidiff as td

    scale.from_numpy(np.array([0.5, -1.0, 2.0, 1.5]))
    fn = td.function(through_a_field_reading_func, inputs=["a"], outputs={"out": ()})
    a, t = np.array([0.3, -0.7, 1.1, 2.0]), np.array([1.0, -2.0, 0.5, 0.25])

    def reference(a):
        return (torch.tensor(scale.to_numpy()) * torch.sin(a) * a).sum()

    _, jvp_out = td.jvp(fn, (a,), (t,))
    _, expected = torch.autograd.functional.jvp(reference, (torch.tensor(a),), (torch.tensor(t),))
    np.testing.assert_allclose(jvp_out, expected.numpy(), rtol=1e-12)
    expected_h = torch.autograd.functional.hessian(reference, torch.tensor(a))
    np.testing.assert_allclose(td.hessian(fn)(a), expected_h.numpy(), rtol=1e-12, atol=1e-14)


@ti.kernel
def writes_an_unlisted_parameter(a: ti.types.ndarray(), spare: ti.types.ndarray(), out: ti.types.ndarray()):
    for i in a:
        spare[i] = a[i] * 2.0
        out[None] += a[i]


@ti.kernel
def writes_a_global_field(a: ti.types.ndarray(), out: ti.types.ndarray()):
    for i in a:
        scale[i] = a[i]
        out[None] += a[i]


@ti.kernel
def returns_a_value(a: ti.types.ndarray(), out: ti.types.ndarray()) -> ti.f64:
    for i in a:
        out[None] += a[i]
    return 1.0


@pytest.mark.parametrize("kernel, constants, construct, hint", [
    (writes_an_unlisted_parameter, {"spare": np.zeros(4)}, "a write to parameter `spare`", "list 'spare' in outputs="),
    (writes_a_global_field, {}, "a write to the global `scale`", "list it in outputs="),
    (returns_a_value, {}, "a kernel over ndarrays that returns a value", "output ndarray"),
])
def test_ndarray_kernel_refusals_name_file_line(kernel, constants, construct, hint):
    import tidiff as td

    fn = td.function(kernel, inputs=["a"], outputs={"out": ()}, constants=constants)
    with pytest.raises(TransformError) as info:
        td.jvp(fn, (np.ones(4),), (np.ones(4),))
    assert construct in str(info.value) and hint in str(info.value)
    assert "test_tangent_kernels.py:" in str(info.value) and info.value.lineno is not None


# --- names: a parameter named like what the launcher reads cannot shadow it (issue 12 item 6) ------
named_in = ti.field(ti.f64, shape=5)
named_out = ti.field(ti.f64, shape=5)


@ti.kernel
def scale_into(src: ti.template(), dst: ti.template(), tangent_of: ti.f64, scale_into_jvp: ti.f64):
    for i in src:
        dst[i] = tangent_of * src[i] ** 2 + scale_into_jvp * ti.sin(src[i])


def launch_scale_into():
    scale_into(named_in, named_out, 0.5, 2.0)


def test_template_kernel_parameters_named_like_the_launchers_names():
    program = Program(launch_scale_into, inputs=[named_in], outputs=[named_out])
    assert_tangents_match_reverse(program, [np.linspace(-1, 1, 5)])
