"""``td.source``: the generated Taichi source behind a transformed function."""
from __future__ import annotations

from typing import Any

from ._lang.compile import generated_sources
from ._protocol import as_function


def source(f: Any, *example_args: Any) -> str:
    """The generated ``@ti.func`` source of a transformed function, readable for debugging.

    Args:
        f: a transformed function (``td.grad(p)``, ``td.hessian(f)``, ...).
        example_args: for functions without annotations, arguments whose
            shapes select the specialization to show.

    Returns:
        The source text: the transform's own body first, then every
        generated function it calls (tangent functions named ``<f>_jvp``,
        tangents of ``x`` named ``dx``).

    Example:
        >>> @ti.func
        ... def p(x: ti.f64) -> ti.f64:
        ...     return x ** 3 - 3 * x
        >>> print(td.source(td.grad(p)))
        @ti.func
        def grad_p(x):
            t_0 = p_jvp(x, ti.cast(1.0, ti.f64))
            J_0_0 = t_0[1]
            return J_0_0
        <BLANKLINE>
        @ti.func
        def p_jvp(x: ti.f64, dx: ti.f64):
            pow = x ** 3
            dpow = 3 * x ** 2 * dx
            mul = 3 * x
            dmul = 3 * dx
            return (pow - mul, dpow - dmul)
        <BLANKLINE>
    """
    fn = as_function(f, "td.source")
    specs = fn.declared_specs() if not example_args else fn.specs_for(example_args)
    if specs is None:
        raise TypeError(f"td.source({fn.name}): the function has no annotations; pass example arguments")
    body = fn.body_for(specs)
    if body is None and hasattr(fn, "kernel_source"):  # an ndarray kernel's tangent: a generated kernel
        return fn.kernel_source(specs)
    if body is None:
        raise TypeError(f"td.source({fn.name}): this function has no generated Taichi source")
    texts = generated_sources(body)
    if not texts:
        raise TypeError(f"td.source({fn.name}): {fn.name} is user code, not generated; transform it first")
    return "\n".join(texts)

