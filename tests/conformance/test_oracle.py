"""The oracle itself: where torch's own derivatives are wrong, the twin must not use them; and how a value
mismatch is classified (tidiff's fault, or Taichi's own)."""
import types

import hypothesis.strategies as st
import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import given, settings
from hypothesis.errors import Unsatisfiable, UnsatisfiedAssumption

import tidiff as td

from . import oracle
from .cases import Case, _modes_agree, assume_tame, nudged
from .checks import TaichiPitfall, _reject_if_torch_modes_differ, chain_modes_agree, check_value, oracle_is_noise
from .compare import Mismatch
from .grammar import Expr, Func, Program
from .ops import OPS
from .render_torch import _det, namespace


@ti.func
def det_of_a_singular_cube(x0: ti.types.vector(1, ti.f64)) -> ti.f64:
    m = ti.Matrix([[x0[0], x0[0], x0[0]], [x0[0], x0[0], x0[0]], [x0[0], x0[0], x0[0]]]) * 1.7
    return ti.math.determinant(ti.pow(m, 3))


def test_determinant_twin_has_finite_derivatives_at_singular_matrices():
    """Found by the long run: torch.linalg.det's fourth derivative of a determinant that is 0 for every x
    is NaN; the twin's cofactor polynomial gives the true 0 (tidiff's answer)."""
    det = eval("lambda m: " + OPS["determinant_fn"].torch.format("m"), namespace())

    def twin(x):
        return det((1.7 * x[0] * torch.ones(3, 3, dtype=torch.float64)) ** 3)

    x = torch.tensor([1.2695181265981104], dtype=torch.float64)
    d = twin
    for _ in range(4):
        d = (lambda g: lambda y: torch.autograd.functional.jacobian(g, y, create_graph=True))(d)
    fourth = d(x)
    np.testing.assert_array_equal(fourth.detach().numpy(), np.zeros((1, 1, 1, 1)))
    got = td.jacfwd(td.jacobian(td.hessian(det_of_a_singular_cube)))(x.numpy())
    np.testing.assert_array_equal(got, np.zeros((1, 1, 1, 1)))


def sine_case():
    x0 = Expr("var", (), (), (("name", "x0"),))
    program = Program((), Func("f", (("x0", ()),), (), (Expr("sin", (x0,), ()),)))
    return Case(program, [np.array([0.3, -0.4])], [False])


def test_a_value_taichi_itself_gets_otherwise_is_a_taichi_pitfall():
    """NOTE: [Taichi pitfalls]: where Taichi's plain evaluation disagrees with the twin too, the net says so."""
    case = sine_case()
    check_value(case)
    case.twin = torch.cos  # Taichi (sin) now disagrees with the "twin", in a plain kernel as through tidiff
    with pytest.raises(TaichiPitfall, match="Taichi's own evaluation"):
        check_value(case)


def test_a_value_only_tidiff_gets_wrong_is_a_tidiff_failure():
    case = sine_case()
    case.fn = lambda x: np.sin(x) + 1.0  # as if tidiff's evaluation were wrong while Taichi's is right
    with pytest.raises(Mismatch) as raised:
        check_value(case)
    assert not isinstance(raised.value, TaichiPitfall)


@ti.func
def ties(x: ti.types.vector(2, ti.f64)) -> ti.f64:
    v = ti.Vector([x[0], x[0], x[1]])
    return ti.max(x[0], x[0] * 1.0) * 2.0 + min(x[1], x[1]) * 3.0 + v.max() * 5.0 + ti.math.clamp(x[0], 0.4, 0.9)


def test_twin_takes_ties_as_tidiff_documents():
    """Found by the long run (seed 9124): the grammar builds ties by construction (a matrix of one value); the
    twin's min, max, v.max() and clamp follow tidiff's convention (docs/limits.md: an even split, as torch's
    own ops), so a tie is not a mismatch."""
    ns = namespace()
    maximum, minimum, max_of, clamp = (ns[name] for name in ("_maximum", "_minimum", "_max_of", "_clamp"))

    def twin(x):
        v = torch.stack([x[0], x[0], x[1]])
        return maximum(x[0], x[0] * 1.0) * 2.0 + minimum(x[1], x[1]) * 3.0 + max_of(v) * 5.0 + clamp(x[0], 0.4, 0.9)

    for point in ([0.4, 0.4], [0.4, 0.1], [0.9, 0.95]):
        x = torch.tensor(point, dtype=torch.float64, requires_grad=True)
        (want,) = torch.autograd.grad(twin(x), x)
        np.testing.assert_allclose(td.grad(ties)(np.array(point)), want.numpy(), rtol=1e-15)


