"""The value of a program calling a transform, with Taichi's optimizer off: how check_value classifies a miscompile.

The program is long run seed 10407, reduced: the transform's tangent is 0 (a clamp), and the same program
with it replaced by a plain 0 gives the same wrong value in a plain kernel, no tidiff involved (Taichi's
optimizer: a literal of a local's own entries, the local written around it in a runtime loop).
"""
import numpy as np
import pytest

import tidiff as td

from . import render_taichi, test_programs
from .cases import Case
from .compare import Mismatch
from .seed_93014 import PROGRAM as SEED_93014
from .test_oracle import sine_case
from .unoptimized import passes_without_optimizer, values_without_optimizer

PROGRAM = """
@ti.func
def h(a: ti.types.vector(3, ti.f64)) -> ti.f64:
    return ti.math.clamp(a[0], -0.8, -0.3)


@ti.func
def f(x: ti.f64) -> ti.f64:
    t = (x - ti.Matrix([[x, x, x], [x, x, x], [x, x, x]])) % 1.3
    for _ in range(2):
        t[0, 0] -= td.jvp(h, (ti.sqrt(ti.Vector([t[2, 2], x, t[2, 0]]) ** 2 + 0.5),), (ti.Vector([x, t[0, 0], x]),))[1]
    t -= ti.rsqrt(t[0, 0] ** 2 + 0.5)
    m = ti.acos(ti.tanh(ti.Matrix([[t[0, 0], x], [x, t[1, 2]], [t[2, 2], x]])) * 0.9)
    return (m @ ti.abs(ti.Vector([x, t[0, 1]]))).sum()
"""


def expected(xs):
    """t is 0 after the %, the loop subtracts 0, then t = -sqrt(2) everywhere."""
    t = -np.sqrt(2.0)
    return np.array([(np.arccos(np.tanh(np.array([[t, x], [x, t], [t, x]])) * 0.9) @ np.abs([x, t])).sum() for x in xs])


def test_the_optimizer_miscompiles_and_the_unoptimized_value_is_right():
    xs = np.array([0.5427525682235554, -1.1390107007773267, -0.10353171154066398])
    f = render_taichi.compile_text(PROGRAM, "f", render_taichi.namespace(), "unoptimized-test")
    optimized = td.function(f)(xs)
    assert np.abs(optimized - expected(xs)).max() > 0.1  # Taichi 1.7.4's optimizer: 9.478 where 9.981
    (unoptimized,) = values_without_optimizer(PROGRAM, "f", [xs])
    np.testing.assert_allclose(unoptimized, expected(xs), rtol=1e-13)


def test_derivatives_the_optimizer_gets_wrong_agree_with_it_off(monkeypatch):
    """Long run seed 93014: tidiff's derivatives of a field program (its value right) differ from torch's, and agree
    with them with Taichi's optimizer off; the net classes such a case as a Taichi pitfall
    (``test_programs.unless_the_optimizer_is_at_fault``)."""
    monkeypatch.setattr(test_programs, "_FIELDS", {})  # fields of this module's own: its trees are freed after it
    # (NOTE: [Trees a test module made] in conftest.py), and test_programs' tests would write freed ones
    case = Case(SEED_93014, [np.array(0.08027031490912151), np.array(1.3207154675793573)], [True, False])
    rng = np.random.default_rng(20758)
    arrays = tuple(rng.uniform(-1.5, 1.5, test_programs.N) for _ in range(5))
    how = ("atomic maxima", "twice, y cleared")
    with pytest.raises(Mismatch):
        test_programs.field_program_rechecked(case, *how, *arrays)
    assert passes_without_optimizer(test_programs.__name__, "field_program_rechecked", case, *how, *arrays)


def differs(case: Case) -> None:
    """A recheck that finds a derivative wrong whatever the optimizer does."""
    raise Mismatch(f"{case.program.main.name}: wrong on purpose")


def test_a_derivative_wrong_without_the_optimizer_too_stays_tidiffs_failure():
    assert not passes_without_optimizer(__name__, "differs", sine_case())
