"""How a program's loops run: adds into gradient entries an iteration owns written without atomics (NOTE: [Owned
gradient entries]), and kernels and adjoints taking numbers only launched by the faster of their serial and
parallel forms (NOTE: [Small loops run serially], NOTE: [Program kernels by their faster form])."""
import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tidiff as td
from tidiff._adjoint.kernels import vjp_kernel
from tidiff._lang.compile import info
from tidiff._lang.serial import SAMPLES, FasterForm, choice, serial_form

N = 6
u = ti.field(ti.f64, (3, N), needs_grad=True)
kappa = ti.field(ti.f64, N, needs_grad=True)
loss = ti.field(ti.f64, (), needs_grad=True)


@ti.func
def kappa_at(i):
    return kappa[i]


@ti.kernel
def smooth(t: ti.i32):
    for i in range(N):
        left, right = u[t, (i + N - 1) % N], u[t, (i + 1) % N]
        u[t + 1, i] = u[t, i] + kappa[i] * (left - 2 * u[t, i] + right)


@ti.kernel
def total():
    for i in range(N):
        loss[None] += u[2, i] ** 2 + ti.sin(kappa[i])


@ti.kernel
def through_func():
    for i in range(N):
        loss[None] += kappa_at(i) * kappa[i]


@ti.kernel
def given_field(f: ti.template()):
    for i in range(N):
        loss[None] += f[i] * kappa[i]


def run():
    smooth(0)
    smooth(1)
    total()


FUNCTION = td.function(run, inputs=[td.part(u, 0), kappa], outputs=[loss])
PROGRAM = td.value_and_grad(FUNCTION, argnums=(0, 1))


def torch_loss(u0, k):
    rows = [u0]
    for _ in range(2):
        r = rows[-1]
        rows.append(r + k * (torch.roll(r, 1) - 2 * r + torch.roll(r, -1)))
    return (rows[2] ** 2).sum() + torch.sin(k).sum()


def test_owned_entries_are_added_plainly_and_shared_ones_atomically():
    source = info(vjp_kernel(smooth).kernel).source
    assert "kappa_grad[i] = kappa_grad[i] + " in source, source  # one entry per iteration
    assert "u_grad[t, (i + 6 - 1) % 6] += " in source and "u_grad[t, i] += " in source, source  # neighbours
    total_source = info(vjp_kernel(total).kernel).source
    assert "u_grad[2, i] = u_grad[2, i] + " in total_source, total_source  # a constant beside the counter


def test_entries_a_func_or_a_template_parameter_reaches_stay_atomic():
    assert "kappa_grad[i] += " in info(vjp_kernel(through_func).kernel).source  # the func adds atomically too
    assert "kappa_grad[i] += " in info(vjp_kernel(given_field).kernel).source  # `f` may be `kappa`


def test_given_field_may_be_the_field_it_reads():
    """``given_field(kappa)``: ``f.grad[i]`` and ``kappa.grad[i]`` are one entry, both added to."""
    F = td.grad(td.function(lambda: given_field(kappa), inputs=[kappa], outputs=[loss]))
    k = np.linspace(0.5, 1.5, N)
    np.testing.assert_allclose(F(k), 2 * k, rtol=1e-14)


def test_serial_form_configures_every_top_level_loop_without_a_config():
    import ast

    cells = ti.Vector.field(2, ti.f64, (3, 4), offset=(1, -2))
    tree = ast.parse("def k():\n    for i in a: pass\n    ti.loop_config(block_dim=8)\n    for j in b: pass\n"
                     "    x = 1\n    for i, j in cells: pass\n    for I in ti.grouped(cells): pass\n"
                     "    for i in sparse: pass\n    for c in ti.static(range(2)): pass\n").body[0]
    form = serial_form(tree, "ti", {"ti": ti, "cells": cells, "sparse": sparse_out})
    assert ast.unparse(form).splitlines() == [
        "def k_serial():", "    ti.loop_config(serialize=True)", "    for i in a:", "        pass",
        "    ti.loop_config(block_dim=8)", "    for j in b:", "        pass", "    x = 1",
        "    ti.loop_config(serialize=True)", "    for i, j in ti.ndrange((1, 4), (-2, 2)):", "        pass",
        "    ti.loop_config(serialize=True)", "    for I in ti.grouped(ti.ndrange((1, 4), (-2, 2))):", "        pass",
        "    for i in sparse:", "        pass",  # a struct-for runs in parallel, however configured
        "    for c in ti.static(range(2)):", "        pass"]  # unrolled: its loops are the kernel's
    assert serial_form(ast.parse("def k():\n    x = 1\n").body[0], "ti", {}) is None


def test_choice_keeps_serial_below_one_dispatch_and_else_the_faster_form():
    asked = []

    def dispatch():
        asked.append(1)
        return 50e-6

    warm = [30e-6] * SAMPLES
    assert choice((warm[:-1], []), dispatch) is None and not asked  # not enough launches yet
    assert choice((warm, []), dispatch) == 0 and len(asked) == 1  # cheaper than any parallel launch
    slow = [80e-6] * SAMPLES
    assert choice((slow, []), dispatch) is None  # worth timing the parallel form
    assert choice((slow, [60e-6] * (SAMPLES - 1)), dispatch) is None
    assert choice((slow, [60e-6] * SAMPLES), dispatch) == 1
    assert choice((slow, [90e-6] * SAMPLES), dispatch) == 0


