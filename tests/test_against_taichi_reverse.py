"""The tangent transform against Taichi's own reverse mode, an independent implementation.

For every op-table row Taichi's reverse mode supports (``UNSUPPORTED_BY_TAICHI`` says what
it refuses in the others), ``kernel.grad`` over a kernel calling the row's function must give
the gradient tidiff computes. (Taichi's reverse mode over tidiff's
generated derivative bodies is no oracle: it refuses their runtime loops, "Mixed usage of
for-loops and statements", or gets them wrong; second order is checked against torch.)
"""
import numpy as np
import pytest
import taichi as ti
from op_table import ROWS

import tidiff as td
from tidiff._signature import ArgSpec

UNSUPPORTED_BY_TAICHI = {  # row -> what Taichi's reverse mode refuses in it ("Not supported" in auto_diff.cpp)
    "stop_gradient": "nothing, but td.stop_gradient is a plain @ti.func to it: it differentiates through",
    "trig": "ti.tan",
    "while_loop": "a while loop",
    "zero_derivative": "ti.round",
    "svd_3x3": "ti.svd of a 3x3 matrix (a C++ builtin)",
    "polar_3x3": "ti.polar_decompose of a 3x3 matrix (ti.svd inside)",
    "sym_eig_3x3": "the while loop of its QL fallback",
}
ROWS_HERE = [r for r in ROWS if r.name not in UNSUPPORTED_BY_TAICHI]
_kernels = {}


def _specs(row):
    return [ArgSpec(f"a{k}", s, np.dtype(np.float64)) for k, s in enumerate(row.shapes)]


def taichi_gradient(body, specs, xs, out_shape, out_index=None):
    """Gradient of the sum of the body's output (``out_index`` of a tuple) by kernel.grad over ti.ndarrays."""
    key = (id(body), out_index)
    if key not in _kernels:
        _kernels[key] = _reduction_kernel(body, specs, out_shape, out_index)
    kernel = _kernels[key]
    bufs = []
    for spec, x in zip(specs, xs):
        buf = ti.ndarray(spec.ti_type(), shape=(1,), needs_grad=True)
        buf.from_numpy(x.reshape((1,) + spec.shape))
        buf.grad.from_numpy(np.zeros((1,) + spec.shape))
        bufs.append(buf)
    loss = ti.ndarray(ti.f64, shape=(1,), needs_grad=True)
    loss.grad.from_numpy(np.ones(1))
    kernel(*bufs, loss)
    kernel.grad(*bufs, loss)
    return [b.grad.to_numpy()[0] for b in bufs]


def _reduction_kernel(body, specs, out_shape, out_index):
    from tidiff._lang.compile import compile_source

    types = {f"T{k}": ti.types.ndarray(dtype=s.ti_type(), ndim=1) for k, s in enumerate(specs)}
    params = ", ".join(f"a{k}: T{k}" for k in range(len(specs)))
    call = ", ".join(f"a{k}[i]" for k in range(len(specs)))
    value = "r" if out_index is None else f"r[{out_index}]"
    total = value if out_shape == () else f"{value}.sum()"
    source = (
        f"@ti.kernel\ndef reduce_({params}, loss: ti.types.ndarray(dtype=ti.f64, ndim=1)):\n"
        f"    for i in range(1):  # one parallel loop: Taichi's reverse mode refuses mixed top-level code\n"
        f"        r = body({call})\n"
        f"        loss[0] += {total}\n"
    )
    return compile_source(source, "reduce_", {"ti": ti, "body": body, **types}, "test")


@pytest.mark.parametrize("row", ROWS_HERE, ids=[r.name for r in ROWS_HERE])
def test_first_order_matches_taichi_reverse(row):
    rng = np.random.default_rng(7)
    xs = [rng.uniform(row.low, row.high, size=s) for s in row.shapes]
    out = td.function(row.func)(*xs)
    expected = taichi_gradient(row.func, _specs(row), xs, np.shape(out))
    # d sum(out) / d args = vjp with a ones cotangent
    _, vjp_fn = td.vjp(row.func, *xs)
    for got, want in zip(vjp_fn(np.ones(np.shape(out))), expected):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
