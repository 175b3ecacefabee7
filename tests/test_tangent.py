"""The tangent transform on whole functions: control flow, mutation, tuples, nested calls,
inactive arguments, higher orders, errors, hooks and the generated source."""
import math

import numpy as np
import pytest
import taichi as ti
import torch
from tangent_harness import assert_close, evaluate, flatten, structure, torch_jvp, torch_second

from tidiff._errors import TransformError
from tidiff._rules.calls import register_jvp
from tidiff._rules.helpers import stop_gradient
from tidiff._tangent import jvp_func, source


def check(f, torch_fn, shapes, active=None, second=True, seed=0, out_struct=None):
    """First order (and second order) of ``f`` against torch at a random point.

    ``out_struct`` gives f's output structure when it nests tuples, which torch
    cannot return: ``torch_fn`` then returns the leaves as a flat tuple.
    """
    rng = np.random.default_rng(seed)
    x = [rng.uniform(0.2, 1.5, s) for s in shapes]
    t = [rng.uniform(-1, 1, s) for s in shapes]
    active = active or (True,) * len(shapes)
    t = [ti_t if a else np.zeros(s) for ti_t, a, s in zip(t, active, shapes)]
    out, dout = torch_jvp(torch_fn, x, t)
    s = out_struct or structure(out)
    tangent_shapes = [sh for sh, a in zip(shapes, active) if a]
    got = evaluate(jvp_func(f, active), list(shapes) + tangent_shapes, [s, s],
                   x + [ti_t for ti_t, a in zip(t, active) if a])
    assert_close(got, flatten(out) + flatten(dout), f"jvp of {f.__name__}")
    if second:
        u, v = t, [rng.uniform(-1, 1, sh) for sh in shapes]
        out, du, dv, duv = torch_second(torch_fn, x, u, v)
        s = out_struct or structure(out)
        g2 = jvp_func(jvp_func(f))
        zeros = [np.zeros(sh) for sh in shapes]
        got = evaluate(g2, list(shapes) * 4, [[s, s], [s, s]], x + u + v + zeros)
        assert_close(got, flatten(out) + flatten(du) + flatten(dv) + flatten(duv),
                     f"second order of {f.__name__}")


# --- control flow -----------------------------------------------------------
@ti.func
def branches(x, y):
    z = 0.0
    if x > y:
        z = x * y
    elif x > 0.5 * y:
        z = ti.sin(x) + y
    else:
        z = y * y
    return z


def torch_branches(x, y):
    if x > y:
        return x * y
    if x > 0.5 * y:
        return torch.sin(x) + y
    return y * y


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_if_elif_else(seed):
    check(branches, torch_branches, [(), ()], seed=seed)


@ti.func
def conditional_expression(x, y):
    return x * x if x > y else -y * x


def test_conditional_expression():
    check(conditional_expression, lambda x, y: x * x if x > y else -y * x, [(), ()])


@ti.func
def loops(x, y):
    s = 0.0
    p = 1.0
    for i in range(4):
        p *= x
        s += p * (i + 1) + y
    for i in ti.static(range(2)):
        s = s * y + i
    return s


def torch_loops(x, y):
    s, p = 0.0, 1.0
    for i in range(4):
        p = p * x
        s = s + p * (i + 1) + y
    for i in range(2):
        s = s * y + i
    return s


def test_for_range_and_static_range():
    check(loops, torch_loops, [(), ()])


@ti.func
def grid(a):
    s = 0.0
    for i, j in ti.ndrange(2, 2):
        s += a[i, j] * a[j, i]
    for k in ti.static(range(2)):
        s += ti.exp(a[k, k])
    return s


def test_ndrange_over_matrix():
    check(grid, lambda a: (a * a.T).sum() + torch.exp(a[0, 0]) + torch.exp(a[1, 1]), [(2, 2)])


@ti.func
def halving(x):
    y = x * 4.0
    n = 0
    while y > 0.1:
        y = y * 0.5 + 0.01 * x
        n += 1
        if n > 40:
            break
    return y


