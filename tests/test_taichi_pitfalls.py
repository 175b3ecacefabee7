"""Taichi 1.7.4 behaviours that give wrong values with no tidiff code involved, each as a minimal program.

Each test asserts what Taichi does today, so it fails (and says so) once a Taichi release fixes it; the
conformance net classifies programs that hit them as Taichi pitfalls, not tidiff failures (NOTE: [Taichi
pitfalls] in tests/conformance/checks.py), and docs/limits.md lists them.
"""
import numpy as np
import taichi as ti
from taped import tape

M22 = ti.types.matrix(2, 2, ti.f64)
V1 = ti.types.vector(1, ti.f64)


def side_by_side(wrong, right, result):
    """A kernel writing ``wrong(x[b])`` and ``right(x[b])`` (each of type ``result``) for every element b."""

    @ti.kernel
    def both(x: ti.types.ndarray(dtype=ti.f64, ndim=1), wrongs: ti.types.ndarray(dtype=result, ndim=1),
             rights: ti.types.ndarray(dtype=result, ndim=1)):
        for b in range(x.shape[0]):
            wrongs[b] = wrong(x[b])
            rights[b] = right(x[b])

    return both


@ti.func
def in_a_loop(x):
    v = ti.Matrix([[x, 2.0 * x], [3.0, x * x]])
    for _ in range(1):
        v = v * 0.5 + ti.Matrix([[v[0, 1], x], [x, x]]).transpose() * (x - 1.5)
        v[1, 1] += v[0, 1]
    return v


@ti.func
def straight_line(x):
    v = ti.Matrix([[x, 2.0 * x], [3.0, x * x]])
    v = v * 0.5 + ti.Matrix([[v[0, 1], x], [x, x]]).transpose() * (x - 1.5)
    v[1, 1] += v[0, 1]
    return v


both = side_by_side(in_a_loop, straight_line, M22)


def test_entry_read_after_a_whole_matrix_write_with_a_transpose_in_a_loop_reads_the_old_entry():
    """Inside a runtime loop, ``v = ... + M(v).transpose() * w`` followed by a read of an entry of ``v``
    reads the entry as it was before the write (found by the conformance net's long run).

    At x = 1.5 the weight is 0: v becomes v / 2 = [[0.75, 1.5], [1.5, 1.125]], and v[1, 1] += v[0, 1]
    gives 2.625. In the loop Taichi adds the old v[0, 1] = 3.0 instead: 4.125.
    """
    x = np.array([1.5])
    looped, straight = np.zeros((1, 2, 2)), np.zeros((1, 2, 2))
    both(x, looped, straight)
    np.testing.assert_array_equal(straight[0], [[0.75, 1.5], [1.5, 2.625]])  # right
    np.testing.assert_array_equal(looped[0], [[0.75, 1.5], [1.5, 4.125]])  # Taichi 1.7.4: the old v[0, 1]


@ti.func
def added_in_a_loop(x):
    v = ti.Matrix([[x, 2.0 * x], [3.0, x * x]])
    for _ in range(1):
        v += ti.Matrix([[v[1, 0], v[0, 0]], [v[1, 0], x]])
        v[1, 0] *= v[0, 1]
    return v


@ti.func
def added_straight(x):
    v = ti.Matrix([[x, 2.0 * x], [3.0, x * x]])
    v += ti.Matrix([[v[1, 0], v[0, 0]], [v[1, 0], x]])
    v[1, 0] *= v[0, 1]
    return v


both_added = side_by_side(added_in_a_loop, added_straight, M22)


def test_entry_update_after_adding_a_matrix_of_own_entries_in_a_loop_reads_the_old_entry():
    """The same family, with ``v += ti.Matrix([[v[1, 0], ...]])`` (``v = v + ...`` is right).

    At x = 1.5: v = [[1.5, 3], [3, 2.25]] + [[3, 1.5], [3, 1.5]] = [[4.5, 4.5], [6, 3.75]], then
    v[1, 0] *= v[0, 1] gives 27. In the loop Taichi multiplies the old v[1, 0] = 3: 13.5.
    """
    x = np.array([1.5])
    looped, straight = np.zeros((1, 2, 2)), np.zeros((1, 2, 2))
    both_added(x, looped, straight)
    np.testing.assert_array_equal(straight[0], [[4.5, 4.5], [27.0, 3.75]])  # right
    np.testing.assert_array_equal(looped[0], [[4.5, 4.5], [13.5, 3.75]])  # Taichi 1.7.4: the old v[1, 0]


