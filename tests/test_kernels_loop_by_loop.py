"""A kernel whose loop reads what an earlier loop of it wrote, then overwrites it, runs loop by loop in a
program (NOTE: [Kernels run loop by loop] in tidiff/_fields/split.py): exact, unchecked, in every mode; the
oracle is torch in float64."""
import warnings

import numpy as np
import pytest
import taichi as ti
import torch

import tidiff as td

N = 6
lx, ly, lz, lw = (ti.field(ti.f64, shape=N) for _ in range(4))
l_loss = ti.field(ti.f64, shape=())


@ti.kernel
def three_loops():
    for i in lx:
        ly[i] = ti.sin(lx[i])
    for i in lx:
        ly[i] *= lx[i] + lw[i]  # reads what the first loop wrote, then overwrites it
    ti.loop_config(serialize=True)
    for i in range(N):
        lz[i] = ly[i] * ly[(i + 1) % N]


@ti.kernel
def loss_of_z():
    for i in lz:
        l_loss[None] += lz[i] ** 2


def torch_three_loops(x, w):
    y = torch.sin(x) * (x + w)
    return y * torch.roll(y, -1)


def program():
    three_loops()
    loss_of_z()


X = np.linspace(-0.9, 1.1, N)
W = np.cos(np.arange(N))


def test_every_mode_as_torch_without_a_check():
    G = td.function(three_loops, inputs=[lx, lw], outputs=[lz])
    F = td.function(program, inputs=[lx, lw], outputs=[l_loss])
    tx, tw = torch.tensor(X), torch.tensor(W)
    jac = torch.autograd.functional.jacobian(torch_three_loops, (tx, tw))
    loss = lambda x, w: (torch_three_loops(x, w) ** 2).sum()  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no TaichiReverseWarning: nothing to check
        for got, want in zip(td.jacrev(G, argnums=(0, 1))(X, W), jac, strict=True):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-14)
        for got, want in zip(td.jacfwd(G, argnums=(0, 1))(X, W), jac, strict=True):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-14)
        value, grads = td.value_and_grad(F, argnums=(0, 1))(X, W)
        want_grads = torch.autograd.functional.jacobian(loss, (tx, tw))
        np.testing.assert_allclose(value, loss(tx, tw).item(), rtol=1e-13)
        for got, want in zip(grads, want_grads, strict=True):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-12)
        _, hv = td.hvp(F, (X, W), (np.sin(X), W))
        want_hv = torch.autograd.functional.hvp(loss, (tx, tw), (torch.sin(tx), tw))[1]
        for got, want in zip(hv, want_hv, strict=True):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-11)
    assert G.memo.peek("reverse verdict") is None
    assert F.memo.peek("reverse verdict") is None


@ti.kernel
def loops_apart():
    for i in lx:
        ly[i] = ti.sin(lx[i])
    for i in lx:
        lz[i] = ly[i] * lw[i]  # reads the first loop's writes, overwrites nothing it read


def test_a_kernel_whose_loops_overwrite_nothing_read_runs_whole():
    G = td.function(loops_apart, inputs=[lx, lw], outputs=[lz])
    want = torch.autograd.functional.jacobian(lambda x: torch.sin(x) * torch.tensor(W), torch.tensor(X)).numpy()
    np.testing.assert_allclose(td.jacrev(G)(X, W), want, rtol=1e-13, atol=1e-15)
    assert all(k._tidiff_loops is None for k in G.program._kernels)


@ti.kernel
def with_top_level_statements(a: ti.f64):
    l_loss[None] = 0.0  # runs in the first loop's part, before it
    c = a * 2.0  # assigned again in each part that reads it
    d = ti.sqrt(c) + lw[0]  # reads a field no loop writes
    for i in lx:
        ly[i] = ti.sin(lx[i]) * c
    for i in lx:
        ly[i] = ly[i] * lx[i] + d  # reads what the first loop wrote, then overwrites it
    for i in lx:
        l_loss[None] += ly[i] ** 2
    l_loss[None] *= 0.5  # after the last loop, in its part


def torch_with_top_level_statements(x, w, a=1.5):
    c = 2.0 * a
    y = torch.sin(x) * c * x + (c ** 0.5 + w[0])
    return 0.5 * (y ** 2).sum()


