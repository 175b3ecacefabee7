"""One Taichi runtime for the whole suite (float64, on-disk cache on), a hypothesis profile, and the trees of
fields each test module made freed after it."""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's idle threads otherwise spin beside Taichi's

import pytest
import taichi as ti
from hypothesis import settings
from taichi.lang import impl
from taichi.lang.snode import SNode

ti.init(arch=ti.cpu, default_fp=ti.f64, offline_cache=True, log_level=ti.WARN)

# First launches compile kernels (tens of ms): no deadline, few but varied examples.
settings.register_profile("tidiff", deadline=None, max_examples=25, derandomize=True)
settings.load_profile("tidiff")


# NOTE: [Trees a test module made] Taichi 1.7.4 holds 512 trees of fields a process and crashes the process on
# the 513th (NOTE: [Trees a process holds] in tidiff/_fields/twins.py). Each field program adds trees (its twins,
# tangent fields, a time loop's stores), and so does every batch of fields a test makes after the first launch:
# the suite makes about 650, and the files one xdist worker ran once held more than 512 (a CI run: three tests
# refused by tidiff, then a segfault in from_numpy). A file's tests run in one process, one after another, and no
# other file uses what they made: the trees made while a module runs are freed after it (a freed tree's place is
# taken again; Taichi then compiles kernels again, from the on-disk cache). Taichi's walks over every tree
# (``ti.ad.Tape`` clearing all gradients) visit a freed one and crash the process (seen: a segfault in
# tests/electric.py's tape): they are given the trees still held.
_TREES_MADE = []
_FREED: dict[int, set[int]] = {}  # per Taichi program (ti.reset starts another), places of freed trees not
# taken again
_finalize = ti.FieldsBuilder._finalize


def _recorded(builder, raise_warning, compile_only):
    tree = _finalize(builder, raise_warning, compile_only)
    _freed().discard(tree.id)
    _TREES_MADE.append(tree)
    return tree


def _freed() -> set[int]:
    return _FREED.setdefault(id(impl.get_runtime().prog), set())


def _held_roots(cls):
    prog, freed = impl.get_runtime().prog, _freed()
    return [SNode(prog.get_snode_root(i)) for i in range(prog.get_snode_tree_size()) if i not in freed]


ti.FieldsBuilder._finalize = _recorded
ti.FieldsBuilder._finalized_roots = classmethod(_held_roots)


@pytest.fixture(autouse=True, scope="module")
def free_trees_made_by_the_module():
    impl.get_runtime().materialize_root_fb(False)  # fields made on import (other modules' too) stay
    _TREES_MADE.clear()
    yield
    for tree in _TREES_MADE:
        if not tree.destroyed and tree.prog is impl.get_runtime().prog:
            _freed().add(tree.id)
            tree.destroy()
    _TREES_MADE.clear()
