"""Comparing tidiff's nested results (tuples of arrays) with torch.func's (tuples of tensors)."""
import numpy as np


def close(actual, expected, rtol=1e-9, atol=1e-12):
    """Every leaf of ``actual`` equals the tensor at the same place in ``expected``; the nesting is the same."""
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, tuple) and len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            close(a, e, rtol, atol)
        return
    np.testing.assert_allclose(actual, expected.numpy(), rtol=rtol, atol=atol)


def nonnegative(argnums, n):
    """torch.func's nested jacfwd reads a negative argnums wrongly (torch 2.13): give it the position."""
    return tuple(a % n for a in argnums) if isinstance(argnums, tuple) else argnums % n