@ti.func
def scaled_twice(x):
    v = ti.Vector([x])
    v -= 0.5
    v *= ti.Matrix([[v[0], x], [v[0], x]]).min()
    v -= 0.5
    v *= ti.Matrix([[v[0], x], [v[0], x]]).min()
    return v


@ti.func
def scaled_twice_by_assignment(x):
    v = ti.Vector([x])
    v = v - 0.5
    v = v * ti.Matrix([[v[0], x], [v[0], x]]).min()
    v = v - 0.5
    v = v * ti.Matrix([[v[0], x], [v[0], x]]).min()
    return v


both_scaled = side_by_side(scaled_twice, scaled_twice_by_assignment, V1)


def test_second_identical_literal_of_own_entries_after_an_augmented_write_reads_the_old_entry():
    """Straight-line code too: ``v *= ti.Matrix([[v[0], x], [v[0], x]]).min()`` written twice, with
    ``v -= 0.5`` between, gives the second literal the v[0] of the first (found by the net).

    At x = 0.7: v = 0.2, then 0.2 * min(0.2, 0.7) = 0.04, then -0.46, then -0.46 * min(-0.46, 0.7)
    = 0.2116. Taichi multiplies by the old v[0] = 0.2 the second time: -0.092.
    """
    x = np.array([0.7])
    augmented, assigned = np.zeros((1, 1)), np.zeros((1, 1))
    both_scaled(x, augmented, assigned)
    np.testing.assert_allclose(assigned[0], [0.2116], rtol=1e-14)  # right
    np.testing.assert_allclose(augmented[0], [-0.092], rtol=1e-14)  # Taichi 1.7.4: the old v[0]



@ti.func
def own_entry_added_after_a_loop(x):
    t = ti.Vector([x, 4.0])
    for _ in range(1):  # a runtime loop, even an empty one
        pass
    m = ti.Vector([t[1], x])[1]
    t = t + m
    return ti.Vector([t[1]])


@ti.func
def own_entry_added_under_a_new_name(x):
    t = ti.Vector([x, 4.0])
    for _ in range(1):
        pass
    m = ti.Vector([t[1], x])[1]
    s = t + m
    return ti.Vector([s[1]])


both_after_a_loop = side_by_side(own_entry_added_after_a_loop, own_entry_added_under_a_new_name, V1)


def test_an_entry_after_a_whole_write_past_a_literal_of_it_after_a_runtime_loop_is_the_old_one():
    """Seed 11591's Taichi half, reduced from tidiff's tangent code of the generated program (before NOTE:
    [Tests read renamed values]) by deleting statements down to plain Taichi: after a runtime loop, even an
    empty one, ``m = ti.Vector([t[1], x])[1]; t = t + m`` and then ``t[1]`` reads the ``t[1]`` of before
    the write. At x = 0.5 that is 4.0; right: 4.0 + 0.5 = 4.5. Right without the loop, with the literal
    inline in the sum, and under a new name (what tidiff's tangent code writes)."""
    x = np.array([0.5])
    wrong, right = np.zeros((1, 1)), np.zeros((1, 1))
    both_after_a_loop(x, wrong, right)
    np.testing.assert_array_equal(right[0], [4.5])  # right
    np.testing.assert_array_equal(wrong[0], [4.0])  # Taichi 1.7.4: the old t[1]


x_field = ti.field(ti.f64, shape=1, needs_grad=True)
loss_field = ti.field(ti.f64, shape=(), needs_grad=True)


@ti.kernel
def cube_through_a_local_copy():
    for i in x_field:
        a = x_field[i]
        t = a
        for _ in range(2):  # a runtime loop
            t = t * a
        loss_field[None] += t


@ti.kernel
def cube_reading_the_field():
    for i in x_field:
        t = x_field[i]
        for _ in range(2):
            t *= x_field[i]
        loss_field[None] += t


def _tape_gradient(kernel):
    x_field.from_numpy(np.array([0.7]))
    with tape(loss_field, x_field):
        kernel()
    return x_field.grad.to_numpy()[0]


def test_reverse_mode_through_a_local_copy_in_a_runtime_loop_is_wrong():
    """Taichi's own reverse mode (ti.ad.Tape, no tidiff) of t = a; t = t * a twice in a runtime loop, with
    a a local copy of x[i]: the gradient of a**3 at 0.7 is 3 * 0.49 = 1.47; Taichi gives 2 * 0.49 = 0.98
    (found by the net through a field program, whose reverse mode is Taichi's). Reading the field
    in the loop is right."""
    np.testing.assert_allclose(_tape_gradient(cube_reading_the_field), 3 * 0.7**2, rtol=1e-14)  # right
    np.testing.assert_allclose(_tape_gradient(cube_through_a_local_copy), 2 * 0.7**2, rtol=1e-14)  # Taichi 1.7.4


