"""Bugs the conformance net (tests/conformance) found, each as a small regression test."""
import numpy as np
import taichi as ti
import torch
from custom_functions import energy, energy_twin  # a td.custom_vjp function without a jvp rule
from test_taichi_pitfalls import rewritten_after_a_runtime_loop

import tidiff as td

mat32d = ti.types.matrix(3, 2, ti.f64)


@ti.func
def rows_in_a_loop(x0: ti.types.vector(2, ti.f64), x1: ti.types.vector(1, ti.f64)):
    t0 = ti.Matrix([[x1[0], x1[0]], [x0[1], x1[0]], [x1[0], x0[1]]]) ** 2
    for _ in range(3):
        if ti.asin(ti.tanh(x1[0] ** 2) * 0.9) > -0.2:
            t0[1, 1] *= ti.math.smoothstep(-0.9, -0.2, ti.math.dot(x1, x1))
            t0[1, 0] *= ti.Vector([x1[0], t0[0, 1]]).x
        else:
            t0 -= mat32d([[x0[0], t0[1, 1]], [x0[0], x1[0]], [x0[0], x0[0]]])
        t0[0, 0] = -ti.pow(x0[0], 3)
    return x0[0] + t0[0, 0]


def test_constructor_rows_without_a_higher_order_tangent():
    """At third order a constructor row whose entries carry no tangent (zeros written as calls) was
    bound to a variable as a Python list, and ``ti.zero`` of it failed Taichi's type check."""
    x0, x1 = np.array([0.7117608246424805, -0.3639857479059343]), np.array([0.677909166808317])
    third = td.jacobian(td.jacfwd(td.jacrev(rows_in_a_loop, argnums=0), argnums=(-1, -2)), argnums=(-1,))
    (by_x1,), (by_x0,) = third(x0, x1)  # d/dx1 and d/dx0 of the gradient in x0, then d/dx1: all zero
    np.testing.assert_array_equal(by_x1, np.zeros((2, 1, 1)))
    np.testing.assert_array_equal(by_x0, np.zeros((2, 2, 1)))
    np.testing.assert_allclose(td.hessian(rows_in_a_loop)(x0, x1), [[-6 * x0[0], 0.0], [0.0, 0.0]], rtol=1e-12)


@ti.func
def entry_of_outer(x0: ti.types.vector(2, ti.f64), x1: ti.types.vector(1, ti.f64)):
    t0 = ti.sin((ti.max(x0[0], ti.Matrix([[x0[0], x0[1], x0[1]], [x1[0], x1[0], x0[1]]])) ** 2 + 0.5) ** -0.7)
    return (x0.outer_product(x0) + 0.4)[1, 1] + t0[0, 1] * x1[0]


def test_reverse_of_a_matrix_entry_write_at_third_order():
    """The reverse rule of an entry written into a matrix indexed its cotangent by a Python tuple of
    symbols (``g[i, j]``), which the rule language refused (TypeError inside td.jacobian)."""
    x0, x1 = np.array([-0.6972347790020618, 0.3289244819779973]), np.array([1.3682217705410031])
    third = td.jacobian(td.jacobian(td.jacobian(entry_of_outer, argnums=(-2, 1)), argnums=(0,)), argnums=1)
    forward = td.jacfwd(td.jacfwd(td.jacfwd(entry_of_outer, argnums=(-2, 1)), argnums=(0,)), argnums=1)
    for got, want in zip(third(x0, x1), forward(x0, x1), strict=True):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


vec2d = ti.types.vector(2, ti.f64)


@ti.func
def unannotated(x0: vec2d, x1: ti.f64):
    return x0[0] * x1 * ti.Matrix([[1.0, 2.0], [3.0, 4.0]])


@ti.kernel
def jacrev_in_a_kernel(a0: ti.types.ndarray(dtype=vec2d, ndim=1), a1: ti.types.ndarray(dtype=ti.f64, ndim=1),
                       o: ti.types.ndarray(dtype=ti.types.matrix(2, 2, ti.f64), ndim=1)):
    for b in range(a0.shape[0]):
        o[b] = td.jacrev(unannotated, argnums=1)(a0[b], a1[b])


def test_in_kernel_transform_of_a_function_without_a_return_annotation():
    """Inside a kernel the output of a @ti.func without a return annotation is read by calling it on zeros;
    the zeros of its vector parameter were a Python-side ti.Vector, which Taichi refused as an argument
    (TaichiSyntaxError "expected to be a Matrix")."""
    o = np.zeros((2, 2, 2))
    jacrev_in_a_kernel(np.full((2, 2), 0.5), np.array([1.0, 3.0]), o)
    np.testing.assert_allclose(o, 0.5 * np.array([[1.0, 2.0], [3.0, 4.0]]) * np.ones((2, 1, 1)), rtol=1e-15)


@ti.func
def doubled(x: vec2d):
    return 2.0 * x * x[1]


@ti.func
def through_jvp_of_unannotated(x: vec2d) -> ti.f64:
    return td.jvp(doubled, (x,), (x,))[1].sum()


def test_jvp_of_a_function_without_a_return_annotation_inside_a_func():
    """td.jvp of an unannotated vector function inside a @ti.func (so inside the kernel tidiff compiles)."""
    x = np.array([0.3, -0.7])
    # doubled(x) = 2 x x1, its jvp along x is 2 x x1 + 2 x x1 = 4 x x1, summed: 4 x1 (x0 + x1)
    np.testing.assert_allclose(td.function(through_jvp_of_unannotated)(x), 4 * x[1] * x.sum(), rtol=1e-15)
    # gradient of 4 x1 (x0 + x1): (4 x1, 4 x0 + 8 x1)
    np.testing.assert_allclose(td.grad(through_jvp_of_unannotated)(x), [4 * x[1], 4 * x[0] + 8 * x[1]], rtol=1e-14)


