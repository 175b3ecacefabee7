"""A new Taichi runtime (``ti.init`` with another ``default_fp``, ``ti.reset``) gets new kernels.

Regression for issue 10, item 10: results came back in the old dtype after a
``ti.init`` with another ``default_fp``. Every cache is tied to the runtime it
was made for (``RuntimeMemo`` in ``tidiff/_protocol.py``). The check runs in a
subprocess: a new runtime would invalidate the fields of the rest of the suite.
"""
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import numpy as np, taichi as ti
    import tidiff as td

    ti.init(arch=ti.cpu, default_fp=ti.f64, log_level=ti.ERROR, offline_cache=True)

    @ti.func
    def cube(x: float) -> float:
        return x * x * x

    @ti.func
    def energy(x: ti.math.vec3, s: float) -> float:
        return s * x.dot(x) + ti.sin(x[0])

    g, h = td.grad(cube), td.hessian(energy)
    assert g(2.0) == 12.0 and g(2.0).dtype == np.float64
    assert h([1.0, 2.0, 3.0], 2.0).dtype == np.float64

    ti.init(arch=ti.cpu, default_fp=ti.f32, log_level=ti.ERROR, offline_cache=True)
    assert g(2.0).dtype == np.float32 and g(2.0) == 12.0         # Python numbers take the new default_fp
    assert h([1.0, 2.0, 3.0], 2.0).dtype == np.float32           # so do lists
    assert td.grad(energy)(np.ones((2, 3)), 1.0).dtype == np.float64  # arrays keep their own precision
    np.testing.assert_allclose(h([1.0, 2.0, 3.0], 2.0), 4.0 * np.eye(3) - np.diag([np.sin(1.0), 0, 0]), rtol=1e-6)

    ti.reset()
    ti.init(arch=ti.cpu, default_fp=ti.f64, log_level=ti.ERROR, offline_cache=True)
    assert g(2.0).dtype == np.float64 and td.jacrev(cube)(3.0) == 27.0
    print("ok")
''')


def test_a_new_runtime_gets_new_kernels(tmp_path):
    script = tmp_path / "runtime_change.py"  # Taichi reads a func's source from its file
    script.write_text(SCRIPT)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


FIELDS_SCRIPT = textwrap.dedent('''
    import numpy as np, pytest, taichi as ti
    import tidiff as td

    ti.init(arch=ti.cpu, default_fp=ti.f64, log_level=ti.ERROR, offline_cache=True)
    x = ti.field(ti.f64, 3)
    loss = ti.field(ti.f64, ())

    @ti.kernel
    def energy():
        for i in x:
            loss[None] += x[i] ** 2

    E = td.function(energy, inputs=[x], outputs=[loss])
    np.testing.assert_array_equal(td.grad(E)(np.ones(3)), 2.0 * np.ones(3))
    ti.init(arch=ti.cpu, default_fp=ti.f64, log_level=ti.ERROR, offline_cache=True)  # a notebook's init cell again
    x = np.ones(3)
    for call in (lambda: td.grad(E)(x), lambda: E(x), lambda: td.jvp(E, (x,), (x,))):
        with pytest.raises(RuntimeError, match=r"td.function\\(energy\\): ti.init or ti.reset ran since"):
            call()
    print("ok")
''')


def test_a_field_program_after_a_new_runtime_refuses_instead_of_crashing(tmp_path):
    """Outside code: td.grad of a field program after ti.init ran again killed the process (SIGSEGV): its twins
    lived in the freed runtime."""
    script = tmp_path / "fields_after_init.py"
    script.write_text(FIELDS_SCRIPT)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


NOT_INITIALIZED = textwrap.dedent('''
    import numpy as np, pytest, taichi as ti
    import tidiff as td

    @ti.func
    def square(x: ti.f64) -> ti.f64:
        return x * x

    @ti.func
    def square_bwd(x, ct):
        return (2.0 * ct * x,)

    g = td.grad(square)  # building a transform needs no runtime, as in JAX
    custom = td.custom_vjp(square)
    calls = {"grad(square)": lambda: g(2.0), "square": lambda: td.function(square)(2.0),
             "td.vjp(square)": lambda: td.vjp(square, 2.0),
             "td.jvp(square)": lambda: td.jvp(square, (2.0,), (1.0,)),
             "td.hvp(square)": lambda: td.hvp(square, (2.0,), (1.0,)),
             "square.defvjp": lambda: custom.defvjp(square_bwd)}

    def refused():
        for name, run in calls.items():
            with pytest.raises(RuntimeError, match=rf"^{name.replace('(', '[(]').replace(')', '[)]')}: Taichi is not "
                                                   r"initialized: call ti.init\\(...\\) first"):
                run()

    refused()
    ti.init(arch=ti.cpu, default_fp=ti.f64, log_level=ti.ERROR, offline_cache=True)
    assert g(2.0) == 4.0
    ti.reset()
    refused()  # after ti.reset(): Taichi's own error was "'NoneType' object has no attribute 'config'"
    print("ok")
''')


def test_calls_before_ti_init_say_so(tmp_path):
    """Issue 35, item 12: before ti.init(), Taichi's "'PyTaichi' object has no attribute 'print_full_traceback'"."""
    script = tmp_path / "not_initialized.py"
    script.write_text(NOT_INITIALIZED)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