V4 = ti.types.vector(4, ti.f64)


@ti.func
def squared_last(x: V4) -> V1:
    t = ti.Vector([x[3]])
    return t * t


@ti.func
def branch_calls_a_func_in_an_unrolled_loop(a: ti.f64, b: V4):
    t1 = ti.Vector([0.0])
    t0 = a
    for _ in ti.static(range(3)):
        if a > -0.2:
            t0 = t0 * 2.0
        else:
            t1 = squared_last(b)
    return t1 * a


def test_a_branch_calling_a_func_in_an_unrolled_loop_inside_a_func_crashes_the_compiler():
    """Found by the long run (seed 9102, via td.jvp of a helper inside such a branch): Taichi 1.7.4's IR
    verifier rejects what its own frontend built, 'block->parent != current_container_stmt', for a
    ti.static loop of three or more iterations in a @ti.func whose branch calls a @ti.func. A runtime error
    at compile time, not a wrong value; no tidiff code involved."""

    @ti.kernel
    def run(a: ti.f64, b: V4) -> ti.f64:
        return branch_calls_a_func_in_an_unrolled_loop(a, b)[0]

    try:
        run(0.45, ti.Vector([-1.4, 0.39, -1.45, 0.049]))
    except RuntimeError as e:
        assert "verify.cpp" in str(e) and "current_container_stmt" in str(e), e
    else:
        raise AssertionError("Taichi compiled it: the pitfall is fixed, update docs/limits.md and the net")


@ti.func
def overwritten_in_a_loop(x: ti.f64) -> ti.f64:
    t = x * 0.0
    for _ in range(2):
        t = ti.cos(x)  # the same value each iteration: d/dx is -sin(x)
    return t


def test_reverse_mode_of_a_value_overwritten_in_a_runtime_loop_is_zero():
    """Found by the long run through an ndarray kernel (seed 9115), whose reverse mode is Taichi's:
    kernel.grad of out[i] = f(a[i]) with t = cos(x) assigned in a runtime loop gives 0, not -sin(x)."""

    @ti.kernel
    def apply(a: ti.types.ndarray(dtype=ti.f64, ndim=1), out: ti.types.ndarray(dtype=ti.f64, ndim=1)):
        for i in range(a.shape[0]):
            out[i] = overwritten_in_a_loop(a[i])

    a = np.array([0.3, -0.6, 1.2])
    arrays = [ti.ndarray(ti.f64, 3, needs_grad=True) for _ in range(2)]
    arrays[0].from_numpy(a)
    apply(*arrays)
    arrays[1].grad.from_numpy(np.ones(3))
    apply.grad(*arrays)
    np.testing.assert_array_equal(arrays[0].grad.to_numpy(), np.zeros(3))  # Taichi 1.7.4; right: -sin(a)


V3 = ti.types.vector(3, ti.f64)


@ti.func
def rewritten_after_literals(x0: V3):
    vector = ti.Vector([x0[2]])
    matrix = ti.Matrix([[x0[0], x0[2], x0[1]], [x0[2], x0[1], x0[1]], [x0[0], x0[0], x0[1]]])
    cos = ti.cos(0.4 - matrix)
    dcos = ti.sin(0.4 - matrix)
    t0 = vector
    t1 = cos
    matrix_1 = ti.Matrix([[t1[1, 1], t0[0], t0[0]], [t1[0, 2], x0[1], t0[0]]])
    matrix_2 = ti.Matrix([[x0[2], t0[0], t1[2, 1]], [t1[0, 0], t0[0], x0[0]]])
    t4 = ti.cast(matrix_1 * matrix_2, ti.f64)
    unused = dcos[1, 0] * ti.math.sign(t1[1, 0])  # noqa: F841 -- part of what reproduces it
    floor = ti.floor(t0 ** 0 * 2.0)
    t0 = (floor ** 2 + 0.5) ** (-0.7)  # 4.5 ** -0.7, whatever t0 was
    add = t0[0] + t4[1, 2]  # noqa: F841
    return ti.Vector([t0[0], 0.0])