@ti.func
def reaches_energy(x: vec2d) -> ti.f64:
    return energy(x, 1.5) * x[1]


def test_third_reverse_transform_through_a_custom_vjp_rule():
    """td.jacrev(td.jacrev(td.grad(f))) of code calling a custom_vjp function: the second-order reverse
    function calls the rule's reverse, which returns the rule's results as a nested tuple
    (``((a, b), ct_x, ...)``); reversing that raised td.TransformError (NOTE: [Nested results])."""
    x = np.array([0.3, -0.7])

    def twin(a):
        return (0.5 * 1.5 * (a * a).sum() + torch.sin(a[0])) * a[1]

    third = torch.autograd.functional.jacobian(
        lambda a: torch.autograd.functional.hessian(twin, a, create_graph=True), torch.tensor(x))
    got = td.jacrev(td.jacrev(td.grad(reaches_energy)))(x)
    np.testing.assert_allclose(got, third.numpy(), rtol=1e-10, atol=1e-12)


@ti.func
def casts_then_energy(x: vec2d) -> ti.f64:
    return energy(ti.cast(x * x[1], ti.f64), 1.5)


def test_reverse_over_reverse_through_a_cast():
    """td.jacrev(td.grad(f)) of code calling a custom_vjp function (so reversed twice) with a ti.cast:
    the first reverse function calls the cast's adjoint helper, which had no reverse rule itself."""
    x = np.array([0.3, -0.7])

    def twin(a):
        b = a * a[1]
        return 0.5 * 1.5 * (b * b).sum() + torch.sin(b[0])

    want = torch.autograd.functional.hessian(twin, torch.tensor(x)).numpy()
    np.testing.assert_allclose(td.jacrev(td.grad(casts_then_energy))(x), want, rtol=1e-10, atol=1e-12)


@ti.func
def energy_times_max(x: ti.types.vector(3, ti.f64)) -> ti.f64:
    return energy(vec2d(x[0], x[1]), 1.5) * x.max()


def test_reverse_over_reverse_through_max():
    """td.jacrev(td.grad(f)) of code calling a custom_vjp function and v.max(): the first reverse function
    calls the max's adjoint helper (extreme_adjoint), which had no reverse rule itself."""
    x = np.array([0.3, -0.7, 0.1])

    def twin(a):
        return (0.75 * (a[0] ** 2 + a[1] ** 2) + torch.sin(a[0])) * a.max()

    want = torch.autograd.functional.hessian(twin, torch.tensor(x)).numpy()
    np.testing.assert_allclose(td.jacrev(td.grad(energy_times_max))(x), want, rtol=1e-10, atol=1e-12)


@ti.func
def counter_shadows(x: ti.f64) -> ti.f64:
    i = x * 2.0
    y = x
    for i in ti.static(range(3)):  # noqa: B007 -- Taichi scopes the counter to the loop: after it, i is 2x
        y = y * x
    return y + i  # x^4 + 2x


@ti.func
def counter_shadows_inside(x: ti.f64) -> ti.f64:
    i = x * 2.0
    y = x
    for i in ti.static(range(2)):  # inside, i is the counter 0, 1: no derivative
        y = y * x + i
    return y * i  # (x^3 + 1) * 2x


@td.custom_vjp
@ti.func
def only_reverse(x: ti.f64) -> ti.f64:
    return x


@only_reverse.defvjp
@ti.func
def only_reverse_bwd(x, ct):
    return (ct,)


@ti.func
def counter_shadows_reversed(x: ti.f64) -> ti.f64:
    return counter_shadows(only_reverse(x))  # forward mode impossible: the reverse transform takes it


def test_a_static_counter_shadowing_a_variable():
    """Found while typing the transforms: a variable reused as a ti.static loop's counter was taken for the
    counter after the loop too (Python's scoping, not Taichi's), and its derivative dropped: jacfwd and
    jacrev gave 0.5 for d(x^4 + 2x) at 0.5, central differences 2.5."""
    x = np.array([0.5, -1.25, 2.0])
    for f, d1, d2 in ((counter_shadows, 4 * x**3 + 2, 12 * x**2),
                      (counter_shadows_inside, 8 * x**3 + 2, 24 * x**2),
                      (counter_shadows_reversed, 4 * x**3 + 2, 12 * x**2)):
        for transform in (td.grad, td.jacfwd, td.jacrev) if f is not counter_shadows_reversed else (td.grad,):
            np.testing.assert_allclose(transform(f)(x), d1, rtol=1e-13)
        np.testing.assert_allclose(td.vjp(f, x)[1](np.ones(3))[0], d1, rtol=1e-13)
        np.testing.assert_allclose(td.hessian(f)(x), d2, rtol=1e-13)


@ti.func
def unused_then_floor(x0: ti.types.vector(2, ti.f64), x1: ti.types.vector(1, ti.f64)):
    t1 = x0 * 3.0  # noqa: F841 -- as drawn: an unused value
    return ti.floor(x0[0]) + ti.sin(x0[0] * x0[1]) * x1[0] ** 3


@ti.func
def unused_then_floor_only(x0: ti.types.vector(2, ti.f64), x1: ti.types.vector(1, ti.f64)):
    t1 = x0 * 3.0  # noqa: F841
    return ti.floor(x0[0])


