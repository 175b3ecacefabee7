"""A return annotation of a narrower float type, spelled out as the cast Taichi applies.

NOTE: [Narrowing return annotations] Taichi casts what a ``@ti.func`` returns
to its return annotation: ``def f(x: vec3) -> ti.f32: return x.dot(x) + 1e-9``
computes in float64 and returns float32. The transforms generate functions of
their own, without the user's annotation, and returned the float64 value:
``td.value_and_grad(f)(x)[0]`` was ``0.140000001`` where ``f(x)`` is
``0.14000000059604645`` (outside code, after JAX's guarantee that the two
agree). Where the annotation is a float type narrower than float64 (``ti.f32``,
``ti.f16``, or a vector or matrix type of one), each ``return e`` of the parsed
tree becomes ``return ti.cast(e, <that float type>)``, which every transform
differentiates as any cast: values and derivatives come out as ``f(x)`` does.
Wider or equal annotations change no value and are left alone, as are tuple
annotations.
"""
import ast
from typing import Any

import taichi as ti
from taichi.lang.matrix import MatrixType

_NARROW = (ti.f32, ti.f16)


def narrowing_returns_cast(tree: ast.FunctionDef, resolve: Any, namespace: dict[str, Any]) -> None:
    """Rewrite, in place, ``tree``'s returns to cast to a narrower float return annotation (see the NOTE);
    ``resolve(node)`` is the object an annotation stands for."""
    if tree.returns is None:
        return
    annotation = resolve(tree.returns)
    dtype = annotation.dtype if isinstance(annotation, MatrixType) else annotation
    if not any(dtype is t for t in _NARROW):
        return
    namespace["_tidiff_cast"], namespace["_tidiff_return_dtype"] = ti.cast, dtype
    for node in ast.walk(tree):
        if isinstance(node, ast.Return) and node.value is not None and not isinstance(node.value, ast.Tuple):
            call = ast.Call(ast.Name("_tidiff_cast", ast.Load()),
                            [node.value, ast.Name("_tidiff_return_dtype", ast.Load())], [])
            node.value = ast.copy_location(call, node.value)
