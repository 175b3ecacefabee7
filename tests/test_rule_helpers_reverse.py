"""The rule helpers that generated code calls, differentiated in both modes by their own table entries.

Reverse code calls them (``row_of`` is the reverse of ``ti.Matrix.rows``, ``extreme_adjoint`` of
``v.max()``), so reversing that code again, or pushing tangents through it, meets them: each has a
forward rule and a reverse rule in ``tidiff/_rules/ops.py``, each the transpose of a neighbour's. Here
each is called as generated code calls it, inside a nonlinear function with a torch twin, and the
gradient (reverse mode: the helper's reverse rule), the forward Jacobian (its forward rule) and the
Hessian (forward over reverse) are compared with torch.autograd.functional in float64.
"""
from dataclasses import dataclass

import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td
from tidiff._adjoint import why_not
from tidiff._rules import helpers as H

vec3 = ti.types.vector(3, ti.f64)
vec9 = ti.types.vector(9, ti.f64)
mat3 = ti.types.matrix(3, 3, ti.f64)
C3 = (0.3, -1.2, 0.7)
C9 = tuple(np.linspace(-1.0, 1.0, 9))
RTOL, ATOL = 1e-7, 1e-10


@dataclass
class Use:
    helper: object
    func: object
    twin: object
    shapes: tuple


USES = []


def use(helper, shapes, twin):
    def register(func):
        USES.append(Use(helper, func, twin, shapes))
        return func
    return register


def c(values):
    return torch.tensor(values, dtype=torch.float64)


@use(H.row_of, ((3, 3),), lambda m: torch.sin(m[1]) @ c(C3))
@ti.func
def row_of(m: mat3) -> ti.f64:
    return ti.sin(H.row_of(m, 1)).dot(ti.Vector(C3))


@use(H.col_of, ((3, 3),), lambda m: torch.sin(m[:, 2]) @ c(C3))
@ti.func
def col_of(m: mat3) -> ti.f64:
    return ti.sin(H.col_of(m, 2)).dot(ti.Vector(C3))


def _placed(m, v, row):
    z = torch.zeros_like(m)
    z = torch.cat([v[None, :], z[1:]]) if row else torch.cat([v[:, None], z[:, 1:]], dim=1)
    return torch.sin(z + m).sum()


@use(H.row_into, ((3,), (3, 3)), lambda v, m: _placed(m, v, True))
@ti.func
def row_into(v: vec3, m: mat3) -> ti.f64:
    return ti.sin(H.row_into(m, v, 0) + m).sum()


@use(H.col_into, ((3,), (3, 3)), lambda v, m: _placed(m, v, False))
@ti.func
def col_into(v: vec3, m: mat3) -> ti.f64:
    return ti.sin(H.col_into(m, v, 0) + m).sum()


@use(H.entries, ((3, 3),), lambda m: torch.sin(m.flatten()) @ c(C9))
@ti.func
def entries(m: mat3) -> ti.f64:
    return ti.sin(H.entries(m)).dot(ti.Vector(C9))


@use(H.unflat_any, ((9,), (3, 3)), lambda v, m: (torch.sin(v.reshape(3, 3)) * m).sum())
@ti.func
def unflat_any(v: vec9, m: mat3) -> ti.f64:
    return (ti.sin(H.unflat_any(v, m)) * m).sum()


@use(H.cast_tangent, ((3,),), lambda x: (x ** 2 * torch.sin(x)).sum())
@ti.func
def cast_tangent(x: vec3) -> ti.f64:
    return (H.cast_tangent(x, ti.f64) ** 2 * ti.sin(x)).sum()


@use(H.inner, ((3,), (3,)), lambda a, b: torch.sin((a * b).sum()))
@ti.func
def inner(a: vec3, b: vec3) -> ti.f64:
    return ti.sin(H.inner(a, b))


@use(H.pick_extreme, ((3,), (3,)), lambda x, t: torch.sin(t[torch.argmax(x)]) * x.max())
@ti.func
def pick_extreme(x: vec3, t: vec3) -> ti.f64:
    return H.pick_extreme(x, ti.sin(t), True) * x.max()


def _extreme(x, s):
    v = torch.zeros_like(x)
    v = torch.where(torch.arange(3) == torch.argmin(x), s, v)
    return torch.exp(v).sum()


@use(H.extreme_adjoint, ((3,), ()), _extreme)
@ti.func
def extreme_adjoint(x: vec3, s: ti.f64) -> ti.f64:
    return ti.exp(H.extreme_adjoint(x, s, False)).sum()


ids = [u.func.__wrapped__.__name__ for u in USES]


def draw(uses, seed):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1.5, 1.5, size=shape) for shape in uses.shapes]


def close(got, want):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=RTOL, atol=ATOL)


def test_every_helper_with_a_reverse_rule_is_used_here():
    from tidiff._rules.table import TABLE
    tested = {u.helper for u in USES}
    new = {H.row_of, H.col_of, H.row_into, H.col_into, H.entries, H.unflat_any, H.cast_tangent, H.inner,
           H.pick_extreme, H.extreme_adjoint}
    assert new <= tested and all(TABLE[h].vjp is not None for h in new)


@pytest.mark.parametrize("u", USES, ids=ids)
def test_the_reverse_transform_takes_the_helper(u):
    assert why_not(u.func, (True,) * len(u.shapes)) is None
    assert "_vjp(" in td.source(td.grad(u.func, argnums=tuple(range(len(u.shapes)))), *draw(u, 0))


@pytest.mark.parametrize("u", USES, ids=ids)
@given(seed=st.integers(0, 2**32 - 1))
def test_gradient_and_forward_jacobian_against_torch(u, seed):
    xs = draw(u, seed)
    argnums = tuple(range(len(xs)))
    want = torch.autograd.functional.jacobian(u.twin, tuple(torch.tensor(x) for x in xs))
    for got_rev, got_fwd, w in zip(td.grad(u.func, argnums=argnums)(*xs), td.jacfwd(u.func, argnums=argnums)(*xs),
                                   want):
        close(got_rev, w.numpy())
        close(got_fwd, w.numpy())


@pytest.mark.parametrize("u", USES, ids=ids)
@given(seed=st.integers(0, 2**32 - 1))
def test_hessian_against_torch(u, seed):
    xs = draw(u, seed)
    argnums = tuple(range(len(xs)))
    want = torch.autograd.functional.hessian(u.twin, tuple(torch.tensor(x) for x in xs))
    got = td.hessian(u.func, argnums=argnums)(*xs)
    for i in argnums:
        for j in argnums:
            close(got[i][j], want[i][j].numpy())
