"""Second order of kernels and Python programs over fields (API.md 1b, 2): exact, against torch.

hessian, hvp, grad of grad, jacfwd/jacrev of jacrev, vjp of grad and the jvp/vjp
of the vjp function, all by reverse passes of the tangent program
(NOTE: [Cotangent map without a body] in tidiff/_composite.py), compared
with torch.autograd.functional in float64.
"""
import numpy as np
import pytest
import taichi as ti
import torch
from programs import mid, out, stage_one, u, v  # stage_one: u, v -> mid
from programs import torch_two_stages as torch_out

import tidiff as td
from tidiff._composite import cotangent_map_of as vjp_function

RTOL, ATOL = 1e-7, 1e-12


def close(actual, expected):
    np.testing.assert_allclose(actual, expected.detach().numpy() if hasattr(expected, "detach") else expected,
                               rtol=RTOL, atol=ATOL)


def nested_close(actual, expected):
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, tuple) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            nested_close(a, e)
    else:
        close(actual, expected)


def tensors(*arrays):
    return tuple(torch.tensor(a, dtype=torch.float64) for a in arrays)


# --- a scalar field and a 0-D field, += accumulation --------------------------------------------
x = ti.field(ti.f64, shape=6)
w = ti.field(ti.f64, shape=())
loss = ti.field(ti.f64, shape=())


@ti.kernel
def energy():
    for i in x:
        loss[None] += w[None] * x[i] ** 2 * ti.sin(x[i]) + ti.exp(w[None] * x[(i + 1) % 6])


E = td.function(energy, inputs=[x, w], outputs=[loss])


def torch_energy(x_, w_):
    return (w_ * x_**2 * torch.sin(x_) + torch.exp(w_ * torch.roll(x_, -1))).sum()


X0, W0 = np.linspace(-1.2, 0.9, 6), np.array(0.4)


def test_hessian_with_tuple_argnums_is_the_nested_block_matrix():
    H = td.hessian(E, argnums=(0, 1))(X0, W0)
    nested_close(H, torch.autograd.functional.hessian(torch_energy, tensors(X0, W0)))
    assert H[0][0].shape == (6, 6) and H[0][1].shape == (6,) and H[1][1].shape == ()
    close(td.hessian(E)(X0, W0), torch.autograd.functional.hessian(lambda a: torch_energy(a, torch.tensor(W0)),
                                                                   torch.tensor(X0)))


def test_hvp_in_one_reverse_pass():
    rng = np.random.default_rng(0)
    u, uw = rng.standard_normal(6), np.array(-0.7)
    value, (hx, hw) = td.hvp(E, (X0, W0), (u, uw))
    ref_value, (ref_x, ref_w) = torch.autograd.functional.hvp(torch_energy, tensors(X0, W0), tensors(u, uw))
    close(value, ref_value)
    close(hx, ref_x)
    close(hw, ref_w)


def test_grad_of_grad_for_a_0d_input_and_composition_spellings():
    g2 = td.grad(td.grad(E, argnums=1), argnums=1)(X0, W0)
    assert isinstance(g2, np.ndarray) and g2.shape == ()
    H = torch.autograd.functional.hessian(torch_energy, tensors(X0, W0))
    close(g2, H[1][1])
    for spelling in (td.jacfwd(td.jacrev(E)), td.jacrev(td.jacrev(E)), td.jacrev(td.grad(E)), td.jacfwd(td.grad(E))):
        close(spelling(X0, W0), H[0][0])
    # jacobian of value_and_grad: the value's gradient and the Hessian
    dvalue, dgrad = td.jacobian(td.value_and_grad(E))(X0, W0)
    close(dvalue, torch.autograd.functional.jacobian(lambda a: torch_energy(a, torch.tensor(W0)), torch.tensor(X0)))
    close(dgrad, H[0][0])


