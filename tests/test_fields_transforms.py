"""Kernels over fields through the public API (API.md 1b): transforms, Tape-like replay, errors."""
import numpy as np
import pytest
import torch
from programs import energy, loss, out, torch_two_stages, two_stages, u, v, w, x  # 1b example, two-kernel step

import tidiff as td

E = td.function(energy, inputs=[x, w], outputs=[loss])


def test_contract_example():
    out = E(np.ones(16), 2.0)
    assert isinstance(out, np.ndarray) and out.shape == () and out == 32.0
    gx, gw = td.grad(E, argnums=(0, 1))(np.ones(16), 2.0)
    np.testing.assert_array_equal(gx, np.full(16, 4.0))
    assert gw == 16.0
    value, gx2 = td.value_and_grad(E)(np.ones(16), 2.0)
    assert value == 32.0
    np.testing.assert_array_equal(gx2, gx)


def test_user_fields_untouched_and_no_needs_grad_required():
    x.fill(7.0)
    loss.fill(0.0)  # tests/programs.py's field: other test files leave values in it
    E(np.ones(16), 2.0)
    td.grad(E)(np.ones(16), 2.0)
    np.testing.assert_array_equal(x.to_numpy(), np.full(16, 7.0))
    assert loss[None] == 0.0


# a two-kernel step: state -> intermediate -> output, replayed in reverse as ti.ad.Tape does
S = td.function(two_stages, inputs=[u, v], outputs=[out])


def test_multi_kernel_program_against_torch():
    rng = np.random.default_rng(0)
    u0, v0 = rng.standard_normal(4), rng.standard_normal((4, 2))
    for mode in (td.jacfwd, td.jacrev, td.jacobian):
        ju, jv = mode(S, argnums=(0, 1))(u0, v0)
        eu, ev = torch.autograd.functional.jacobian(torch_two_stages, (torch.tensor(u0), torch.tensor(v0)))
        np.testing.assert_allclose(ju, eu.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(jv, ev.numpy(), rtol=1e-10, atol=1e-12)


def test_field_program_dot_product_test():
    rng = np.random.default_rng(1)
    u0, v0 = rng.standard_normal(4), rng.standard_normal((4, 2))
    tu, tv = rng.standard_normal(4), rng.standard_normal((4, 2))
    c = rng.standard_normal(4)
    y, ty = td.jvp(S, (u0, v0), (tu, tv))
    y2, vjp_fn = td.vjp(S, u0, v0)
    gu, gv = vjp_fn(c)
    np.testing.assert_array_equal(y, y2)
    assert np.sum(tu * gu) + np.sum(tv * gv) == pytest.approx(np.sum(ty * c), rel=1e-12)


def test_field_program_refuses_bad_input():
    with pytest.raises(ValueError, match=r"\(16,\)"):
        E(np.ones(15), 2.0)
    with pytest.raises(ValueError, match="batch"):
        E(np.ones((3, 16)), 2.0)
    # nothing was left behind by the refused calls
    assert E(np.ones(16), 2.0) == 32.0


def test_wrap_time_errors():
    with pytest.raises(TypeError, match="inputs"):
        td.function(energy)
    with pytest.raises(TypeError, match=r"inputs\[1\]"):
        td.function(energy, inputs=[x, np.ones(3)], outputs=[loss])
    with pytest.raises(ValueError):
        td.function(energy, inputs=[x, x], outputs=[loss])


def test_second_order_of_field_program():
    H = td.hessian(E, argnums=(0, 1))(np.ones(16), 2.0)
    np.testing.assert_allclose(H[0][0], 4.0 * np.eye(16))
    np.testing.assert_allclose(H[0][1], 2.0 * np.ones(16))
    assert H[1][1] == 0.0