def test_top_level_statements_run_in_the_part_of_the_loop_after_them():
    F = td.function(lambda: with_top_level_statements(1.5), inputs=[lx, lw], outputs=[l_loss])
    tx, tw = torch.tensor(X), torch.tensor(W)
    want = torch.autograd.functional.jacobian(torch_with_top_level_statements, (tx, tw))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no TaichiReverseWarning: nothing to check
        value, grads = td.value_and_grad(F, argnums=(0, 1))(X, W)
        np.testing.assert_allclose(value, torch_with_top_level_statements(tx, tw).item(), rtol=1e-13)
        for got, expected in zip(grads, want, strict=True):
            np.testing.assert_allclose(got, expected.numpy(), rtol=1e-12, atol=1e-14)
        for got, expected in zip(td.jacfwd(F, argnums=(0, 1))(X, W), want, strict=True):
            np.testing.assert_allclose(got, expected.numpy(), rtol=1e-12, atol=1e-14)
        _, hv = td.hvp(F, (X, W), (np.sin(X), W))
        want_hv = torch.autograd.functional.hvp(torch_with_top_level_statements, (tx, tw), (torch.sin(tx), tw))[1]
        for got, expected in zip(hv, want_hv, strict=True):
            np.testing.assert_allclose(got, expected.numpy(), rtol=1e-11, atol=1e-13)
    assert F.memo.peek("reverse verdict") is None
    assert [len(k._tidiff_loops) for k in F.program._kernels] == [3]


@ti.kernel
def recurrence_beside_a_parallel_loop():
    for i in lx:
        lz[i] = lx[i] * lw[i]
    ti.loop_config(serialize=True)
    for i in range(1, N):
        ly[i] = 0.5 * ly[i - 1] + ti.sin(lx[i])  # reads what the iteration before wrote


@ti.kernel
def add_z_to_y():
    for i, j in ti.ndrange(N, N):
        ly[i] += lz[j]


def torch_recurrence(x, w):
    y = [x[0] * 0.0]
    for i in range(1, N):
        y.append(0.5 * y[-1] + torch.sin(x[i]))
    return torch.stack(y) + (x * w).sum()


