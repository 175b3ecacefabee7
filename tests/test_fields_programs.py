"""Field programs over the shapes programs take: closures, Python steps, templates, dtypes, errors."""
import hypothesis.strategies as st
import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import given, settings
from taichi.lang import impl
from taichi.lang.kernel_impl import AutodiffMode

if impl.get_runtime().prog is None:
    ti.init(arch=ti.cpu, default_fp=ti.f64)


from programs import M, Program, energy_out, s0, s3, simulate, torch_simulate  # noqa: E402

RTOL = 1e-7


def assert_all_close(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=1e-12)


@pytest.fixture(scope="module")
def sim():
    return Program(simulate, inputs=[s0], outputs=[s3, energy_out])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-3, 3), min_size=M, max_size=M), st.floats(-2, 2))
def test_multi_step_simulation_matches_torch(sim, values, weight):
    start = np.array(values)
    cotangents = [np.linspace(-1, 1, M), np.array(weight)]
    outs, (grad,) = sim.vjp([start], cotangents)
    ref_outs, (ref_grad,) = torch.autograd.functional.vjp(
        torch_simulate, (torch.tensor(start),), tuple(torch.tensor(c) for c in cotangents)
    )
    assert_all_close(outs, [t.numpy() for t in ref_outs])
    assert_all_close([grad], [ref_grad.numpy()])
    tangent = np.cos(start)
    outs, out_tangents = sim.jvp([start], [tangent])
    _, ref_tangents = torch.autograd.functional.jvp(torch_simulate, (torch.tensor(start),), (torch.tensor(tangent),))
    assert_all_close(out_tangents, [t.numpy() for t in ref_tangents])


def test_reverse_after_forward_with_a_kernel_launched_several_times(sim):
    """Forward mode runs tangent kernels of tidiff's own: the program's kernels keep their mode."""
    from programs import advance

    start, cotangents = np.linspace(-1, 1, M), [np.ones(M), np.array(0.5)]
    before = sim.vjp([start], cotangents)
    sim.jvp([start], [np.ones(M)])
    after = sim.vjp([start], cotangents)
    assert_all_close(before[0] + before[1], after[0] + after[1])
    assert advance._primal.autodiff_mode == AutodiffMode.NONE


def test_template_kernel_compiles_once_per_field_combination(sim):
    import tidiff as td

    start = np.linspace(0, 1, M)
    sim.vjp([start], [np.ones(M), np.array(1.0)]), sim.jvp([start], [np.ones(M)])
    count, forward = sim.compiles(), td.cache_info()["jvp(simulate)"].compiles
    assert count == 4 * 2  # advance over three (src, dst) pairs and reduce_energy, primal and adjoint
    assert forward == 4  # their tangent kernels
    sim.vjp([start + 1], [np.ones(M), np.array(2.0)]), sim.jvp([start], [np.zeros(M)]), sim.primal([start])
    assert sim.compiles() == count and td.cache_info()["jvp(simulate)"].compiles == forward


# -- a kernel over fields captured in a closure ------------------------------------------------


def make_closure_program():
    a = ti.Vector.field(2, ti.f64, shape=(2, 3))
    b = ti.field(ti.f64, shape=(2, 3))

    @ti.func
    def squash(u):
        return ti.tanh(u)

    @ti.kernel
    def kernel():
        for i, j in a:
            b[i, j] = squash(a[i, j]).dot(a[i, j]) * (i + 1)

    return Program(kernel, inputs=[a], outputs=[b]), a, b


def test_closure_fields_and_2d_shapes():
    prog, a, b = make_closure_program()
    assert prog.in_specs[0].shape == (2, 3, 2) and prog.out_specs[0].shape == (2, 3)
    start = np.linspace(-1, 1, 12).reshape(2, 3, 2)
    weight = torch.tensor([[1.0], [2.0]], dtype=torch.float64)

    def f(u):
        return (torch.tanh(u) * u).sum(-1) * weight

    cot = np.arange(6.0).reshape(2, 3)
    outs, (grad,) = prog.vjp([start], [cot])
    _, ref = torch.autograd.functional.vjp(f, torch.tensor(start), torch.tensor(cot))
    assert_all_close(outs + [grad], [f(torch.tensor(start)).numpy(), ref.numpy()])
    _, (tangent,) = prog.jvp([start], [np.ones_like(start)])
    _, ref_t = torch.autograd.functional.jvp(f, torch.tensor(start), torch.ones(2, 3, 2, dtype=torch.float64))
    assert_all_close([tangent], [ref_t.numpy()])
    assert not a.to_numpy().any() and not b.to_numpy().any()


# -- dtypes, offsets, integer inputs ------------------------------------------------------


def test_integer_input_is_not_differentiable():
    n = ti.field(ti.i32, shape=())
    xs = ti.field(ti.f64, shape=3)
    out = ti.field(ti.f64, shape=())

    @ti.kernel
    def power():
        for i in xs:
            out[None] += xs[i] ** n[None]

    prog = Program(power, inputs=[n, xs], outputs=[out])
    assert prog.in_specs[0].dtype == np.int32
    args = [np.array(3), np.array([1.0, 2.0, 3.0])]
    (value,), (dn, dxs) = prog.vjp(args, [np.array(1.0)])
    assert value == 36.0 and dn is None
    np.testing.assert_allclose(dxs, [3.0, 12.0, 27.0])
    _, (tangent,) = prog.jvp(args, [np.array(5), np.ones(3)])
    assert tangent == 42.0


