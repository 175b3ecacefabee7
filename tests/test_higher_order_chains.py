"""Third and fourth derivatives by chains of Jacobians over ``td.hessian``, argnums in any order.

A Jacobian by several arguments of a Hessian takes the reverse transform
through tangent code that unpacks nested results (``t, dt = f_jvp_jvp(...)``,
then ``t[1]``; NOTE: [Nested results] in tidiff/_adjoint/results.py): those
reads once carried no derivative, and ``td.jacrev(td.hessian(f), argnums=(0, 1))``
gave zeros without an error (long run, seed 9813). Every chain must equal
torch.func's same chain (float64).
"""
import numpy as np
import taichi as ti
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from nested_trees import close, nonnegative

import tidiff as td

V2 = ti.types.vector(2, ti.f64)


@ti.func
def f(x: ti.f64, v: V2):
    return ti.sin(x) * v.dot(v) + x * x * x * v[0] + ti.exp(v[1] * x)


def torch_f(x, v):
    return torch.sin(x) * (v @ v) + x ** 3 * v[0] + torch.exp(v[1] * x)


ARGNUMS = [0, 1, (0,), (1,), (0, 1), (1, 0), -1, (-1, 0)]
TORCH_KINDS = {"jacfwd": torch.func.jacfwd, "jacrev": torch.func.jacrev, "jacobian": torch.func.jacrev}


@given(inner=st.sampled_from(ARGNUMS),
       outer=st.lists(st.tuples(st.sampled_from(sorted(TORCH_KINDS)), st.sampled_from(ARGNUMS)), min_size=1,
                      max_size=2),
       x=st.floats(-1.5, 1.5), v=st.lists(st.floats(-1.5, 1.5), min_size=2, max_size=2))
@settings(max_examples=12)
def test_jacobians_of_a_hessian_equal_torch_func(inner, outer, x, v):
    mine, theirs = td.hessian(f, argnums=inner), torch.func.hessian(torch_f, argnums=nonnegative(inner, 2))
    for kind, argnums in outer:
        mine = getattr(td, kind)(mine, argnums=argnums)
        theirs = TORCH_KINDS[kind](theirs, argnums=nonnegative(argnums, 2))
    close(mine(x, np.array(v)), theirs(torch.tensor(x, dtype=torch.float64), torch.tensor(v, dtype=torch.float64)),
          atol=1e-11)


def test_a_reverse_jacobian_by_two_arguments_of_a_hessian():
    """The case the long run found, small: d/dx of f's second derivative in x is f_xxx, not 0."""
    got = td.jacrev(td.hessian(f, argnums=0), argnums=(0, 1))(0.3, np.array([0.5, -0.4]))
    want = torch.func.jacrev(torch.func.hessian(torch_f, argnums=0), argnums=(0, 1))(
        torch.tensor(0.3, dtype=torch.float64), torch.tensor([0.5, -0.4], dtype=torch.float64))
    assert abs(float(want[0])) > 0.1
    close(got, want, atol=1e-11)
