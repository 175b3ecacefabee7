"""Kernels over fields reversed by tidiff's own transform (NOTE: [Reverse of a kernel]).

Every op-table row inside a kernel, against torch; kernels Taichi's reverse mode cannot take (runtime
loops carrying a local, ``while``, ``ti.tan``, statements beside loops) against central differences and
tidiff's forward mode; kernels it can take against ``ti.ad.Tape`` to 1e-12.
"""
import inspect
import warnings

import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from op_table import ROWS

import tidiff as td
from tidiff._adjoint import vjp_func
from tidiff._adjoint.kernels import KernelAdjoint, vjp_kernel
from tidiff._lang.compile import compile_source

B = 3  # elements per field


def _field_type(shape):
    if shape == ():
        return ti.f64
    return ti.types.vector(shape[0], ti.f64) if len(shape) == 1 else ti.types.matrix(*shape, ti.f64)


class RowKernel:
    """A kernel applying an op-table row to each element of B-element fields, summed into a loss."""

    def __init__(self, row):
        self.row = row
        # with gradients, so that ti.ad.Tape and vjp_kernel can run on the user's own kernel too
        self.fields = [ti.field(_field_type(s), shape=B, needs_grad=True) for s in row.shapes]
        self.loss = ti.field(ti.f64, shape=(), needs_grad=True)
        names = [f"a{k}" for k in range(len(row.shapes))]
        # scalar or not from the torch twin (test_op_table checks the row's values against it): a host call of
        # the row's function compiled a kernel of its own only to learn this (1.5 s for sym_eig_3x3)
        middle = [torch.full(s, 0.5 * (row.low + row.high), dtype=torch.float64) for s in row.shapes]
        scalar = row.torch_fn(*middle).ndim == 0
        args = ", ".join(f"{n}[i]" for n in names)
        source = (
            "@ti.kernel\ndef row_kernel():\n"
            f"    for i in {names[0]}:\n"
            f"        r = body({args})\n"
            f"        loss[None] += {'r' if scalar else 'r.sum()'}\n"
        )
        namespace = {"ti": ti, "body": row.func, "loss": self.loss, **dict(zip(names, self.fields))}
        self.kernel = compile_source(source, "row_kernel", namespace, "test")
        self.fn = td.function(self.kernel, inputs=self.fields, outputs=[self.loss])


_ROW_KERNELS = {}


def row_kernel(row):
    if row.name not in _ROW_KERNELS:
        _ROW_KERNELS[row.name] = RowKernel(row)
    return _ROW_KERNELS[row.name]


def torch_gradient(row, xs):
    """d sum_i sum(row(x_i)) / d x, per argument, in float64."""
    ts = [torch.tensor(x, requires_grad=True) for x in xs]
    total = sum(torch.as_tensor(row.torch_fn(*[t[i] for t in ts])).sum() for i in range(B))
    return [g.numpy() for g in torch.autograd.grad(total, ts, allow_unused=True)]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_every_row_in_a_kernel_against_torch(row):
    rk = row_kernel(row)
    rng = np.random.default_rng(3)
    xs = [rng.uniform(row.low, row.high, size=(B,) + s) for s in row.shapes]
    grads = td.grad(rk.fn, argnums=tuple(range(len(xs))))(*xs)
    # tidiff's adjoint, not Taichi's, wherever the row's func has a reverse function (else Taichi's, for now)
    reversible = vjp_func(row.func, (True,) * len(xs), 1) is not None
    assert isinstance(vjp_kernel(rk.kernel), KernelAdjoint) == reversible
    for got, want in zip(grads, torch_gradient(row, xs)):
        np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-10)


# --- kernels Taichi's reverse mode cannot take, and one it can -------------------------------------
N = 6
xa = ti.field(ti.f64, N, needs_grad=True)
ya = ti.field(ti.f64, N, needs_grad=True)
la = ti.field(ti.f64, (), needs_grad=True)
va = ti.Vector.field(2, ti.f64, N, needs_grad=True)
yb, yc, yd, ye, yf = (ti.field(ti.f64, N, needs_grad=True) for _ in range(5))  # one program's outputs: the
lc, ld = (ti.field(ti.f64, (), needs_grad=True) for _ in range(2))  # constructs below share twins (trees, NOTE:
# [Trees a process holds])
gather = ti.field(ti.i32, N)  # an integer field: an index, no derivative
gather.from_numpy(np.array([3, 0, 5, 1, 1, 2], dtype=np.int32))


@ti.kernel
def recurrence(a: ti.f64):
    for i in xa:  # a local carried through 40 iterations: beyond Taichi's autodiff stack
        s = xa[i]
        for j in range(40):
            s = ti.sin(s) * a + xa[(i + j) % N] * 0.1
        ya[i] = s


@ti.kernel
def iterate():
    for i in xa:
        c = xa[i]
        k = 0
        while c < 4.0:  # a while loop, a branch on values, ti.tan: Taichi has no reverse rule for them
            c = c * 1.5 + 0.1
            k += 1
        if k % 2 == 0:
            ya[i] = c * xa[i]
        else:
            ya[i] -= ti.tan(c / 8)
    la[None] = xa[0] * xa[1]  # a statement beside a loop: Taichi refuses the mix


@ti.kernel
def scatter_gather():
    for i in xa:
        va[i] = ti.Vector([xa[i], xa[i] ** 2])
        ya[i] = va[i][1] * 2 + va[i].norm()  # read where this iteration wrote: the value it left
        ti.atomic_add(la[None], xa[gather[i]] * ya[i])
        ti.atomic_sub(la[None], 0.5 * va[i][0])


@ti.kernel
def squares():
    for i in xa:
        ya[i] = xa[i] ** 2


@ti.kernel
def rescale():
    for i in xa:
        ya[i] *= ti.sin(xa[i])  # an update other than += and -=: read the entry, then write it


@ti.kernel
def weighted_total():
    for i in xa:
        la[None] += ya[i] / (1.5 + xa[i])


@ti.kernel
def binned():
    for i in xa:
        k = int(xa[i] * 2.0) % N  # an index computed from a float: no derivative flows through it
        yb[i] = xa[k] * xa[i] + ti.sin(xa[(i + int(xa[i] * 3.0)) % N])


@ti.kernel
def top_level_values():
    s = xa[0] * 2.0 + ti.sin(xa[1])  # top-level locals read in parallel loops: their cotangents summed over them
    v = ti.Vector([xa[2], s * xa[3]])
    for i in xa:
        yc[i] = s * xa[i] + v.dot(v) * xa[i]
    for i in xa:
        ti.atomic_max(lc[None], yc[i] * s)


@ti.kernel
def reductions():
    total = xa[0]  # sums into top-level locals: Taichi's reduction idiom
    sq = 0.0
    for i in xa:
        total += ti.sin(xa[i]) * xa[(i + 1) % N]
        if xa[i] > 0.5:
            sq -= xa[i] ** 2
        for j in range(i):  # a runtime loop summing too
            sq += 0.1 * xa[j] * xa[i]
    count = 0
    for i in xa:
        if xa[i] > 1.0:
            count += 1  # an integer count: no derivative
    ld[None] = total**2 + sq * total / (1 + count)
    for i in xa:
        yd[i] = total * xa[i]


@ti.kernel
def grouped():
    for at in ti.grouped(xa):  # a loop over a field's indices, as DiffTaichi writes grid loops
        ye[at] = ti.sin(xa[at]) * xa[(at[0] + 1) % N]


@ti.kernel
def boundaries():
    for i in xa:  # conditional expressions: Taichi evaluates the side the test takes, so no entry outside xa
        left = xa[i - 1] if i > 0 else 0.0
        yf[i] = ti.sin(xa[i]) * (left + (xa[i + 1] ** 2 if i < N - 1 else 1.0))


