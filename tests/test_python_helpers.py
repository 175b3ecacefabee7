"""Plain Python helpers and lambdas called from Taichi code (NOTE: [Python helpers]).

Taichi calls them while it compiles and inlines what they build; tidiff
transforms their source as it does a @ti.func's, everywhere it transforms
source: @ti.func bodies forward and reverse, on the host and in kernels,
second order of field programs and the tangent kernels of ndarray kernels.
Every derivative is checked against torch.autograd.functional and central
differences (td.testing), forward against reverse.
"""
import functools
import operator
import re

import numpy as np
import pytest
import taichi as ti
import torch

import tidiff as td
import tidiff.testing as tt
from tidiff._adjoint import vjp_func, why_not
from tidiff._adjoint.kernels import KernelAdjoint, vjp_kernel
from tidiff._tangent import jvp_func, source

# Taichi warns at each call of a plain Python function in the user's code: expected here
pytestmark = pytest.mark.filterwarnings("ignore:.*Calling non-taichi function:SyntaxWarning")

F64 = torch.float64
VEC3 = ti.types.vector(3, ti.f64)
N = 3

# --- helpers, as Taichi's own autodiff tests and user code write them ---------------------------
OPS = {  # one lambda per op; two of them share a line, with the same parameter
    "sin": lambda x: ti.sin(x),
    "cube": lambda x: x * x * x,
    "exp": lambda x: ti.exp(x),
    "sq": lambda x: x * x, "inv": lambda x: 1.0 / x,
    "tanh": lambda x: ti.tanh(x),
}
TORCH_OPS = {"sin": torch.sin, "cube": lambda x: x ** 3, "exp": torch.exp, "sq": lambda x: x * x,
             "inv": lambda x: 1.0 / x, "tanh": torch.tanh}


def scaled_by(c):
    """A closure over a Python constant; its body calls another helper."""
    def scaled(x):
        return c * OPS["cube"](x)
    return scaled


def compose(f, g):
    """A closure over two helpers."""
    def composed(x):
        return f(g(x))
    return composed


scaled = scaled_by(0.5)
sin_of_sq = compose(OPS["sin"], OPS["sq"])


def weighted(x, w=1.5, bias=0.0):
    return w * x + bias


def affine(a, x):
    return a * x + 1.0


half = functools.partial(weighted, w=0.5)  # a bound keyword, the rest defaults
double_plus = functools.partial(affine, 2.0)  # a bound positional: the active argument comes second


def power_sum(x, n):
    """An int argument that must stay a compile-time constant (Taichi passes it as is)."""
    s = 0.0
    for i in ti.static(range(n)):
        s = s + x ** (i + 2)
    return s


def pair(x, y):
    return x * y, x + y


def poly(x, coeffs):
    """A tuple of Python numbers as an argument, read in a static loop."""
    s = 0.0
    for k in ti.static(range(len(coeffs))):
        s = s + coeffs[k] * x ** k
    return s


# --- @ti.func bodies calling them ----------------------------------------------------------------
@ti.func
def straight(v: VEC3, s: ti.f64) -> ti.f64:
    """Straight-line: the reverse transform takes it, helpers and all."""
    a, b = pair(v[2], s)
    return (OPS["sin"](v[1]) * s + scaled(v[2]) + weighted(v[0], bias=0.25) + half(v[1]) * v[0]
            + double_plus(s) * OPS["inv"](v[2]) + sin_of_sq(v[0] * s) + a * b)


def straight_torch(v, s):
    return (torch.sin(v[1]) * s + 0.5 * v[2] ** 3 + 1.5 * v[0] + 0.25 + 0.5 * v[1] * v[0]
            + (2.0 * s + 1.0) / v[2] + torch.sin((v[0] * s) ** 2) + v[2] * s * (v[2] + s))


@ti.func
def looped(v: VEC3, s: ti.f64) -> ti.f64:
    """A static loop over an int argument, a tuple returned and unpacked."""
    a, b = pair(v[0], s)
    return (power_sum(v[2], ti.static(N)) * a + b * OPS["exp"](v[1] * s) + power_sum(s, 2)
            + poly(v[1], (1.0, 2.0, 3.0)))