def test_a_vector_rewritten_after_literals_of_its_entries_is_miscompiled():
    """Found by the long run (seed 9123) in tidiff's tangent code of a generated program, reduced to plain
    Taichi by deleting statements: straight-line code, no loop. After t0 = (...) ** -0.7 (4.5 ** -0.7 =
    0.3489 whatever t0 was) Taichi returns 0.0 for t0[0] (in the unreduced code, t0's entry from before the
    write). Renaming the rewritten vector (t5 = ...) gives the right value."""

    @ti.kernel
    def run(x: V3) -> ti.types.vector(2, ti.f64):
        return rewritten_after_literals(x)

    got = run(ti.Vector([-0.5326140926502904, -0.7249415699311464, -0.38906455755512903]))
    assert got[0] == 0.0, got  # Taichi 1.7.4; right: 4.5 ** -0.7


@ti.func
def rewritten_twice_in_a_loop(t):
    for _ in range(2):  # a runtime loop
        t = t * (t[1] + 0.3)
        t = t - t[1] * t[2]
    return t


@ti.func
def rewritten_under_new_names_in_a_loop(t):
    for _ in range(2):
        a = t * (t[1] + 0.3)
        b = a - a[1] * a[2]
        t = b
    return t


def test_a_vector_rewritten_twice_in_a_runtime_loop_reads_stale_entries():
    """Found by the long run (seeds 9712, 9726, 9727) in tidiff's tangent code, reduced to plain Taichi: no
    literal, two whole writes of a vector in a runtime loop, the second reading entries of the first. The
    same body under new names (tidiff's tangent code since: NOTE: [Rebinding in loops]) is right, and so
    is the first with ``advanced_optimization=False``; ``cfg_optimization=False`` alone does not help here."""

    @ti.kernel
    def run(x: V3) -> ti.types.matrix(2, 3, ti.f64):
        wrong, right = rewritten_twice_in_a_loop(x), rewritten_under_new_names_in_a_loop(x)
        return ti.Matrix.rows([wrong, right])

    x = np.array([0.1, 0.4, -0.3])
    want = x.copy()
    for _ in range(2):
        want = want * (want[1] + 0.3)
        want = want - want[1] * want[2]
    got = run(ti.Vector(list(x))).to_numpy()
    np.testing.assert_allclose(got[1], want, rtol=1e-14)  # right
    assert not np.allclose(got[0], want, rtol=1e-3), got  # Taichi 1.7.4: stale entries


@ti.func
def branch_then_runtime_loop(x0: ti.f64, x1: ti.f64) -> ti.f64:
    t = ti.Vector([x1]) ** 2 + 0.5
    if x0 > 0.3:
        for _ in range(1):
            t = t + 0.5
    else:
        t = t * 0.5
    for _ in range(2):
        t = ti.sin(t)
    return t[0]


def test_reverse_mode_of_a_vector_through_a_branch_and_a_runtime_loop_fails_its_ir_verifier():
    """Found by the long run (seed 10707) in Taichi's reverse mode of a plain ndarray kernel (and of the field
    program around the same function), reduced by deleting and simplifying statements: kernel.grad does not
    compile, 'IR broken: stmt BinaryOpStmt ... cannot have operand BinaryOpStmt ...'. The kernel itself
    compiles and runs. A runtime error, not a wrong value; no tidiff code involved."""

    @ti.kernel
    def apply(a: ti.types.ndarray(dtype=ti.f64, ndim=1), b: ti.types.ndarray(dtype=ti.f64, ndim=1),
              out: ti.types.ndarray(dtype=ti.f64, ndim=1)):
        for i in range(a.shape[0]):
            out[i] = branch_then_runtime_loop(a[i], b[i])

    arrays = [ti.ndarray(ti.f64, 2, needs_grad=True) for _ in range(3)]
    arrays[0].from_numpy(np.array([0.1, 0.5]))
    arrays[1].from_numpy(np.array([0.7, 0.7]))
    apply(*arrays)
    t = 0.7**2 + 0.5
    np.testing.assert_allclose(arrays[2].to_numpy(), np.sin(np.sin([t * 0.5, t + 0.5])), rtol=1e-14)
    arrays[2].grad.from_numpy(np.ones(2))
    try:
        apply.grad(*arrays)
    except RuntimeError as e:
        assert "verify.cpp" in str(e) and "cannot have operand" in str(e), e
    else:
        raise AssertionError("Taichi compiled it: the pitfall is fixed, update docs/limits.md")