def test_vjp_of_grad_is_the_hessian_times_the_cotangent():
    r = np.random.default_rng(1).standard_normal(6)
    g, vjp_fn = td.vjp(td.grad(E, argnums=0), X0, W0)
    dx, dw = vjp_fn(r)
    H = torch.autograd.functional.hessian(torch_energy, tensors(X0, W0))
    close(dx, H[0][0].numpy() @ r)
    close(dw, H[0][1].numpy() @ r)
    # with a cotangent on the value too: c * grad + H r
    (value, g), vjp_fn = td.vjp(td.value_and_grad(E, argnums=0), X0, W0)
    dx, dw = vjp_fn((np.array(0.7), r))
    grad_x, grad_w = torch.autograd.functional.jacobian(torch_energy, tensors(X0, W0))
    close(dx, 0.7 * grad_x.numpy() + H[0][0].numpy() @ r)
    close(dw, 0.7 * grad_w.numpy() + H[0][1].numpy() @ r)


# --- vector and matrix fields: several inputs, nested blocks ------------------------------------
V = ti.Vector.field(3, ti.f64, shape=4)
M = ti.Matrix.field(2, 2, ti.f64, shape=3)
s = ti.field(ti.f64, shape=())
e = ti.field(ti.f64, shape=())


@ti.func
def coupling(i):
    return ti.sin(V[i].dot(V[(i + 1) % 4])) * s[None]


@ti.kernel
def structure():
    for i in V:
        e[None] += coupling(i) + V[i].norm_sqr() ** 1.5
    for j in M:
        m = M[j]
        e[None] += ti.log(m.determinant() ** 2 + 1.0) + (m @ m.transpose()).trace() * s[None] ** 2


ES = td.function(structure, inputs=[V, M, s], outputs=[e])


def torch_structure(v_, m_, s_):
    total = (torch.sin((v_ * torch.roll(v_, -1, 0)).sum(1)) * s_).sum() + ((v_ * v_).sum(1) ** 1.5).sum()
    det = m_[:, 0, 0] * m_[:, 1, 1] - m_[:, 0, 1] * m_[:, 1, 0]
    return total + torch.log(det**2 + 1).sum() + (m_ * m_).sum() * s_**2


def test_vector_and_matrix_fields_full_hessian():
    rng = np.random.default_rng(2)
    v0, m0, s0 = rng.standard_normal((4, 3)), rng.standard_normal((3, 2, 2)), np.array(0.8)
    H = td.hessian(ES, argnums=(0, 1, 2))(v0, m0, s0)
    nested_close(H, torch.autograd.functional.hessian(torch_structure, tensors(v0, m0, s0)))
    assert H[0][1].shape == (4, 3, 3, 2, 2) and H[1][2].shape == (3, 2, 2)
    u = rng.standard_normal((4, 3)), rng.standard_normal((3, 2, 2)), np.array(0.3)
    _, hv = td.hvp(ES, (v0, m0, s0), u)
    _, ref = torch.autograd.functional.hvp(torch_structure, tensors(v0, m0, s0), tensors(*u))
    nested_close(hv, ref)


# --- a Python program: two kernels through an intermediate field, vector output -----------------
total = ti.field(ti.f64, shape=())


@ti.kernel
def stage_two_with_total():  # tests/programs.py's stage_two, and a scalar output reading what it wrote
    for i in mid:
        out[i] += mid[i].norm_sqr() + ti.exp(mid[i][0])
        total[None] += out[i] * u[(i + 1) % 4]


def step():
    stage_one()
    stage_two_with_total()


S = td.function(step, inputs=[u, v], outputs=[out, total])
U0 = np.linspace(0.3, -0.6, 4)
V0 = np.random.default_rng(3).standard_normal((4, 2))


def torch_total(u_, v_):
    return (torch_out(u_, v_) * torch.roll(u_, -1)).sum()


def test_two_kernel_program_hessian_of_a_scalar_output():
    total_only = td.function(step, inputs=[u, v], outputs=[total])
    H = td.hessian(total_only, argnums=(0, 1))(U0, V0)
    nested_close(H, torch.autograd.functional.hessian(torch_total, tensors(U0, V0)))


def test_second_derivative_of_a_vector_output_and_several_outputs():
    """jacfwd(jacrev(S)) gives d2 out_k / du du for every k (and the same for the scalar output)."""
    d2_out, d2_total = td.jacfwd(td.jacrev(S))(U0, V0)

    def jac_out(u_):
        return torch.autograd.functional.jacobian(lambda a: torch_out(a, torch.tensor(V0)), u_, create_graph=True)

    close(d2_out, torch.autograd.functional.jacobian(jac_out, torch.tensor(U0)))
    close(d2_total, torch.autograd.functional.hessian(lambda a: torch_total(a, torch.tensor(V0)), torch.tensor(U0)))
    # reverse over reverse: the same tensor (each H_k is symmetric)
    rr_out, rr_total = td.jacrev(td.jacrev(S))(U0, V0)
    close(rr_out, d2_out)
    close(rr_total, d2_total)