def torch_halving(x):
    y, n = x * 4.0, 0
    while y > 0.1:
        y = y * 0.5 + 0.01 * x
        n += 1
        if n > 40:
            break
    return y


def test_while_and_break():
    check(halving, torch_halving, [()])


@ti.func
def skipping(x):
    s = 0.0
    for i in range(5):
        if i == 2:
            continue
        s += x ** i
    return s


def test_continue_and_integer_exponent():
    check(skipping, lambda x: sum(x ** i for i in range(5) if i != 2), [()])


# --- mutation and local state ------------------------------------------------
@ti.func
def components(x):
    v = ti.Vector([0.0, 0.0, 0.0])
    v[0] += x[1] * x[2]
    v[1] = ti.sin(x[0])
    v[2] -= x[0]
    v *= x[1]
    v /= 2.0 + x[2] ** 2
    v[0] *= x[0]
    return v


def torch_components(x):
    v = torch.stack([x[1] * x[2], torch.sin(x[0]), -x[0]]) * x[1] / (2.0 + x[2] ** 2)
    return torch.stack([v[0] * x[0], v[1], v[2]])


def test_component_mutation_and_augmented_assignment():
    check(components, torch_components, [(3,)])


@ti.func
def integers(x):
    k = 3
    m = k * 2 + 1
    j = ti.cast(x * 10.0, ti.i32)
    y: ti.f64 = x * m
    a, b = y, x
    a, b = b, a
    return a * b + j * 0.5 + float(m)


def test_integer_locals_annotations_and_swap():
    check(integers, lambda x: x * 7 * x + torch.trunc(x * 10).detach() * 0.5 + 7.0, [()])


# --- tuples and nested calls ---------------------------------------------------
@ti.func
def pair(x, y):
    return x * y, ti.Vector([x, ti.exp(y)])


def test_tuple_output():
    check(pair, lambda x, y: (x * y, torch.stack([x, torch.exp(y)])), [(), ()])


@ti.func
def nested_output(x, y):
    return x, (y * x, ti.sin(y))


def test_nested_tuple_output():
    check(nested_output, lambda x, y: (x, y * x, torch.sin(y)), [(), ()], out_struct=[(), [(), ()]])


@ti.func
def square(x):
    return x * x


@ti.func
def scaled(x, scale):
    return square(x) * scale


@ti.func
def caller(x, y):
    p, v = pair(x, y)
    z = scaled(scale=y, x=x) + square(square(x))
    return p + v[1] * z + pair(y, x)[0]


def torch_caller(x, y):
    return x * y + torch.exp(y) * (x * x * y + x ** 4) + y * x


def test_nested_calls_keywords_and_tuple_results():
    check(caller, torch_caller, [(), ()])


def test_nested_transforms_are_cached_and_called_by_name():
    text = source(jvp_func(caller))
    assert "pair_jvp(x, y, dx, dy)" in text
    assert text.count("square_jvp") >= 2
    assert jvp_func(caller) is jvp_func(caller)
    assert jvp_func(square) is jvp_func(square, (True,))


@ti.func
def static_return(x):
    if ti.static(True):
        return ti.sin(x) * x
    else:
        return x


def test_return_inside_static_if():
    check(static_return, lambda x: torch.sin(x) * x, [()])


# --- activity ---------------------------------------------------------------
@ti.func
def weighted(x, w, v):
    w = w * 2.0
    return w * ti.sin(x) + v.dot(v) * x


def test_inactive_arguments_get_no_tangent_parameter():
    g = jvp_func(weighted, active=(True, False, False))
    assert "def weighted_jvp(x, w, v, dx):" in source(g)
    check(weighted, lambda x, w, v: 2 * w * torch.sin(x) + v.dot(v) * x, [(), (), (3,)],
          active=(True, False, False), second=False)
    check(weighted, lambda x, w, v: 2 * w * torch.sin(x) + v.dot(v) * x, [(), (), (3,)],
          active=(False, True, True), second=False)


