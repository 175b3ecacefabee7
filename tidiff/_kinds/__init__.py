"""The kinds of Taichi code tidiff differentiates, each registered with ``td.function``:
kernels over ndarrays (``ndarray``), ``@ti.func`` code (``func``, with user rules in
``custom``), and programs over fields (``fields``). The order of the imports is the
order ``td.function`` tries them in: kept as written, not sorted."""
# ruff: noqa: I001
from . import ndarray as ndarray
from . import func as func
from . import fields as fields
from . import custom as custom

__all__ = ["custom", "fields", "func", "ndarray"]
