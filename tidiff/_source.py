"""``td.source``: the generated Taichi source behind a transformed function."""
from ._function import as_function


def source(f, *example_args):
    """The generated ``@ti.func`` source of a transformed function, readable for debugging.

    Args:
        f: a transformed function (``td.grad(p)``, ``td.hessian(f)``, ...).
        example_args: for functions without annotations, arguments whose
            shapes select the specialization to show.

    Returns:
        The source text: the transform's own body followed by the tangent
        functions it calls.

    Example:
        >>> print(td.source(td.grad(p)))
    """
    from ._tangent import source as tangent_source

    fn = as_function(f, "td.source")
    specs = fn.specs_for(example_args) if example_args or fn.declared_specs() is None else fn.declared_specs()
    if specs is None:
        raise TypeError(f"td.source({fn.name}): the function has no annotations; pass example arguments")
    body = fn.body_for(specs)
    if body is None:
        raise TypeError(f"td.source({fn.name}): this function has no generated Taichi source")
    texts = [getattr(fn, "source", None) or ""]
    namespace = getattr(getattr(body, "__wrapped__", None), "__globals__", {})
    for value in namespace.values():
        try:
            texts.append(tangent_source(value))
        except Exception:
            continue
    return "\n".join(t for t in texts if t)