def run_recurrence():
    recurrence(0.9)


def run_constructs():
    squares()
    rescale()
    weighted_total()
    binned()
    top_level_values()
    reductions()
    grouped()
    boundaries()


PROGRAMS = {
    "recurrence": td.function(run_recurrence, inputs=[xa], outputs=[ya]),
    "iterate": td.function(iterate, inputs=[xa], outputs=[ya, la]),
    "scatter_gather": td.function(scatter_gather, inputs=[xa], outputs=[ya, la]),
    "constructs": td.function(run_constructs, inputs=[xa], outputs=[ya, la, yb, yc, lc, yd, ld, ye, yf]),
}
POINTS = st.lists(st.floats(0.3, 2.0), min_size=N, max_size=N).map(np.array)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@settings(max_examples=8)
@given(x=POINTS, t=POINTS, seed=st.integers(0, 2**16))
def test_reverse_equals_forward_mode(name, x, t, seed):
    """<J^T c, t> = <c, J t>: tidiff's adjoint kernels against its tangent kernels, exact to rounding."""
    fn = PROGRAMS[name]
    outs, vjp_fn = td.vjp(fn, x)
    outs = outs if isinstance(outs, tuple) else (outs,)
    rng = np.random.default_rng(seed)
    cts = tuple(rng.standard_normal(np.shape(o)) for o in outs)
    (grad,) = vjp_fn(cts if len(cts) > 1 else cts[0])
    _, tangents = td.jvp(fn, (x,), (t,))
    tangents = tangents if isinstance(tangents, tuple) else (tangents,)
    forward = sum(float(np.sum(c * d)) for c, d in zip(cts, tangents))
    assert float(grad @ t) == pytest.approx(forward, rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_reverse_against_central_differences(name):
    fn = PROGRAMS[name]
    x = np.array([0.45, 1.3, 0.8, 1.7, 0.6, 1.05])  # away from the while loop's and branch's switching points
    outs = fn(x)
    cts = tuple(np.linspace(0.5, 1.5, np.size(o)).reshape(np.shape(o)) for o in (outs if isinstance(outs, tuple)
                                                                                  else (outs,)))

    def pairing(z):
        values = fn(z)
        return sum(float(np.sum(c * v)) for c, v in zip(cts, values if isinstance(values, tuple) else (values,)))

    (grad,) = td.vjp(fn, x)[1](cts if len(cts) > 1 else cts[0])
    eps = 1e-6
    central = [(pairing(x + eps * e) - pairing(x - eps * e)) / (2 * eps) for e in np.eye(N)]
    np.testing.assert_allclose(grad, central, rtol=1e-7, atol=1e-8)


def test_equals_taichi_tape_where_taichi_reverses():
    x = np.linspace(0.3, 1.8, N)
    cts = (np.linspace(-1, 1, N), np.array(0.7))
    (grad,) = td.vjp(PROGRAMS["scatter_gather"], x)[1](cts)
    xa.from_numpy(x)
    for f in (ya, la, va):
        f.fill(0)
        f.grad.fill(0)
    xa.grad.fill(0)
    scatter_gather()
    ya.grad.from_numpy(cts[0])
    la.grad[None] = 0.7
    scatter_gather.grad()
    np.testing.assert_allclose(grad, xa.grad.to_numpy(), rtol=1e-12, atol=1e-14)
    assert isinstance(vjp_kernel(scatter_gather), KernelAdjoint)


def torch_top_level_values(x):
    s = x[0] * 2 + torch.sin(x[1])
    v = torch.stack([x[2], s * x[3]])
    y = s * x + (v @ v) * x
    return y, (y * s).max()


def torch_reductions(x):
    total = x[0] + (torch.sin(x) * torch.roll(x, -1)).sum()
    sq = -torch.where(x > 0.5, x**2, 0).sum() + sum(0.1 * x[j] * x[i] for i in range(N) for j in range(i))
    return total * x, total**2 + sq * total / (1 + (x > 1.0).sum())


def torch_grouped(x):
    return torch.sin(x) * torch.roll(x, -1)


def torch_boundaries(x):
    left = torch.cat([torch.zeros(1, dtype=x.dtype), x[:-1]])
    right = torch.cat([x[1:] ** 2, torch.ones(1, dtype=x.dtype)])
    return torch.sin(x) * (left + right)


def torch_rescale(x):
    y = x**2 * torch.sin(x)
    return y, (y / (1.5 + x)).sum()


def torch_binned(x):
    i = torch.arange(N)
    k = (x * 2.0).long() % N
    return x[k] * x + torch.sin(x[(i + (x * 3.0).long()) % N])


def torch_constructs(x):
    return (*torch_rescale(x), torch_binned(x), *torch_top_level_values(x), *torch_reductions(x), torch_grouped(x),
            torch_boundaries(x))


def test_updates_float_indices_and_top_level_values_are_exact_and_not_checked():
    """``y[i] *= e`` is ``y[i] = y[i] * e`` (the recorder keeps the entry it overwrites); ``x[int(x[i] * 2)]``
    has no derivative through its index; a top-level local read in parallel loops gets the sum of their
    cotangents (NOTE: [Top-level values in parallel loops]); one summed into in loops gives each term its
    cotangent (NOTE: [Reductions into top-level locals]): tidiff's adjoints, equal to torch's, no check."""
    fn = PROGRAMS["constructs"]  # one program (its twins are fields: a process holds 512 trees of them)
    x = np.array([0.45, 1.3, 0.8, 1.7, 0.6, 1.05])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jac = td.jacrev(fn)(x)
    want = torch.autograd.functional.jacobian(torch_constructs, torch.tensor(x))
    assert len(jac) == len(want) == 9
    for got, w in zip(jac, want, strict=True):
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-12, atol=1e-14)
    assert fn.memo.peek("reverse verdict") is None


@ti.kernel
def chained_product():
    for i in xa:
        la[None] = la[None] * (1.0 + 0.1 * xa[i])  # every iteration reads what the one before wrote


def run_chained_product():
    seed_loss()
    chained_product()


@ti.kernel
def seed_loss():
    la[None] = 2.0


