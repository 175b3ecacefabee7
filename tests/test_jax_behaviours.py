"""Behaviours JAX users rely on (issue 10, item 13): has_aux, argnums types, integer outputs,
keyword arguments, precision, and the messages bad input gets."""
import numpy as np
import pytest
import taichi as ti
import torch

import tidiff as td

vec3 = ti.types.vector(3, ti.f64)


@ti.func
def three(x: ti.f64):
    return x, x * 2.0, x * 3.0


@ti.func
def with_aux(x: vec3, s: ti.f64):
    return ti.sin(x) * s, x.norm_sqr()  # (out, aux)


@ti.func
def scalar_with_aux(x: vec3, s: ti.f64):
    return s * x.dot(x) + ti.cos(x[1]), x * 2.0


def torch_with_aux(x, s):
    return torch.sin(x) * s


def torch_scalar(x, s):
    return s * x.dot(x) + torch.cos(x[1])


X = np.array([0.3, -0.5, 1.1])
S = 1.7


def tensors(*values):
    return tuple(torch.tensor(v, dtype=torch.float64) for v in values)


@pytest.mark.parametrize("transform", [td.grad, td.value_and_grad, td.jacfwd, td.jacrev, td.jacobian, td.hessian])
def test_has_aux_needs_exactly_a_pair(transform):
    with pytest.raises(TypeError, match=r"has_aux=True needs the function to return a pair \(out, aux\); "
                                        r"it returns a tuple of 3"):
        transform(three, has_aux=True)(1.0)


def test_has_aux_on_jvp_and_vjp_needs_a_pair_too():
    with pytest.raises(TypeError, match="a pair"):
        td.jvp(three, (1.0,), (1.0,), has_aux=True)
    with pytest.raises(TypeError, match="a pair"):
        td.vjp(three, 1.0, has_aux=True)


@pytest.mark.parametrize("transform", [td.jacfwd, td.jacrev, td.jacobian])
def test_has_aux_on_jacobians(transform):
    jac, aux = transform(with_aux, argnums=(0, 1), has_aux=True)(X, S)
    expected = torch.autograd.functional.jacobian(torch_with_aux, tensors(X, S))
    for got, want in zip(jac, expected):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(aux, X @ X, rtol=1e-14)


