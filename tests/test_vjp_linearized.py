"""td.vjp keeps small per-element Jacobians (NOTE: [Linearized vjp]): vjp_fn contracts them."""
import numpy as np
import taichi as ti
import torch
from hypothesis import given
from hypothesis import strategies as st

import tidiff as td
from tidiff._api import _linearization


@ti.func
def wave(x: ti.f64, k: ti.f64, n: ti.i32) -> ti.f64:
    return ti.sin(k * x) * x ** n + ti.exp(-x)


@ti.func
def energy_and_aux(x: ti.math.vec3, s: ti.f64):
    return s * x.dot(x), x * 2.0


def _linearized(f, args, has_aux=False):
    fn = td.function(f)
    specs = fn.read(args).specs
    out_specs, tree = fn.signature(specs)
    main = [0] if has_aux else list(range(len(out_specs)))
    return _linearization(fn, specs, out_specs, main, has_aux) is not None


@given(seed=st.integers(0, 2**31 - 1))
def test_broadcast_arguments_get_summed_cotangents(seed):
    rng = np.random.default_rng(seed)
    x, k, c = rng.uniform(-2, 2, (4, 5)), rng.uniform(0.5, 2.0, (1, 5)), rng.standard_normal((4, 5))
    assert _linearized(wave, (x, k, 2))
    y, vjp_fn = td.vjp(wave, x, k, 2)
    gx, gk, gn = vjp_fn(c)
    xt, kt = torch.tensor(x, requires_grad=True), torch.tensor(k, requires_grad=True)
    yt = torch.sin(kt * xt) * xt**2 + torch.exp(-xt)
    yt.backward(torch.tensor(c))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-13)
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(gk, kt.grad.numpy(), rtol=1e-12, atol=1e-13)
    assert gk.shape == (1, 5) and gn is None


def test_aux_outputs_and_an_unbatched_call():
    x, s = np.array([0.3, -0.2, 0.5]), 1.5
    assert _linearized(energy_and_aux, (x, s), has_aux=True)  # the aux output is not differentiated
    y, vjp_fn, aux = td.vjp(energy_and_aux, x, s, has_aux=True)
    np.testing.assert_allclose(aux, 2 * x, rtol=1e-15)
    gx, gs = vjp_fn(2.0)
    np.testing.assert_allclose(y, s * x @ x, rtol=1e-15)
    np.testing.assert_allclose(gx, 2.0 * 2 * s * x, rtol=1e-14)
    np.testing.assert_allclose(gs, 2.0 * x @ x, rtol=1e-14)