@ti.func
def rewritten_after_a_runtime_loop(x):
    t = ti.Matrix([[0.5, 0.5], [0.5, 0.5]])
    if t[1, 0] > 0.3:  # always taken
        t = t * 0.5
    else:
        for i in ti.static(range(2)):
            t += x[i]
    for _ in range(1):  # a runtime loop
        t = ti.sin(t)
    t = x.outer_product(x)  # whatever t was
    t = ti.tan(t * t[0, 1])
    return t[1, 0]


@ti.func
def renamed_after_a_runtime_loop(x):
    u = x.outer_product(x)
    u = ti.tan(u * u[0, 1])
    return u[1, 0]


def test_a_matrix_rewritten_after_a_branch_and_a_runtime_loop_keeps_its_old_value():
    """Found by the long run (seed 11015, at 57c2bb2), reduced to plain Taichi by deleting and simplifying
    statements: after the runtime loop, t is written whole twice, yet Taichi returns sin(0.25), t's entry
    from the loop. Right with ``advanced_optimization=False``. In the unreduced program tidiff's tangent and
    reverse functions (renamed variables) were right, and so was td.function's kernel, which calls the user's
    function too (the miscompile depends on the kernel around it); the aux beside a forward-push Jacobian,
    then computed by calling the user's function after the loop of pushes, was Taichi's number (now the
    pushes' primal: tests/test_net_findings.py::test_the_aux_beside_looped_pushes_is_the_pushes_primal)."""

    @ti.kernel
    def run(x: ti.types.vector(2, ti.f64)) -> ti.types.vector(2, ti.f64):
        return ti.Vector([rewritten_after_a_runtime_loop(x), renamed_after_a_runtime_loop(x)])

    x = np.array([0.0765097908207737, 1.3743307775626277])
    want = np.tan((x[0] * x[1]) ** 2)
    wrong, right = run(ti.Vector(list(x))).to_numpy()
    np.testing.assert_allclose(right, want, rtol=1e-14)
    assert wrong == np.sin(0.25), wrong  # Taichi 1.7.4; right: tan((x0 x1)^2) = 0.011056...


points = ti.Vector.field(2, ti.f64, shape=3, needs_grad=True)
pair_loss = ti.field(ti.f64, shape=(), needs_grad=True)


@ti.kernel
def pair_products():
    """sum over i, j of d[0] * d[1] with d = x[i] - x[j] + 0.3: the shape of an n-body force loop."""
    for i in points:
        f = 0.0
        for j in range(3):  # a runtime loop
            d = points[i] - points[j] + 0.3  # a vector local given a new value from field reads
            f += d[0] * d[1]
        pair_loss[None] += f


def pair_products_gradient(x: np.ndarray) -> np.ndarray:
    """The gradient of ``pair_products``'s loss: d[0] * d[1] for the pair (i, j) moves x[i] and -x[j]."""
    d = x[:, None, :] - x[None, :, :] + 0.3
    swapped = d[..., ::-1]
    return swapped.sum(axis=1) - swapped.sum(axis=0)


def test_reverse_mode_of_a_vector_local_in_a_runtime_loop_is_wrong():
    """Found through a DiffTaichi-style n-body program (session 26): Taichi's own reverse mode (ti.ad.Tape,
    no tidiff) of a loop that gives a vector local a new value from field reads in each iteration gets the
    gradient wrong (half of it here); the same loop over scalar locals is right. tidiff checks Taichi's
    reverse mode against its own forward mode before trusting it (tests/test_reverse_checked.py)."""
    x = np.array([[0.1, -0.4], [0.9, 0.3], [-0.5, 0.2]])
    points.from_numpy(x)
    with tape(pair_loss, points):
        pair_products()
    right = pair_products_gradient(x)  # central differences of the kernel agree to 1e-9
    np.testing.assert_allclose(points.grad.to_numpy(), right / 2, rtol=1e-13)  # Taichi 1.7.4: half of it


@ti.func
def maximum_in_a_loop_then_branches(x0: V3) -> ti.f64:
    t0, t1 = ti.cos(x0), ti.Vector([x0[0], x0[0], x0[1], x0[2]])
    for _ in range(2):
        t1, t0 = ti.rsqrt((t1 + 0.7391).normalized(0.5) ** 2 + 0.5), ti.max(ti.Vector([t1[1], t0[2], t0[0]]),
                                                                            (t0 + 0.7391).normalized())
    if min(t1[0], t0[2]) > -0.2:
        m = ti.Matrix([[x0[2], t0[2], t1[1]], [t0[2], t0[0], t0[0]], [t1[2], x0[2], t1[3]]])
        if ti.atan2(t1[3], t0[1] ** 2 + 0.5) * m.determinant() > 0.3:
            t0 = V3(t0[1])
        j = 0
        while j < 1:
            j += 1
        if t0[0] > 0.3:
            t0 = x0
    return t0[0] + t0[1] + t0[2] + t1[0]