def test_third_order_reverse_through_a_nested_tuple_of_tangents():
    """Found by the long run (seed 9101): reversing a jvp function whose callee returns tuples inside its
    tuple (``t, dt = f_jvp_jvp(...)``, each a (value, tangent) pair) read ``t[1]`` as an entry of a vector:
    td.jacrev(td.hessian(f, argnums=1), argnums=(-1, 0)) failed to compile (a tuple indexed by an Expr).
    Every leaf of nested results now has a name of its own, the nesting followed through the callee's code
    (NOTE: [Nested results]); seed 9404 hit it again in td.jacfwd(td.jacrev(td.grad(f)))."""
    x0, x1 = np.array([1.17, 0.95]), np.array([-0.4])

    def twin(a, b):
        return torch.floor(a[0]) + torch.sin(a[0] * a[1]) * b[0] ** 3

    J = torch.autograd.functional.jacobian
    a, b = torch.tensor(x0), torch.tensor(x1)
    by_b_b_a = J(lambda a_: J(lambda b_: J(lambda c: twin(a_, c), b_, create_graph=True), b, create_graph=True), a)
    got = td.jacrev(td.jacrev(td.jacrev(unused_then_floor, argnums=1), argnums=1), argnums=0)(x0, x1)
    np.testing.assert_allclose(got, by_b_b_a.numpy(), rtol=1e-13)
    by_b_b_b = J(lambda b_: J(lambda c: J(lambda d: twin(a, d), c, create_graph=True), b_, create_graph=True), b)
    third_b, third_a = td.jacrev(td.hessian(unused_then_floor, argnums=1), argnums=(-1, 0))(x0, x1)
    np.testing.assert_allclose(third_b, by_b_b_b.numpy(), rtol=1e-13)
    np.testing.assert_allclose(third_a, by_b_b_a.numpy(), rtol=1e-13)
    third_b, third_a = td.jacrev(td.hessian(unused_then_floor_only, argnums=1), argnums=(-1, 0))(x0, x1)
    np.testing.assert_array_equal(third_b, np.zeros((1, 1, 1)))  # the case drawn: it failed to compile
    np.testing.assert_array_equal(third_a, np.zeros((1, 1, 2)))


vec1d, mat22d = ti.types.vector(1, ti.f64), ti.types.matrix(2, 2, ti.f64)


@ti.func
def typed_constructors_of_one(x: vec2d) -> ti.f64:
    filled = vec1d(x[0] * x[1])[0] + ti.math.vec3(x[1]).norm_sqr() * mat22d(x[0])
    return energy(x, 1.5) + (filled @ vec2d(x)).sum()


def test_reverse_of_a_typed_constructor_of_one_argument():
    """``vec1d(x)`` (long run, seed 9205) was refused by the reverse transform, so code reaching a
    custom_vjp rule without a jvp rule could not be differentiated: Taichi fills every entry with a
    scalar argument and copies a vector one; the adjoint sums the cotangent back to the argument."""
    x = np.array([0.3, -0.7])

    def twin(x):
        filled = (x[0] * x[1]) + 3 * x[1] ** 2 * x[0] * torch.ones((2, 2), dtype=torch.float64)
        return energy_twin(x, 1.5) + (filled @ x).sum()

    xt = torch.tensor(x, requires_grad=True)
    (expected,) = torch.autograd.grad(twin(xt), xt)
    np.testing.assert_allclose(td.grad(typed_constructors_of_one)(x), expected.numpy(), rtol=1e-12)


@ti.func
def rewritten_after_literals(x0: ti.types.vector(4, ti.f64)) -> ti.types.matrix(3, 3, ti.f64):
    t0 = ti.asin(ti.tanh(ti.pow(ti.Matrix([[x0[3], x0[3], x0[1]], [x0[1], x0[0], x0[1]]]), 3)) * 0.9)
    t1 = ti.log(ti.acos(ti.tanh(x0) * 0.9) ** 2 + 1.0)
    t1 -= (-max(t0[0, 0], t1[0]))
    t1 -= (t1 * -0.6)
    m = ti.Matrix([[t0[0, 2], x0[1], x0[1]], [t0[0, 0], t1[0], t1[0]], [x0[3], t0[0, 0], x0[2]]])
    return ti.cos(ti.cos(m)) + 2.3


def test_forward_mode_of_a_vector_rewritten_after_literals_of_its_entries():
    """Found by the long run (seed 9403; seed 9123 likewise): Taichi's optimizer miscompiled the tangent code,
    which rewrote ``t1`` in place after matrix literals of its entries: jacfwd 1.104 where torch gives 0.714
    (right with advanced_optimization=False). Tangent code now gives each new value a new name (NOTE:
    [Rebinding in straight-line code])."""
    x = np.array([1.4926739710302606, 0.6843406712712952, 0.8077728440491567, 0.8100741692369864])

    def twin(x0):
        t0 = torch.asin(torch.tanh(torch.stack([x0[3], x0[3], x0[1], x0[1], x0[0], x0[1]]).reshape(2, 3) ** 3) * 0.9)
        t1 = torch.log(torch.acos(torch.tanh(x0) * 0.9) ** 2 + 1.0)
        t1 = 1.6 * (t1 + torch.maximum(t0[0, 0], t1[0]))
        m = torch.stack([t0[0, 2], x0[1], x0[1], t0[0, 0], t1[0], t1[0], x0[3], t0[0, 0], x0[2]]).reshape(3, 3)
        return torch.cos(torch.cos(m)) + 2.3

    expected = torch.autograd.functional.jacobian(twin, torch.tensor(x)).numpy()
    np.testing.assert_allclose(td.jacfwd(rewritten_after_literals)(x), expected, rtol=1e-12, atol=1e-15)




