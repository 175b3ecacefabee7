"""Ndarray kernels' adjoints with the gradients every iteration adds into summed per chunk of rows (NOTE:
[Accumulations by chunk]): the same numbers as torch, whichever form a launch takes.

A launch takes the chunked form only with enough rows (thousands); the drawn cases lower the thresholds so
that every launch takes it at the sizes hypothesis draws, and check each result against torch.
"""
import contextlib
import pathlib
import runpy
from unittest import mock

import numpy as np
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import tidiff as td
from tidiff._adjoint import chunks
from tidiff._adjoint.kernels import KernelAdjoint, vjp_ndarray_kernel
from tidiff._lang.compile import info

IN, OUT = 3, 2


linear = runpy.run_path(str(pathlib.Path(__file__).parents[1] / "examples" / "torch_linear_layer.py"),
                        run_name="layer")["linear_kernel"]  # the seeds' layer: every row adds into W's gradient


def torch_linear(x, W, b):
    return x @ W.T + b


@ti.kernel
def gathered(x: ti.types.ndarray(), idx: ti.types.ndarray(dtype=ti.i32, ndim=1), w: ti.types.ndarray(),
             out: ti.types.ndarray()):
    for i, j in ti.ndrange(idx.shape[0], w.shape[0]):
        out[i, j] = ti.sin(x[idx[i]] * w[j])  # x's gradient at an index no row owns: each chunk's copy of it
        out[i, j] -= w[j] ** 2


def torch_gathered(x, idx, w):
    return torch.sin(x[idx][:, None] * w[None, :]) - w[None, :] ** 2


@ti.kernel
def rows_of_vectors(v: ti.types.ndarray(dtype=ti.math.vec2, ndim=1), s: ti.types.ndarray(),
                    out: ti.types.ndarray()):
    for i in range(v.shape[0]):
        out[i] = v[i].dot(v[i]) * s[0] + ti.exp(v[i][1] * s[1])  # v's gradient by row (plain adds), s's shared


def torch_rows_of_vectors(v, s):
    return (v * v).sum(1) * s[0] + torch.exp(v[:, 1] * s[1])


LINEAR = td.function(linear, inputs=["x", "W", "b"], outputs={"y": lambda x, W, b: (x.shape[0], W.shape[0])})
GATHERED = td.function(gathered, inputs=["x", "idx", "w"], outputs={"out": lambda x, idx, w: (idx.shape[0],
                                                                                            w.shape[0])})
VECTORS = td.function(rows_of_vectors, inputs=["v", "s"], outputs={"out": lambda v, s: v.shape[:1]})


@contextlib.contextmanager
def launches(every_launch_chunked=False):
    """The forms the launches took (True: by chunk); with ``every_launch_chunked``, thresholds low enough that
    every launch takes the chunked form."""
    taken = []
    pick = KernelAdjoint.for_launch

    def recorded(self, arrays):
        form = pick(self, arrays)
        taken.append(form is self.chunked)
        return form

    with mock.patch.object(KernelAdjoint, "for_launch", recorded), \
            mock.patch.object(chunks, "GRAIN", 0 if every_launch_chunked else chunks.GRAIN), \
            mock.patch.object(chunks, "ROWS", 1 if every_launch_chunked else chunks.ROWS):
        yield taken
    assert taken and (all(taken) or not every_launch_chunked)


def check_vjp(f, reference, args, cotangent, rtol=1e-12):
    got = td.vjp(f, *args)[1](cotangent)
    floats = [torch.tensor(a, requires_grad=True) for a in args if a.dtype.kind == "f"]
    inputs = iter(floats)
    out = reference(*[next(inputs) if a.dtype.kind == "f" else torch.tensor(a, dtype=torch.long) for a in args])
    want = torch.autograd.grad(out, floats, torch.tensor(cotangent))
    got_floats = [g for g, a in zip(got, args, strict=True) if a.dtype.kind == "f"]
    for g, w in zip(got_floats, want, strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=rtol, atol=rtol)


def values(shape, dtype=np.float64):
    return arrays(dtype, shape, elements=st.floats(-1.5, 1.5, width=np.finfo(dtype).bits))


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(values((n, IN)), values((OUT, IN)), values((OUT,)),
                                                     values((n, OUT)))))
def test_a_layer_by_chunk_equals_torch(drawn):
    x, W, b, c = drawn
    with launches(every_launch_chunked=True):
        check_vjp(LINEAR, torch_linear, (x, W, b), c)


@given(st.integers(1, 8).flatmap(lambda n: st.tuples(values((4,)), st.lists(st.integers(0, 3), min_size=n,
                                                                              max_size=n), values((3,)),
                                                     values((n, 3)))))
def test_a_gather_by_chunk_equals_torch(drawn):
    x, idx, w, c = drawn
    with launches(every_launch_chunked=True):
        check_vjp(GATHERED, torch_gathered, (x, np.array(idx, dtype=np.int32), w), c)


@given(st.integers(1, 8).flatmap(lambda n: st.tuples(values((n, 2), np.float32), values((2,), np.float32),
                                                     values((n,), np.float32))))
def test_float32_vectors_by_chunk_equal_torch(drawn):
    v, s, c = drawn
    with launches(every_launch_chunked=True):
        check_vjp(VECTORS, torch_rows_of_vectors, (v, s), c, rtol=1e-5)


def test_launches_take_the_chunked_form_with_thousands_of_rows():
    rng = np.random.default_rng(0)
    for rows, chunked in ((16, False), (20_000, True)):
        x, W, b = rng.standard_normal((rows, IN)), rng.standard_normal((OUT, IN)), rng.standard_normal(OUT)
        with launches() as taken:
            check_vjp(LINEAR, torch_linear, (x, W, b), rng.standard_normal((rows, OUT)), rtol=1e-10)
        assert taken == [chunked]


def test_the_torch_operator_takes_it_too():
    op = td.torch.function(linear, inputs=["x", "W", "b"], outputs={"y": lambda x, W, b: (x.shape[0], W.shape[0])})
    g = torch.Generator().manual_seed(1)
    x, W, b = (torch.randn(*s, dtype=torch.float64, generator=g, requires_grad=True)
               for s in ((20_000, IN), (OUT, IN), (OUT,)))
    c = torch.randn(20_000, OUT, dtype=torch.float64, generator=g)
    want = torch.autograd.grad(torch_linear(x, W, b), (x, W, b), c)
    with launches() as taken:
        for _ in range(2):  # the second call runs the launch plan
            got = torch.autograd.grad(op(x, W, b), (x, W, b), c)
            for a, e in zip(got, want, strict=True):
                torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10)
    assert taken == [True, True]


def test_the_chunked_form_is_generated_where_it_applies():
    made = vjp_ndarray_kernel(linear, {"x": ti.f64, "W": ti.f64, "b": ti.f64, "y": ti.f64})
    assert isinstance(made, KernelAdjoint) and made.chunked is not None
    source = info(made.chunked.kernel).source
    assert "W_part[chunk, j, k_1] = W_part[chunk, j, k_1] +" in source  # the copy of W's gradient: plain adds
    assert "x.grad[i, k_1] = x.grad[i, k_1] +" in source  # x's by row: plain adds
    assert [c.parts for c in made.chunkings] == [("W", "b")]