def test_third_order():
    g3 = jvp_func(jvp_func(jvp_func(static_return)))
    x = 0.7
    # x; level 1: dx; level 2: tangents of (x, dx); level 3: tangents of those four
    seeds = [1.0] + [1.0, 0.0] + [1.0, 0.0, 0.0, 0.0]
    got = evaluate(g3, [()] * 8, [[[(), ()], [(), ()]], [[(), ()], [(), ()]]], [x] + seeds)
    third = -3 * np.sin(x) - x * np.cos(x)  # d^3/dx^3 of x sin x
    assert_close([got[-1]], [third], "third derivative of x sin x")


# --- hooks ----------------------------------------------------------------------
@ti.func
def blocked(x):
    return x * stop_gradient(x)


def test_stop_gradient_has_zero_tangent():
    check(blocked, lambda x: x * x.detach(), [()], second=False)


@ti.func
def soft(x):
    return ti.sqrt(x)


@ti.func
def soft_jvp(x, dx):
    return ti.sqrt(x), 3.0 * dx


@ti.func
def uses_soft(x):
    return soft(x) * 2.0


def test_registered_jvp_replaces_the_transform():
    register_jvp(soft, soft_jvp)
    g = jvp_func(uses_soft)
    assert "soft_jvp(x, dx)" in source(g)
    got = evaluate(g, [(), ()], [(), ()], [4.0, 1.0])
    assert_close(got, [4.0, 6.0], "custom rule")


def test_closure_variables_resolve():
    scale = 3.0

    @ti.func
    def inner(x):
        return x * scale

    @ti.func
    def outer(x):
        return inner(x) + scale

    check(outer, lambda x: x * 3.0 + 3.0, [()], second=False)


# --- errors -----------------------------------------------------------------------
values = ti.field(ti.f64, shape=4)


@ti.func
def calls_builtin(x):
    return math.sin(x) * 2.0  # a C function: no source to transform


@ti.func
def reads_field(x):
    return values[0] * x


@ti.func
def atomic(x):
    y = 0.0
    ti.atomic_add(y, x)
    return y + ti.atomic_max(y, x)


@pytest.mark.parametrize("f, construct", [
    (calls_builtin, "a call to `math.sin`: a builtin or C extension function"),
    (reads_field, "field access `values[0]`"),
    (atomic, "Taichi op `ti.atomic_max`"),
])
def test_unsupported_constructs_name_file_line_and_fix(f, construct):
    with pytest.raises(TransformError) as info:
        jvp_func(f)
    message = str(info.value)
    assert construct in message
    assert "test_tangent.py:" in message and info.value.lineno is not None
    assert "td.custom_jvp" in message


def test_not_a_taichi_function():
    with pytest.raises(TypeError, match="@ti.func"):
        jvp_func(math.sin)


# --- the generated source -----------------------------------------------------
@ti.func
def golden(x, y):
    s = x * ti.sin(y)
    return s / y


GOLDEN = '''\
@ti.func
def golden_jvp(x, y, dx, dy):
    sin_y = ti.sin(y)
    dsin_y = dy * ti.cos(y)
    s = x * sin_y
    ds = dx * sin_y + x * dsin_y
    return (s / y, ds / y - dy * (s / y) / y)
'''


def test_golden_source():
    assert source(jvp_func(golden)) == GOLDEN


# --- the harness itself -------------------------------------------------------------------------
@ti.func
def _pack(s, v, m):
    return s, (v, m)


def test_evaluate_reads_and_writes_every_leaf():
    v, m = np.arange(3.0), np.arange(4.0).reshape(2, 2)
    leaves = evaluate(_pack, [(), (3,), (2, 2)], [(), [(3,), (2, 2)]], [7.0, v, m])
    assert_close(leaves, [7.0, v, m], "harness round trip")
