"""Bad input is refused at the call, naming the argument, and leaves no state behind."""
import numpy as np
import pytest
import taichi as ti
import torch
from op_table import ROW_BY_NAME

import tidiff as td

vector = ROW_BY_NAME["vector"].func
norms = ROW_BY_NAME["norms"].func


@ti.func
def scaled(x: ti.math.vec3, n: ti.i32) -> ti.f64:
    return x.sum() * n


def test_wrong_core_shape_names_argument_and_expected_shape():
    with pytest.raises(ValueError, match=r"'x'.*\(3,\).*\(5, 4\)"):
        td.function(vector)(np.ones((5, 4)), 1.0)
    with pytest.raises(ValueError, match=r"'x'.*\(3,\)"):
        td.grad(vector)(np.ones(2), 1.0)


def test_batch_dims_that_do_not_broadcast():
    with pytest.raises(ValueError, match="broadcast"):
        td.function(vector)(np.ones((4, 3)), np.ones(5))


def test_wrong_argument_count_and_dtype():
    with pytest.raises(TypeError, match="expected 2 arguments"):
        td.function(vector)(np.ones(3))
    with pytest.raises(TypeError, match="'n' expects integer"):
        td.function(scaled)(np.ones(3), 2.5)
    with pytest.raises(TypeError, match="real numbers"):
        td.function(vector)(np.array(["a", "b", "c"]), 1.0)
    with pytest.raises(TypeError, match="real numbers"):
        td.function(vector)(np.ones(3, complex), 1.0)


def test_grad_of_vector_output_suggests_jacobian():
    with pytest.raises(TypeError, match="scalar output.*td.jacobian"):
        td.grad(norms)(np.ones(3))


def test_integer_argument_is_not_differentiable():
    with pytest.raises(TypeError, match=r"'n'.*integers"):
        td.grad(scaled, argnums=1)(np.ones(3), 2)
    with pytest.raises(TypeError, match=r"'n'.*integers"):
        td.jacfwd(scaled, argnums=(0, 1))(np.ones(3), 2)
    # differentiating the float argument of the same function works
    np.testing.assert_allclose(td.grad(scaled)(np.ones(3), 2), [2.0, 2.0, 2.0])


def test_bad_argnums():
    with pytest.raises(TypeError, match="argnums"):
        td.grad(vector, argnums="x")
    with pytest.raises(ValueError, match="out of range"):
        td.grad(vector, argnums=5)(np.ones(3), 1.0)


def test_jvp_tangent_shape_must_match_primal():
    with pytest.raises(ValueError, match=r"tangents\[0\].*\(4, 3\)"):
        td.jvp(vector, (np.ones((4, 3)), 1.0), (np.ones(3), 0.0))
    with pytest.raises(TypeError, match="tuple"):
        td.jvp(vector, np.ones(3), np.ones(3))


def test_vjp_cotangent_shape_must_match_output():
    _, vjp_fn = td.vjp(vector, np.ones((4, 3)), 1.0)
    with pytest.raises(ValueError, match=r"cotangent.*\(4,\)"):
        vjp_fn(np.ones(3))


def test_not_taichi_code():
    with pytest.raises(TypeError, match="@ti.func"):
        td.grad(42)
    with pytest.raises(TypeError, match="inputs"):
        td.function(lambda: None)


def test_failed_call_leaves_no_state_behind():
    """A refused call changes nothing: the next good call gives the same answer as before."""
    x = np.random.default_rng(0).standard_normal((3, 3))
    good = td.grad(vector)(x, 2.0)
    with pytest.raises(ValueError):
        td.grad(vector)(np.ones((3, 4)), 2.0)
    np.testing.assert_array_equal(td.grad(vector)(x, 2.0), good)


def test_nan_and_inf_flow_through():
    x = np.array([[np.nan, 1.0, 2.0], [np.inf, 0.0, 0.0]])
    out = td.function(vector)(x, 1.0)
    assert np.isnan(out[0]) and np.isnan(out[1])  # inf * inf + sin(inf)
    g = td.grad(vector)(x, 1.0)
    assert np.isnan(g[0, 0]) and g.shape == (2, 3)


@ti.real_func
def real_square(x: ti.f64) -> ti.f64:
    return x * x


@ti.func
def calls_real_square(x: ti.f64) -> ti.f64:
    return real_square(x) + 1.0


def test_a_real_func_is_refused_by_its_name_and_the_users_call():
    """Issue 12 item 9: the message names td.grad and the function, never tidiff's internals."""
    with pytest.raises(TypeError, match=r"td\.grad: real_square is a @ti\.real_func.*make it a @ti\.func") as info:
        td.grad(real_square)(2.0)
    assert "jvp_func" not in str(info.value)
    with pytest.raises(td.TransformError, match=r"the call `real_square\(x\)` of a @ti\.real_func") as info:
        td.grad(calls_real_square)(2.0)
    assert "test_errors.py:" in str(info.value) and "jvp_func" not in str(info.value)