@ti.func
def truncated(x: ti.f64) -> ti.f64:
    k = 0
    k = x * 2.5  # Taichi keeps k an i32: the value is truncated
    return k * x


@ti.func
def truncated_in_a_loop(x: ti.f64) -> ti.f64:
    k = 0
    for i in range(2):
        k += x * 2.5 + i  # an i32 still
    return k * x


@ti.func
def truncated_in_reverse(x: vec2d) -> ti.f64:
    k = 0
    k = x[0] * 2.5
    return energy(x, 1.5) + k * x[1]  # energy: a custom_vjp without a jvp rule, so reverse mode


def test_a_float_assigned_to_an_integer_variable():
    """Found while renaming rebindings in tangent code: k = 0; k = x * 2.5 makes the function int(2.5 x) * x
    (Taichi truncates), whose derivative is int(2.5 x); both modes gave 2.4 at 0.7 where it is 1 (forward
    truncated the tangent, reverse took k as a float). A variable first bound to an integer constant now
    carries no derivative, and reverse code keeps its type."""
    x = np.array([0.7, 1.3, -2.2])
    np.testing.assert_array_equal(td.jvp(truncated, (x,), (np.ones(3),))[0], np.trunc(2.5 * x) * x)  # the value
    for f, want in ((truncated, np.trunc(2.5 * x)), (truncated_in_a_loop, np.trunc(2.5 * x) + np.trunc(2.5 * x + 1))):
        np.testing.assert_array_equal(td.jvp(f, (x,), (np.ones(3),))[1], want)
        np.testing.assert_array_equal(td.vjp(f, x)[1](np.ones(3))[0], want)
        np.testing.assert_array_equal(td.hessian(f)(x), np.zeros(3))
    v = np.array([0.7, -1.3])
    xt = torch.tensor(v, requires_grad=True)
    (expected,) = torch.autograd.grad(energy_twin(xt, 1.5) + torch.trunc(2.5 * xt[0]).detach() * xt[1], xt)
    np.testing.assert_allclose(td.grad(truncated_in_reverse)(v), expected.numpy(), rtol=1e-14)


vec4d = ti.types.vector(4, ti.f64)


@ti.func
def rewritten_in_a_loop(x0: ti.types.matrix(3, 3, ti.f64)):
    t0 = ti.math.normalize(ti.Vector([x0[0, 1], x0[1, 2], x0[1, 1]]) + 0.7391)
    for i1 in range(2):
        if ti.max(ti.Vector([x0[0, 0]]), x0[1, 1]).x > -0.2:
            t0 *= (ti.asin(ti.tanh(t0[1]) * 0.9) * (i1 + 1.0))
            t0 -= ((t0 / (t0 ** 2 + 1.0)) + (t0[1] * t0[2]))
        t0 *= ti.floor(ti.math.mix(x0[1, 1], x0[1, 2], t0) * 2.0)
    return ti.Matrix([[t0[1], t0[2]], [x0[0, 1], t0[2]], [x0[1, 1], t0[1]]]), ti.rsqrt(ti.tanh(vec4d(t0[0])) ** 2 + 0.5)


def test_forward_mode_of_a_vector_rewritten_in_a_loop():
    """Found by the long run (seed 9726; seeds 9712, 9727 alike): Taichi's optimizer miscompiled the tangent
    code of in-place rewrites inside a loop, which renaming straight-line code did not reach: the dot-product
    test gave -0.8958 against the vjp's -0.9148. Loop bodies and branches are renamed too now, writing the
    carried variables back at their end (NOTE: [Rebinding in loops])."""
    rng = np.random.default_rng(0)
    x, t = rng.uniform(-1, 1, (3, 3)), rng.uniform(-1, 1, (3, 3))
    out, tangents = td.jvp(rewritten_in_a_loop, (x,), (t,))
    cotangents = tuple(rng.uniform(-1, 1, np.shape(o)) for o in out)
    pulled = np.sum(t * td.vjp(rewritten_in_a_loop, x)[1](cotangents)[0])
    pushed = sum(np.sum(d * c) for d, c in zip(tangents, cotangents, strict=True))
    np.testing.assert_allclose(pushed, pulled, rtol=1e-12)
    np.testing.assert_allclose(pulled, -0.9147534680836602, rtol=1e-12)  # central differences: -0.91475346802


mat33d = ti.types.matrix(3, 3, ti.f64)


@ti.func
def read_after_a_static_loop(x0: ti.types.matrix(2, 2, ti.f64)):
    t0 = ti.min(ti.Vector([x0[0, 1], x0[1, 0], x0[1, 0], x0[0, 1]], dt=ti.f64), ti.asin(ti.tanh(ti.Matrix(
        [[x0[1, 1], x0[1, 1], x0[0, 0]], [x0[0, 0], x0[0, 1], x0[0, 1]], [x0[0, 0], x0[1, 0], x0[0, 0]]]).min()) * 0.9))
    for i1 in ti.static(range(1)):
        for _i2 in ti.static(range(1)):
            t0 = ti.math.mix(ti.Vector([t0[0], t0[1], x0[0, 0], x0[0, 0]], dt=ti.f64),
                             ti.max(ti.log(t0 ** 2 + 1.0), ti.min(t0[3], x0[0, 0])), abs(t0 * -0.6))
            t0 += max(float(x0[0, 0]), (x0[1, 1] * (i1 + 1.0)))
    t0, t3 = ti.Vector([t0[0], x0[1, 0], t0[1], x0[0, 0]]), ti.tanh(ti.math.mix(x0, x0, x0))
    return ti.select((t0[1] / (x0[0, 1] ** 2 + 1.0)) > 0.0, ti.Matrix(
        [[x0[1, 1], t3[1, 0], t0[0]], [t3[0, 0], t3[0, 0], t3[1, 1]], [t3[1, 0], t0[3], t3[0, 0]]]).transpose(),
        mat33d(ti.Matrix([[t0[0], t3[0, 0], t3[1, 0]], [x0[1, 0], t0[3], x0[0, 0]], [t0[2], t0[0], x0[0, 0]]]))) * 0.4


