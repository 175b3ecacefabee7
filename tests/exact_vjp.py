"""tidiff's vjp against torch's where tidiff's own adjoint is exact: the check shared by the tests of kernels it
reverses itself."""
import warnings

import numpy as np
import torch

import tidiff as td


def assert_exact_vjp(f, args, twin, cotangents, rtol=1e-12, atol=1e-14):
    """``td.vjp(f, *args)`` at ``cotangents`` (one per output) gives torch's values and vjp of ``twin`` (within
    ``rtol`` / ``atol``), with no ``td.TaichiReverseWarning`` and no check of reverse mode run (exact); returns its
    cotangents of ``args``."""
    ts = [torch.tensor(a, requires_grad=True) for a in args]
    want = twin(*ts)
    want = want if isinstance(want, tuple) else (want,)
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.TaichiReverseWarning)
        outs, pull = td.vjp(f, *args)
        got = pull(tuple(cotangents) if len(want) > 1 else cotangents[0])
    assert f.memo.peek("reverse verdict") is None  # exact: never checked
    for o, w in zip(outs if len(want) > 1 else (outs,), want, strict=True):
        np.testing.assert_allclose(o, w.detach().numpy(), rtol=rtol, atol=atol)
    expected = torch.autograd.grad(want, ts, [torch.tensor(c) for c in cotangents])
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e.numpy(), rtol=rtol, atol=atol)
    return got