def _forms(form):
    """Make the program's kernels and their adjoints launch ``form`` (0 serial, 1 parallel, None: choose)."""
    FUNCTION.program.primal([np.zeros(N), np.full(N, 0.1)])  # (its kernels find their forms at a first launch)
    kernels = FUNCTION.program._reversed  # the program's copies of smooth and total
    adjoints = [vjp_kernel(kernel) for kernel in kernels]
    launches = [launch for kernel in kernels for launch in kernel._tidiff_launches]
    assert len(adjoints) == 2 and len(launches) == 2 and all(launch.faster for launch in launches)
    for adjoint in adjoints:
        adjoint.launch = FasterForm(adjoint.kernel, adjoint.serial)
    for launch in launches:
        launch.faster = FasterForm(launch.primal, launch.faster.forms[0].kernel, told=True)
    forms = [adjoint.launch for adjoint in adjoints] + [launch.faster for launch in launches]
    for faster in forms:
        faster.chosen = None if form is None else faster.forms[form]
    return forms


@pytest.mark.parametrize("form", [0, 1, None], ids=["serial", "parallel", "chosen"])
@settings(max_examples=8)
@given(st.lists(st.floats(-2, 2), min_size=N, max_size=N), st.lists(st.floats(0.05, 0.4), min_size=N, max_size=N))
def test_each_form_gives_the_gradient(form, u0, k):
    launches = _forms(form)
    value, (du, dk) = PROGRAM(np.array(u0), np.array(k))
    tu, tk = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (u0, k))
    expected = torch_loss(tu, tk)
    expected.backward()
    np.testing.assert_allclose(value, expected.item(), rtol=1e-13)
    np.testing.assert_allclose(du, tu.grad.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dk, tk.grad.numpy(), rtol=1e-12, atol=1e-14)
    if form is not None:
        assert all(launch.forms[form].kernel.compiled_kernels for launch in launches)  # it ran that form


def test_the_launches_choose_a_form_and_keep_it():
    launches = _forms(None)
    for _ in range(2 * SAMPLES + 2):  # (a launch that compiles is not timed)
        PROGRAM(np.linspace(-1, 1, N), np.full(N, 0.2))
    for launch in launches:
        assert launch.chosen in launch.forms
        count = sum(map(len, launch.times))
        PROGRAM(np.linspace(-1, 1, N), np.full(N, 0.2))
        assert sum(map(len, launch.times)) == count  # no more timing once chosen


flag = ti.field(ti.i32, ())


@ti.kernel
def set_flag(v: ti.i32):
    for _ in range(1):
        flag[None] = v


@ti.kernel
def broken_flag(v: ti.i32):
    for _ in range(1):
        flag[None] = undefined_name  # noqa: F821 -- Taichi fails to compile it


def test_a_serial_form_taichi_does_not_compile_leaves_the_parallel_one():
    launch = FasterForm(set_flag, broken_flag)
    launch(7)
    assert flag[None] == 7 and launch.chosen is launch.forms[1]
    launch(8)
    assert flag[None] == 8


shifted = ti.field(ti.f64, (N,), offset=(-2,))
shifted_out = ti.field(ti.f64, (N,), offset=(-2,))
sparse_out = ti.field(ti.f64)
_sparse_tree = ti.FieldsBuilder()  # (a pointer node placed under ti.root after another tree was finalized
_sparse_tree.pointer(ti.i, 2).dense(ti.i, N // 2).place(sparse_out)  # crashes Taichi 1.7.4 when read)
_sparse_tree.finalize()
shifted_loss = ti.field(ti.f64, ())


@ti.kernel
def square_shifted(scale: ti.f64):
    for i in shifted:  # a struct-for over cells -2 .. N - 3: its serial form loops over them by index
        shifted_out[i] = scale * shifted[i] ** 2 + i


@ti.kernel
def activate_and_sum():
    for i in shifted_out:
        sparse_out[i + 2] = shifted_out[i] * (i + 3)
    for i in sparse_out:  # a struct-for over the cells a pointer node activated: it stays one
        shifted_loss[None] += ti.sin(sparse_out[i])


def run_shifted():
    square_shifted(0.5)
    activate_and_sum()


SHIFTED = td.function(run_shifted, inputs=[shifted], outputs=[shifted_loss])


@pytest.mark.parametrize("form", [0, 1], ids=["serial", "parallel"])
def test_struct_fors_over_offset_and_sparse_fields_in_each_form(form):
    x = np.linspace(-1.0, 1.2, N)
    SHIFTED.program.primal([x])
    kernels = SHIFTED.program._reversed
    for launch in (launch for kernel in kernels for launch in kernel._tidiff_launches):
        launch.faster = FasterForm(launch.primal, launch.faster.forms[0].kernel, told=True)
        launch.faster.chosen = launch.faster.forms[form]
    for adjoint in map(vjp_kernel, kernels):
        adjoint.launch = FasterForm(adjoint.kernel, adjoint.serial)
        adjoint.launch.chosen = adjoint.launch.forms[form]
    value, grad = td.value_and_grad(SHIFTED)(x)
    i = np.arange(-2, N - 2)
    inner = (0.5 * x**2 + i) * (i + 3)
    np.testing.assert_allclose(value, np.sin(inner).sum(), rtol=1e-13)
    np.testing.assert_allclose(grad, np.cos(inner) * (i + 3) * x, rtol=1e-12, atol=1e-14)
