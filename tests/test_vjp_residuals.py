"""vjp_fn computes at the primals td.vjp was given, whatever the caller does to them afterwards.

Regression for issue 10, item 4: ``vjp_fn`` read its residuals late, so a
caller overwriting the input array after ``td.vjp`` got the cotangents at the
new values (JAX captures everything ``vjp_fn`` needs when ``vjp`` returns).
"""
import numpy as np
import pytest
import taichi as ti
import torch

import tidiff as td

N = 16
x_field = ti.field(ti.f64, shape=N)
w_field = ti.field(ti.f64, shape=())
squares = ti.field(ti.f64, shape=N)


@ti.kernel
def weighted_squares():
    for i in x_field:
        squares[i] = w_field[None] * x_field[i] ** 2


@ti.func
def repeated_product(x: ti.f64, y: ti.f64) -> ti.f64:
    out = x
    i = 0
    while i < 2:  # not straight-line: no linearized vjp, vjp_fn runs again at the primals
        out = out * y + ti.sin(x)
        i += 1
    return out


@ti.kernel
def cube(x: ti.types.ndarray(), out: ti.types.ndarray()):
    for i in x:
        out[i] = x[i] ** 3


FIELDS = td.function(weighted_squares, inputs=[x_field, w_field], outputs=[squares])
NDARRAY = td.function(cube, inputs=["x"], outputs={"out": lambda x: x.shape})


def overwrite(arrays):
    for a in arrays:
        a[...] = 5.0


@pytest.mark.parametrize("kind", ["fields", "func", "ndarray", "func-torch", "ndarray-torch"])
def test_overwriting_the_primals_after_vjp_changes_nothing(kind):
    rng = np.random.default_rng(0)
    xs, ys, c = rng.uniform(0.1, 1.0, N), rng.uniform(0.5, 1.5, N), rng.standard_normal(N)
    if kind == "fields":
        fn, primals = FIELDS, (xs, np.array(2.0))
    elif kind.startswith("func"):
        fn, primals = repeated_product, (xs, ys)
    else:
        fn, primals = NDARRAY, (xs,)
    if kind.endswith("torch"):
        primals = tuple(torch.tensor(p) for p in primals)
        c = torch.tensor(c)
    _, vjp_fn = td.vjp(fn, *primals)
    before = [np.asarray(g).copy() for g in vjp_fn(c)]
    overwrite(primals)
    after = vjp_fn(c)
    for b, a in zip(before, after):
        np.testing.assert_array_equal(np.asarray(a), b)