def test_has_aux_on_hessian_and_jvp():
    hessian, aux = td.hessian(scalar_with_aux, has_aux=True)(X, S)
    x, s = tensors(X, S)
    np.testing.assert_allclose(hessian, torch.autograd.functional.hessian(lambda z: torch_scalar(z, s), x).numpy(),
                               rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(aux, 2.0 * X)
    t = np.array([1.0, -2.0, 0.5])
    out, tangent, aux = td.jvp(with_aux, (X, S), (t, 0.0), has_aux=True)
    _, want = torch.autograd.functional.jvp(torch_with_aux, (x, s), tensors(t, 0.0))
    np.testing.assert_allclose(out, np.sin(X) * S, rtol=1e-14)
    np.testing.assert_allclose(tangent, want.numpy(), rtol=1e-12)
    np.testing.assert_allclose(aux, X @ X, rtol=1e-14)


@ti.func
def two_args(x: ti.f64, z: ti.f64) -> ti.f64:
    return x * x * z + z**3


def test_argnums_may_be_numpy_integers():
    assert td.grad(two_args, argnums=np.int64(1))(2.0, 3.0) == 4.0 + 27.0
    gz, gx = td.grad(two_args, argnums=(np.int32(1), np.int64(0)))(2.0, 3.0)
    assert (gz, gx) == (31.0, 12.0)
    with pytest.raises(TypeError, match="argnums must be an int or a non-empty tuple of ints"):
        td.grad(two_args, argnums=1.0)
    with pytest.raises(TypeError, match="argnums must be"):
        td.grad(two_args, argnums=True)


@ti.func
def rounds(x: ti.f64) -> ti.i32:
    return ti.cast(x, ti.i32)


@ti.func
def doubles(n: ti.i32) -> ti.i32:
    return n * 2


def test_derivatives_of_integer_outputs_are_refused():
    for transform in (td.grad, td.jacrev, td.jacfwd, td.hessian):
        with pytest.raises(TypeError, match=r"output 'out' holds integers \(int32\); only float outputs"):
            transform(rounds)(1.5)


def test_vjp_of_an_all_integer_function():
    out, vjp_fn = td.vjp(doubles, 3)
    assert out == 6 and out.dtype == np.int32
    assert vjp_fn(np.array(1, np.int32)) == (None,)
    with pytest.raises(TypeError, match="argument 'n'.*holds integers"):
        td.grad(doubles)(3)


def test_keyword_arguments_pass_through_undifferentiated():
    assert td.grad(two_args)(2.0, z=3.0) == 12.0
    value, g = td.value_and_grad(two_args)(2.0, z=3.0)
    assert (value, g) == (39.0, 12.0)
    np.testing.assert_allclose(td.grad(two_args)(np.array([1.0, 2.0]), z=np.array([3.0, 4.0])), [6.0, 16.0])
    assert td.function(two_args)(x=2.0, z=3.0) == 39.0
    with pytest.raises(TypeError, match=r"td.grad\(two_args\): differentiating with respect to argnums=\(1,\) needs "
                                        r"them among the 1 positional arguments"):
        td.grad(two_args, argnums=1)(2.0, z=3.0)
    with pytest.raises(TypeError, match=r"grad\(two_args\): got an unexpected keyword argument 'q'; "
                                        r"parameters are \['x', 'z'\]"):
        td.grad(two_args)(2.0, q=3.0)
    with pytest.raises(TypeError, match="multiple values for argument 'x'"):
        td.grad(two_args)(2.0, x=3.0)


@ti.kernel
def keywords_in_a_kernel(x: ti.f64) -> ti.f64:
    return td.grad(two_args)(x, z=3.0)


def test_keyword_arguments_inside_a_kernel():
    assert keywords_in_a_kernel(2.0) == 12.0


@ti.func
def energy(x: ti.math.vec3, s: ti.f64) -> ti.f64:
    return s * x.dot(x) + ti.sin(x[0])


def test_float32_in_float32_out():
    x32, s32 = X.astype(np.float32), np.float32(S)
    for result in (td.function(energy)(x32, s32), td.grad(energy)(x32, s32), td.jacobian(energy)(x32, s32),
                   td.hessian(energy)(x32, s32), td.jvp(energy, (x32, s32), (x32, s32))[1],
                   td.vjp(energy, x32, s32)[1](np.float32(1.0))[0]):
        assert result.dtype == np.float32
    np.testing.assert_allclose(td.grad(energy)(x32, s32), td.grad(energy)(X, S), rtol=1e-6)
    x = torch.tensor(X, dtype=torch.float32)
    assert td.grad(energy)(x, torch.tensor(S, dtype=torch.float32)).dtype == torch.float32
    assert td.grad(energy)(X, S).dtype == np.float64  # float64 stays float64


@ti.func
def mixed(x, y):
    return ti.exp(x) * y + ti.sin(x * y)


def test_mixed_precision_computes_in_the_widest_float():
    """Issue 35, item 5: with a float32 and a float64 argument the float64 result carried float32 error (exp(1)
    off by 8e-8): the float32 argument was computed in float32. The widest float decides the arithmetic."""
    x32, y = np.array([1.0, 0.3], np.float32), np.array([1.0, 2.0])
    x = x32.astype(np.float64)
    np.testing.assert_allclose(td.function(mixed)(x32, y), td.function(mixed)(x, y), rtol=1e-15)
    for got, want in zip(td.jacrev(mixed, argnums=(0, 1))(x32, y), td.jacrev(mixed, argnums=(0, 1))(x, y)):
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-15)
    _, tangent = td.jvp(mixed, (x32, y), (np.ones(2, np.float32), np.ones(2)))
    np.testing.assert_allclose(tangent, td.jvp(mixed, (x, y), (np.ones(2), np.ones(2)))[1], rtol=1e-15)
    want = np.exp(x) * y + np.sin(x * y)
    np.testing.assert_allclose(td.function(mixed)(x32, y), want, rtol=1e-15)


@ti.func
def defaulted(x: ti.f64, y: ti.f64 = 3.0) -> ti.f64:
    return x * x * y


@ti.kernel
def defaulted_in_a_kernel(x: ti.f64) -> ti.f64:
    hv = td.hvp(defaulted, (x,), (1.0,))[1][0]
    return defaulted(x) + td.grad(defaulted)(x) + td.jvp(defaulted, (x,), (1.0,))[1] + hv


def test_default_parameter_values_are_honoured_as_constants():
    """Issue 35, item 8: ``td.grad(g)(2.)`` raised "expected 2 arguments", and in a kernel "Parameter 'y'
    missing". A left-out parameter takes its default, a constant (JAX passes defaults through undifferentiated);
    jvp/vjp/hvp take and give one tangent or cotangent per primal given."""
    assert td.function(defaulted)(2.0) == 12.0
    assert td.grad(defaulted)(2.0) == 12.0 and td.grad(defaulted)(2.0, 4.0) == 16.0
    assert td.grad(defaulted)(2.0, y=4.0) == 16.0
    assert td.hessian(defaulted)(2.0) == 6.0
    assert td.jvp(defaulted, (2.0,), (1.0,)) == (12.0, 12.0)
    y, vjp_fn = td.vjp(defaulted, 2.0)
    assert y == 12.0 and vjp_fn(1.0) == (12.0,)
    assert td.hvp(defaulted, (2.0,), (1.0,)) == (12.0, (6.0,))
    np.testing.assert_array_equal(td.jacfwd(defaulted)(np.array([1.0, 2.0])), [6.0, 12.0])
    assert defaulted_in_a_kernel(2.0) == 12.0 + 12.0 + 12.0 + 6.0
    with pytest.raises(TypeError, match=r"argnums=\(1,\) needs them among the 1 positional arguments"):
        td.grad(defaulted, argnums=1)(2.0)
    with pytest.raises(TypeError, match=r"expected 2 arguments"):
        td.grad(mixed)(2.0)  # no default: the count is named