def looped_torch(v, s):
    return ((v[2] ** 2 + v[2] ** 3 + v[2] ** 4) * v[0] * s + (v[0] + s) * torch.exp(v[1] * s) + s ** 2 + s ** 3
            + 1.0 + 2.0 * v[1] + 3.0 * v[1] ** 2)


@ti.func
def paired(x, y):
    """A helper's tuple as the function's outputs."""
    return pair(ti.sin(x), y)


def paired_torch(x, y):
    return torch.sin(x) * y, torch.sin(x) + y


def batch():
    rng = np.random.default_rng(0)
    return rng.uniform(0.3, 1.2, (3, 3)), rng.uniform(0.3, 1.2, 3)


@pytest.mark.parametrize("f, torch_f", [(straight, straight_torch), (looped, looped_torch)],
                         ids=["straight", "looped"])
def test_func_against_torch_and_central_differences(f, torch_f):
    # value, jacfwd, jacrev, jacobian, jvp, vjp, grad, value_and_grad, hessian, jacrev(grad), hvp
    tt.check_against_torch(f, torch_f, batch(), order=2)
    tt.check_grads(f, batch(), order=2)


def test_helper_tuple_as_outputs():
    args = (np.array([0.3, 0.5]), np.array([1.2, 0.4]))
    tt.check_against_torch(paired, paired_torch, args, order=2)  # jacfwd(jacrev) and jacrev(jacrev)
    tt.check_grads(paired, args, order=2)


def test_straight_line_helpers_go_through_the_reverse_transform():
    assert why_not(straight, (True, True)) is None
    text = source(vjp_func(straight, (True, True)))
    assert "scaled_vjp(" in text and "weighted_vjp(" in text and "pair_vjp(" in text


def tifunc_of(tifunc):
    """Taichi's grad_test pattern: a parametrized op called in Taichi code."""
    @ti.func
    def f(x: ti.f64) -> ti.f64:
        return tifunc(x)
    return f


@pytest.mark.parametrize("name", sorted(OPS))
def test_each_lambda_of_the_table(name):
    x = np.array([0.4, 0.9, 1.3])
    tt.check_against_torch(tifunc_of(OPS[name]), TORCH_OPS[name], (x,), order=2)


def test_lambdas_sharing_a_line_are_told_apart():
    square, inverse = source(jvp_func(OPS["sq"])), source(jvp_func(OPS["inv"]))
    assert "return (x * x," in square and "1.0 / x" not in square
    assert "1.0 / x" in inverse and "x * x," not in inverse


def test_generated_helper_functions_are_ti_funcs_taking_arguments_as_is():
    text = source(jvp_func(power_sum, (True, False)))
    assert text.startswith("@ti.func\ndef power_sum_jvp(x: ti.template(), n: ti.template(), dx: ti.template()):")
    assert "for i in ti.static(range(n)):" in text


def test_helpers_are_transformed_once_and_partials_share_their_function():
    assert jvp_func(weighted, (True, False, False)) is jvp_func(weighted, (True, False, False))
    text = td.source(td.jacfwd(straight, argnums=(0, 1)))
    # weighted(...) and half(...) call one tangent function of weighted per tangent function of straight
    helpers, callers = re.findall(r"def weighted_jvp\d*\(", text), re.findall(r"def straight_jvp\d*\(", text)
    assert len(helpers) == len(callers) >= 1


def test_inactive_helper_calls_and_compile_time_builtins_are_copied():
    @ti.func
    def f(v: VEC3) -> ti.f64:
        return v.sum() * len(v) + weighted(2.0)

    g = td.grad(f)(np.array([0.1, 0.2, 0.3]))
    np.testing.assert_allclose(g, [3.0, 3.0, 3.0], rtol=1e-14)
    assert "weighted(2.0)" in td.source(td.grad(f))


# --- inside kernels ----------------------------------------------------------------------------
@ti.func
def p(x):
    return OPS["cube"](x) + double_plus(OPS["sq"](x)) - weighted(x, w=3.0, bias=-1.0)  # x^3 + 2x^2 - 3x + 1


dpdx = td.grad(p)


@ti.kernel
def derivatives_of_p(xs: ti.template(), out: ti.template()):
    for i in xs:
        out[i] = ti.Vector([dpdx(xs[i]), td.hessian(p)(xs[i])])