def test_a_loop_chaining_its_iterations_through_one_entry_is_not_taken_and_stays_right():
    """The adjoint reads ``la`` as the kernel left it, not what each iteration read: the transform does not
    take the kernel, and the gradient is still the product's (never a silent wrong answer). Reverse mode is
    refused, naming the kernel, the construct and its line, where Taichi's kernel.grad ran, checked, found
    wrong and replaced by forward pushes (NOTE: [Taichi's reverse mode not run]); td.grad and the Jacobians
    choose forward mode, with no check and no warning."""
    reason = vjp_kernel(chained_product)
    assert not isinstance(reason, KernelAdjoint) and "the same in every iteration" in str(reason)
    source, first = inspect.getsourcelines(chained_product.__wrapped__)
    line = first + next(k for k, text in enumerate(source) if "for i in xa" in text)  # the loop
    fn = td.function(run_chained_product, inputs=[xa], outputs=[la])
    x = np.linspace(0.2, 1.2, N)
    product = 2.0 * np.prod(1.0 + 0.1 * x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(td.grad(fn)(x), product * 0.1 / (1.0 + 0.1 * x), rtol=1e-12)
        np.testing.assert_allclose(td.jacrev(fn)(x), product * 0.1 / (1.0 + 0.1 * x), rtol=1e-12)
    with pytest.raises(td.TransformError, match=r"does not take `chained_product` \(a parallel loop reading a "
                       rf"field .*, line {line} of .*test_kernel_adjoints.py\).*kernel.grad\) does not run"):
        td.vjp(fn, x)[1](np.array(1.0))
    assert fn.memo.peek("reverse verdict") is None


@ti.func
def cubic(x):
    return x * x * x + ti.sin(x)


@ti.func
def slope_and_curvature(x):  # a func calling transforms: reversed through their reverse (NOTE: [Calls through
    # Functions]), the tuple arguments taken entry by entry
    return td.jvp(cubic, (x,), (1.0,))[1] + 0.5 * td.hvp(cubic, (x,), (x,))[1][0] + td.grad(cubic)(x) * x


@ti.kernel
def with_transforms():
    for i in xa:
        ya[i] = slope_and_curvature(xa[i]) * xa[(i + 1) % N]


def test_a_kernel_calling_a_func_that_calls_transforms_is_reversed_by_tidiff():
    """(3x^2 + cos x)(1 + x) + x/2 (6x - sin x), times the next entry: against torch, with no check."""
    fn = td.function(with_transforms, inputs=[xa], outputs=[ya])
    assert isinstance(vjp_kernel(with_transforms), KernelAdjoint)

    def twin(x):
        inner = (3 * x**2 + torch.cos(x)) * (1 + x) + 0.5 * x * (6 * x - torch.sin(x))
        return inner * torch.roll(x, -1)

    x = np.linspace(-1.0, 1.4, N)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jac = td.jacrev(fn)(x)
    np.testing.assert_allclose(jac, torch.autograd.functional.jacobian(twin, torch.tensor(x)).numpy(), rtol=1e-12,
                               atol=1e-14)
    assert fn.memo.peek("reverse verdict") is None


@ti.kernel
def configured():
    ti.loop_config(block_dim=16)
    for i in xa:
        assert xa[i] > -100.0, "checked in debug mode only"
        ya[i] = ti.tan(xa[i]) * xa[(i + 2) % N]
    ti.loop_config(serialize=True)
    for i in xa:  # serial, and reading no field it writes: its adjoint may run so too
        la[None] += ya[i] * xa[i]
        if xa[i] > 100.0:
            print("large", xa[i])


def test_loop_config_assert_and_print_are_taken():
    """``ti.loop_config`` goes before the adjoint's loop too; ``assert`` and ``print`` do not run again."""
    fn = td.function(configured, inputs=[xa], outputs=[ya, la])
    assert isinstance(vjp_kernel(configured), KernelAdjoint)

    def twin(x):
        y = torch.tan(x) * torch.roll(x, -2)
        return y, (y * x).sum()

    x = np.linspace(-1.0, 1.2, N)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jac = td.jacrev(fn)(x)
    want = torch.autograd.functional.jacobian(twin, torch.tensor(x))
    for got, w in zip(jac, want):
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-12, atol=1e-14)
    assert fn.memo.peek("reverse verdict") is None


MANY = 1 << 21
xm = ti.field(ti.f64, MANY, needs_grad=True)
lm = ti.field(ti.f64, (), needs_grad=True)


@ti.kernel
def sum_of_sines():
    s = 0.0
    for j in xm:
        s += ti.sin(xm[j])  # a reduction over threads: an atomic add, in the tangent and adjoint kernels too
    lm[None] = s * s


def test_a_reduction_over_many_iterations_in_both_modes():
    """The tangent kernel kept ``ds += de`` an atomic add; it was a copy and a write-back, which iterations run
    on other threads overwrote (a jvp 30-50% off at two million entries on two threads)."""
    fn = td.function(sum_of_sines, inputs=[xm], outputs=[lm])
    x = np.random.default_rng(5).uniform(-1.0, 1.0, MANY)
    total = np.sin(x).sum()
    _, tangent = td.jvp(fn, (x,), (np.ones(MANY),))
    assert tangent == pytest.approx(2 * total * np.cos(x).sum(), rel=1e-9)
    np.testing.assert_allclose(td.grad(fn)(x), 2 * total * np.cos(x), rtol=1e-9)


@pytest.mark.parametrize("kernel", [recurrence, iterate, scatter_gather, rescale, binned, top_level_values,
                                    reductions, grouped, boundaries], ids=lambda k: k.__name__)
def test_the_transform_takes_these_kernels(kernel):
    assert isinstance(vjp_kernel(kernel), KernelAdjoint)


# --- which tapes need no check (NOTE: [Launches that keep the access rules]) ------------------------------
T = 4
path = ti.field(ti.f64, (T + 1, N), needs_grad=True)
end = ti.field(ti.f64, (), needs_grad=True)
grown = ti.field(ti.f64, N, needs_grad=True)


@ti.kernel
def advance(t: ti.i32):
    for i in range(N):
        path[t + 1, i] = path[t, i] + 0.1 * ti.sin(path[t, (i + 1) % N])


@ti.kernel
def measure():
    for i in range(N):
        end[None] += path[T, i] ** 2


def trajectory():
    for t in range(T):
        advance(t)
    measure()


@ti.kernel
def double_in_place():
    for i in grown:
        grown[i] = grown[i] * grown[i]  # read, then written where it was read: the adjoint needs the old value


@ti.kernel
def total_of_grown():
    for i in grown:
        end[None] += grown[i]


def square_in_place():
    double_in_place()
    total_of_grown()


def torch_trajectory(x0):
    x = x0
    for _ in range(T):
        x = x + 0.1 * torch.sin(torch.roll(x, -1))
    return (x**2).sum()


def test_a_trajectory_keeps_the_rules_and_is_not_checked():
    """Each step reads row t and writes row t + 1: no entry read is written after, so the replay is exact and
    the first gradient runs no check (no tangent run, no second pass)."""
    fn = td.function(trajectory, inputs=[td.part(path, 0)], outputs=[end])
    x0 = np.linspace(-1.0, 1.0, N)
    grad = td.grad(fn)(x0)
    x = torch.tensor(x0, requires_grad=True)
    (want,) = torch.autograd.grad(torch_trajectory(x), [x])
    np.testing.assert_allclose(grad, want.numpy(), rtol=1e-12)
    assert fn.memo.peek("reverse verdict") is None


def test_a_field_written_where_it_was_read_is_exact_and_not_checked():
    """x -> x * x in place: the adjoint of the square needs x before the write; the recorder keeps the entries
    the launch overwrites and the replay puts them back before its adjoint (NOTE: [Overwritten values kept]),
    so the gradient is exact and not checked (Taichi's kernel.grad would see the new value)."""
    fn = td.function(square_in_place, inputs=[grown], outputs=[end])
    x = np.linspace(0.5, 2.0, N)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(td.grad(fn)(x), 2 * x, rtol=1e-12)
    assert fn.memo.peek("reverse verdict") is None


# --- ti.stop_grad, as Taichi's own tests define it (tests/python/test_ad_basics.py: test_stop_grad, 2) ---------
held_x = ti.field(ti.f64, N)
held_loss = ti.field(ti.f64, ())


@ti.kernel
def stopped_everywhere():
    for i in range(N):
        ti.stop_grad(held_x)
        a = held_x[i] * 2.0  # a local made from the stopped field: a constant too
        held_loss[None] += held_x[i] ** 2 + a * a


@ti.kernel
def stopped_in_one_loop():
    for _ in range(N):  # Taichi stops the gradient in the loop (offloaded task) ti.stop_grad stands in
        ti.stop_grad(held_x)
        held_loss[None] += held_x[0] ** 2
    for _ in range(N):
        held_loss[None] += held_x[0] ** 2


@pytest.mark.parametrize("kernel, gradient", [
    (stopped_everywhere, lambda x: np.zeros(N)),
    (stopped_in_one_loop, lambda x: np.eye(N)[0] * 2 * N * x[0]),
], ids=["stop_grad", "stop_grad2"])
def test_stop_grad_as_taichi_defines_it_in_both_modes(kernel, gradient):
    fn = td.function(kernel, inputs=[held_x], outputs=[held_loss])
    x = np.linspace(0.5, 1.5, N)
    np.testing.assert_allclose(td.grad(fn)(x), gradient(x), rtol=1e-14, atol=0)
    np.testing.assert_allclose(td.jacfwd(fn)(x), gradient(x), rtol=1e-14, atol=0)