def read_after_a_static_loop_twin(x):
    corners = torch.stack([x[1, 1], x[1, 1], x[0, 0], x[0, 0], x[0, 1], x[0, 1], x[0, 0], x[1, 0], x[0, 0]])
    t0 = torch.minimum(torch.stack([x[0, 1], x[1, 0], x[1, 0], x[0, 1]]), torch.asin(torch.tanh(corners.min()) * 0.9))
    a, w = torch.stack([t0[0], t0[1], x[0, 0], x[0, 0]]), torch.abs(t0 * -0.6)
    t0 = a * (1 - w) + torch.maximum(torch.log(t0 ** 2 + 1.0), torch.minimum(t0[3], x[0, 0])) * w
    t0 = t0 + torch.maximum(x[0, 0], x[1, 1])
    t0, t3 = torch.stack([t0[0], x[1, 0], t0[1], x[0, 0]]), torch.tanh(x)
    first = torch.stack([x[1, 1], t3[1, 0], t0[0], t3[0, 0], t3[0, 0], t3[1, 1], t3[1, 0], t0[3], t3[0, 0]])
    second = torch.stack([t0[0], t3[0, 0], t3[1, 0], x[1, 0], t0[3], x[0, 0], t0[2], t0[0], x[0, 0]])
    chosen = first.reshape(3, 3).T if t0[1] / (x[0, 1] ** 2 + 1.0) > 0 else second.reshape(3, 3)
    return chosen * 0.4


def test_forward_mode_reads_a_vector_after_the_static_loop_that_rewrote_it():
    """Found by the long run (seed 9712): after static loops rewriting t0 (written back at the end of each
    body), a literal of t0's entries read stale ones with Taichi's CFG optimization on: jacfwd 0 where torch
    gives 0.4. Tangent code now reads a variable a loop or branch rewrote through a copy made after it, and
    a loop body reads its carried values through copies made on entry (NOTE: [Rebinding in loops])."""
    x = np.array([[1.3166678452560916, 1.3777365955694387], [-0.6486041941046574, -0.6979457586968281]])
    want = torch.func.jacfwd(read_after_a_static_loop_twin)(torch.tensor(x)).numpy()
    np.testing.assert_allclose(td.jacfwd(read_after_a_static_loop)(x), want, rtol=1e-12, atol=1e-14)


@ti.func
def aux_after_a_runtime_loop(x: ti.types.vector(8, ti.f64)):
    t = rewritten_after_a_runtime_loop(ti.Vector([x[0], x[1]]))  # tan((x0 x1)^2), which Taichi can miscompile
    return t * x, t


def test_the_aux_beside_looped_pushes_is_the_pushes_primal():
    """Long run, seed 11015: the aux beside a Jacobian of forward pushes in a runtime loop came from a
    second call of the user's function after the loop, which Taichi 1.7.4 miscompiles here (sin(0.25)-like
    stale entries; tests/test_taichi_pitfalls.py), while the pushes themselves were right. The value and
    the aux are now the primal outputs of the pushes (NOTE: [The value beside looped pushes])."""
    x = np.linspace(0.1, 1.0, 8)
    x[:2] = 0.0765097908207737, 1.3743307775626277
    xs = np.stack([x, 0.9 * x, 1.1 * x])
    for xb in (x, xs):
        s = (xb[..., 0] * xb[..., 1]) ** 2
        t = np.tan(s)
        dt = np.zeros(xb.shape)
        dt[..., 0], dt[..., 1] = 2 * s / xb[..., 0] / np.cos(s) ** 2, 2 * s / xb[..., 1] / np.cos(s) ** 2
        want = t[..., None, None] * np.eye(8) + xb[..., :, None] * dt[..., None, :]
        for transform in (td.jacfwd, td.jacrev, td.jacobian):
            jac, aux = transform(aux_after_a_runtime_loop, has_aux=True)(xb)
            np.testing.assert_allclose(aux, t, rtol=1e-13, err_msg=transform.__name__)
            np.testing.assert_allclose(jac, want, rtol=1e-13, err_msg=transform.__name__)
    np.testing.assert_allclose(aux_in_a_kernel(ti.Vector(list(x))), np.tan((x[0] * x[1]) ** 2), rtol=1e-13)


jacfwd_with_aux = td.jacfwd(aux_after_a_runtime_loop, has_aux=True)


@ti.kernel
def aux_in_a_kernel(x: ti.types.vector(8, ti.f64)) -> ti.f64:
    _, aux = jacfwd_with_aux(x)
    return aux


