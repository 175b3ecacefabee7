"""How the long run tells a Taichi crash from a failure: a known message, or a death or an error in a check of
Taichi alone."""
import types

import hypothesis.strategies as st
import pytest
import taichi as ti
from hypothesis import given, settings
from hypothesis.errors import Unsatisfiable

from .cases import PITFALL_LOG_ENV, Case
from .crashes import CURRENT_ENV, TAICHI_ALONE, known_crash, known_error
from .pitfall_warning import TaichiPitfallWarning


def test_a_known_message_names_the_taichi_bug():
    why = known_crash("... Assertion failure: matrix_ptr_stmt->offset->template is<ConstStmt> ...", "")
    assert why is not None and "scalarize" in why


def test_a_kernel_taichi_compiled_to_invalid_llvm_is_taichi_s():
    """Long run, seed 11813: td.function(f) raised it; a plain parallel loop calling f raises alike."""
    message = ("[kernel_compilation_manager.cpp:compile_kernel@176] Assertion failure: ckd->check() == "
               "CompiledKernelData::Err::kNoError")
    assert "invalid LLVM IR" in known_error(message, "td.function(f)(*args)")


def test_a_death_in_a_check_of_taichi_alone_is_taichi_s():
    report = f"program ...\nargs = [...]\n{TAICHI_ALONE} ti.ad.Tape of the field program\n"
    assert known_crash("Fatal Python error: Bus error", report) == \
        "Taichi alone (no tidiff code) ended the process in: ti.ad.Tape of the field program"


def test_a_death_in_a_check_of_tidiff_is_a_failure():
    assert known_crash("Fatal Python error: Segmentation fault", "field program: value, grad, vjp") is None


def test_a_check_of_taichi_alone_gives_the_file_back_to_the_check_around_it(tmp_path, monkeypatch):
    current = tmp_path / "current"
    monkeypatch.setenv(CURRENT_ENV, str(current))
    case = types.SimpleNamespace(report=lambda call: call)  # checking() needs only report()
    with Case.checking(case, "field program: grad"):
        with Case.checking(case, f"{TAICHI_ALONE} ti.ad.Tape"):
            assert current.read_text() == f"{TAICHI_ALONE} ti.ad.Tape"
        assert current.read_text() == "field program: grad"


IR_BROKEN = ("[verify.cpp:basic_verify@56] IR broken: stmt BinaryOpStmt 1468378 cannot have operand BinaryOpStmt "
             "1468812.")  # Taichi's reverse mode of a plain ndarray kernel (long run, seed 10707)


def test_an_error_in_a_check_of_taichi_alone_is_taichi_s():
    assert known_error(IR_BROKEN, f"{TAICHI_ALONE} kernel.grad of the ndarray kernel") == \
        "Taichi alone (no tidiff code) raised it"


def test_an_unknown_error_in_a_check_of_tidiff_is_a_failure():
    assert known_error(IR_BROKEN, "ndarray kernel: value, jvp, vjp") is None
    assert "scalarize" in known_error("matrix_ptr_stmt->offset->template is<ConstStmt>", "ndarray kernel: vjp")


@pytest.mark.parametrize("error", [RuntimeError(IR_BROKEN), ti.TaichiCompilationError("Taichi cannot compile it")])
def test_a_check_of_taichi_alone_that_raises_rejects_the_draw_as_a_pitfall(error, monkeypatch):
    monkeypatch.delenv(PITFALL_LOG_ENV, raising=False)
    case = types.SimpleNamespace(report=lambda call: call)

    @settings(max_examples=2, database=None)
    @given(st.none())
    def check(_):
        with Case.checking(case, f"{TAICHI_ALONE} kernel.grad of the ndarray kernel"):
            raise error

    with pytest.warns(TaichiPitfallWarning, match="Taichi alone"), pytest.raises(Unsatisfiable):
        check()


def test_a_check_of_tidiff_that_raises_the_same_fails_with_the_reproduction(monkeypatch):
    monkeypatch.delenv(PITFALL_LOG_ENV, raising=False)
    case = types.SimpleNamespace(report=lambda call: f"reproduction of {call}")
    with pytest.raises(RuntimeError, match="IR broken") as raised:
        with Case.checking(case, "ndarray kernel: vjp"):
            raise RuntimeError(IR_BROKEN)
    assert raised.value.__notes__ == ["reproduction of ndarray kernel: vjp"]


WARNED_THEN_DIED = """....................xx..........
[W 11/26/26 15:04:53.929 1915] TaichiWarning
While compiling `apply_jvp_c131_0_reverse_grad`, Statement $888 (type=taichi::lang::LocalLoadStmt);
Loading variable 887 before anything is stored to it.
Fatal Python error: Bus error

Current thread 0x00007f (most recent call first):
  File "taichi/lang/kernel_impl.py", line 969 in launch_kernel
"""


def test_a_death_right_after_taichi_s_reverse_mode_warning_in_a_field_program_is_taichi_s():
    """Long run, seed 10835: td.hvp of a field program (Taichi's reverse mode of tidiff's tangent kernel)."""
    under_way = "program ...\nargs = [...]\nfield program: value, grad, vjp, jvp, jacobian, hvp"
    why = known_crash(WARNED_THEN_DIED, under_way)
    assert why is not None and "before anything is stored" in why


def test_a_death_after_the_warning_elsewhere_is_a_failure():
    assert known_crash(WARNED_THEN_DIED, "program ...\nargs = [...]\nout, vjp_fn = td.vjp(f, *args)") is None
    later = WARNED_THEN_DIED.replace("Fatal Python error", "[W] TaichiWarning\nanother warning\nFatal Python error")
    assert known_crash(later, "program ...\nargs = [...]\nfield program: value, grad") is None
