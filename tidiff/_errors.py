"""Error classes and message helpers shared by every module."""


class TransformError(TypeError):
    """A construct the tangent transform cannot differentiate.

    Carries where it stands (file, line) and what it is, and suggests
    ``td.custom_jvp`` as the way around it.
    """

    def __init__(self, construct, filename=None, lineno=None, hint=None):
        self.construct = construct
        self.filename = filename
        self.lineno = lineno
        where = f"{filename}:{lineno}: " if filename else ""
        hint = hint or "wrap the enclosing @ti.func with td.custom_jvp to give its derivative"
        super().__init__(f"{where}cannot differentiate {construct}; {hint}")


def describe_shape(shape):
    """`()` reads as 'a scalar', `(3,)` as 'shape (3,)'."""
    return "a scalar" if tuple(shape) == () else f"shape {tuple(shape)}"