@ti.func
def loss_with_a_tuple_aux(x: ti.types.vector(3, ti.f64), s: ti.f64):
    return s * x.norm_sqr(), (x * 2.0, s + 1.0)


def test_a_nested_tuple_output_is_refused_by_name():
    """Outside code (JAX's api tests allow any aux tree): a tuple aux crashed inside tidiff's output probe,
    "'tuple' object has no attribute 'ptr'"."""
    x = np.array([0.1, 0.2, 0.3])
    for call in (lambda: td.grad(loss_with_a_tuple_aux, has_aux=True)(x, 1.5),
                 lambda: td.function(loss_with_a_tuple_aux)(x, 1.5)):
        with pytest.raises(TypeError, match=r"`loss_with_a_tuple_aux` returns a tuple holding a tuple \(its result"):
            call()


@ti.func
def returns_nothing(x: ti.f64):
    y = x * 2.0  # noqa: F841  (computed, never returned)


def test_a_function_without_a_result_is_refused_by_name():
    """Issue 35, item 15: a TaichiCompilationError from a generated probe kernel."""
    for call in (lambda: td.grad(returns_nothing)(2.0), lambda: td.function(returns_nothing)(2.0)):
        with pytest.raises(TypeError, match=r"`returns_nothing` returns nothing: there is no result to differentiate"):
            call()


def test_vjp_fn_takes_one_cotangent():
    """Issue 35, item 20 (JAX's api_test): Python's "vjp_fn() takes 1 positional argument but 2 were given"."""
    _, vjp_fn = td.vjp(squared_pair, 2.0)
    for args in ((1.0, 1.0), ()):
        with pytest.raises(TypeError, match=rf"td.vjp\(squared_pair\): vjp_fn takes one cotangent, in the structure "
                                            rf"of the outputs \(a tuple for several\), got {len(args)} arguments"):
            vjp_fn(*args)
    assert vjp_fn((1.0, 1.0)) == (5.0,)


@ti.kernel
def vjp_in_a_kernel(x: ti.f64) -> ti.f64:
    y, _ = td.vjp(returns_nothing, x)
    return y


def test_vjp_in_a_kernel_says_what_is_offered_there():
    """Issue 35, item 13: "argument 'x' must hold real numbers ... got Taichi Expression"."""
    with pytest.raises(TypeError, match=r"td.vjp\(returns_nothing\): td.vjp returns a Python function, so it is not "
                                        r"offered in Taichi scope .*there td.grad, td.value_and_grad"):
        vjp_in_a_kernel(1.0)


@ti.func
def updates_atomically(x: ti.f64) -> ti.f64:
    return ti.atomic_max(x, 1.0)


grad_updates_atomically = td.grad(updates_atomically)


@ti.kernel
def grad_in_a_kernel_of_what_has_no_rule(x: ti.f64) -> ti.f64:
    return grad_updates_atomically(x)


def test_a_transform_in_a_kernel_that_cannot_differentiate_says_why():
    """Found while checking jvp rules (issue 35, item 6): Taichi names a callee by ``__name__`` in the error of a
    call that raised, and a tidiff Function had none: an AttributeError hid the reason."""
    with pytest.raises(TypeError, match=r"cannot differentiate a call to Taichi op `ti.atomic_max`"):
        grad_in_a_kernel_of_what_has_no_rule(1.0)


@ti.func
def unannotated_sin(x):
    return ti.sin(x)


def test_grad_of_an_unannotated_function_of_an_array_says_how_it_was_read():
    """Issue 35, item 16: "output has core shape (5,), use td.jacobian" left out why: without annotations the
    array is one value, not a batch of scalars."""
    with pytest.raises(TypeError, match=r"no annotations, so each argument is one value of its whole shape: 'x' "
                                        r"\(shape \(5,\)\) was read as one value, not as a batch of scalars; "
                                        r"annotate the parameters"):
        td.grad(unannotated_sin)(np.ones(5))
    f = td.function(unannotated_sin, signature=[()])  # what the message points to
    np.testing.assert_allclose(td.grad(f)(np.ones(5)), np.cos(np.ones(5)), rtol=1e-15)


@ti.func
def squared_pair(x: ti.f64):
    return x * x, x


@ti.func
def squares(x: ti.types.vector(2, ti.f64)) -> ti.types.vector(2, ti.f64):
    return x * x


def test_messages_of_calls_a_jax_user_gets_wrong():
    """Outside code (JAX's api tests): each of these named another function or a wrong remedy, or crashed."""
    with pytest.raises(TypeError, match=r"pass has_aux=True"):
        td.grad(squared_pair)(1.0)
    with pytest.raises(TypeError, match=r"td.hvp\(squares\): a Hessian-vector product needs a scalar output"):
        td.hvp(squares, (np.ones(2),), (np.ones(2),))
    with pytest.raises(TypeError, match=r"write the function as a @ti.func \(def, not lambda\)"):
        td.grad(lambda x: x * 2)(1.0)
    with pytest.raises(TypeError, match=r"argument 'x': the dtype torch.bfloat16 has no Taichi type"):
        td.grad(squares)(torch.ones(2, dtype=torch.bfloat16))
