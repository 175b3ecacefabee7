"""How the long run tells a Taichi crash from a failure: a known message, or a death in a check of Taichi alone."""
import types

from .cases import Case
from .crashes import CURRENT_ENV, TAICHI_ALONE, known_crash


def test_a_known_message_names_the_taichi_bug():
    why = known_crash("... Assertion failure: matrix_ptr_stmt->offset->template is<ConstStmt> ...", "")
    assert why is not None and "scalarize" in why


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