def test_transforms_of_a_func_calling_helpers_inside_a_kernel():
    xs, out = ti.field(ti.f64, shape=4), ti.Vector.field(2, ti.f64, shape=4)
    x = np.array([1.0, -0.5, 0.25, 2.0])
    xs.from_numpy(x)
    derivatives_of_p(xs, out)
    np.testing.assert_allclose(out.to_numpy(), np.stack([3 * x**2 + 4 * x - 3, 6 * x + 4], axis=1), rtol=1e-14)
    np.testing.assert_allclose(td.grad(p)(1.0), 4.0, rtol=1e-14)


# --- kernels over fields: Taichi's reverse mode, and second order by the tangent transform --------
xs = ti.field(ti.f64, shape=5)
ys = ti.field(ti.f64, shape=5)
w = ti.field(ti.f64, shape=())
loss = ti.field(ti.f64, shape=())


def grad_test_program(tifunc):
    """Taichi's grad_test kernel, ``y[i] = tifunc(x[i])``, as a tidiff program."""
    @ti.kernel
    def func():
        for i in xs:
            ys[i] = tifunc(xs[i])
    return td.function(func, inputs=[xs], outputs=[ys])


@pytest.mark.parametrize("name", ["sin", "cube", "inv"])
def test_field_kernel_of_a_lambda(name):
    x = np.linspace(0.3, 1.4, 5)
    tt.check_against_torch(grad_test_program(OPS[name]), TORCH_OPS[name], (x,), order=2)


@ti.kernel
def energy():
    for i in xs:
        a, b = pair(xs[i], w[None])
        loss[None] += (OPS["sin"](xs[i]) * w[None] + weighted(xs[i], w=w[None]) + half(a) * b
                       + power_sum(xs[i], ti.static(N)) * scaled(w[None]))


E = td.function(energy, inputs=[xs, w], outputs=[loss])


def energy_torch(x, w_):
    return (torch.sin(x) * w_ + w_ * x + 0.5 * x * w_ * (x + w_)
            + (x**2 + x**3 + x**4) * 0.5 * w_**3).sum()


def test_field_program_grad_hessian_and_hvp():
    args = (np.linspace(-0.8, 1.1, 5), np.array(0.7))
    tt.check_against_torch(E, energy_torch, args, order=2)  # hessian and hvp: the tangent kernel
    tt.check_grads(E, args, order=2)
    # power_sum loops over ti.static(range(n)), n its parameter: no reverse function of its own, its calls
    # reversed by pushes of its tangent (NOTE: [Calls reversed by pushes]), so both kernels are tidiff's
    for kernel in [energy, *E.program.tangent()._kernels]:
        assert isinstance(vjp_kernel(kernel), KernelAdjoint), vjp_kernel(kernel)


# --- kernels over ndarrays: the tangent kernel, and Taichi's reverse mode over it ----------------
@ti.kernel
def apply_helpers(a: ti.types.ndarray(), b: ti.types.ndarray(), out: ti.types.ndarray()):
    for i in a:
        p_, q = pair(a[i], b[i])
        out[i] = OPS["sin"](p_) + scaled(q) + weighted(a[i], bias=0.5) + half(b[i]) * power_sum(a[i], ti.static(N))


F = td.function(apply_helpers, inputs=["a", "b"], outputs={"out": lambda a, b: a.shape})


def apply_torch(a, b):
    return torch.sin(a * b) + 0.5 * (a + b) ** 3 + 1.5 * a + 0.5 + 0.5 * b * (a**2 + a**3 + a**4)


def test_ndarray_kernel_first_and_second_order():
    a, b = np.linspace(0.1, 0.9, 4), np.linspace(-0.5, 0.5, 4)
    assert F.adjoint_for(F.specs_for([a, b])) is not None  # tidiff's adjoint, power_sum's calls by pushes
    tangent = F.tangent_at(F.specs_for([a, b]))
    assert tangent.adjoint_for(tangent.specs_for([a, b, a, b])) is not None
    rng = np.random.default_rng(1)
    args = (rng.uniform(0.2, 1.0, 4), rng.uniform(0.2, 1.0, 4))
    # jvp (the tangent kernel), vjp, Jacobians; jacfwd(jacrev) and jacrev(jacrev): the tangent kernel again
    tt.check_against_torch(F, apply_torch, args, order=2)
    tt.check_grads(F, args, order=2)


