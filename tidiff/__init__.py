"""tidiff: JAX-style function transforms for Taichi code."""
from . import (
    _inline,  # lets the source transforms call through tidiff Functions
    _kinds,  # registers the kinds of function with td.function
)
from . import testing as testing
from ._api import function as function
from ._api import grad as grad
from ._api import hessian as hessian
from ._api import hvp as hvp
from ._api import jacfwd as jacfwd
from ._api import jacobian as jacobian
from ._api import jacrev as jacrev
from ._api import jvp as jvp
from ._api import value_and_grad as value_and_grad
from ._api import vjp as vjp
from ._cache import CacheInfo as CacheInfo
from ._cache import cache_info as cache_info
from ._compose import compose as compose
from ._elements.function import element_map as element_map
from ._elements.function import element_sum as element_sum
from ._elements.sparse import hessian_operator as hessian_operator
from ._elements.sparse import sparse_hessian as sparse_hessian
from ._elements.sparse import sparse_jacobian as sparse_jacobian
from ._errors import TransformError as TransformError
from ._fields.parts import part as part
from ._kinds.custom import custom_jvp as custom_jvp
from ._kinds.custom import custom_vjp as custom_vjp
from ._protocol import Function as Function
from ._reverse_check import TaichiReverseWarning as TaichiReverseWarning
from ._rules.helpers import stop_gradient as stop_gradient
from ._scan import scan as scan
from ._source import source as source

del _inline, _kinds


def __getattr__(name: str) -> object:
    # td.torch imports torch, an optional dependency: only when first used
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'tidiff' has no attribute {name!r}")


__all__ = [
    "CacheInfo",
    "Function",
    "TaichiReverseWarning",
    "TransformError",
    "cache_info",
    "compose",
    "custom_jvp",
    "custom_vjp",
    "element_map",
    "element_sum",
    "function",
    "grad",
    "hessian",
    "hessian_operator",
    "hvp",
    "jacfwd",
    "jacobian",
    "jacrev",
    "jvp",
    "part",
    "scan",
    "sparse_hessian",
    "sparse_jacobian",
    "source",
    "stop_gradient",
    "testing",
    "value_and_grad",
    "vjp",
]
