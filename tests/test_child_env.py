"""Child processes of the tests see this checkout first and keep the PYTHONPATH they were given."""
import os

from child_env import ROOT, child_env


def test_the_checkout_goes_before_what_pythonpath_had(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "site"), str(tmp_path / "more")]))
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    env = child_env(OMP_NUM_THREADS="1")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), str(tmp_path / "site"), str(tmp_path / "more")]
    assert env["OMP_NUM_THREADS"] == "1" and os.environ["OMP_NUM_THREADS"] == "4"  # a copy: ours untouched


def test_without_pythonpath_the_checkout_alone(monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert child_env()["PYTHONPATH"] == str(ROOT)