def test_a_parallel_loop_calling_this_function_does_not_compile_with_fast_math():
    """Found by the long run (seed 11813, td.function(f) of a generated function), reduced by deleting and
    simplifying statements: Taichi 1.7.4's LLVM backend emits a vectorized ``llvm.maxnum.v2f64`` that does
    not dominate its uses, and the kernel fails an assertion ('ckd->check() == CompiledKernelData::Err::
    kNoError'). A plain kernel calling the function on scalar arguments compiles; a parallel loop over an
    ndarray calling it (what td.function compiles, and what users write) does not, unless
    ti.init(fast_math=False). No tidiff code involved; the vectorizer's choice depends on the CPU, so where
    this CPU's code compiles, its value must be right (NumPy's, and Taichi's with fast_math=False)."""

    @ti.kernel
    def apply(x: ti.types.ndarray(dtype=ti.f64, ndim=2), out: ti.types.ndarray(dtype=ti.f64, ndim=1)):
        for i in range(x.shape[0]):
            out[i] = maximum_in_a_loop_then_branches(ti.Vector([x[i, 0], x[i, 1], x[i, 2]]))

    out = np.zeros(2)
    try:
        apply(np.array([[0.0401036894, -0.7730326968, -0.1862466441], [-1.3814927397, 0.2881065556, 0.1924033959]]),
              out)
    except RuntimeError as e:
        assert "ckd->check() == CompiledKernelData::Err::kNoError" in str(e), e
    else:
        np.testing.assert_allclose(out, [0.29151941812910476, 0.2870755043488469], rtol=1e-12)  # as NumPy


@ti.func
def entry_updates_around_a_runtime_loop(x):
    t0 = x * 0.5 + 0.5
    t1 = ti.Vector([x, x * 0.5])
    for _ in ti.static(range(2)):
        for _ in ti.static(range(2)):
            t1[1] += (2.3 - t1).cross(t1)
        t1 = ti.select(t0 * x > 0.0, t0 - t1 * t1, t1 * 3.0)
        t0, t1 = x * 0.7, t1 * 0.4
    for _ in range(3):
        t1[1] -= x
    return t1


def _entry_updates_in_numpy(x):
    t0, t1 = x * 0.5 + 0.5, np.array([x, 0.5 * x])
    for _ in range(2):
        for _ in range(2):
            a = 2.3 - t1
            t1[1] += a[0] * t1[1] - a[1] * t1[0]
        t1 = t0 - t1 * t1 if t0 * x > 0 else t1 * 3.0
        t0, t1 = 0.7 * x, t1 * 0.4
    for _ in range(3):
        t1[1] -= x
    return t1


entry_updates_out = ti.Vector.field(2, ti.f64, 2)


@ti.kernel
def entry_updates_at_top_level(x: ti.f64):
    entry_updates_out[0] = entry_updates_around_a_runtime_loop(x)


@ti.kernel
def entry_updates_in_a_parallel_loop(x: ti.f64):
    for _ in range(1):
        entry_updates_out[1] = entry_updates_around_a_runtime_loop(x)


def test_entry_updates_of_a_vector_before_a_runtime_loop_at_a_kernels_top_level_are_miscompiled():
    """Found by the long run (seed 93014): tidiff's tangent and reverse code of a generated field program's
    element function were wrong, central differences and torch agreeing, and right with
    ti.init(advanced_optimization=False); reduced from the function alone, which Taichi's optimizer
    miscompiles with no tidiff code. A 2-vector updated entry by entry in unrolled loops, rewritten whole,
    then updated in a runtime loop, evaluated in a kernel's serial top-level code, loses the unrolled
    updates; the same call in a parallel loop is right."""
    for x in (0.3, 0.7, -0.4):
        entry_updates_at_top_level(x)
        entry_updates_in_a_parallel_loop(x)
        top, looped = entry_updates_out.to_numpy()
        np.testing.assert_allclose(looped, _entry_updates_in_numpy(x), rtol=1e-12)
        assert abs(top[1] - looped[1]) > 1.0, (x, top, looped)  # Taichi's wrong number