@ti.func
def pair_of(x0: ti.types.matrix(3, 3, ti.f64), x1: ti.types.matrix(2, 3, ti.f64)):
    t0 = td.stop_gradient(ti.sqrt(ti.tanh(x0) ** 2 + 0.5))
    return abs((x1 @ t0).transpose()), (((abs(x0[2, 2]) ** 0) ** 2 + 0.5) ** ti.tanh(ti.cos(td.stop_gradient(
        ti.Vector([x1[0, 0]])))))


@ti.func
def unpacked_before_a_static_loop(x0: ti.types.vector(4, ti.f64)) -> ti.types.matrix(2, 2, ti.f64):
    t0 = ((((ti.abs(ti.Vector([x0[1]])) ** 2 + 0.5) ** 1.5) ** 2 + 0.5) ** ti.tanh(
        (ti.Vector([x0[1]]) / (ti.Vector([x0[3]]) ** 2 + 1.0)) + 2.3))
    t1, t0 = pair_of((ti.exp(ti.tanh(ti.Matrix([[x0[1], x0[0], x0[0]], [t0[0], t0[0], t0[0]], [t0[0], x0[1], t0[0]]]))
                             * 2.0) + -0.6),
                     ti.pow(ti.pow(ti.Matrix([[x0[0], t0[0], x0[2]], [x0[1], x0[2], x0[0]]]), 3) ** 2 + 0.5, 1.5))
    t1, t0 = pair_of(abs(ti.Matrix([[x0[2], t0[0], t1[1, 1]], [x0[1], x0[3], t1[2, 1]], [t1[0, 0], t0[0], t0[0]]])
                          / (t1[1, 1] ** 2 + 1.0)),
                     ti.cast((t1[2, 1] + ti.Matrix([[x0[3], t0[0], t0[0]], [t1[2, 1], t1[2, 0], x0[2]]])), ti.f64))
    for i2 in ti.static(range(2)):
        t0 *= ti.atan2((x0[3] ** 2), x0[i2] ** 2 + 0.5)
    return ti.log((ti.Matrix([[t0[0], x0[1]], [x0[0], t1[1, 1]]]) - ti.Matrix([[t0[0], x0[1]], [x0[0], t1[0, 0]]])) ** 2
                  + 1.0)


def test_tangent_code_renames_a_vector_that_a_later_loop_binds():
    """Long run, seed 11260 at 192d9db: td.jacfwd/td.jacrev/td.jacobian/td.jvp 6% off torch (td.vjp right). The
    tangent code kept ``t0 = out[1]`` under the user's name, a vector given a new whole value after matrix
    literals of its entries, because a static loop binds ``t0`` later: Taichi's optimizer read stale entries
    (NOTE: [Rebinding in straight-line code]). Now renamed up to the loop, which starts from ``t0 = t0_k``."""
    x = np.array([-0.17706886895690532, -0.5980954540317819, -0.15509391470451672, -1.1222552962284187])
    torch_row = [-9.27436727e-04, -3.33205927e+01, 4.32535357e-01, -3.65325652e-01]  # d out[1, 1] / dx, the twin
    _, vjp_fn = td.vjp(unpacked_before_a_static_loop, x)
    by_reverse = np.stack([vjp_fn(np.eye(4)[k].reshape(2, 2))[0] for k in range(4)]).reshape(2, 2, 4)
    np.testing.assert_allclose(by_reverse[1, 1], torch_row, rtol=1e-8)
    for transform in (td.jacfwd, td.jacobian):
        np.testing.assert_allclose(transform(unpacked_before_a_static_loop)(x), by_reverse, rtol=1e-12, atol=1e-14)


@ti.func
def carried_through_a_runtime_loop(x0: ti.f64) -> ti.f64:
    t0 = (x0 ** 2 + 0.5) ** 1.5
    t1 = ti.Matrix([[x0, x0], [x0, x0]]) % 1.3
    for _ in range(3):
        t0 += t0 * t0 + 0.4
        j = 0
        while j < 1:
            t1[0, 0] *= ti.min(x0, t0)
            t1 += ti.select(t0 > 0.0, ti.cos(x0), ti.tanh(x0))
            j += 1
    return t1.sum() + 0.0 * t0


@ti.func
def breaks_out_of_a_runtime_loop(x: ti.f64) -> ti.f64:
    s = x
    for _ in range(5):
        s = s * s + 0.1
        if s > 1.0:
            break
    return s


def _carried_through_a_runtime_loop_twin(x0):
    t0, t1 = (x0 ** 2 + 0.5) ** 1.5, torch.remainder(x0 * torch.ones(2, 2, dtype=x0.dtype), 1.3)
    for _ in range(3):
        t0 = t0 + t0 * t0 + 0.4
        corner = torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=x0.dtype)
        t1 = t1 + corner * t1[0, 0] * (torch.minimum(x0, t0) - 1.0)
        t1 = t1 + torch.where(t0 > 0.0, torch.cos(x0), torch.tanh(x0))
    return t1.sum()


