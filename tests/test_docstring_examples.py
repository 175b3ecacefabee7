"""Every example in a docstring of tidiff runs and prints what it shows (issue 39: 38 never ran).

Examples are doctests (``>>>``) with NumPy, Taichi, tidiff, torch and hypothesis's ``given``,
``settings`` and ``st`` at hand, beside the names of their own module; each defines the functions
it uses. Taichi reads a ``@ti.func``'s source, which doctest serves from the example itself.
"""
import __future__

import doctest
import importlib
import pathlib
import re

import hypothesis
import numpy as np
import pytest
import taichi as ti
import torch
from hypothesis import strategies as st

import tidiff as td

ROOT = pathlib.Path(td.__file__).parent
MODULES = sorted(".".join(p.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
                 for p in ROOT.rglob("*.py") if "Example" in p.read_text())


def doctests(name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(name)
    shared = {"np": np, "ti": ti, "td": td, "torch": torch, "given": hypothesis.given,
              "settings": hypothesis.settings, "st": st}
    own = {k: v for k, v in vars(module).items() if not isinstance(v, __future__._Feature)}  # Taichi reads annotations
    return [t for t in doctest.DocTestFinder().find(module, globs={**own, **shared}) if t.examples]


@pytest.mark.parametrize("name", MODULES)
def test_examples_run(name):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    found = doctests(name)
    assert found, f"{name} has an Example section without a doctest (>>>)"
    for test in found:
        runner.run(test, out=lambda text: pytest.fail(text, pytrace=False))
    assert runner.summarize(verbose=False).failed == 0


def test_every_example_is_a_doctest():
    """An ``Example::`` block (code that never runs) is no example: it must be written with ``>>>``."""
    blocks = [f"{p.relative_to(ROOT)}: line {text[:m.start()].count(chr(10)) + 1}" for p in ROOT.rglob("*.py")
              for text in [p.read_text()] for m in re.finditer(r"Example::", text)]
    assert not blocks, blocks
