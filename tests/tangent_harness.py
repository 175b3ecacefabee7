"""Evaluate generated tangent functions in small test kernels, and torch references for them.

Imported by the tangent test modules (test_tangent.py checks the harness itself).
"""
import itertools

import numpy as np
import taichi as ti
import torch

from tidiff._lang.compile import compile_source

_KERNELS = {}


def _arg_source(shape, offset):
    """Taichi source building an argument of ``shape`` from the flat input ``a``."""
    if shape == ():
        return f"a[{offset}]", offset + 1
    if len(shape) == 1:
        items = ", ".join(f"a[{offset + i}]" for i in range(shape[0]))
        return f"ti.Vector([{items}])", offset + shape[0]
    rows = []
    for i in range(shape[0]):
        rows.append("[" + ", ".join(f"a[{offset + i * shape[1] + j}]" for j in range(shape[1])) + "]")
    return f"ti.Matrix([{', '.join(rows)}])", offset + shape[0] * shape[1]


def _leaves(struct, path=()):
    """(index path, shape) of every array in a nested tuple of shapes."""
    if isinstance(struct, list):
        for i, sub in enumerate(struct):
            yield from _leaves(sub, path + (i,))
    else:
        yield path, struct


def evaluate(g, arg_shapes, out_struct, values):
    """Run ``r = g(*args)`` in a kernel; return every leaf of ``r`` (shapes in ``out_struct``).

    ``out_struct`` nests lists for tuples and shape tuples for arrays, e.g.
    ``[(), [(3,), ()]]``; ``values`` is a list of arrays, one per argument.
    """
    key = (g, tuple(arg_shapes), repr(out_struct))
    if key not in _KERNELS:
        args, offset = [], 0
        for shape in arg_shapes:
            text, offset = _arg_source(tuple(shape), offset)
            args.append(text)
        lines = [f"    r = g({', '.join(args)})"]
        k = 0
        for path, shape in _leaves(out_struct):
            ref = "r" + "".join(f"[{i}]" for i in path)
            for index in itertools.product(*[range(n) for n in shape]):
                element = ref + (f"[{', '.join(map(str, index))}]" if index else "")
                lines.append(f"    out[{k}] = {element}")
                k += 1
        source = ("@ti.kernel\ndef k(a: ti.types.ndarray(dtype=ti.f64, ndim=1),"
                  " out: ti.types.ndarray(dtype=ti.f64, ndim=1)):\n" + "\n".join(lines) + "\n")
        _KERNELS[key] = (compile_source(source, "k", {"ti": ti, "g": g}, tag="test"), k)
    kernel, size = _KERNELS[key]
    flat = np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in values])
    out = np.full(size, np.nan)
    kernel(flat, out)
    leaves, pos = [], 0
    for _, shape in _leaves(out_struct):
        n = int(np.prod(shape, dtype=int))
        leaves.append(out[pos:pos + n].reshape(shape))
        pos += n
    return leaves


def structure(value):
    """The ``out_struct`` of a torch result: a shape, or a list of them for tuples."""
    if isinstance(value, (tuple, list)):
        return [structure(v) for v in value]
    return tuple(value.shape)


def flatten(value):
    """Leaves of a (nested) torch result as NumPy arrays."""
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in flatten(v)]
    return [value.detach().numpy()]


def torch_jvp(fn, primals, tangents):
    """(out, tangent of out) by torch.autograd.functional.jvp."""
    primals = tuple(torch.tensor(p, dtype=torch.float64) for p in primals)
    tangents = tuple(torch.tensor(t, dtype=torch.float64) for t in tangents)
    return torch.autograd.functional.jvp(fn, primals, tangents)


def torch_second(fn, primals, u, v):
    """(f, f'u, f'v, f''[u, v]) by nesting torch.autograd.functional.jvp."""
    primals = tuple(torch.tensor(p, dtype=torch.float64) for p in primals)
    u = tuple(torch.tensor(t, dtype=torch.float64) for t in u)
    v = tuple(torch.tensor(t, dtype=torch.float64) for t in v)

    def directional(*xs):
        return torch.autograd.functional.jvp(fn, xs, u, create_graph=True)[1]

    out, du = torch.autograd.functional.jvp(fn, primals, u)
    _, dv = torch.autograd.functional.jvp(fn, primals, v)
    _, duv = torch.autograd.functional.jvp(directional, primals, v)
    return out, du, dv, duv


def assert_close(actual, expected, what):
    """rtol 1e-7 (float64), naming the leaf and showing the worst entry."""
    assert len(actual) == len(expected), what
    for i, (a, e) in enumerate(zip(actual, expected)):
        a, e = np.asarray(a, dtype=np.float64), np.asarray(e, dtype=np.float64)
        assert a.shape == e.shape, f"{what}, leaf {i}: shape {a.shape} != {e.shape}"
        np.testing.assert_allclose(a, e, rtol=1e-7, atol=1e-10, err_msg=f"{what}, leaf {i}")