# --- a simulation written as an object ---------------------------------------------------------------------
@ti.data_oriented
class Shaper:
    def __init__(self):
        self.x = ti.field(ti.f64, N)
        self.y = ti.field(ti.f64, N)
        self.loss = ti.field(ti.f64, ())

    @ti.func
    def shape(self, v):  # a method reading a field of the object
        return ti.tan(v) * self.x[0]

    @ti.func
    def bias(self, i):  # given only an index: its tangent func is called with no tangent argument
        return ti.sin(self.x[(i + 1) % N])

    @ti.kernel
    def step(self, a: ti.f64):
        for i in self.x:
            self.y[i] = self.shape(self.x[i]) * a + self.bias(i)

    @ti.kernel
    def total(self):
        for i in self.y:
            self.loss[None] += self.y[i] ** 2

    def run(self):
        self.step(0.5)
        self.total()


def test_a_data_oriented_program_with_a_method_reading_fields():
    """Class kernels and the methods they call are reversed by tidiff (ti.tan: Taichi's kernel.grad cannot)."""
    shaper = Shaper()
    fn = td.function(shaper.run, inputs=[shaper.x], outputs=[shaper.loss])
    x = np.array([0.3, 0.5, 0.7, 0.9, 0.2, 0.4])
    xt = torch.tensor(x, requires_grad=True)

    def twin(a):
        return ((torch.tan(a) * a[0] * 0.5 + torch.sin(torch.roll(a, -1))) ** 2).sum()

    twin(xt).backward()
    np.testing.assert_allclose(td.grad(fn)(x), xt.grad.numpy(), rtol=1e-13)
    np.testing.assert_allclose(td.jacfwd(fn)(x), xt.grad.numpy(), rtol=1e-13)
    for k in fn.program.tangent()._kernels:  # the tangent kernels too: Hessians go through their adjoints
        assert isinstance(vjp_kernel(k, shaper), KernelAdjoint)
    v = np.linspace(-1.0, 1.0, N)
    want = torch.autograd.functional.hvp(twin, torch.tensor(x), torch.tensor(v))[1]
    np.testing.assert_allclose(td.hvp(fn, (x,), (v,))[1][0], want.numpy(), rtol=1e-12)


@ti.data_oriented
class Pusher:
    """A class kernel calling a method that writes a field (it was reversed by Taichi, which has no ti.tan)."""

    def __init__(self):
        self.p = ti.field(ti.f64, N, needs_grad=True)
        self.q = ti.field(ti.f64, N, needs_grad=True)
        self.e = ti.field(ti.f64, (), needs_grad=True)

    @ti.func
    def push(self, i, v):
        self.q[i] = v * v + self.p[(i + 1) % N]

    @ti.kernel
    def step(self):
        for i in self.p:
            self.push(i, ti.tan(self.p[i]))

    @ti.kernel
    def measure(self) -> ti.f64:
        for i in self.q:
            self.e[None] += self.q[i] * (1.0 + i)
        return self.e[None]  # a number for the program; it carries no derivative

    def run(self):
        self.step()
        return self.measure()


def torch_pusher(p):
    q = torch.tan(p) ** 2 + torch.roll(p, -1)
    return (q * (1.0 + torch.arange(N, dtype=p.dtype))).sum()


def test_a_method_writing_fields_and_a_kernel_returning_a_value_are_reversed_by_tidiff():
    pusher = Pusher()
    assert isinstance(vjp_kernel(Pusher.step, pusher), KernelAdjoint)
    assert isinstance(vjp_kernel(Pusher.measure, pusher), KernelAdjoint)
    fn = td.function(pusher.run, inputs=[pusher.p], outputs=[pusher.e])
    p = np.linspace(-0.6, 0.7, N)
    pt = torch.tensor(p, requires_grad=True)
    torch_pusher(pt).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(td.grad(fn)(p), pt.grad.numpy(), rtol=1e-13)
        v = np.cos(np.arange(N))
        want = torch.autograd.functional.hvp(torch_pusher, torch.tensor(p), torch.tensor(v))[1]
        np.testing.assert_allclose(td.hvp(fn, (p,), (v,))[1][0], want.numpy(), rtol=1e-12)


# --- integer fields: written without a derivative; an index overwritten after a read is checked ------------
counter = ti.field(ti.i32, ())
shift = ti.field(ti.i32, N)


@ti.kernel
def count_and_square():
    for i in xa:
        ti.atomic_add(counter[None], 1)  # the adjoint does not count again
        ya[i] = xa[i] ** 2


@ti.kernel
def gather_shifted():
    for i in xa:
        ya[i] = xa[shift[i]] ** 2


@ti.kernel
def move_shift():
    for i in shift:
        shift[i] = (i + 2) % N  # after gather_shifted read it: its adjoint would gather elsewhere


def gather_then_move():
    gather_shifted()
    move_shift()


def test_integer_writes_have_no_derivative_and_keep_the_rules():
    fn = td.function(count_and_square, inputs=[xa], outputs=[ya])
    x = np.linspace(0.5, 1.5, N)
    np.testing.assert_allclose(td.vjp(fn, x)[1](np.ones(N))[0], 2 * x, rtol=1e-14)
    assert isinstance(vjp_kernel(count_and_square), KernelAdjoint)


def test_an_index_field_overwritten_after_a_read_is_kept_and_exact():
    """``move_shift`` only stores into the integer field ``shift`` that ``gather_shifted`` read: the recorder keeps
    the entries it overwrites (NOTE: [Overwritten values kept]), and the gather's adjoint reads the old ones. Its
    stores were logged as reads too, so it read and then wrote the same entries: checked, and warned."""
    shift.from_numpy(np.array([1, 2, 3, 4, 5, 0], dtype=np.int32))
    fn = td.function(gather_then_move, inputs=[xa], outputs=[ya])
    x = np.linspace(0.5, 1.5, N)
    c = np.arange(1.0, N + 1.0)  # ya[i] = x[shift[i]] ** 2 over the shift the gather read, not the one after
    want = np.zeros(N)
    np.add.at(want, (np.arange(N) + 1) % N, 2 * x[(np.arange(N) + 1) % N] * c)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(td.vjp(fn, x)[1](c)[0], want, rtol=1e-12)
    assert fn.memo.peek("reverse verdict") is None and fn.program.replay_exact


@ti.kernel
def pair_sums(n: ti.i32):
    for i in xa:
        s = 0.0
        for j in range(n):  # a runtime loop accumulating: its adjoint reads no carried value
            s += ti.sin(xa[i] - xa[j]) * xa[j]
        ya[i] = s * s


def test_an_accumulating_loop_is_reversed_once_per_iteration():
    """NOTE: [Loops whose adjoint reads no carried value]: no recomputation from the loop's start (which would
    nest a loop over the iterations so far inside the reverse loop)."""
    from tidiff._lang.compile import info

    source = info(vjp_kernel(pair_sums).kernel).source
    assert source.count("for ") == 3, source  # the parallel loop, the forward loop, the one reverse loop
    fn = td.function(lambda: pair_sums(N), inputs=[xa], outputs=[ya])
    x = np.linspace(0.2, 1.4, N)
    xt = torch.tensor(x, requires_grad=True)
    s = (torch.sin(xt[:, None] - xt[None, :]) * xt[None, :]).sum(1)
    c = np.cos(np.arange(N))
    (want,) = torch.autograd.grad((s * s * torch.tensor(c)).sum(), [xt])
    np.testing.assert_allclose(td.vjp(fn, x)[1](c)[0], want.numpy(), rtol=1e-12)


