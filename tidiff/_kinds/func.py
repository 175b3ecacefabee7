"""A ``@ti.func`` as a batched, differentiable function (docs/transforms.md).

Its body is the func itself; everything else is :class:`~tidiff._pointwise.Pointwise`.
Annotations (or ``signature=``) give each argument's core shape; without
them each call's arguments give their whole shape. Output specs come from
the return annotation, else from compiling the body once (a probe kernel).
"""
from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from taichi.lang import impl

from .._cache import uses
from .._codegen.batch import identifier, probe_in_kernel, probe_outputs
from .._lang.parse import real_func_refusal
from .._pointwise import Pointwise
from .._protocol import register_kind
from .._signature import ArgSpec, input_specs, output_specs, parameter_names, result_float
from .._tree import Tree, flat_tree


def python_function(tifunc: Any) -> Any:
    """The plain Python function behind a ``@ti.func``."""
    return getattr(tifunc, "__wrapped__", None) or tifunc.func.func


class FuncFunction(Pointwise):
    """A ``@ti.func`` as a batched, differentiable function."""

    def __init__(self, tifunc: Any, signature: Any = None, name: str | None = None, *, listed: bool = True) -> None:
        pyfunc = python_function(tifunc)
        super().__init__(name or pyfunc.__name__, listed=listed)
        self.tifunc = tifunc
        self._pyfunc = pyfunc
        self._signature_option = signature
        self._names = parameter_names(pyfunc)
        input_specs(pyfunc, signature, f"td.function({self.name})")  # refuse a bad signature= now

    def param_names(self) -> list[str]:
        return self._names

    def param_defaults(self) -> dict[str, Any]:
        return {name: p.default for name, p in inspect.signature(self._pyfunc).parameters.items()
                if p.default is not inspect.Parameter.empty}

    def declared_specs(self) -> list[ArgSpec] | None:
        def read() -> list[ArgSpec] | None:  # default_fp is the current runtime's
            specs = input_specs(self._pyfunc, self._signature_option)
            return None if any(s is None for s in specs) else specs  # type: ignore[return-value]

        return self.memo.get("declared", read)

    def signature(self, in_specs: Sequence[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        return self.memo.get(("signature", tuple(in_specs)), lambda: self._signature(list(in_specs)))

    def _signature(self, in_specs: list[ArgSpec]) -> tuple[list[ArgSpec], Tree]:
        ann = output_specs(self._pyfunc)
        if isinstance(ann, ArgSpec):
            return [_precision(ann, in_specs)], 0
        if isinstance(ann, list) and all(s.shape != () for s in ann):
            return [_precision(s, in_specs) for s in ann], flat_tree(len(ann), False)
        # no annotation, or a tuple one with scalars (which Taichi 1.7.4 cannot compile): ask the body
        if impl.inside_kernel():
            out_specs, is_tuple = probe_in_kernel(self.tifunc, in_specs)
        else:
            out_specs, is_tuple, kernel = probe_outputs(self.tifunc, in_specs, identifier(self.name))
            self._counter.add(kernel)
            uses(kernel)
        return [_precision(s, in_specs) for s in out_specs], flat_tree(len(out_specs), not is_tuple)

    def body_for(self, in_specs: Sequence[ArgSpec]) -> Any:
        return self.tifunc


def _precision(spec: ArgSpec, in_specs: Sequence[ArgSpec]) -> ArgSpec:
    """A float output takes the inputs' float precision (NOTE: [Float precision] in ``_signature``)."""
    if not spec.is_float:
        return spec
    return ArgSpec(spec.name, spec.shape, result_float(in_specs))


def _accepts(f: Any, options: dict[str, Any]) -> bool:
    return bool(getattr(f, "_is_taichi_function", False)) and not getattr(f, "_is_wrapped_kernel", False)


def _make(f: Any, *, inputs: Any = None, outputs: Any = None, signature: Any = None, name: str | None = None,
          constants: Any = None) -> FuncFunction:
    if inputs is not None or outputs is not None or constants is not None:
        raise TypeError(
            "td.function: inputs=/outputs=/constants= are for kernels over fields or ndarrays; "
            "a @ti.func takes its values as arguments"
        )
    if getattr(f, "_is_real_function", False):
        raise TypeError(f"td.function: {real_func_refusal(f)}")
    return FuncFunction(f, signature=signature, name=name)


register_kind("@ti.func", _accepts, _make)
