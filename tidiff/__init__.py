"""tidiff: JAX-style function transforms for Taichi code."""
from ._cache import CacheInfo as CacheInfo
from ._cache import cache_info as cache_info
from ._custom import custom_jvp as custom_jvp
from ._custom import custom_vjp as custom_vjp
from ._errors import TransformError as TransformError
from ._function import Function as Function
from ._function import function as function
from ._source import source as source
from ._tangent import stop_gradient as stop_gradient
from ._transforms import grad as grad
from ._transforms import hessian as hessian
from ._transforms import hvp as hvp
from ._transforms import jacfwd as jacfwd
from ._transforms import jacobian as jacobian
from ._transforms import jacrev as jacrev
from ._transforms import jvp as jvp
from ._transforms import value_and_grad as value_and_grad
from ._transforms import vjp as vjp
from . import testing as testing



def __getattr__(name):
    # td.torch imports torch, an optional dependency: only when first used
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'tidiff' has no attribute {name!r}")


__all__ = [
    "CacheInfo",
    "Function",
    "TransformError",
    "cache_info",
    "custom_jvp",
    "custom_vjp",
    "function",
    "grad",
    "hessian",
    "hvp",
    "jacfwd",
    "jacobian",
    "jacrev",
    "jvp",
    "source",
    "stop_gradient",
    "testing",
    "value_and_grad",
    "vjp",
]