def test_the_access_log_finds_a_written_entry_that_was_read_and_only_those():
    from tidiff._adjoint.accesses import _Reads

    reads = _Reads()
    for t in range(50):
        reads.add((t, None))  # a trajectory's steps read rows 0..49
    assert reads.overlaps((49, None)) and reads.overlaps((0, 3)) and not reads.overlaps((50, None))
    assert reads.overlaps((None, 2)) and reads.overlaps(None)
    reads.add((None, 7))  # and column 7 of any row
    assert reads.overlaps((80, 7)) and not reads.overlaps((80, 6))
    assert not _Reads().overlaps(None)


entries = st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=3, max_size=3).map(tuple)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), entries), max_size=12), st.lists(st.one_of(st.none(), entries), max_size=6))
def test_the_access_log_agrees_with_comparing_every_pair(reads, writes):
    """Grouped lookups and their projections (a write knowing fewer positions than the reads) against the
    definition: two accesses overlap unless some position both know differs."""
    from tidiff._adjoint.accesses import _overlap, _Reads

    log = _Reads()
    for k, where in enumerate(reads):
        log.add(where)
        for write in writes:  # interleaved: projections made early are kept up to date
            assert log.overlaps(write) == any(_overlap(write, r) for r in reads[:k + 1]), (reads[:k + 1], write)


@ti.kernel
def skip_some():
    for i in xa:
        if xa[i] < 0.8:
            continue  # NOTE: [Continue as a branch]: the rest of the body on the other side
        s = 0.0
        for j in range(N):
            if j == i:
                continue
            s += ti.tan(xa[j] * 0.3) * xa[i]
        ya[i] = s


def test_kernels_with_continue_are_reversed_by_tidiff():
    assert isinstance(vjp_kernel(skip_some), KernelAdjoint)
    fn = td.function(skip_some, inputs=[xa], outputs=[ya])
    x = np.array([0.45, 1.3, 0.8 + 1e-3, 1.7, 0.6, 1.05])
    xt = torch.tensor(x, requires_grad=True)
    terms = torch.tan(xt * 0.3)[None, :] * xt[:, None] * (1 - torch.eye(N, dtype=torch.float64))
    y = torch.where(xt < 0.8, torch.zeros(N, dtype=torch.float64), terms.sum(1))
    c = np.cos(np.arange(N))
    (want,) = torch.autograd.grad((y * torch.tensor(c)).sum(), [xt])
    np.testing.assert_allclose(td.vjp(fn, x)[1](c)[0], want.numpy(), rtol=1e-12)
    np.testing.assert_allclose(td.jvp(fn, (x,), (np.ones(N),))[1], td.jacrev(fn)(x).sum(1), rtol=1e-12)


