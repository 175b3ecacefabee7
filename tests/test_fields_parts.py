"""Part of a field as an input or output (td.part), and state fields zeroed before each call."""
import numpy as np
import pytest
import taichi as ti
from taped import tape

import tidiff as td

RTOL = 1e-10
T, N = 4, 3


def make_trajectory(needs_grad=False):
    """DiffTaichi's smoke in miniature: a (T, n) trajectory whose first slice is optimized."""
    v = ti.Vector.field(2, ti.f64, shape=(T, N), needs_grad=needs_grad)
    loss = ti.field(ti.f64, shape=(), needs_grad=needs_grad)

    @ti.kernel
    def advance(t: ti.i32):
        for i in range(N):
            v[t + 1, i] = v[t, i] + 0.1 * ti.sin(v[t, (i + 1) % N]) * v[t, i].norm()

    @ti.kernel
    def measure():
        for i in range(N):
            loss[None] += v[T - 1, i].norm_sqr() * (i + 1)

    def run():
        for t in range(T - 1):
            advance(t)
        measure()

    return v, loss, run


V, LOSS, RUN = make_trajectory()
F = td.function(RUN, inputs=[td.part(V, 0)], outputs=[LOSS])
V0 = np.arange(1.0, 7.0).reshape(N, 2) / 6


def central(f, x, eps=1e-6):
    steps = [e.reshape(x.shape) for e in np.eye(x.size)]
    columns = [(f(x + eps * e) - f(x - eps * e)) / (2 * eps) for e in steps]
    return np.moveaxis(np.array(columns), 0, -1).reshape(np.shape(f(x)) + x.shape)


def test_first_slice_as_input_equals_tape():
    assert [(s.name, s.shape) for s in F.declared_specs()] == [("v[0]", (N, 2))]
    value, grad = td.value_and_grad(F)(V0)
    v, loss, run = make_trajectory(needs_grad=True)
    v.from_numpy(np.concatenate([V0[None], np.zeros((T - 1, N, 2))]))
    with tape(loss, v):
        run()
    assert value == loss[None]
    np.testing.assert_allclose(grad, v.grad.to_numpy()[0], rtol=1e-13)  # tidiff's adjoint, rounded its own way
    np.testing.assert_allclose(grad, central(F, V0), rtol=1e-7)


def test_forward_mode_and_hessian_of_a_slice():
    t = np.linspace(-1, 1, 2 * N).reshape(N, 2)
    _, tangent = td.jvp(F, (V0,), (t,))
    assert tangent == pytest.approx(float(np.vdot(td.grad(F)(V0), t)), rel=RTOL)
    H = td.hessian(F)(V0)
    assert H.shape == (N, 2, N, 2)
    np.testing.assert_allclose(H, central(td.grad(F), V0), rtol=1e-6, atol=1e-8)


def test_slices_as_outputs_beside_an_input_slice_of_the_same_field():
    G = td.function(RUN, inputs=[td.part(V, 0)], outputs=[td.part(V, T - 1), td.part(V, 1), LOSS])
    last, first_step, value = G(V0)
    assert last.shape == (N, 2) and value == F(V0)
    jac = td.jacobian(G)(V0)
    np.testing.assert_allclose(jac[0], central(lambda a: G(a)[0], V0), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(jac[1], central(lambda a: G(a)[1], V0), rtol=1e-7, atol=1e-9)
    assert not V.to_numpy().any()  # the user's field is untouched


def test_two_leading_indices_and_an_offset():
    w = ti.field(ti.f64, shape=(2, 3, 4), offset=(-1, 0, 0))
    out = ti.field(ti.f64, shape=())

    @ti.kernel
    def total():
        for k in range(4):
            out[None] += w[0, 2, k] ** 2 + w[-1, 2, k]

    G = td.function(total, inputs=[td.part(w, 0, 2)], outputs=[out])
    assert G.declared_specs()[0].shape == (4,)
    np.testing.assert_allclose(td.grad(G)(np.arange(4.0)), 2 * np.arange(4.0), rtol=RTOL)


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda: td.part(V, 5), IndexError, "index 5 is out of range for axis 0 (from 0 to 3)"),
        (lambda: td.part(V, 0.5), TypeError, "integers along leading axes"),
        (lambda: td.part(V, 0, 0, 0), ValueError, "the field has 2 axes, got 3"),
        (lambda: td.part(np.zeros(3), 0), TypeError, "got ndarray"),
        (
            lambda: td.function(RUN, inputs=[td.part(V, 0), V], outputs=[LOSS]),
            ValueError,
            "inputs[1]: this field is already listed",
        ),
        (
            lambda: td.function(RUN, inputs=[td.part(V, 1)], outputs=[V]),
            ValueError,
            "inputs[0]: this field is also an output",
        ),
    ],
)
def test_parts_errors_name_the_call(make, error, words):
    with pytest.raises(error) as info:
        make()
    assert words in str(info.value)


# --- state: fields zeroed before each call (NOTE in docs/kernel-programs.md) -----------------------
xs = ti.field(ti.f64, shape=4)
acc = ti.field(ti.f64, shape=())  # an accumulator the program reads after adding to it
out = ti.field(ti.f64, shape=())


@ti.kernel
def accumulate():
    for i in xs:
        acc[None] += xs[i] ** 2


@ti.kernel
def finish():
    out[None] = ti.sqrt(acc[None])


def program():
    accumulate()
    finish()


def test_a_stale_accumulator_is_read_unless_declared_state():
    plain = td.function(program, inputs=[xs], outputs=[out])
    clean = td.function(program, inputs=[xs], outputs=[out], state=[acc])
    x = np.array([1.0, 2.0, 2.0, 0.0])
    try:
        acc[None] = 7.0  # left over from the user's own runs
        assert plain(x) == pytest.approx(4.0)  # documented: other fields hold their current values
        assert clean(x) == 3.0
        np.testing.assert_allclose(td.grad(clean)(x), x / 3.0, rtol=RTOL)
        assert acc[None] == 7.0
    finally:
        acc[None] = 0.0


def test_state_errors():
    with pytest.raises(TypeError, match=r"td.function\(program\): state\[0\]: expected a field"):
        td.function(program, inputs=[xs], outputs=[out], state=[3.0])
    with pytest.raises(ValueError, match=r"state\[0\]: this field is already an input or output"):
        td.function(program, inputs=[xs], outputs=[out], state=[xs])