def test_jvp_and_vjp_of_the_vjp_function():
    """V(x, c) = J^T c: jvp in (t, s) = J^T s + sum c_k H_k t; vjp with r: (sum c_k H_k r, J r)."""
    rng = np.random.default_rng(4)
    c_out, c_total = rng.standard_normal(4), np.array(0.6)
    tu, tv, s_out, s_total = rng.standard_normal(4), rng.standard_normal((4, 2)), rng.standard_normal(4), np.array(-1.1)
    vjp_s = vjp_function(S)

    def torch_vjp(u_, v_, co, ct):
        gu, gv = torch.autograd.grad((torch_out(u_, v_) * co).sum() + torch_total(u_, v_) * ct, (u_, v_),
                                     create_graph=True)
        return gu, gv

    primals = (U0, V0, c_out, c_total)
    tangents = (tu, tv, s_out, s_total)
    got_out, got_tangent = td.jvp(vjp_s, primals, tangents)
    ref_out, ref_tangent = torch.autograd.functional.jvp(torch_vjp, tensors(*primals), tensors(*tangents))
    nested_close(got_out, ref_out)
    nested_close(got_tangent, ref_tangent)
    r = (rng.standard_normal(4), rng.standard_normal((4, 2)))
    got_out, vjp_fn = td.vjp(vjp_s, *primals)
    nested_close(got_out, ref_out)
    _, ref = torch.autograd.functional.vjp(torch_vjp, tensors(*primals), tensors(*r))
    nested_close(vjp_fn(r), ref)


# --- compile once, no state between calls, what is absent -----------------------------------------
def test_compiles_once_and_leaves_no_state():
    hess = td.hessian(E, argnums=(0, 1))
    first = hess(X0, W0)
    before = td.cache_info()[hess.name].compiles
    rng = np.random.default_rng(5)
    for _ in range(3):
        td.hvp(E, (rng.standard_normal(6), np.array(1.3)), (rng.standard_normal(6), np.array(0.2)))
        hess(rng.standard_normal(6), np.array(-0.5))
    assert td.cache_info()[hess.name].compiles == before
    nested_close(hess(X0, W0), first)  # nothing of the other calls is left in the fields
    x.fill(5.0)
    assert E(X0, W0) == pytest.approx(torch_energy(*tensors(X0, W0)).item(), rel=1e-12)
    np.testing.assert_array_equal(x.to_numpy(), np.full(6, 5.0))  # the user's fields are untouched
    assert loss[None] == 0.0


def test_third_order_through_the_tangent_program_of_the_tangent_program():
    """Every order comes from the protocol: the tangent program's own tangent program gives the third."""
    x_, w_ = tensors(X0, W0)

    def torch_hessian_x(z):
        return torch.autograd.functional.hessian(lambda y: torch_energy(y, w_), z, create_graph=True)

    close(td.jacfwd(td.hessian(E))(X0, W0), torch.autograd.functional.jacobian(torch_hessian_x, x_))

    def torch_grad_w(v):
        return torch.autograd.grad(torch_energy(x_, v), v, create_graph=True)[0]

    close(td.hessian(td.grad(E, argnums=1), argnums=1)(X0, W0),
          torch.autograd.functional.hessian(torch_grad_w, w_.clone().requires_grad_(True)))


# --- template kernels over double buffers, a Python helper, fill (tests/programs.py) ---------------
def test_template_kernel_simulation_hessian():
    from programs import M, energy_out, s0, simulate, torch_simulate

    sim = td.function(simulate, inputs=[s0], outputs=[energy_out])
    start = np.linspace(-1, 1, M)
    expected = torch.autograd.functional.hessian(lambda s: torch_simulate(s)[1], torch.tensor(start))
    close(td.hessian(sim)(start), expected)


Pair = ti.types.struct(a=ti.f64, b=ti.f64)


