"""The warning a Taichi pitfall raises, alone in a module that imports nothing.

pytest-xdist's controller rebuilds a worker's warning by importing the module of its category: in
``cases.py`` that import compiled Taichi kernels (the library's custom rules) on the controller's
thread, and Taichi's LLVM context asserts it runs on its main thread (a fresh-clone run, 2026-11-29: the
controller died, ``INTERNALERROR``, at the first pitfall a drawn program hit outside ``pytest.warns``).
"""


class TaichiPitfallWarning(UserWarning):
    """A drawn program hit a Taichi miscompile: rejected, not counted as a tidiff failure."""
