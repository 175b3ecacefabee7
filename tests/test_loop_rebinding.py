"""Vectors rewritten as a whole inside loops and branches: tangent code renames each new value there and
writes the carried variables back at the end of the block (NOTE: [Rebinding in loops] in
tidiff/_lang/rebinding.py), since Taichi's optimizer reads stale entries of the plain spelling
(tests/test_taichi_pitfalls.py). Every spelling must give torch's derivatives, first and second order."""
import ast

import numpy as np
import taichi as ti
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tidiff as td

V3 = ti.types.vector(3, ti.f64)


@ti.func
def twice_in_a_loop(t: V3):
    for _ in range(2):
        t = t * (t[1] + 0.3)
        t = t - t[1] * t[2]
    return t


@ti.func
def in_a_branch_in_a_loop(t: V3):
    for i in range(3):
        if t[0] > -0.5:
            t *= ti.tanh(t[1]) + 0.5 * i
            t -= t[1] * t[2]
        t = t * 0.9 + t[2]
    return t


@ti.func
def with_a_continue(t: V3):
    for i in range(3):
        t = t * (t[1] + 0.3)
        if i == 1:
            continue
        t = t - t[1] * t[2]
    return t


@ti.func
def in_a_while_loop(t: V3):
    k = 0
    while k < 2:
        t = t * (t[1] + 0.3)
        t = t - t[1] * t[2]
        k += 1
    return t


@ti.func
def in_a_static_loop(t: V3):
    for i in ti.static(range(2)):
        t = t * (t[1] + 0.3 * i)
        t = t - t[1] * t[2]
    return t


def twin_twice(t):
    for _ in range(2):
        t = t * (t[1] + 0.3)
        t = t - t[1] * t[2]
    return t


def twin_branch(t):
    for i in range(3):
        if t[0] > -0.5:
            t = t * (torch.tanh(t[1]) + 0.5 * i)
            t = t - t[1] * t[2]
        t = t * 0.9 + t[2]
    return t


def twin_continue(t):
    for i in range(3):
        t = t * (t[1] + 0.3)
        if i == 1:
            continue
        t = t - t[1] * t[2]
    return t


def twin_static(t):
    for i in range(2):
        t = t * (t[1] + 0.3 * i)
        t = t - t[1] * t[2]
    return t


CASES = [(twice_in_a_loop, twin_twice), (in_a_branch_in_a_loop, twin_branch), (with_a_continue, twin_continue),
         (in_a_while_loop, twin_twice), (in_a_static_loop, twin_static)]
vectors = st.lists(st.floats(-1.0, 1.0), min_size=3, max_size=3).map(np.array)


@given(case=st.sampled_from(CASES), x=vectors, dx=vectors)
@settings(max_examples=15)
def test_forward_and_second_order_equal_torch(case, x, dx):
    f, twin = case
    xt, dxt = torch.tensor(x), torch.tensor(dx)
    value, tangent = td.jvp(f, (x,), (dx,))
    want_value, want_tangent = torch.func.jvp(twin, (xt,), (dxt,))
    np.testing.assert_allclose(value, want_value.numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(tangent, want_tangent.numpy(), rtol=1e-10, atol=1e-12)
    hessians = torch.func.jacfwd(torch.func.jacrev(twin))(xt).numpy()
    np.testing.assert_allclose(td.jacfwd(td.jacrev(f))(x), hessians, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(td.jacrev(td.jacfwd(f))(x), hessians, rtol=1e-9, atol=1e-11)  # reverse of renamed code


def test_the_tangent_code_of_a_loop_writes_carried_values_back():
    """The jvp of twice_in_a_loop rewrites no vector twice in its loop's body: it reads t through a copy made
    on entry, gives each new value its own name, and ends by giving t its last value."""
    module = ast.parse(td.source(td.jacfwd(twice_in_a_loop)))
    (jvp,) = [f for f in module.body if isinstance(f, ast.FunctionDef) and f.name.startswith("twice_in_a_loop_jvp")]
    (for_loop,) = [s for s in jvp.body if isinstance(s, ast.For)]
    loop = [ast.unparse(s) for s in for_loop.body]
    assert [line for line in loop if line.startswith("t = ")] == [loop[-1]], loop
    assert loop[-1].startswith("t = t_") and "t_1 = t" in loop, loop