def test_float32_fields_and_offsets():
    xs = ti.field(ti.f32, shape=4, offset=-2)
    out = ti.field(ti.f32, shape=())

    @ti.kernel
    def weighted():
        for i in xs:
            out[None] += xs[i] * i

    prog = Program(weighted, inputs=[xs], outputs=[out])
    assert prog.out_specs[0].dtype == np.float32
    (value,), (grad,) = prog.vjp([np.ones(4)], [np.array(1.0)])
    assert value.dtype == np.float32 and value == -2.0
    np.testing.assert_array_equal(grad, [-2.0, -1.0, 0.0, 1.0])
    _, (tangent,) = prog.jvp([np.ones(4)], [np.ones(4)])
    assert tangent == -2.0


def test_forward_mode_restores_the_compile_config():
    xs = ti.field(ti.f64, shape=2)
    out = ti.field(ti.f64, shape=2)

    @ti.kernel
    def double():
        for i in xs:
            out[i] = 2 * xs[i]

    prog = Program(double, inputs=[xs], outputs=[out])
    before = impl.current_cfg().force_scalarize_matrix
    _, (tangent,) = prog.jvp([np.ones(2)], [np.array([1.0, -1.0])])
    np.testing.assert_array_equal(tangent, [2.0, -2.0])
    assert impl.current_cfg().force_scalarize_matrix == before


# -- errors --------------------------------------------------------------------------------

xe = ti.field(ti.f64, shape=4)
we = ti.field(ti.f64, shape=())
le = ti.field(ti.f64, shape=())


@ti.kernel
def err_kernel():
    for i in xe:
        le[None] += we[None] * xe[i]


@pytest.fixture(scope="module")
def err_prog():
    return Program(err_kernel, inputs=[xe, we], outputs=[le])


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(inputs=[xe, 3.0], outputs=[le]), TypeError, ["inputs[1]", "field", "float"]),
        (dict(inputs=[xe], outputs=[le, np.zeros(3)]), TypeError, ["outputs[1]", "ndarray"]),
        (dict(inputs=[xe, xe], outputs=[le]), ValueError, ["inputs[1]", "already listed"]),
        (dict(inputs=[xe], outputs=[le, le]), ValueError, ["outputs[1]", "already listed"]),
        (dict(inputs=[xe, le], outputs=[le]), ValueError, ["inputs[1]", "also an output"]),
        (dict(inputs=[xe], outputs=[]), ValueError, ["outputs", "at least one"]),
    ],
)
def test_construction_errors(kwargs, error, words):
    with pytest.raises(error) as info:
        Program(err_kernel, **kwargs)
    for word in words:
        assert word in str(info.value)


def test_program_must_be_a_parameterless_kernel_or_function():
    @ti.kernel
    def with_param(h: ti.f64):
        le[None] = h

    with pytest.raises(TypeError, match="no parameters.*h"):
        Program(with_param, inputs=[xe], outputs=[le])
    with pytest.raises(TypeError, match="td.function: expected .* got int"):
        Program(42, inputs=[xe], outputs=[le])
    with pytest.raises(TypeError, match="no parameters"):
        Program(lambda n: None, inputs=[xe], outputs=[le])


def test_call_errors_name_the_argument_and_leave_no_state(err_prog):
    good = [np.ones(4), np.array(2.0)]
    with pytest.raises(
        ValueError, match=r"err_kernel: argument 'xe' \(a field\): expected shape \(4,\), got shape \(5,\)"
    ):
        err_prog.primal([np.ones(5), np.array(2.0)])
    with pytest.raises(ValueError, match=r"td.vjp\(err_kernel\): argument 'we' \(a field\): expected a scalar, "
                                         r"got shape \(1,\) \(a field program takes no batch dims\)"):
        err_prog.vjp([np.ones(4), np.ones(1)], [np.array(1.0)])
    with pytest.raises(ValueError, match=r"td.vjp\(err_kernel\): the cotangent must have the output's shape \(\)"):
        err_prog.vjp(good, [np.ones(3)])
    with pytest.raises(
        ValueError, match=r"td.jvp\(err_kernel\): argument 'tangents\[0\]' .*got an array of shape \(3,\)"
    ):
        err_prog.jvp(good, [np.ones(3), None])
    with pytest.raises(TypeError, match=r"expected 2 arguments \(xe, we\), got 1"):
        err_prog.primal([np.ones(4)])
    with pytest.raises(TypeError, match=r"argument 'we' \(a field\): expected an array, got None"):
        err_prog.primal([np.ones(4), None])
    with pytest.raises(TypeError, match="must hold real numbers"):
        err_prog.primal([np.ones(4), "two"])
    (value,), grads = err_prog.vjp(good, [np.array(1.0)])
    assert value == 8.0 and grads[1] == 4.0
    np.testing.assert_array_equal(grads[0], np.full(4, 2.0))