@ti.func
def scaled(a: ti.f64, v: ti.types.vector(2, ti.f64)) -> ti.f64:
    return a * v[0]


@ti.func
def grad_of_shared(x: ti.types.vector(2, ti.f64)) -> ti.types.vector(2, ti.f64):
    return td.grad(scaled, argnums=1)(x[1], x)  # (x[1], 0): by v alone, though a is read from x too


def test_twin_grad_is_by_its_argument_alone():
    """Found by the long run (seed 9803): the twin of td.grad(h, argnums=1)(-x[1], x) differentiated by the
    tensor x, so the path through the first argument counted too; tidiff was right."""
    grad = namespace()["_grad"]

    def twin(x):
        return grad(lambda a, v: a * v[0], 1)(x[1], x)

    x = np.array([0.3, -0.8])
    want = torch.autograd.functional.jacobian(twin, torch.tensor(x))
    np.testing.assert_allclose(want.numpy(), [[0.0, 1.0], [0.0, 0.0]])
    np.testing.assert_allclose(td.jacrev(grad_of_shared)(x), want.numpy(), rtol=1e-15)


def test_a_twin_whose_jacobian_differs_by_mode_is_no_oracle():
    """Long run, seed 10506: torch's reverse mode gave -4.5e-4 where its forward mode, tidiff and central
    differences give 0 (a saturated tanh behind ``t[1, 1] - t`` of equal entries whose derivative is huge).
    Such draws are rejected (``_modes_agree``); here a twin of the same shape."""
    helpers = namespace()

    def cancelling(x):
        s = (((1.7 / (torch.cos(x * 30.0) ** 2 + 1.0)) ** 3) ** 3).sum() * 1e6
        t = helpers["_filled"]((2, 3), s)
        m = helpers["_matrix"](2, 2, [x[0], x[1], x[1], x[0]]) ** 2 + 0.5
        return torch.exp(torch.tanh(t)) + m @ (t[1, 1] - t)

    case = types.SimpleNamespace(arrays=[np.array([0.3, -0.7, 1.1])], cores=[(3,)], twin=cancelling)
    assert not _modes_agree(case)
    case.twin = lambda x: torch.sin(x) * x.sum()
    assert _modes_agree(case)