def test_the_tangent_of_a_determinant_is_reversed_by_tidiff():
    """The determinant's tangent calls the cofactors helper (``for i, j in ti.static(ti.ndrange(3, 3))``,
    ``i1, i2 = ti.static(...)``, ``r0, r1, r2 = ti.static(OTHERS[i])``): tidiff reverses the tangent kernel
    itself, so Hessian-vector products of a program over determinants need no kernel.grad."""
    a3, a4 = ti.Matrix.field(3, 3, ti.f64, 2), ti.Matrix.field(4, 4, ti.f64, 2)
    loss = ti.field(ti.f64, ())

    @ti.kernel
    def determinants():
        for i in a3:
            loss[None] += a3[i].determinant() ** 2 + ti.sin(a4[i].determinant())

    f = td.function(determinants, inputs=[a3, a4], outputs=[loss])
    rng = np.random.default_rng(11)
    primals = (rng.normal(size=(2, 3, 3)), rng.normal(size=(2, 4, 4)))
    tangents = (rng.normal(size=(2, 3, 3)), rng.normal(size=(2, 4, 4)))
    value, (h3, h4) = td.hvp(f, primals, tangents)
    assert all(isinstance(vjp_kernel(k), KernelAdjoint) for k in f.program.tangent()._kernels)

    def torch_loss(m3, m4):
        return (torch.linalg.det(m3) ** 2).sum() + torch.sin(torch.linalg.det(m4)).sum()

    want_value, (w3, w4) = torch.autograd.functional.hvp(
        torch_loss, tuple(torch.tensor(p) for p in primals), tuple(torch.tensor(t) for t in tangents))
    np.testing.assert_allclose(value, want_value.numpy(), rtol=1e-12)
    np.testing.assert_allclose(h3, w3.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(h4, w4.numpy(), rtol=1e-9, atol=1e-12)


@ti.kernel
def spread(a: ti.template(), b: ti.template(), n: ti.i32):
    for i in a:
        for j in range(n):  # a runtime loop writing entries of a template field: the field is not a local it carries
            b[i] += a[j] * ti.sin(a[i])


def test_a_template_field_written_in_a_runtime_loop():
    """Found making ndarray kernels tidiff's: the loop's reversal took the parameter ``b`` for a local it carries
    and wrote ``b_1 = b``, which Taichi refused to compile at the first td.grad."""
    fn = td.function(lambda: spread(xa, ya, N), inputs=[xa], outputs=[ya])
    assert isinstance(vjp_kernel(spread), KernelAdjoint)
    x = np.linspace(-0.5, 0.9, N)
    want = torch.autograd.functional.jacobian(lambda t: t.sum() * torch.sin(t), torch.tensor(x))
    np.testing.assert_allclose(td.jacrev(fn)(x), want.numpy(), rtol=1e-13)


@ti.func
def take(src: ti.template(), i):
    return src[i]


taken_loss = ti.field(ti.f64, (), needs_grad=True)


@ti.kernel
def tan_through_takes():
    for i in xa:
        ya[i] = ti.tan(take(xa, i)) * take(xa, (i + 1) % N)
    for i in ya:
        taken_loss[None] += ya[i] ** 2


def test_a_tangent_kernel_unpacking_a_func_given_fields_is_reversed_by_tidiff():
    """Conformance net, seed 101: the tangent kernel calls ``take_jvp(x, i, dx)``, unpacking its ``(out, dout)``;
    such a call was not written out, so Taichi reversed the tangent kernel, which has no rule for ti.tan (td.hvp
    raised)."""
    fn = td.function(tan_through_takes, inputs=[xa], outputs=[taken_loss])
    assert all(isinstance(vjp_kernel(k), KernelAdjoint) for k in fn.program.tangent()._kernels)
    x, v = np.linspace(-0.6, 0.8, N), np.cos(np.arange(N))

    def energy(t):
        return ((torch.tan(t) * torch.roll(t, -1)) ** 2).sum()

    hv = td.hvp(fn, (x,), (v,))[1][0]
    want = torch.autograd.functional.hvp(energy, torch.tensor(x), torch.tensor(v))[1]
    np.testing.assert_allclose(hv, want.numpy(), rtol=1e-12)


pair_in = [ti.field(ti.f64, 3, needs_grad=True), ti.field(ti.f64, 3, needs_grad=True)]
pair_out = (ti.field(ti.f64, 3, needs_grad=True), ti.field(ti.f64, 3, needs_grad=True))


@ti.kernel
def through_containers():
    for i in range(3):
        for k in ti.static(range(2)):  # fields as entries of a list and a tuple, at constant indices
            pair_out[(k + 2) % 2][i] = pair_in[k][i] + 0.1 * ti.sin(pair_in[1 - k][i]) * pair_in[k][(i + 1) % 3]


def test_fields_in_lists_and_tuples_are_reversed_by_tidiff():
    fn = td.function(through_containers, inputs=pair_in, outputs=list(pair_out))
    assert isinstance(vjp_kernel(through_containers), KernelAdjoint)

    def twin(a, b):
        return a + 0.1 * torch.sin(b) * torch.roll(a, -1), b + 0.1 * torch.sin(a) * torch.roll(b, -1)

    a, b = np.linspace(-1.0, 1.0, 3), np.linspace(0.2, 0.9, 3)
    jac = td.jacrev(fn, argnums=(0, 1))(a, b)
    want = torch.autograd.functional.jacobian(twin, (torch.tensor(a), torch.tensor(b)))
    for i in range(2):
        for j in range(2):
            np.testing.assert_allclose(jac[i][j], want[i][j].numpy(), rtol=1e-13, atol=1e-15)
    assert fn.memo.peek("reverse verdict") is None


def assert_exact_in_both_modes(fn, x, twin):
    """fn's value, jacrev and jacfwd at x against its torch twin (one output or several), with no check of its
    reverse mode: tidiff's adjoints are exact there."""
    wants = twin(torch.tensor(x))
    jacobians = torch.autograd.functional.jacobian(twin, torch.tensor(x))
    values = fn(x)
    single = isinstance(wants, torch.Tensor)
    for got, want in zip((values,) if single else values, (wants,) if single else wants, strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-14, atol=1e-14)
    for transform in (td.jacrev, td.jacfwd):
        got = transform(fn)(x)
        for g, want in zip((got,) if single else got, (jacobians,) if single else jacobians, strict=True):
            np.testing.assert_allclose(g, want.numpy(), rtol=1e-13, atol=1e-14)
    assert fn.memo.peek("reverse verdict") is None


dict_x, dict_out = ti.field(ti.f64, 4, needs_grad=True), ti.field(ti.f64, 4, needs_grad=True)
NUMBERED = {0: ti.field(ti.f64, 4, needs_grad=True), 1: ti.field(ti.f64, 4, needs_grad=True)}
NAMED, NAMES = {"u": NUMBERED[0], "v": NUMBERED[1]}, ("u", "v")


@ti.kernel
def through_dicts():
    for i in dict_x:
        for k in ti.static(range(2)):  # a dict of fields at a static loop's counter, over numbers and names
            NUMBERED[k][i] = ti.sin(dict_x[i]) * (k + 1.5)
    for i in dict_x:
        s = 0.0
        for key in ti.static(NAMES):
            s += NAMED[key][i]
        dict_out[i] = s * dict_x[(i + 1) % 4]


def test_fields_in_dicts_in_both_modes():
    """Forward mode gave these a zero tangent (no error) and reverse mode fell back to Taichi's kernel.grad."""
    assert isinstance(vjp_kernel(through_dicts), KernelAdjoint)
    fn = td.function(through_dicts, inputs=[dict_x], outputs=[dict_out])
    assert_exact_in_both_modes(fn, np.linspace(-0.9, 1.3, 4), lambda z: 4 * torch.sin(z) * torch.roll(z, -1))


fx, fy, fz, tally = (ti.field(ti.f64, 5, needs_grad=True) for _ in range(4))
MODE = 1


@ti.func
def pushed(i, v):
    tally[i] += v
    return ti.sin(v) * fx[i]


@ti.func
def settled(i):
    if ti.static(MODE == 1):  # Taichi takes a return in a static branch
        tally[i] += fx[i] ** 2
        return ti.exp(fx[i])
    return fx[i]


@ti.func
def flagged(i):
    tally[i] += fx[i] ** 3
    return fx[i] > 0.0


@ti.func
def raised(i, power: ti.template()):
    if ti.static(power == 2):  # on a template parameter given a constant
        tally[i] += fx[i]
        return fx[i] ** 2
    return fx[i] ** power


@ti.kernel
def funcs_writing_fields():
    for i in fx:
        fy[i] = pushed(i, fx[i] ** 2) if i % 2 == 0 else fx[i]  # Taichi writes the field on either side
        fz[i] = settled(i) * fx[i] + raised(i, 2) + raised(i, 3)
        if flagged(i) and i > 2:  # and every operand of `and`
            fz[i] += fx[i]


@ti.kernel
def clear_tally():
    for i in tally:
        tally[i] = 0.0


def run_funcs_writing_fields():
    clear_tally()
    funcs_writing_fields()


def test_funcs_writing_fields_in_conditional_expressions_or_returning_in_a_static_branch():
    """NOTE: [Funcs in conditional expressions] and NOTE: [Static branches taken when inlining]: written out in
    the kernel as Taichi compiles them; they fell back to Taichi's kernel.grad."""
    assert isinstance(vjp_kernel(funcs_writing_fields), KernelAdjoint)
    fn = td.function(run_funcs_writing_fields, inputs=[fx], outputs=[fy, fz, tally])
    even = torch.arange(5) % 2 == 0

    def twin(x):
        late = (x > 0) & (torch.arange(5) > 2)
        return (torch.where(even, torch.sin(x ** 2) * x, x),
                torch.exp(x) * x + x ** 2 + x ** 3 + torch.where(late, x, 0 * x), 2 * x ** 2 + x ** 3 + x)

    assert_exact_in_both_modes(fn, np.linspace(-1.1, 0.8, 5), twin)


cx = ti.field(ti.f64, 5, needs_grad=True)
cv = ti.Vector.field(3, ti.f64, 5, needs_grad=True)
cm = ti.Matrix.field(2, 2, ti.f64, 5, needs_grad=True)
cy = ti.field(ti.f64, 5, needs_grad=True)


@ti.kernel
def component_writes():
    for i in cx:
        cv[i][0] = ti.sin(cx[i])  # one component of a vector field's entry, by index and by name
        cv[i].y = cx[i] ** 2
        cv[i][2] = 0.5
        cv[i][2] *= cx[i]
        cm[i][0, 1] = ti.exp(cx[i])
        cm[i][1, 0] = cx[i]
        cm[i][1, 1] = 0.0
        cm[i][0, 0] = 1.0
    for i in cx:
        cv[(i + 1) % 5].x += cx[i] * 0.5  # components scattered into from other iterations
        ti.atomic_add(cv[(i + 2) % 5][1], cx[i] ** 3)
        cm[i][1, 0] -= 0.25 * cx[i] ** 2
        for k in range(3):
            cv[i][k] += 0.1 * k * cx[i]
    for i in cx:
        cy[i] = cv[i].dot(cv[i]) + cm[i].determinant() * cv[i][2]


def torch_component_writes(x):
    roll = torch.roll
    v0 = torch.sin(x) + 0.5 * roll(x, 1)
    v1 = x ** 2 + roll(x, 2) ** 3 + 0.1 * x
    v2 = 0.5 * x + 0.2 * x
    m01, m10 = torch.exp(x), x - 0.25 * x ** 2
    return v0 ** 2 + v1 ** 2 + v2 ** 2 + (0.0 - m01 * m10) * v2


def test_writes_into_components_of_vector_and_matrix_fields():
    """NOTE: [Writes into components]: they fell back to Taichi's kernel.grad."""
    assert isinstance(vjp_kernel(component_writes), KernelAdjoint)
    fn = td.function(component_writes, inputs=[cx], outputs=[cy])
    assert_exact_in_both_modes(fn, np.linspace(-0.8, 1.1, 5), torch_component_writes)


ox, oz, ow, ov, oy = (ti.field(ti.f64, 5, needs_grad=True) for _ in range(5))


@ti.kernel
def own_writes():
    for i in ox:
        oz[i] = 0.5
        oz[i] *= ox[i]  # reads what this iteration wrote: 0.5, not the 0.5 * x the kernel leaves
        if ox[i] > 0.0:
            ov[i] = ti.sin(ox[i])
        else:
            ov[i] = ox[i]
        ov[i] += oz[i] * ox[i]  # after a branch (either side stored), reading what this iteration stored
    for i in ox:
        oy[i] = oz[i] * ov[i] + ov[i] ** 2


@ti.kernel
def own_writes_in_a_loop(n: ti.i32):
    for i in ox:
        ow[i] = ox[i]
        for _ in range(n):  # each iteration reads what the one before wrote
            ow[i] = ow[i] * 0.5 + ox[i] ** 2
        oy[i] = ow[i] * ox[i]


def torch_own_writes(x):
    z = 0.5 * x
    v = torch.where(x > 0, torch.sin(x), x) + z * x
    return z * v + v ** 2


def torch_own_writes_in_a_loop(x):
    w = x
    for _ in range(3):
        w = w * 0.5 + x ** 2
    return w * x


def test_reads_of_what_the_iteration_wrote():
    """NOTE: [Reads of what the iteration wrote]: the gradient took the value the kernel left (0.32 where torch
    gives -0.4), and the access log, dropping the second write as a repeat, called the launch exact."""
    x = np.linspace(-0.8, 1.1, 5)
    assert_exact_in_both_modes(td.function(own_writes, inputs=[ox], outputs=[oy]), x, torch_own_writes)

    looped = td.function(lambda: own_writes_in_a_loop(3), inputs=[ox], outputs=[oy])
    want = torch.autograd.functional.jacobian(torch_own_writes_in_a_loop, torch.tensor(x)).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", td.TaichiReverseWarning)  # checked: the runtime loop rereads its writes
        np.testing.assert_allclose(td.jacrev(looped)(x), want, rtol=1e-12, atol=1e-14)


sx, sy, sloss = ti.field(ti.f64, 9, needs_grad=True), ti.field(ti.f64, 9, needs_grad=True), ti.field(
    ti.f64, (), needs_grad=True)


@ti.kernel
def serial_scan():
    h = 0.0
    ti.loop_config(serialize=True)
    for i in range(9):
        h = 0.8 * h * ti.cos(h) + ti.sin(sx[i])
        sy[i] = h * sx[i]


@ti.kernel
def scan_loss():
    for i in sy:
        sloss[None] += sy[i] ** 2


def torch_serial_scan(x):
    h, total = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    for v in x:
        h = 0.8 * h * torch.cos(h) + torch.sin(v)
        total = total + (h * v) ** 2
    return total


def test_a_serialized_loop_carrying_a_value_in_a_field_program():
    """NOTE: [Serialized kernels as one iteration]: Taichi's reverse mode refuses the kernel (a top-level value
    assigned in its loop); tidiff takes it as one iteration around a runtime loop."""
    assert isinstance(vjp_kernel(serial_scan), KernelAdjoint)

    def program():
        serial_scan()
        scan_loss()

    F = td.function(program, inputs=[sx], outputs=[sloss])
    x = np.linspace(-1.2, 1.4, 9)
    want = torch.autograd.functional.jacobian(torch_serial_scan, torch.tensor(x)).numpy()
    np.testing.assert_allclose(td.grad(F)(x), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(td.jacfwd(F)(x), want, rtol=1e-10, atol=1e-12)


ix, iy = ti.field(ti.f64, 5, needs_grad=True), ti.field(ti.f64, 5, needs_grad=True)


@ti.kernel
def in_place_in_one_kernel():
    for i in ix:
        iy[i] = ti.sin(ix[i])
    for i in ix:
        iy[i] = iy[i] * ix[i] + 1.0  # reads what the loop before wrote, then overwrites it


@ti.kernel
def sine_into_iy():
    for i in ix:
        iy[i] = ti.sin(ix[i])


@ti.kernel
def iy_in_place():
    for i in ix:
        iy[i] = iy[i] * ix[i] + 1.0


def test_a_loop_overwriting_what_an_earlier_loop_of_its_kernel_wrote_is_exact_as_two_kernels_are():
    """NOTE: [Kernels run loop by loop]: the kernel's adjoint read iy as the kernel left it; the check found it,
    warned, and forward pushes answered. Its loops now run one by one, each a launch with its own adjoint."""
    x = np.linspace(0.2, 1.1, 5)
    want = np.diag(np.cos(x) * x + np.sin(x))
    one = td.function(in_place_in_one_kernel, inputs=[ix], outputs=[iy])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(td.jacrev(one)(x), want, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(td.jacfwd(one)(x), want, rtol=1e-13, atol=1e-15)
    assert one.memo.peek("reverse verdict") is None

    def two_kernels():
        sine_into_iy()
        iy_in_place()

    two = td.function(two_kernels, inputs=[ix], outputs=[iy])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(td.jacrev(two)(x), want, rtol=1e-13, atol=1e-15)
    assert two.memo.peek("reverse verdict") is None


ex, ev, ex_in, ev_in, eout = (ti.field(ti.f64, 5, needs_grad=True) for _ in range(5))


@ti.kernel
def load_state():
    for i in ex:
        ex[i] = ex_in[i]
        ev[i] = ev_in[i]


@ti.kernel
def symplectic_euler():
    for i in ex:
        ev[i] = ev[i] + ti.sin(ex[i]) * 0.1  # v read, written, then read by the next loop: its value is not needed
    for i in ex:
        ex[i] = ex[i] + ev[i] * 0.1  # overwrites the x the first loop's adjoint needs: kept


@ti.kernel
def energy_like():
    for i in ex:
        eout[i] = ex[i] * ev[i]


def euler_program():
    load_state()
    for _ in range(3):
        symplectic_euler()
    energy_like()


def torch_euler(x, v):
    for _ in range(3):
        v = v + torch.sin(x) * 0.1
        x = x + v * 0.1
    return x * v


def test_a_symplectic_euler_step_in_one_kernel_is_exact():
    """NOTE: [Values the adjoint uses]: it was checked, warned TaichiReverseWarning and pushed tangents forward."""
    fn = td.function(euler_program, inputs=[ex_in, ev_in], outputs=[eout])
    assert_quietly_exact(td.jacrev, fn, (np.linspace(0.2, 1.1, 5), np.linspace(-0.3, 0.4, 5)), torch_euler,
                         rtol=1e-13, atol=1e-15)


def assert_quietly_exact(derivative, fn, args, twin, rtol, atol):
    """``derivative(fn)`` by every argument against torch's Jacobian of ``twin``, with no warning and no check of
    reverse mode."""
    want = torch.autograd.functional.jacobian(twin, tuple(torch.tensor(a) for a in args))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = derivative(fn, argnums=tuple(range(len(args))))(*args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=rtol, atol=atol)
    assert fn.memo.peek("reverse verdict") is None


mx, mw, my = (ti.field(ti.f64, 4, needs_grad=True) for _ in range(3))
mloss = ti.field(ti.f64, (), needs_grad=True)


@ti.kernel
def two_maxima():
    for i in mx:
        v = mx[i] * mw[i] + ti.sin(mx[i]) * 3.0
        ti.atomic_max(my[i], v)
        ti.atomic_max(my[(i + 1) % 4], v - 0.5)  # two atomics into one field: the adjoint reads what won


@ti.kernel
def my_in_place():
    for i in my:
        my[i] = my[i] * 0.75 + 0.25 * ti.sin(mw[i])  # overwrites what won: kept for the maxima's adjoint


@ti.kernel
def my_loss():
    for i in range(4):
        mloss[None] += (my[i] * ti.cos(my[(i + 1) % 4])) ** 2


def maxima_program():
    two_maxima()
    my_in_place()
    my_loss()


def torch_maxima_program(x, w):
    v = x * w + torch.sin(x) * 3.0
    y = torch.amax(torch.stack([torch.zeros_like(v), v, torch.roll(v, 1) - 0.5]), dim=0) * 0.75 + 0.25 * torch.sin(w)
    return ((y * torch.cos(torch.roll(y, -1))) ** 2).sum()


def test_two_atomic_maxima_into_one_field_then_overwritten_are_exact():
    """The maxima's reads of what won stand after the kernel's accesses: between the two atomics' writes they
    made the launch look like one reading, then writing, a field (long run, seed 6500: then checked, and where
    the check could not tell, a gradient of zeros)."""
    fn = td.function(maxima_program, inputs=[mx, mw], outputs=[mloss])
    assert_quietly_exact(td.grad, fn, (np.array([0.3, 1.2, 0.7, 1.5]), np.array([0.5, -0.4, 1.1, 0.9])),
                         torch_maxima_program, rtol=1e-12, atol=1e-12)


G = 6  # a wave on a G x G grid, DiffTaichi's wave.py: two steps of a leapfrog over p[t], every cell reading its
# neighbours through a func with conditional reads
wave_p = ti.field(ti.f64, (4, G, G), needs_grad=True)
wave_init = ti.field(ti.f64, (G, G), needs_grad=True)
wave_loss = ti.field(ti.f64, (), needs_grad=True)


@ti.func
def wave_at(t, i, j):
    return wave_p[t, i, j] if 0 <= i < G and 0 <= j < G else 0.0


@ti.func
def wave_laplacian(t, i, j):
    return -4 * wave_at(t, i, j) + wave_at(t, i, j - 1) + wave_at(t, i, j + 1) + wave_at(t, i + 1, j) \
        + wave_at(t, i - 1, j)


@ti.kernel
def wave_start():
    for i in range(G):
        for j in range(G):
            wave_p[0, i, j] = wave_init[i, j]
            wave_p[1, i, j] = 0.5 * ti.sin(wave_init[i, j])


@ti.kernel
def wave_step(t: ti.i32):
    for i in range(G):
        for j in range(G):  # a runtime loop, as Taichi runs it: its iterations carry nothing (NOTE: [Constant
            # ranges in kernels])
            p_lap, q_lap = wave_laplacian(t - 2, i, j), wave_laplacian(t - 1, i, j)
            wave_p[t, i, j] = 2 * wave_p[t - 1, i, j] + 0.1 * q_lap - wave_p[t - 2, i, j] - 0.01 * p_lap


@ti.kernel
def wave_misfit():
    for i in range(G):
        for j in range(G):
            wave_loss[None] += (wave_p[3, i, j] - 0.1 * i) ** 2


def wave_program():
    wave_start()
    wave_step(2)
    wave_step(3)
    wave_misfit()


def torch_wave(init):
    def laplacian(u):
        padded = torch.nn.functional.pad(u, (1, 1, 1, 1))
        return padded[:-2, 1:-1] + padded[2:, 1:-1] + padded[1:-1, :-2] + padded[1:-1, 2:] - 4 * u

    ps = [init, 0.5 * torch.sin(init)]
    for _ in range(2):
        ps.append(2 * ps[-1] + 0.1 * laplacian(ps[-1]) - ps[-2] - 0.01 * laplacian(ps[-2]))
    return ((ps[-1] - 0.1 * torch.arange(G, dtype=init.dtype)[:, None]) ** 2).sum()


def test_a_constant_range_carrying_nothing_stays_a_loop_in_the_adjoint():
    """DiffTaichi's wave.py: written out 16 times, the adjoint of its step took 148 s to compile (Taichi's 0.5 s)."""
    from tidiff._lang.compile import info
    source = info(vjp_kernel(wave_step).kernel).source
    assert "in range(count" in source and source.count("wave_laplacian(t - 2") <= 2  # a loop, not six copies
    fn = td.function(wave_program, inputs=[wave_init], outputs=[wave_loss])
    x = np.cos(np.arange(G * G).reshape(G, G) * 0.7)
    assert_quietly_exact(td.grad, fn, (x,), torch_wave, rtol=1e-12, atol=1e-12)


mpm_x = ti.Vector.field(2, ti.f64, shape=3, needs_grad=True)
mpm_grid = ti.field(ti.f64, shape=(5, 3), needs_grad=True)


@ti.kernel
def mpm_weights(shift: ti.template()):
    for p in mpm_x:
        fx = mpm_x[p] + shift  # a ti.template() parameter given a number (DiffTaichi's smoke: compute_p(t, k))
        w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2]  # MLS-MPM weights: a list
        for i in ti.static(range(3)):
            for j in ti.static(range(3)):
                mpm_grid[p + i, j] += w[i][0] * w[j][1] * ti.sin(fx[0] * fx[1])


def torch_mpm_weights(x, shift=0.25):
    fx = x + shift
    w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2]
    grid = torch.zeros(5, 3, dtype=x.dtype)
    for p in range(3):
        for i in range(3):
            for j in range(3):
                grid = grid.index_put((torch.tensor(p + i), torch.tensor(j)),
                                      w[i][p, 0] * w[j][p, 1] * torch.sin(fx[p, 0] * fx[p, 1]), accumulate=True)
    return grid


def test_mls_mpm_weights_and_template_numbers_in_both_modes():
    """DiffTaichi's diffmpm p2g / g2p (a list of weights read as w[i][0] in static loops) and smoke's numbers
    given to ti.template() parameters: reversed by Taichi's kernel.grad before, tidiff's own now, exact."""
    assert isinstance(vjp_kernel(mpm_weights), KernelAdjoint)

    def run():
        mpm_weights(0.25)

    fn = td.function(run, inputs=[mpm_x], outputs=[mpm_grid])
    x = np.array([[0.3, 0.7], [0.55, 0.2], [0.9, 0.45]])
    want = torch.autograd.functional.jacobian(lambda a: torch_mpm_weights(a), torch.tensor(x))
    for transform in (td.jacrev, td.jacfwd):
        got = transform(fn)(x)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-13, atol=1e-14)
    assert fn.memo.peek("reverse verdict") is None


