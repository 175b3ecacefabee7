"""Field programs written as Taichi users write them: @ti.data_oriented classes, attributes, lists of fields.

Every derivative is checked against ti.ad.Tape on the same program (the
user's own fields with needs_grad) and central differences; forward mode
against reverse mode.
"""
import numpy as np
import pytest
import taichi as ti
from taped import tape

import tidiff as td
from tidiff._adjoint.kernels import KernelAdjoint, vjp_kernel

RTOL = 1e-10


@ti.data_oriented
class Chain:
    """A DiffTaichi-style simulation: a (T+1, n) trajectory, a loss, a list of scratch fields."""

    def __init__(self, n=4, steps=5, needs_grad=False):
        self.n, self.steps, self.dt = n, steps, 0.1
        self.x = ti.field(ti.f64, shape=(steps + 1, n), needs_grad=needs_grad)
        self.v0 = ti.field(ti.f64, shape=n, needs_grad=needs_grad)
        self.k = ti.field(ti.f64, shape=n, needs_grad=needs_grad)
        self.loss = ti.field(ti.f64, shape=(), needs_grad=needs_grad)
        self.scratch = [ti.field(ti.f64, shape=n, needs_grad=needs_grad) for _ in range(2)]
        self.k.from_numpy(np.linspace(1.0, 2.0, n))

    @ti.func
    def force(self, t, i):
        return -self.k[i] * ti.sin(self.x[t, i]) + 0.3 * self.x[t, (i + 1) % self.n] ** 2

    @ti.kernel
    def start(self):
        for i in self.v0:
            self.x[0, i] = self.v0[i]

    @ti.kernel
    def step(self, t: ti.i32):
        for i in range(self.n):
            self.x[t + 1, i] = self.x[t, i] + self.dt * self.force(t, i)

    @ti.kernel
    def compute_loss(self):
        for i in range(self.n):
            for k in ti.static(range(2)):
                self.scratch[k][i] = self.x[self.steps, i] ** (k + 2)
        for i in range(self.n):
            self.loss[None] += self.scratch[0][i] * (i + 1) - 0.1 * self.scratch[1][i]

    def run(self):
        self.start()
        for t in range(self.steps):
            self.step(t)
        self.compute_loss()


CHAIN = Chain()
F = td.function(CHAIN.run, inputs=[CHAIN.v0], outputs=[CHAIN.loss])
V0 = np.linspace(0.1, 0.7, 4)


def tape_gradient(v0, k=None):
    sim = Chain(needs_grad=True)
    if k is not None:
        sim.k.from_numpy(k)
    sim.v0.from_numpy(v0)
    with tape(sim.loss, sim.x, sim.v0, sim.k, *sim.scratch):
        sim.run()
    return sim.loss[None], sim.v0.grad.to_numpy(), sim.k.grad.to_numpy()


def central(f, x, eps=1e-6):
    steps = [e.reshape(x.shape) for e in np.eye(x.size)]
    columns = [(f(x + eps * e) - f(x - eps * e)) / (2 * eps) for e in steps]
    return np.moveaxis(np.array(columns), 0, -1).reshape(np.shape(f(x)) + x.shape)


def test_data_oriented_program_value_and_grad_equal_tape():
    value, grad = td.value_and_grad(F)(V0)
    tape_value, tape_grad, _ = tape_gradient(V0)
    assert value == tape_value
    np.testing.assert_allclose(grad, tape_grad, rtol=1e-12)  # tidiff's adjoint kernels, rounded their own way
    np.testing.assert_allclose(grad, central(F, V0), rtol=1e-7)
    # every kernel of the program and of its tangent program is tidiff's, compute_loss's list of scratch fields
    # (self.scratch[k][i] in a static loop) too
    for program in (F.program, F.program.tangent()):
        for kernel in program._kernels:
            assert isinstance(vjp_kernel(kernel, CHAIN), KernelAdjoint), (kernel, vjp_kernel(kernel, CHAIN))
    assert F.memo.peek("reverse verdict") is None


