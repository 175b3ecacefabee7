"""Every transform on every op-table row, against torch.autograd.functional in float64."""
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from op_table import ROWS

import tidiff as td
import tidiff.testing as tt

RTOL, ATOL = 1e-7, 1e-10
BATCHES = st.sampled_from([(), (3,), (2, 2)])


def draw(row, seed, batch):
    rng = np.random.default_rng(seed)
    return [rng.uniform(row.low, row.high, size=batch + shape) for shape in row.shapes]


def per_element(batch, args, fn):
    """Apply ``fn`` to each batch element's arguments; stack the results (tuples entrywise)."""
    results = []
    for idx in np.ndindex(*batch):
        results.append(fn([a[idx] for a in args]))
    if isinstance(results[0], tuple):
        return tuple(
            np.stack([r[k] for r in results]).reshape(batch + results[0][k].shape) for k in range(len(results[0]))
        )
    return np.stack(results).reshape(batch + results[0].shape)


def torch_jacobian(row, xs):
    ts = tuple(torch.tensor(x) for x in xs)
    jac = torch.autograd.functional.jacobian(row.torch_fn, ts)
    return tuple(j.numpy() for j in jac)


def torch_hessian(row, xs):
    ts = tuple(torch.tensor(x) for x in xs)
    hes = torch.autograd.functional.hessian(row.torch_fn, ts)
    return tuple(tuple(h.numpy() for h in hrow) for hrow in hes)


def close(actual, expected):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=RTOL, atol=ATOL)


ids = [r.name for r in ROWS]
ROW_FUNCTIONS = {}


def function_of(row):
    """The row's td.function, made once: a new Function per example rebuilt its kernel (0.25 s for sym_eig)."""
    if row.name not in ROW_FUNCTIONS:
        ROW_FUNCTIONS[row.name] = td.function(row.func)
    return ROW_FUNCTIONS[row.name]
every_arg = {r.name: tuple(range(len(r.shapes))) for r in ROWS}


@pytest.mark.parametrize("row", ROWS, ids=ids)
@given(seed=st.integers(0, 2**32 - 1), batch=BATCHES)
def test_value(row, seed, batch):
    xs = draw(row, seed, batch)
    expected = per_element(batch, xs, lambda a: row.torch_fn(*map(torch.tensor, a)).numpy())
    close(function_of(row)(*xs), expected)


@pytest.mark.parametrize("mode", ["jacfwd", "jacrev", "jacobian"])
@pytest.mark.parametrize("row", ROWS, ids=ids)
@given(seed=st.integers(0, 2**32 - 1), batch=BATCHES)
def test_jacobian(row, mode, seed, batch):
    xs = draw(row, seed, batch)
    jac = getattr(td, mode)(row.func, argnums=every_arg[row.name])(*xs)
    expected = per_element(batch, xs, lambda a: torch_jacobian(row, a))
    for got, want in zip(jac, expected):
        close(got, want)


@pytest.mark.parametrize("row", ROWS, ids=ids)
@given(seed=st.integers(0, 2**32 - 1), batch=BATCHES)
def test_jvp_and_vjp(row, seed, batch):
    """jvp and vjp against torch, and the dot-product test <t, vjp(c)> == <jvp(t), c>."""
    xs = draw(row, seed, batch)
    rng = np.random.default_rng(seed + 1)
    tangents = tuple(rng.standard_normal(x.shape) for x in xs)
    out, tout = td.jvp(row.func, tuple(xs), tangents)
    expected = per_element(
        batch,
        list(xs) + list(tangents),
        lambda a: torch.autograd.functional.jvp(
            row.torch_fn, tuple(map(torch.tensor, a[: len(xs)])), tuple(map(torch.tensor, a[len(xs):]))
        )[1].numpy(),
    )
    close(tout, expected)
    y, vjp_fn = td.vjp(row.func, *xs)
    close(y, out)
    cot = rng.standard_normal(np.shape(y))
    grads = vjp_fn(cot)
    lhs = sum(float(np.sum(t * g)) for t, g in zip(tangents, grads))
    rhs = float(np.sum(np.asarray(tout) * cot))
    assert lhs == pytest.approx(rhs, rel=1e-9, abs=1e-9)


def _scalar_output(row):
    args = [torch.full(shape, 0.5 * (row.low + row.high), dtype=torch.float64) for shape in row.shapes]
    return row.torch_fn(*args).ndim == 0


scalar_rows = [r for r in ROWS if _scalar_output(r)]


@pytest.mark.parametrize("row", scalar_rows, ids=[r.name for r in scalar_rows])
@given(seed=st.integers(0, 2**32 - 1), batch=BATCHES)
def test_grad_and_value_and_grad(row, seed, batch):
    xs = draw(row, seed, batch)
    argnums = every_arg[row.name]
    grads = td.grad(row.func, argnums=argnums)(*xs)
    value, grads2 = td.value_and_grad(row.func, argnums=argnums)(*xs)
    expected = per_element(batch, xs, lambda a: torch_jacobian(row, a))
    for g, g2, want in zip(grads, grads2, expected):
        close(g, want)
        close(g2, want)
    close(value, function_of(row)(*xs))


smooth_scalar_rows = [r for r in scalar_rows if r.smooth]


@pytest.mark.parametrize("row", smooth_scalar_rows, ids=[r.name for r in smooth_scalar_rows])
@given(seed=st.integers(0, 2**32 - 1), batch=BATCHES)
def test_hessian(row, seed, batch):
    xs = draw(row, seed, batch)
    argnums = every_arg[row.name]
    hes = td.hessian(row.func, argnums=argnums)(*xs)
    expected = per_element(
        batch, xs, lambda a: tuple(h for hrow in torch_hessian(row, a) for h in hrow)
    )
    got = [h for hrow in hes for h in hrow]
    for g, want in zip(got, expected):
        close(g, want)


fd_rows = [r for r in ROWS if r.fd]


@pytest.mark.parametrize("row", fd_rows, ids=[r.name for r in fd_rows])
def test_central_differences(row):
    """jvp, vjp and the dot-product test against central differences, a second independent oracle
    (``check_grads(fast=True)``; second order is checked against torch above)."""
    rng = np.random.default_rng(11)
    args = tuple(rng.uniform(row.low, row.high, size=(2,) + shape) for shape in row.shapes)
    tt.check_grads(row.func, args, order=1, fast=True)