def test_ndarray_kernel_as_a_torch_op():
    a, b = (torch.tensor(x, dtype=F64, requires_grad=True) for x in np.random.default_rng(2).uniform(0.2, 1.0, (2, 4)))
    op = td.torch.function(F)  # forward AD and double backward go through the tangent kernel
    assert torch.autograd.gradcheck(op, (a, b), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(op, (a, b))


# --- what cannot be transformed is refused at the call, with what to do there --------------------
class Model:
    def energy(self, x):
        return x * x


model = Model()
_namespace = {"ti": ti}
exec("def hidden(x):\n    return x * x\n", _namespace)  # noqa: S102 (no source file: inspect cannot read it)
hidden = _namespace["hidden"]


def uses_builtin(x):
    return operator.mul(x, x)


@ti.func
def calls_builtin(x: ti.f64) -> ti.f64:
    return operator.mul(x, x)


@ti.func
def calls_method(x: ti.f64) -> ti.f64:
    return model.energy(x)


@ti.func
def calls_hidden(x: ti.f64) -> ti.f64:
    return hidden(x)


@ti.func
def calls_helper_calling_builtin(x: ti.f64) -> ti.f64:
    return uses_builtin(x)


@ti.func
def calls_lambda_calling_builtin(x: ti.f64) -> ti.f64:
    return BAD["mul"](x)


BAD = {"mul": lambda x: operator.mul(x, x)}

FUNC_HINT = "td.custom_jvp to give its derivative, or move the call into a @ti.func of its own and wrap that"


@pytest.mark.parametrize("f, construct, hint", [
    (calls_builtin, "`operator.mul`: a builtin or C extension function",
     "wrap the enclosing @ti.func `calls_builtin` with " + FUNC_HINT),
    (calls_method, "`model.energy`: a method of an object", "wrap the enclosing @ti.func `calls_method` with"),
    (calls_hidden, "`hidden`: a Python function whose source is not available", "`calls_hidden` with td.custom_jvp"),
    (calls_helper_calling_builtin, "`operator.mul`",
     "decorate the helper `uses_builtin` with @ti.func and give it a rule with td.custom_jvp"),
    (calls_lambda_calling_builtin, "`operator.mul`", "write the lambda as a @ti.func and give it a rule"),
], ids=["builtin", "method", "no-source", "in-helper", "in-lambda"])
def test_refused_call_in_a_func_names_it_and_the_fix_there(f, construct, hint):
    np.testing.assert_allclose(td.function(f)(1.5), 2.25)  # valid Taichi code, only not differentiable
    for transform in (td.grad, td.jacfwd):
        with pytest.raises(td.TransformError) as info:
            transform(f)(1.5)
        message = str(info.value)
        assert "cannot differentiate a call to " + construct in message
        assert hint in message
        assert "test_python_helpers.py:" in message and info.value.lineno is not None


@ti.kernel
def nd_calls_builtin(a: ti.types.ndarray(), out: ti.types.ndarray()):
    for i in a:
        out[i] = operator.mul(a[i], a[i])


@ti.kernel
def field_calls_method():
    for i in xs:
        loss[None] += model.energy(xs[i])


KERNEL_HINT = "move the call into a @ti.func and give that a rule with td.custom_jvp (a kernel cannot be wrapped)"


def test_refused_call_in_a_kernel_says_to_move_it_into_a_func():
    G = td.function(nd_calls_builtin, inputs=["a"], outputs={"out": lambda a: a.shape})
    with pytest.raises(td.TransformError, match=r"`operator\.mul`.*" + re.escape(KERNEL_HINT)):
        td.jvp(G, (np.ones(3),), (np.ones(3),))
    P = td.function(field_calls_method, inputs=[xs], outputs=[loss])
    np.testing.assert_allclose(P(np.arange(5.0)), np.sum(np.arange(5.0) ** 2))
    for transform in (td.grad, td.hessian):  # neither transform takes the call; Taichi's kernel.grad, which gave
        with pytest.raises(td.TransformError) as info:  # the gradient, no longer runs in their place (NOTE:
            transform(P)(np.arange(5.0))  # [Taichi's reverse mode not run])
        assert "`model.energy`: a method of an object" in str(info.value) and KERNEL_HINT in str(info.value)
        assert re.search(r"test_python_helpers.py:\d+: ", str(info.value))  # the line of the call
