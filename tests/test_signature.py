"""Core shapes from annotations, from td.function(signature=...), or from the arguments themselves."""
import numpy as np
import pytest
import taichi as ti

import tidiff as td


@ti.func
def plain(x, s):
    return s * x.dot(x)


def test_signature_by_position_and_by_name_batches_the_call():
    x = np.arange(12.0).reshape(4, 3)
    for signature in ([(3,), ()], [ti.math.vec3, ti.f64], {"x": ti.math.vec3, "s": ()}):
        f = td.function(plain, signature=signature)
        np.testing.assert_allclose(f(x, 2.0), 2.0 * (x * x).sum(-1))
        np.testing.assert_allclose(td.grad(f)(x, 2.0), 4.0 * x)


def test_without_annotations_the_full_shape_is_the_core_shape():
    x = np.array([1.0, 2.0, 3.0])
    assert td.function(plain)(x, 2.0) == 28.0
    np.testing.assert_allclose(td.grad(plain)(x, 2.0), 4.0 * x)
    H = td.hessian(plain)(x, 2.0)
    np.testing.assert_allclose(H, 4.0 * np.eye(3))


def test_bad_signatures_are_refused_at_wrap_time():
    with pytest.raises(ValueError, match="2 parameters"):
        td.function(plain, signature=[(3,)])
    with pytest.raises(ValueError, match="unknown parameters"):
        td.function(plain, signature={"y": (3,)})
    with pytest.raises(TypeError, match="core shape"):
        td.function(plain, signature=["three", ()])