def test_the_runtime_loops_of_a_scalar_call_run_in_order():
    """A call with no batch dims on a function of scalars ran ``return f(a0)`` at a kernel's top level,
    where Taichi parallelizes f's runtime loop (NOTE: [The body's loops stay serial] in _codegen/batch):
    a value carried through it came out wrong without an error (long run, seed 11437: 14.16 for 12.96;
    a batch of one gave 12.96), and ``break`` in it was refused ("Cannot break in the outermost loop")."""
    x = -0.26761386329363024
    want = _carried_through_a_runtime_loop_twin(torch.tensor(x, dtype=torch.float64)).item()
    np.testing.assert_allclose(td.function(carried_through_a_runtime_loop)(x), want, rtol=1e-12)
    np.testing.assert_allclose(td.function(carried_through_a_runtime_loop)(np.array([x])), [want], rtol=1e-12)
    slope = torch.autograd.functional.jacobian(_carried_through_a_runtime_loop_twin,
                                               torch.tensor(x, dtype=torch.float64)).item()
    np.testing.assert_allclose(td.grad(carried_through_a_runtime_loop)(x), slope, rtol=1e-10)
    s, slope = 0.9, 1.0  # the loop breaks after its fourth step
    for _ in range(5):
        s, slope = s * s + 0.1, 2 * s * slope
        if s > 1.0:
            break
    np.testing.assert_allclose(td.function(breaks_out_of_a_runtime_loop)(0.9), s, rtol=1e-14)
    np.testing.assert_allclose(td.grad(breaks_out_of_a_runtime_loop)(0.9), slope, rtol=1e-12)


@ti.func
def _pushed_inside(x: vec2d) -> ti.f64:
    return x[0] * ti.sin(x[1]) + x[1] ** 3


@ti.func
def pushes_a_jvp_inside(x: vec2d):
    return td.jvp(_pushed_inside, (ti.exp(x) * 2.0,), (x,))[1] + td.grad(_pushed_inside)(x).norm_sqr()


def _pushes_a_jvp_inside_twin(x):
    def inner(z):
        return z[0] * torch.sin(z[1]) + z[1] ** 3

    (g,) = torch.autograd.grad(inner(x), x, create_graph=True)
    return torch.func.jvp(inner, (torch.exp(x) * 2.0,), (x,))[1] + g.dot(g)


def test_second_order_through_a_transform_called_on_a_small_vector():
    """A function calling ``td.jvp`` (or ``td.grad``) of a 2-vector: Jacobians of it push both basis
    tangents in one widened tangent function, which called the inner transform's tangent as one call
    carrying both lanes; differentiating that again raised "a widened tangent call is not differentiated
    again" (long run, seed 11523: td.hessian). A call through a transform is now called once per lane
    (NOTE: [Tangent calls lane by lane]), a single-direction call differentiated to any order."""
    x = np.array([0.3, -0.7])
    want = torch.autograd.functional.hessian(_pushes_a_jvp_inside_twin, torch.tensor(x, requires_grad=True))
    for second in (td.hessian, lambda f: td.jacfwd(td.jacfwd(f)), lambda f: td.jacrev(td.jacfwd(f))):
        np.testing.assert_allclose(second(pushes_a_jvp_inside)(x), want.numpy(), rtol=1e-12, atol=1e-12)
    third = torch.autograd.functional.jacobian(
        lambda z: torch.autograd.functional.hessian(_pushes_a_jvp_inside_twin, z, create_graph=True),
        torch.tensor(x, requires_grad=True))
    np.testing.assert_allclose(td.jacfwd(td.hessian(pushes_a_jvp_inside))(x), third.numpy(), rtol=1e-11, atol=1e-12)


@ti.func
def branch_on_entries_after_a_loop(x0: ti.types.matrix(3, 3, ti.f64)):
    t0, t1 = (ti.log((2.3 / (ti.Matrix([[x0[1, 0], x0[0, 2], x0[1, 0]], [x0[1, 2], x0[0, 1], x0[1, 2]]]) ** 2 + 1.0))
                     ** 2 + 1.0),
              ti.math.smoothstep(0.3, 1.9, ti.tanh(ti.Matrix([[x0[2, 0], x0[2, 1]], [x0[0, 2], x0[2, 2]]]))))
    j2 = 0
    while j2 < 3:
        t0, t1 = t0, abs(t1)
        j2 += 1
    t0 += ti.max(ti.floor(x0[1, 2] * 2.0),
                 ti.Matrix([[x0[1, 2], t0[1, 1]], [t1[1, 1], t1[1, 1]], [t1[0, 1], x0[0, 2]]])[2, 1])
    if ti.sqrt(ti.Vector([t0[0, 2], t1[1, 0]]) ** 2 + 0.5).cross(
            ti.exp(ti.tanh(ti.Vector([t0[1, 1], t1[0, 0]])) * 2.0)) > -0.2:
        t0 *= (t0 + 2.3) % 1.3
        t1 += ti.sqrt(ti.pow(t1, 3) ** 2 + 0.5)
    return (ti.Matrix.identity(ti.f64, 2) + 0.25 * ti.tanh(-(t1 + -0.6))).inverse()


def _branch_on_entries_after_a_loop_twin(x0):
    t0 = torch.log((2.3 / (torch.stack([torch.stack([x0[1, 0], x0[0, 2], x0[1, 0]]),
                                        torch.stack([x0[1, 2], x0[0, 1], x0[1, 2]])]) ** 2 + 1.0)) ** 2 + 1.0)
    s = torch.clamp((torch.tanh(torch.stack([torch.stack([x0[2, 0], x0[2, 1]]), torch.stack([x0[0, 2], x0[2, 2]])]))
                     - 0.3) / 1.6, 0.0, 1.0)
    t1 = torch.abs(s * s * (3 - 2 * s))
    t0 = t0 + torch.maximum(torch.floor(x0[1, 2] * 2.0), t1[0, 1])
    a = torch.sqrt(torch.stack([t0[0, 2], t1[1, 0]]) ** 2 + 0.5)
    b = torch.exp(torch.tanh(torch.stack([t0[1, 1], t1[0, 0]])) * 2.0)
    if a[0] * b[1] - a[1] * b[0] > -0.2:
        t1 = t1 + torch.sqrt((t1 ** 3) ** 2 + 0.5)
    return torch.linalg.inv(torch.eye(2, dtype=x0.dtype) + 0.25 * torch.tanh(-(t1 - 0.6)))


