"""Error classes and message helpers shared by every module."""
from collections.abc import Sequence


class TransformError(TypeError):
    """A construct the tangent transform cannot differentiate.

    Carries where it stands (file, line) and what it is, and suggests
    ``td.custom_jvp`` as the way around it.
    """

    def __init__(self, construct: str, filename: str | None = None, lineno: int | None = None,
                 hint: str | None = None) -> None:
        self.construct = construct
        self.filename = filename
        self.lineno = lineno
        where = f"{filename}:{lineno}: " if filename and not filename.startswith("<tidiff-") else ""
        hint = hint or "wrap the enclosing @ti.func with td.custom_jvp to give its derivative"
        super().__init__(f"{where}cannot differentiate {construct}; {hint}")


def where_hint(form: str, name: str | None, call: bool = False) -> str:
    """The way around a construct the transform refuses, for where it stands.

    ``form`` is what is being transformed: ``"kernel"`` (which cannot be
    wrapped: its code must move into a ``@ti.func`` that can),
    ``"func"`` (a ``@ti.func``, which can) or ``"helper"`` (a plain Python
    function, which must become a ``@ti.func`` first); ``call`` says the
    construct is a call, which can also move into a ``@ti.func`` of its own.
    ``name`` names the function (None for a lambda).
    """
    if form == "kernel":
        what = "the call" if call else "that code"
        return f"move {what} into a @ti.func and give that a rule with td.custom_jvp (a kernel cannot be wrapped)"
    if form == "helper":  # name None: a lambda
        helper = f"decorate the helper `{name}` with @ti.func" if name else "write the lambda as a @ti.func"
        return (f"{helper} and give it a rule with td.custom_jvp"
                + (", or move the call into a @ti.func of its own and wrap that" if call else ""))
    return (f"wrap the enclosing @ti.func `{name}` with td.custom_jvp to give its derivative"
            + (", or move the call into a @ti.func of its own and wrap that" if call else ""))


def describe_shape(shape: Sequence[int]) -> str:
    """`()` reads as 'a scalar', `(3,)` as 'shape (3,)'."""
    return "a scalar" if tuple(shape) == () else f"shape {tuple(shape)}"


class NoForwardRule(TransformError):
    """Forward mode reached a ``td.custom_vjp`` function that has no jvp rule.

    As in JAX, a cotangent rule gives reverse mode only; transforms that can
    run in reverse mode choose it when they meet this.
    """

    def __init__(self, function: str, filename: str | None = None, lineno: int | None = None) -> None:
        self.function = function
        super().__init__(
            f"`{function}` in forward mode: it is a td.custom_vjp function without a jvp rule "
            "(as in JAX, its bwd rule gives reverse mode only)",
            filename, lineno,
            f"use reverse mode (td.grad, td.vjp, td.jacrev), or give it a forward rule too with "
            f"{function}.defjvp(...)",
        )


def taichi_cannot_reverse(name: str, error: BaseException) -> "TransformError | None":
    """Taichi's reverse-mode refusals from ``kernel.grad`` (a bare "Not supported.", or "Invalid program input for
    autodiff") as a TransformError naming the kernel; None for another error. Reverse mode of field programs and
    ndarray kernels is Taichi's (docs/limits.md)."""
    first = str(error).strip().splitlines()[0].strip() if str(error).strip() else ""
    forward = "use forward mode (td.jvp, td.jacfwd), which is tidiff's own tangent transform"
    if "Not supported" in str(error):
        what = (f"Taichi's reverse mode has no rule for an op in it ({first}); Taichi 1.7.4 lacks ones for ti.tan and "
                "ti.round, among others")
        hint = f"compute that value in a kernel the inputs do not reach, or {forward}"
    elif "Invalid program input for autodiff" in str(error):
        what = f"Taichi's reverse mode refuses its structure ({first.split('] ')[-1]})"
        hint = f"split the kernel as Taichi asks (its loop and the statements outside it in two kernels), or {forward}"
    else:
        return None
    return TransformError(f"the kernel `{name}` in reverse mode: {what}", hint=hint)