def test_a_serialized_recurrence_beside_a_parallel_loop_runs_as_one_iteration_in_its_part():
    G = td.function(lambda: (recurrence_beside_a_parallel_loop(), add_z_to_y()), inputs=[lx, lw], outputs=[ly])
    want = torch.autograd.functional.jacobian(torch_recurrence, (torch.tensor(X), torch.tensor(W)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # before, its whole-kernel adjoint was checked, found wrong and pushed
        for transform in (td.jacrev, td.jacfwd):
            for got, expected in zip(transform(G, argnums=(0, 1))(X, W), want, strict=True):
                np.testing.assert_allclose(got, expected.numpy(), rtol=1e-12, atol=1e-14)
    assert G.memo.peek("reverse verdict") is None


@ti.kernel
def summed_into_a_top_level_local():
    total = 0.0  # a loop sums into it and the statement after that loop reads it: both in that loop's part
    for i in lx:
        ly[i] = ti.sin(lx[i])
    for i in lx:
        ly[i] = ly[i] * lx[i]
        total += ly[i]
    l_loss[None] = total


def test_a_sum_into_a_local_read_after_its_loop_stays_in_its_part():
    F = td.function(summed_into_a_top_level_local, inputs=[lx], outputs=[l_loss])
    tx = torch.tensor(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(td.grad(F)(X), torch.autograd.functional.jacobian(
            lambda x: (torch.sin(x) * x).sum(), tx).numpy(), rtol=1e-12, atol=1e-14)
    assert [len(k._tidiff_loops) for k in F.program._kernels] == [2]
    assert F.memo.peek("reverse verdict") is None


@ti.kernel
def sum_read_by_a_later_loop():
    total = 0.0  # handed to the third loop's launch in a 0-d field (NOTE: [Sums handed to a later loop])
    for i in lx:
        ly[i] = ti.sin(lx[i])
    for i in lx:
        ly[i] = ly[i] * lx[i]
        total += ly[i]
    for i in lx:
        lz[i] = ly[i] * total


@ti.kernel
def softmax_of_x():
    total = 0.0
    count = ti.cast(N, ti.f64)  # computed from constants: assigned again where read
    for i in lx:
        ly[i] = ti.exp(lx[i] * lw[i])
        total += ly[i]
    mean = total / count  # computed from the sum: computed again where a later loop reads it
    for i in lx:
        ly[i] = ly[i] / total + 0.25 * mean


@ti.kernel
def weighted_loss():
    for i in ly:
        l_loss[None] += ly[i] * ly[i] * (i + 1)


def softmax_steps():
    for _ in range(2):  # the second launch overwrites what the first's parts read
        softmax_of_x()
        weighted_loss()


def torch_softmax_steps(x, w):
    loss = 0.0
    for _ in range(2):
        e = torch.exp(x * w)
        y = e / e.sum() + 0.25 * e.sum() / N
        loss = loss + (y * y * torch.arange(1, N + 1)).sum()
    return loss


def assert_exact_in_three_parts(G, want):
    """Both Jacobians of ``G`` equal ``want``, with no warning and no check, its kernel run in three parts."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(td.jacrev(G)(X), want, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(td.jacfwd(G)(X), want, rtol=1e-12, atol=1e-14)
    assert [len(k._tidiff_loops) for k in G.program._kernels] == [3]
    assert G.memo.peek("reverse verdict") is None


def test_a_sum_read_by_a_later_loop_is_handed_on():
    G = td.function(sum_read_by_a_later_loop, inputs=[lx], outputs=[lz])
    tx = torch.tensor(X)
    want = torch.autograd.functional.jacobian(lambda x: torch.sin(x) * x * (torch.sin(x) * x).sum(), tx).numpy()
    assert_exact_in_three_parts(G, want)


def test_a_softmax_launched_twice_in_every_mode_as_torch():
    F = td.function(softmax_steps, inputs=[lx, lw], outputs=[l_loss])
    tx, tw = torch.tensor(X), torch.tensor(W)
    v = np.linspace(0.5, -0.5, N)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grads = td.grad(F, argnums=(0, 1))(X, W)
        _, hv = td.hvp(F, (X, W), (v, np.zeros(N)))
    for got, want in zip(grads, torch.autograd.grad(torch_softmax_steps(tx.requires_grad_(), tw.requires_grad_()),
                                                    (tx, tw)), strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-14)
    want_hv = torch.autograd.functional.hvp(torch_softmax_steps, (tx.detach(), tw.detach()),
                                            (torch.tensor(v), torch.zeros(N)))[1]
    for got, want in zip(hv, want_hv, strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-12)
    assert F.memo.peek("reverse verdict") is None


lv = ti.Vector.field(2, ti.f64, shape=N)


@ti.kernel
def drift_removed():
    mean = ti.Vector([0.0, 0.0])  # a vector sum a later loop reads, handed on in a 0-d vector field
    for i in lv:
        lv[i] = lv[i] * 1.5 + ti.sin(lv[i])
    for i in lv:
        mean += lv[i] / N
    for i in lv:
        lv[i] = lv[i] - mean


@ti.kernel
def weighted_energy():
    for i in lv:
        l_loss[None] += lv[i].norm_sqr() * (i + 1)


def drift_removed_then_energy():
    drift_removed()
    weighted_energy()


def test_a_vector_sum_read_by_a_later_loop_is_handed_on():
    F = td.function(drift_removed_then_energy, inputs=[lv], outputs=[l_loss])
    v = np.stack([X, W], 1)
    vt = torch.tensor(v, requires_grad=True)
    u = vt * 1.5 + torch.sin(vt)
    c = u - u.mean(0)
    want = torch.autograd.grad(((c * c).sum(1) * torch.arange(1, N + 1)).sum(), vt)[0].numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(td.grad(F)(v), want, rtol=1e-12, atol=1e-13)
        _, tangent = td.jvp(F, (v,), (np.ones_like(v),))
    np.testing.assert_allclose(tangent, want.sum(), rtol=1e-12)
    assert F.memo.peek("reverse verdict") is None


@ti.kernel
def entry_of_a_local_set_beside(a: ti.f64):
    c = ti.Vector([1.0, 2.0])
    c[0] = a  # an entry of a top-level local set beside the loops: a part assigning c again would miss it
    for i in lx:
        ly[i] = ti.sin(lx[i])
    for i in lx:
        ly[i] = ly[i] * c[0]


@ti.kernel
def entry_of_a_local_set_in_a_loop():
    c = ti.Vector([1.0, 2.0])
    for i in lx:
        ly[i] = ti.sin(lx[i])
    ti.loop_config(serialize=True)
    for _ in range(1):
        c[0] = lx[0] * 2.0 + c[1]  # written by a loop, read by a later one
    for i in lx:
        ly[i] = ly[i] * c[0]


def test_an_entry_of_a_local_set_beside_the_loops_keeps_the_kernel_whole():
    """Such a kernel ran loop by loop for a while (this session's first version of the top-level statements): the
    later part assigned ``c`` again without the entry written, and even the value was wrong."""
    G = td.function(lambda: entry_of_a_local_set_beside(2.5), inputs=[lx], outputs=[ly])
    np.testing.assert_allclose(G(X), np.sin(X) * 2.5, rtol=1e-13)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", td.TaichiReverseWarning)  # whole, so checked (and pushed where wrong)
        np.testing.assert_allclose(td.jacrev(G)(X), np.diag(np.cos(X) * 2.5), rtol=1e-12, atol=1e-14)
    assert all(k._tidiff_loops is None for k in G.program._kernels)


def test_an_entry_of_a_local_a_loop_writes_is_handed_on_with_it():
    """The adjoint once read ``c`` in the last loop as the top level assigned it, without the entry the
    serialized loop wrote: td.grad a third of the truth, silently; then Taichi's reverse mode refused the kernel.
    Now the loops run one by one and ``c`` is handed on as the loop left it (NOTE: [Sums handed to a later loop]):
    exact in both modes."""
    G = td.function(entry_of_a_local_set_in_a_loop, inputs=[lx], outputs=[ly])
    np.testing.assert_allclose(G(X), np.sin(X) * (2.0 * X[0] + 2.0), rtol=1e-13)
    want = np.diag(np.cos(X) * (2.0 * X[0] + 2.0))
    want[:, 0] += np.sin(X) * 2.0
    assert_exact_in_three_parts(G, want)


@ti.func
def first_of_y() -> ti.f64:
    return ly[0]


@ti.kernel
def local_of_a_written_field():
    c = ly[0]  # the first loop writes ly: a part after it would read another value
    for i in lx:
        ly[i] = ti.sin(lx[i])
    for i in lx:
        ly[i] = ly[i] * c


@ti.kernel
def local_of_a_func():
    c = first_of_y()  # a func may read what the kernel writes
    for i in lx:
        ly[i] = ti.sin(lx[i])
    for i in lx:
        ly[i] = ly[i] * c


@ti.kernel
def local_assigned_twice():
    c = 1.0
    for i in lx:
        ly[i] = ti.sin(lx[i])
    c = 2.0
    for i in lx:
        ly[i] = ly[i] * c


@ti.kernel
def configured_then_assigned():
    ti.loop_config(serialize=True)
    c = 1.0  # the configuration belongs to the loop right after it
    for i in lx:
        ly[i] = ti.sin(lx[i])
    for i in lx:
        ly[i] = ly[i] * c


@ti.kernel
def top_level_branch(a: ti.f64):
    for i in lx:
        ly[i] = ti.sin(lx[i])
    if a > 0:
        l_loss[None] = a
    for i in lx:
        ly[i] = ly[i] * lx[i]


@pytest.mark.parametrize("kernel", [local_of_a_written_field, local_of_a_func, local_assigned_twice,
                                    configured_then_assigned, top_level_branch])
def test_what_a_part_could_not_compute_again_keeps_the_kernel_whole(kernel):
    from tidiff._fields.split import loop_parts
    assert loop_parts(kernel) is None


def test_top_level_locals_are_assigned_again_where_read():
    from tidiff._fields.split import loop_parts
    from tidiff._lang.compile import info
    sources = [info(part).source for part in loop_parts(with_top_level_statements)]
    assert [s.count("c = a * 2.0") for s in sources] == [1, 1, 0]  # the last part reads neither local
    assert [s.count("d = ti.sqrt(c) + lw[0]") for s in sources] == [0, 1, 0]
    assert [s.count("l_loss[None] = 0.0") for s in sources] == [1, 0, 0]
    assert sources[2].index("l_loss[None] += ") < sources[2].index("l_loss[None] *= 0.5")