def test_a_branch_test_reads_the_renamed_value_not_the_written_back_one():
    """Tangent code wrote ``t0 = t0_3`` back before a branch that rewrites t0 (NOTE: [Rebinding in straight-line
    code]), and the branch's test read entries of t0 after that whole write: Taichi's optimizer gave them stale
    values from the loop, the tangent code took the other branch, and jacfwd and jacrev were 0.04 off (12 of 36
    entries), td.jvp's primal off the function's value (long run, seed 11591; right with
    advanced_optimization=False). The test now reads the renamed value (NOTE: [Tests read renamed values])."""
    x = np.array([[1.1039541712360874, 1.1645792609133734, 0.20162174731302995],
                  [-0.10951660677669173, -0.9288308263417872, 1.113546148354828],
                  [0.5119623526550732, 0.6216543918596122, 1.04045248641226]])
    value = _branch_on_entries_after_a_loop_twin(torch.tensor(x)).numpy()
    want = torch.autograd.functional.jacobian(_branch_on_entries_after_a_loop_twin, torch.tensor(x)).numpy()
    for jacobian in (td.jacfwd, td.jacrev):
        np.testing.assert_allclose(jacobian(branch_on_entries_after_a_loop)(x), want, rtol=1e-12, atol=1e-15)
    e = np.zeros((3, 3))
    e[2, 1] = 1.0
    out, tangent = td.jvp(branch_on_entries_after_a_loop, (x,), (e,))
    np.testing.assert_allclose(out, value, rtol=1e-14)
    np.testing.assert_allclose(tangent, want[..., 2, 1], rtol=1e-12, atol=1e-15)


@ti.func
def cubic_energy(x: ti.types.vector(2, ti.f64), s: ti.f64, n: ti.i32) -> ti.f64:
    return s * x.norm_sqr() * x[0] + ti.sin(x[1]) * n


@ti.func
def calls_hvp(x: ti.types.vector(2, ti.f64), s: ti.f64) -> ti.f64:
    value, hv = td.hvp(cubic_energy, (x, s, 2), (ti.Vector([1.0, -0.5]), 0.3, 0))
    return value * 0.1 + hv[0].dot(x) + hv[1] * s


def _calls_hvp_twin(x, s):
    def energy(x, s):
        return s * (x * x).sum() * x[0] + torch.sin(x[1]) * 2

    tangents = (torch.tensor([1.0, -0.5], dtype=x.dtype), torch.tensor(0.3, dtype=x.dtype))
    value, hv = torch.autograd.functional.hvp(energy, (x, s), tangents, create_graph=True)
    return value * 0.1 + hv[0].dot(x) + hv[1] * s


def test_a_function_calling_td_hvp_is_differentiated_again():
    """Outside code (JAX's api tests: transforms compose): td.grad of a @ti.func calling td.hvp raised 'cannot
    differentiate a call to td.hvp: a function of tidiff' (td.jvp of td.grad worked)."""
    x, s = np.array([0.4, -0.3]), 1.3
    xt, st = torch.tensor(x), torch.tensor(s, dtype=torch.float64)
    np.testing.assert_allclose(td.function(calls_hvp)(x, s), _calls_hvp_twin(xt, st).item(), rtol=1e-14)
    want = torch.autograd.functional.jacobian(_calls_hvp_twin, (xt, st))
    for jacobian in (td.grad, td.jacfwd, td.jacrev):
        dx, ds = jacobian(calls_hvp, argnums=(0, 1))(x, s)
        np.testing.assert_allclose(dx, want[0].numpy(), rtol=1e-13)
        np.testing.assert_allclose(ds, want[1].numpy(), rtol=1e-13)
    hessian = torch.autograd.functional.hessian(lambda x: _calls_hvp_twin(x, st), xt).numpy()
    np.testing.assert_allclose(td.hessian(calls_hvp)(x, s), hessian, rtol=1e-12, atol=1e-14)



@ti.func
def sine_cubed(x: ti.f64) -> ti.f64:
    return ti.sin(x) ** 3


@ti.func
def calls_hvp_beside_a_3_vector(x: ti.f64, w: ti.types.vector(3, ti.f64)) -> ti.f64:
    return td.hvp(sine_cubed, (x,), (x,))[1][0] * w.sum()


def test_a_td_hvp_call_is_pushed_in_three_lanes():
    """Long run, seed 12031: td.jacfwd by a 3-vector pushes three tangent lanes through one call, and a call
    through a tidiff Function is made once per lane; lanes 0 and 1 stored td.hvp's tuple result in one scratch
    name, which Taichi cannot assign twice ('Variable ... cannot be assigned'). Now a name per lane."""
    x, w = 0.7, np.array([0.5, -1.1, 0.7])

    def twin(x, w):
        def cubed(x):
            return torch.sin(x) ** 3

        return torch.autograd.functional.hvp(cubed, x, x, create_graph=True)[1] * w.sum()

    want = torch.autograd.functional.jacobian(twin, (torch.tensor(x, dtype=torch.float64), torch.tensor(w)))
    for jacobian in (td.jacfwd, td.jacrev):
        dx, dw = jacobian(calls_hvp_beside_a_3_vector, argnums=(0, 1))(x, w)
        np.testing.assert_allclose(dx, want[0].numpy(), rtol=1e-13)
        np.testing.assert_allclose(dw, want[1].numpy(), rtol=1e-13)
