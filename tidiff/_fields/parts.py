"""``td.part(v, 0)``: part of a field, along its leading axes, as a program's input or output.

DiffTaichi programs keep a trajectory in one field with a time axis,
``v = ti.Vector.field(2, float, shape=(T, n, n))``, and optimize its first
slice ``v[0]``. ``v[0]`` is not Taichi syntax for a field, so the part is
spelled ``td.part(v, 0)``: the field and integer indices along its leading
axes, in the field's own indexing (offsets included). As an input its value
is loaded into that slice and the rest of the field holds its current values
(or zeros, for a field declared ``state``); as an output only that slice is
read, and zeroed before each evaluation.

Every declared input and output is a :class:`Part` inside the engine: a whole
field is the part with no index.
"""
from collections.abc import Sequence
from typing import Any

import numpy as np

from .graph import is_field
from .twins import full_shape


class Part:
    """``field[index]`` along leading axes; ``index == ()`` is the whole field.

    Attributes:
        field: the Taichi field.
        index: integer positions along the first ``len(index)`` axes, from 0
            (the field's offset already taken off).
        shape: the NumPy shape of the part (the rest of the field's shape,
            then its element shape).
    """

    def __init__(self, field: Any, index: Sequence[int] = ()) -> None:
        self.field = field
        self.index = tuple(index)
        self.shape = full_shape(field)[len(self.index):]

    @property
    def whole(self) -> bool:
        return not self.index

    def overlaps(self, other: "Part") -> bool:
        """Whether two parts of the same field share an element (one index is a prefix of the other)."""
        n = min(len(self.index), len(other.index))
        return self.field is other.field and self.index[:n] == other.index[:n]

    def of(self, field: Any) -> "Part":
        """The same part of another field of the same shape (a twin, a tangent field)."""
        return Part(field, self.index)

    def take(self, array: np.ndarray) -> np.ndarray:
        """This part of an array holding the whole field."""
        return array[self.index] if self.index else array

    def label(self, name: str) -> str:
        """``"v[0]"`` for messages and specs."""
        return f"{name}[{', '.join(map(str, self.index))}]" if self.index and name else name

    def __repr__(self) -> str:
        return f"td.part({getattr(self.field, 'name', 'field')}, {', '.join(map(str, self.index))})"


def part(field: Any, *index: int) -> "Part":
    """Part of a field along its leading axes, as an input or output of ``td.function``.

    Args:
        field: a Taichi scalar, vector or matrix field.
        *index: one integer per leading axis taken, in the field's own
            indexing (with its offset): ``td.part(v, 0)`` is ``v[0]``, a slice
            of shape ``v.shape[1:]`` plus the element shape.

    Returns:
        A part to list in ``inputs=`` or ``outputs=``: its argument (or
        result) is an array of the part's shape. Parts of one field may be
        both inputs and outputs if they do not overlap.

    Example:
        >>> v = ti.Vector.field(2, ti.f64, shape=(2, 4))       # two steps of 4 points
        >>> loss = ti.field(ti.f64, shape=())
        >>> @ti.kernel
        ... def simulate():
        ...     for i in range(4):
        ...         v[1, i] = 2.0 * v[0, i]
        ...     for i in range(4):
        ...         loss[None] += v[1, i].norm_sqr()
        >>> F = td.function(simulate, inputs=[td.part(v, 0)], outputs=[loss])
        >>> td.grad(F)(np.ones((4, 2)))                      # the part's shape: v.shape[1:] + (2,)
        array([[8., 8.],
               [8., 8.],
               [8., 8.],
               [8., 8.]])
    """
    if not is_field(field):
        raise TypeError(f"td.part(field, *index): expected a Taichi scalar, vector or matrix field, "
                        f"got {type(field).__name__}")
    if not index:
        raise TypeError("td.part(field, *index): give at least one index along the field's leading axes")
    shape = tuple(field.shape)
    if len(index) > len(shape):
        raise ValueError(f"td.part(field, *index): the field has {len(shape)} axes, got {len(index)} indices")
    offset = list(field.snode.ptr.offset) or [0] * len(shape)
    positions = []
    for axis, i in enumerate(index):
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
            raise TypeError(f"td.part(field, *index): indices are integers along leading axes, got {i!r} "
                            f"for axis {axis}")
        position = int(i) - offset[axis]
        if not 0 <= position < shape[axis]:
            raise IndexError(f"td.part(field, *index): index {i} is out of range for axis {axis} "
                             f"(from {offset[axis]} to {offset[axis] + shape[axis] - 1})")
        positions.append(position)
    return Part(field, positions)


def as_part(entry: Any) -> Part:
    """A declared input or output as a :class:`Part` (a field is its whole part)."""
    return entry if isinstance(entry, Part) else Part(entry)