cg_x = ti.field(ti.f64, shape=(4, 3), needs_grad=True)  # a state per step
cg_grid = ti.field(ti.f64, shape=3, needs_grad=True)  # reused by every step, cleared with its gradient
cg_loss = ti.field(ti.f64, shape=(), needs_grad=True)


@ti.kernel
def cg_clear():
    for i in cg_grid:
        cg_grid[i] = 0.0
        cg_grid.grad[i] = 0.0  # for the tape's next pass, as DiffTaichi's clear_grid


@ti.kernel
def cg_scatter(t: ti.i32):
    for i in range(3):
        cg_grid[(i + 1) % 3] += ti.sin(cg_x[t, i])


@ti.kernel
def cg_gather(t: ti.i32):
    for i in range(3):
        cg_x[t + 1, i] = cg_x[t, i] + 0.5 * cg_grid[i] ** 2


@ti.kernel
def cg_misfit():
    for i in range(3):
        cg_loss[None] += cg_x[3, i] ** 2


def cleared_grid_program():
    for t in range(3):
        cg_clear()
        cg_scatter(t)
        cg_gather(t)
    cg_misfit()


def torch_cleared_grid(x0):
    x = x0
    for _ in range(3):
        x = x + 0.5 * torch.roll(torch.sin(x), 1) ** 2
    return (x ** 2).sum()


def test_gradients_cleared_by_the_program_are_left_out_of_the_adjoint():
    """DiffTaichi's diffmpm without grad_replaced: its clear kernel, writing x.grad, was Taichi's to reverse, and
    the program's grid (reused each step) then wrong, checked and differentiated by forward pushes."""
    assert isinstance(vjp_kernel(cg_clear), KernelAdjoint)
    fn = td.function(cleared_grid_program, inputs=[td.part(cg_x, 0)], outputs=[cg_loss])
    assert_quietly_exact(td.grad, fn, (np.array([0.3, -0.8, 1.1]),), torch_cleared_grid, rtol=1e-12, atol=1e-12)