def test_ragged_input_names_the_argument():
    with pytest.raises(ValueError, match=r"argument 'x' is not a rectangular array of numbers"):
        td.grad(energy)([[1.0, 2.0, 3.0], [1.0]], 2.0)
    with pytest.raises(TypeError, match=r"argument 's' must hold real numbers"):
        td.grad(energy)(X, "two")


@ti.func
def calls_a_transform(x: vec3) -> ti.f64:
    return td.grad(energy)(x, 2.0).norm_sqr()


dE = td.grad(energy)


@ti.func
def calls_a_named_transform(x: vec3, s: ti.f64) -> ti.f64:
    g = dE(x, s)
    h = td.hessian(energy, argnums=0)(x, s)
    return g.dot(h @ g) + td.jvp(energy, (x, s), (g, 1.0))[1]


def torch_energy(x, s):
    return s * x.dot(x) + torch.sin(x[0])


def torch_calls_a_named_transform(x, s):
    (g,) = torch.autograd.grad(torch_energy(x, s), x, create_graph=True)
    h = torch.stack([torch.autograd.grad(g[i], x, create_graph=True)[0] for i in range(3)])
    dot = g.dot(h @ g)
    _, tangent = torch.autograd.functional.jvp(torch_energy, (x, s), (g, torch.ones((), dtype=x.dtype)),
                                               create_graph=True)
    return dot + tangent


def test_differentiating_through_transforms_called_in_a_function():
    """Issue 10, item 9: transforms compose through user code, host and in kernels, to second order."""
    def torch_calls_a_transform(x):
        (g,) = torch.autograd.grad(torch_energy(x, torch.tensor(2.0, dtype=x.dtype)), x, create_graph=True)
        return g.dot(g)

    want = torch.autograd.functional.jacobian(torch_calls_a_transform, torch.tensor(X, requires_grad=True))
    np.testing.assert_allclose(td.grad(calls_a_transform)(X), want.numpy(), rtol=1e-12)
    x, s = tensors(X, S)
    for argnums in (0, 1):
        want = torch.autograd.functional.jacobian(torch_calls_a_named_transform, (x, s))[argnums]
        np.testing.assert_allclose(td.grad(calls_a_named_transform, argnums=argnums)(X, S), want.numpy(), rtol=1e-11)
        np.testing.assert_allclose(td.jacrev(calls_a_named_transform, argnums=argnums)(X, S), want.numpy(),
                                   rtol=1e-11)
    hessian = torch.autograd.functional.hessian(lambda z: torch_calls_a_named_transform(z, s), x)
    np.testing.assert_allclose(td.hessian(calls_a_named_transform)(X, S), hessian.numpy(), rtol=1e-10, atol=1e-12)


@ti.func
def narrowed(x: ti.types.vector(3, ti.f64)) -> ti.f32:
    return x.dot(x) + 1e-9


@ti.func
def narrowed_vector(x: ti.types.vector(3, ti.f64)) -> ti.types.vector(2, ti.f32):
    return ti.Vector([x.dot(x), ti.sin(x[0])]) + 1e-9


def test_a_narrower_return_annotation_casts_the_value_of_every_transform():
    """Outside code, after JAX's value_and_grad(f)(x)[0] == f(x): with ``-> ti.f32`` on a float64 computation the
    transforms returned the float64 value (0.140000001, f(x) 0.14000000059604645; NOTE: [Narrowing return
    annotations]). Reverse mode is exact (the cotangent 1 is cast back); a tangent is cast to float32, as JAX's."""
    x = np.array([0.1, 0.2, 0.3])
    value = td.function(narrowed)(x)
    assert value == np.float32(x.dot(x) + 1e-9)
    assert td.value_and_grad(narrowed)(x)[0] == value
    assert td.jvp(narrowed, (x,), (x,))[0] == value
    assert td.vjp(narrowed, x)[0] == value
    assert td.hvp(narrowed, (x,), (x,))[0] == value
    np.testing.assert_array_equal(td.grad(narrowed)(x), 2 * x)
    np.testing.assert_array_equal(td.jacfwd(narrowed)(x), (2 * x).astype(np.float32))
    vector = td.function(narrowed_vector)(x)
    np.testing.assert_array_equal(td.jvp(narrowed_vector, (x,), (x,))[0], vector)
    np.testing.assert_array_equal(td.vjp(narrowed_vector, x)[0], vector)
