"""Compile once: repeated calls with new values or batch sizes compile nothing."""
import numpy as np
import pytest
import taichi as ti

import tidiff as td


@ti.func
def cache_energy(x: ti.math.vec3, k: ti.f64) -> ti.f64:
    return 0.5 * k * x.norm_sqr() + ti.exp(-x[2])


def _info(fn):
    return td.cache_info(fn)


def test_new_values_and_batch_sizes_compile_nothing():
    rng = np.random.default_rng(0)
    for transform in (td.grad, td.jacfwd, td.jacrev, td.hessian):
        f = transform(cache_energy)
        f(rng.standard_normal((4, 3)), 1.0)
        first = _info(f).compiles
        assert first > 0
        for shape in [(7, 3), (100, 3), (2, 5, 3), (3,), (1000, 3)]:
            f(rng.standard_normal(shape), rng.standard_normal())
        info = _info(f)
        assert info.compiles == first, (transform.__name__, info)
        assert info.calls == 6 and info.hits == 5


def test_transforms_are_memoized():
    assert td.grad(cache_energy) is td.grad(cache_energy)
    assert td.jacrev(cache_energy, argnums=(0, 1)) is td.jacrev(cache_energy, argnums=(0, 1))
    assert td.grad(cache_energy, argnums=1) is not td.grad(cache_energy)


def test_jvp_and_vjp_calls_compile_once():
    rng = np.random.default_rng(1)
    seen = []
    for n in (3, 9, 27):
        x = rng.standard_normal((n, 3))
        td.jvp(cache_energy, (x, 2.0), (np.ones_like(x), 0.0))
        td.vjp(cache_energy, x, 2.0)[1](np.ones(n))
        info = td.cache_info()  # by name: jvp and vjp calls count against functions the user never holds
        seen.append((info["jvp(cache_energy)"], info["vjp(cache_energy)"]))
    (jvp1, vjp1), (jvp3, vjp3) = seen[0], seen[-1]
    assert jvp3.compiles == jvp1.compiles and vjp3.compiles == vjp1.compiles
    assert jvp3.calls == 3 and jvp3.hits == jvp1.hits + 2
    assert vjp3.calls == 6 and vjp3.hits == vjp1.hits + 4


@ti.func
def cubic(x: ti.f64, k: ti.i32) -> ti.f64:
    return k * x ** 3 - x


def test_repeated_calls_with_python_numbers_launch_the_scalar_kernel_directly():
    d = td.grad(cubic)
    assert d(2.0, 3) == 35.0  # checked and dispatched, then remembered for (float, int)
    before = _info(d)
    for x in (0.5, -1.0, float("nan")):
        np.testing.assert_equal(d(x, 3), 9 * x ** 2 - 1)
    assert isinstance(d(0.5, 3), np.ndarray) and d(0.5, 3).dtype == np.float64
    info = _info(d)
    assert info.compiles == before.compiles and info.calls == before.calls + 5 and info.hits == before.hits + 5
    # other argument types still go through the checks
    with pytest.raises(TypeError, match="expects integer values"):
        d(2.0, 3.5)
    with pytest.raises(TypeError, match="expected 2 arguments"):
        d(2.0)
    np.testing.assert_allclose(d(np.array([1.0, 2.0]), 3), [8.0, 35.0])


def _twin(power):
    @ti.func
    def twin(x: ti.f64) -> ti.f64:
        return x ** power
    return twin


def test_functions_of_one_name_are_told_apart():
    first, second = td.grad(_twin(2)), td.grad(_twin(3))
    first(np.ones(3))
    second(np.ones(3))
    second(np.ones(4))
    assert td.cache_info(first).calls == 1 and td.cache_info(second).calls == 2
    by_name = td.cache_info()
    assert by_name["grad(twin)"] == td.cache_info(first)  # primes in the order the functions were made
    assert by_name["grad(twin)'"] == td.cache_info(second)


def test_cache_info_of_something_else_is_refused():
    with pytest.raises(TypeError, match="td.cache_info: fn must be a tidiff function"):
        td.cache_info(np.sin)