@ti.kernel
def through_struct(p: Pair):
    for i in x:
        loss[None] += p.a * x[i] ** 3 + p.b


def test_a_kernel_the_tangent_transform_cannot_take_is_named():
    program = td.function(lambda: through_struct(Pair(a=2.0, b=1.0)), inputs=[x], outputs=[loss])
    with pytest.raises(td.TransformError, match="kernel parameter `p` of kind StructType"):
        td.hessian(program)(X0)


# --- Taichi's reverse mode over the tangent kernel of local matrix products: quiet, and right ---------------------
pos = ti.Vector.field(2, ti.f64, 6)
triangles = ti.Vector.field(3, ti.i32, 4)
inverse_rest = ti.Matrix.field(2, 2, ti.f64, 4)
strain_energy = ti.field(ti.f64, ())
TRIANGLES = np.array([[0, 1, 2], [1, 3, 2], [2, 3, 4], [3, 5, 4]], np.int32)
INVERSE_REST = np.tile(np.array([[1.0, 0.1], [0.0, 0.9]]), (4, 1, 1))
triangles.from_numpy(TRIANGLES)
inverse_rest.from_numpy(INVERSE_REST)


@ti.kernel
def neo_hookean():
    for e in range(4):
        a, b, c = triangles[e][0], triangles[e][1], triangles[e][2]
        F = ti.Matrix.cols([pos[b] - pos[a], pos[c] - pos[a]]) @ inverse_rest[e]
        J = F.determinant()
        I1 = (F.transpose() @ F).trace()
        for k in range(2):  # a runtime loop: Taichi's reverse mode keeps its locals on a stack
            I1 += 0.01 * F[k, 0] ** 2
        strain_energy[None] += 0.5 * (I1 - 2) - ti.log(J) + 0.5 * ti.log(J) ** 2


def torch_neo_hookean(p):
    energy = p.new_zeros(())
    for e, (a, b, c) in enumerate(TRIANGLES):
        F = torch.stack([p[b] - p[a], p[c] - p[a]], 1) @ torch.tensor(INVERSE_REST[e])
        J = torch.det(F)
        I1 = (F.T @ F).trace() + 0.01 * (F[0, 0] ** 2 + F[1, 0] ** 2)
        energy = energy + 0.5 * (I1 - 2) - torch.log(J) + 0.5 * torch.log(J) ** 2
    return energy


def test_hvp_over_local_matrix_products_is_right_and_quiet(capfd):
    """Issue 35, item 19: compiling this printed 24 Taichi warnings "Loading variable N before anything is stored
    to it" in its own matmul helper, which docs/limits.md calls a sign of untrustworthy results; the results are
    right (NOTE: [Harmless warnings])."""
    E2 = td.function(neo_hookean, inputs=[pos], outputs=[strain_energy])
    p = np.array([[0, 0], [1, 0], [0, 1], [1, 1], [0, 2], [1, 2]], float) + np.linspace(0, 0.1, 12).reshape(6, 2)
    t = np.random.default_rng(0).normal(size=p.shape)
    capfd.readouterr()
    _, (hv,) = td.hvp(E2, (p,), (t,))
    assert "before anything is stored" not in capfd.readouterr().err
    _, want = torch.autograd.functional.hvp(torch_neo_hookean, torch.tensor(p), torch.tensor(t))
    close(hv, want)


def test_only_the_known_warning_is_dropped():
    from tidiff._fields.harmless_warnings import _TAICHI_LIBRARY, kept
    header = "[W 11/28/26 10:55:05.905 6766] TaichiWarning\n"
    library = (f'While compiling `e_jvp_c95_0_reverse_grad`, File "{_TAICHI_LIBRARY}/lang/matrix_ops.py", line 281, '
               "in _matmul_helper:\n    mat_z[i, j] = mat_z[i, j] + mat_x[i, k] * mat_y[k, j]\n"
               "Loading variable 219 before anything is stored to it.\n")
    user = library.replace(f"{_TAICHI_LIBRARY}/lang/matrix_ops.py", "/home/me/sim.py")
    other = library.replace("Loading variable 219 before anything is stored to it.", "Something else.")
    assert kept("before\n" + header + library + header + user + header + other) == \
        "before\n" + header + user + header + other