def test_data_oriented_program_forward_mode_and_hessian():
    t = np.array([0.3, -1.0, 0.5, 2.0])
    _, tangent = td.jvp(F, (V0,), (t,))
    assert tangent == pytest.approx(float(td.grad(F)(V0) @ t), rel=RTOL)
    H = td.hessian(F)(V0)
    np.testing.assert_allclose(H, H.T, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(H, central(td.grad(F), V0), rtol=1e-6, atol=1e-8)
    _, hv = td.hvp(F, (V0,), (t,))
    np.testing.assert_allclose(hv[0], H @ t, rtol=RTOL)


def test_two_objects_and_a_parameter_field_of_an_object():
    """Several inputs reached through attributes; a second object of the class is its own program."""
    other = Chain()
    G = td.function(other.run, inputs=[other.v0, other.k], outputs=[other.loss])
    k = np.linspace(0.5, 1.5, 4)
    value, (gv, gk) = td.value_and_grad(G, argnums=(0, 1))(V0, k)
    tape_value, tape_v, tape_k = tape_gradient(V0, k)
    assert value == tape_value
    np.testing.assert_array_equal(gv, tape_v)
    np.testing.assert_array_equal(gk, tape_k)
    assert F(V0) == tape_gradient(V0)[0]  # the first object's program is unchanged


def test_user_objects_and_fields_are_untouched():
    CHAIN.x.fill(3.0)
    for f in CHAIN.scratch:
        f.fill(2.0)
    before = [f.to_numpy() for f in [CHAIN.x, CHAIN.v0, CHAIN.loss] + CHAIN.scratch]
    attributes = dict(vars(CHAIN))
    td.value_and_grad(F)(V0), td.jvp(F, (V0,), (V0,)), td.hessian(F)(V0)
    after = [f.to_numpy() for f in [CHAIN.x, CHAIN.v0, CHAIN.loss] + CHAIN.scratch]
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    assert vars(CHAIN) == attributes
    CHAIN.x.fill(0.0)
    for f in CHAIN.scratch:
        f.fill(0.0)


def test_a_class_kernel_bound_to_its_object_is_a_program():
    sim = Chain()
    sim.x.from_numpy(np.arange(24.0).reshape(6, 4) / 24)
    L = td.function(sim.compute_loss, inputs=[sim.x], outputs=[sim.loss])
    x = np.linspace(-1, 1, 24).reshape(6, 4)
    g = td.grad(L)(x)
    np.testing.assert_allclose(g[-1], 2 * x[-1] * np.arange(1, 5) - 0.3 * x[-1] ** 2, rtol=RTOL)
    assert not g[:-1].any()


# --- a plain object holding fields, module kernels reading attributes, dicts of fields ------------
class Params:  # not data_oriented: module-level kernels read its attributes
    def __init__(self):
        self.fields = {"a": ti.field(ti.f64, shape=3), "b": ti.Vector.field(2, ti.f64, shape=3)}
        self.scale = 2.5
        self.out = ti.field(ti.f64, shape=())


P = Params()


@ti.kernel
def through_attributes():
    for i in P.fields["a"]:
        P.out[None] += P.scale * P.fields["a"][i] * P.fields["b"][i].norm_sqr()


def test_attributes_and_dicts_of_a_plain_object():
    G = td.function(through_attributes, inputs=[P.fields["a"], P.fields["b"]], outputs=[P.out])
    assert [s.name for s in G.declared_specs()] == ["fields['a']", "fields['b']"]
    a, b = np.array([1.0, -2.0, 0.5]), np.arange(6.0).reshape(3, 2)
    ga, gb = td.grad(G, argnums=(0, 1))(a, b)
    np.testing.assert_allclose(ga, 2.5 * (b**2).sum(1), rtol=RTOL)
    np.testing.assert_allclose(gb, 5.0 * a[:, None] * b, rtol=RTOL)
    _, t = td.jvp(G, (a, b), (np.ones(3), np.zeros((3, 2))))
    assert t == pytest.approx(ga.sum(), rel=RTOL)
    assert isinstance(vjp_kernel(through_attributes), KernelAdjoint)  # P.out[None] named as a field, reversed


# --- what cannot be followed, and how it is refused -------------------------------------------
def test_a_kernel_made_while_the_program_runs_is_refused_before_it_runs():
    target = ti.field(ti.f64, shape=())
    xs = ti.field(ti.f64, shape=3)
    out = ti.field(ti.f64, shape=())

    def make():
        @ti.kernel
        def poke():
            target[None] = 99.0

        return poke

    @ti.kernel
    def total():
        for i in xs:
            out[None] += xs[i]

    def program():
        total()
        make()()

    G = td.function(program, inputs=[xs], outputs=[out])
    with pytest.raises(TypeError, match=r"td.function\(program\): the program launched kernel 'poke'"):
        G(np.ones(3))
    assert target[None] == 0.0


def test_a_class_kernel_taken_from_its_class_is_refused():
    with pytest.raises(TypeError, match=r"td.function\(compute_loss\): .*sim.run, not Sim.run"):
        td.function(Chain.compute_loss, inputs=[CHAIN.x], outputs=[CHAIN.loss])


@ti.data_oriented
class ImplicitFemPort:
    """As the implicit FEM example ported to a class: kernels the program calls beside kernels it does not, one of
    them beyond any transform (an atomic min), and a func returning a tuple."""

    def __init__(self, n):
        self.x = ti.field(ti.f64, n)
        self.f = ti.field(ti.f64, n)
        self.energy = ti.field(ti.f64, ())

    @ti.func
    def force_parts(self, i):
        return 2.0 * self.x[i], self.x[i] ** 2

    @ti.kernel
    def get_force(self):
        for i in self.x:
            a, b = self.force_parts(i)
            self.f[i] = a + b

    @ti.kernel
    def get_energy(self):
        for i in self.x:
            self.energy[None] += self.f[i] ** 2

    @ti.kernel
    def smallest(self) -> ti.f64:  # never called by the program; has no derivative rule
        lo = 1e9
        for i in self.x:
            ti.atomic_min(lo, self.x[i])
        return lo

    def step(self):
        self.get_force()
        self.get_energy()


def test_only_the_kernels_a_program_calls_are_transformed():
    """Issue 35, item 11: td.function of a program over an object transformed every kernel of its class, and a
    kernel it never calls failed the program's derivatives. Now what the code names is followed (NOTE: [Members
    the code names]), and a func returning a tuple is taken."""
    sim = ImplicitFemPort(4)
    F = td.function(sim.step, inputs=[sim.x], outputs=[sim.energy])
    x = np.linspace(0.1, 0.4, 4)
    want = 2 * (2 * x + x**2) * (2 + 2 * x)
    np.testing.assert_allclose(td.grad(F)(x), want, rtol=1e-14)
    np.testing.assert_allclose(td.jacfwd(F)(x), want, rtol=1e-14)
    hessian = np.diag(2 * (2 + 2 * x) ** 2 + 4 * (2 * x + x**2))
    np.testing.assert_allclose(td.hessian(F)(x), hessian, rtol=1e-13)