def crossed_with_ones(x):
    """``cross(c * (1, 1, 1), (1, 1, 1))`` is 0 whatever c; its cotangent reaches c as ``sum(cross(ones, ct))``,
    a rounding error for a random ct, here times a derivative of c near 1e12."""
    c = torch.tan(x * 1.5).sum() * 1e12
    return torch.linalg.cross(namespace()["_filled"]((3,), c), torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("tidiff_gives, rejected", [(0.0, True), (1.0, False)])
def test_a_vjp_whose_twin_differs_by_mode_is_no_oracle(tidiff_gives, rejected):
    """Long run, seed 10829: torch's reverse mode gave cotangents of 9e-5 where its forward mode and tidiff give 0
    (``_modes_agree`` passes: both Jacobians are exactly 0, a unit cotangent leaves no rounding error). A draw
    whose vjp differs from torch's reverse mode is rejected where torch's forward mode differs too and tidiff
    agrees with it; a vjp agreeing with neither is tidiff's failure."""
    x = np.array([0.3, -0.7])
    ct = np.array([0.53, 0.89, -0.72])
    case = types.SimpleNamespace(arrays=[x], cores=[(2,)], use_torch=False)
    want = oracle.vjp(crossed_with_ones, case.cores, case.arrays, ct)[1]
    assert np.abs(want[0]).max() > 1e-6  # torch's reverse mode: rounding error, amplified
    np.testing.assert_array_equal(oracle.forward_cotangents(crossed_with_ones, case.cores, case.arrays, ct)[0], 0.0)
    mismatch = Mismatch("tidiff's vjp differs from torch's reverse mode")

    @settings(max_examples=2, database=None)
    @given(st.none())
    def check(_):
        _reject_if_torch_modes_differ(case, crossed_with_ones, ct, (np.full(2, tidiff_gives),), tuple(want), mismatch)

    with pytest.raises(Unsatisfiable if rejected else Mismatch):
        check()


def twin_of_seed_11364(x):
    """The third entry of cos(v) x normalized(w) with v[0] = v[1] and w[0] = w[1]: zero up to rounding."""
    v = torch.cos(torch.stack([x[1], x[1], x[0]]))
    w = torch.stack([x[0], x[0], x[1]]) + 0.7391
    return torch.remainder(torch.linalg.cross(v, w / torch.linalg.norm(w))[2] * x[0], 1.3)


def test_inputs_putting_a_jump_at_its_jump_up_to_rounding_are_rejected():
    """Long run, seed 11364 (NOTE: [Values at a jump] in cases.py): torch rounded such a zero to -3e-18 and
    its % 1.3 to 1.3, tidiff to 0; both right. Such inputs say nothing: rejected. Away from a jump: kept."""
    at_jump = [np.array([0.28761861180610526, -1.1285252277077364])]
    with pytest.raises(UnsatisfiedAssumption):
        assume_tame(lambda arrays: twin_of_seed_11364(torch.tensor(arrays[0])), at_jump)
    with pytest.raises(UnsatisfiedAssumption):
        assume_tame(lambda arrays: torch.floor(torch.tensor(arrays[0]) * 2.0), [np.array([0.5 - 1e-17])])
    assume_tame(lambda arrays: torch.remainder(torch.tensor(arrays[0]), 1.3), [np.array([0.4, -2.1])])
    assume_tame(lambda arrays: torch.tensor(arrays[0]) % 1.3 + torch.trunc(torch.tensor(arrays[0]) * 2.0),
                [np.array([0.4, -2.1])])


def branch_on_a_singular_determinant(arrays, rows=((0, 0, 0), (1, 1, 1), (1, 0, 1))):
    """Seed 34229's branch reduced: ``if det(m) > 0.0`` of a matrix whose first two rows are proportional."""
    x = torch.tensor(arrays[0])
    m = torch.stack([torch.stack([x[k] for k in row]) for row in rows])
    return torch.where(_det(m) > 0.0, torch.sin(x[0]), torch.cos(x[1]))


def test_inputs_putting_a_branch_at_its_threshold_up_to_rounding_are_rejected():
    """Long run, seed 34229 (NOTE: [Values at a jump] in cases.py): the determinant is 0 by construction;
    torch's cofactors give exactly 0 and skip the branch, Taichi's a few ulps above 0 and take it. Such inputs
    say nothing: rejected, though no nudge moves the value. The same branch of a regular matrix: kept."""
    with pytest.raises(UnsatisfiedAssumption):
        assume_tame(branch_on_a_singular_determinant, [np.array([0.8665875645, 0.9677488781])])
    assume_tame(lambda a: branch_on_a_singular_determinant(a, ((0, 1, 0), (1, 1, 0), (1, 0, 1))),
                [np.array([0.8665875645, 0.9677488781])])
    assume_tame(lambda a: torch.maximum(torch.tensor(a[0]), torch.tensor(a[0])), [np.array([0.5])])  # a tie


def atomic_minima_of_a_cross_product(arrays):
    """Seed 6002's twin reduced: ``min(0, cross(-v, -0.6 v))``, a 2-D cross product of proportional vectors."""
    x, w = (torch.tensor(a) for a in arrays)
    f = (-x) * (-0.6 * w) - (-w) * (-0.6 * x)
    return torch.amin(torch.stack([torch.zeros_like(f), f]), dim=0)


def test_inputs_putting_two_compared_values_within_rounding_are_rejected():
    """Long run, seed 6002 at 99050c0 (NOTE: [Values at a jump] in cases.py): the cross product is 0 up to rounding
    by construction, torch's 5.6e-17 beside the atomic minimum's 0; which side wins is rounding. Rejected; an
    exact tie (a convention, NOTE: [Ties]) and values apart are kept."""
    x, w = np.array([0.60223913, 0.43689112]), np.array([1.3742621, 0.69372341])
    with pytest.raises(UnsatisfiedAssumption):
        assume_tame(atomic_minima_of_a_cross_product, [x, w])
    assume_tame(lambda a: torch.amin(torch.stack([torch.tensor(a[0]), torch.tensor(a[0]) + 1e-3]), dim=0), [x])
    assume_tame(lambda a: torch.tensor(a[0]).amax(), [np.array([0.5, 0.5])])


def atan2_of_a_large_square(scale):
    """Seed 12107's output reduced: ``atan2(tanh(x), (scale x)**2 + 0.5)``, a value near 1 / (scale x)**2."""
    def twin(arrays):
        x = torch.tensor(arrays[0])
        return torch.atan2(torch.tanh(x), (scale * x) ** 2 + 0.5)
    return twin


def test_inputs_exploding_an_intermediate_are_rejected_however_tame_the_output():
    """Long run, seed 12107 (EXPLODED in cases.py): an intermediate of 1e129 in a value of 4e-130; its
    second derivatives pass float64's range, and torch's Hessian (1e-126) and tidiff's forward over forward
    mode (inf) differ by the order of their operations. Such inputs say nothing: rejected. 1e80: kept."""
    with pytest.raises(UnsatisfiedAssumption):
        assume_tame(atan2_of_a_large_square(1e65), [np.array([0.9])])
    assume_tame(atan2_of_a_large_square(1e40), [np.array([0.9])])


def unit_entry(x):
    """normalize([x, x] + 0.7391)[0]: the constant 1 / sqrt(2) where x > -0.7391, computed through 1 / |v|."""
    v = torch.stack([x, x]) + 0.7391
    return (v / torch.linalg.norm(v))[0]


def test_a_chain_whose_twin_is_rounding_noise_is_told_by_torchs_modes():
    """Long run, seed 11386 (NOTE: [Noise of high derivatives] in checks.py): near |v| = 0.0085 the fourth
    derivative of a constant is noise of 1e-6, and torch's forward and reverse mode give different noise;
    a smooth twin's modes agree."""
    chain = [("jacfwd", 0), ("jacrev", 0), ("hessian", 0)]
    near = [np.array([-0.7305753457984808])]
    assert not chain_modes_agree(unit_entry, chain, near, [()])
    assert chain_modes_agree(unit_entry, chain, [np.array([0.5, 1.5])], [()])
    assert chain_modes_agree(lambda x: torch.sin(x) * x**3, chain, near, [()])


def _exploded(x):
    """A normalized vector holding cos(t) of an intermediate t near 1e13, in an entry near 1e-14."""
    t = 7e12 * (1.0 + x[0])
    v = torch.stack([torch.cos(t) * x[0], torch.ones((), dtype=x.dtype), t])
    return v / torch.linalg.vector_norm(v)


def test_a_derivative_torch_gets_otherwise_under_a_nudge_is_rounding_noise():
    """Long run, seed 30023 (NOTE: [Noise of exploded values] in checks.py): tame in value (assume_tame
    passes), but the Jacobian is set by the last bits of an intermediate near 1e13; a mismatch there is
    noise. A smooth function's mismatch is not."""
    x = [np.array([0.3])]
    assume_tame(lambda arrays: oracle.per_element(_exploded, arrays, [(1,)]), x)  # the value does not tell
    jacobian = oracle.jac(_exploded, 0)
    want = oracle.per_element(jacobian, x, [(1,)])
    assert abs(want[0, 0]) > 1e-3
    near = oracle.per_element(jacobian, nudged(x), [(1,)])
    assert oracle_is_noise(want * 1.01, want, near)

    def smooth(y):
        return torch.stack([torch.sin(y[0]), y[0] ** 3, torch.ones((), dtype=y.dtype)])
    want = oracle.per_element(oracle.jac(smooth, 0), x, [(1,)])
    near = oracle.per_element(oracle.jac(smooth, 0), nudged(x), [(1,)])
    assert not oracle_is_noise(want * 1.01, want, near)
    assert not oracle_is_noise(want[:2], want, near)  # a shape that differs is a failure, never noise
