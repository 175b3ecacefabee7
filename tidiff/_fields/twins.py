"""Tidiff-owned copies of the user's fields, with gradients.

A field declared without ``needs_grad`` can never get a usable ``.grad``
once its tree is materialized (DESIGN, "Facts about Taichi 1.7.4"), and the
user's fields must never change. So every field a program touches gets a
*twin* of the same kind, dtype, shape and offset, with ``.grad`` when its
dtype is real, all placed in one ``ti.FieldsBuilder`` tree that
:meth:`Twins.destroy` can free (forward mode runs tangent kernels over
tangent fields of their own, :mod:`.tangent`: twins need no ``.dual``).

Data moves through ``from_numpy``/``to_numpy``/``fill(0)``, whose kernels
Taichi compiles once per field and array dtype, or, for a program's many
fields at once, through one kernel per list of fields (``load_all``,
``read_all``, ``zero_all``: one compile and one launch where Taichi's helpers
take one each). A call compiles nothing new.
"""
from collections.abc import Sequence
from typing import Any

import numpy as np
import taichi as ti
from taichi.lang import impl
from taichi.lang.field import Field
from taichi.lang.matrix import MatrixField
from taichi.lang.util import to_numpy_type

from .._arrays import contiguous, is_tensor, zeros
from .._lang import extremes
from .._lang.compile import compile_source


def element_shape(field: Field) -> tuple[int, ...]:
    """``()`` for a scalar field, ``(n,)`` for a vector field, ``(n, m)`` for a matrix field."""
    if not isinstance(field, MatrixField):
        return ()
    return (field.n,) if field.ndim == 1 else (field.n, field.m)


def full_shape(field: Field) -> tuple[int, ...]:
    """The shape of the NumPy array that holds ``field``: its shape, then its element shape."""
    return tuple(field.shape) + element_shape(field)


def numpy_dtype(field: Field) -> np.dtype[Any]:
    """The NumPy dtype of the field's elements."""
    return np.dtype(to_numpy_type(field.dtype))


def is_real(field: Field) -> bool:
    """Whether the field's dtype is a float, i.e. it can carry gradients and tangents."""
    return np.issubdtype(numpy_dtype(field), np.floating)


def _new_like(field: Field, differentiable: bool) -> Field:
    """An unplaced field of the same kind and dtype as ``field``."""
    flags = {"needs_grad": differentiable}
    if not isinstance(field, MatrixField):
        return ti.field(field.dtype, **flags)
    if field.ndim == 1:
        return ti.Vector.field(field.n, field.dtype, **flags)
    return ti.Matrix.field(field.n, field.m, field.dtype, **flags)


#: NOTE: [Trees a process holds] Taichi 1.7.4 holds at most 512 trees of fields in a process (on the CPU the
#: 513th crashes the process, a segfault at its first launch, without an error). Every field program adds trees
#: of its own (its twins, its tangent fields, a time loop's stores), so tidiff refuses to start one more there.
TREES_A_PROCESS_HOLDS = 512


def fields_builder(what: str) -> Any:
    """A ``ti.FieldsBuilder`` for tidiff's fields of ``what``; RuntimeError where Taichi holds no more trees."""
    trees = impl.get_runtime().prog.get_snode_tree_size()
    if trees >= TREES_A_PROCESS_HOLDS:
        raise RuntimeError(
            f"{what}: Taichi holds at most {TREES_A_PROCESS_HOLDS} trees of fields in a process and this one has "
            f"{trees}; one more crashes the process (NOTE: [Trees a process holds] in tidiff/_fields/twins.py). "
            "Each program over fields adds two to four (its twins and tangent fields): make fields and "
            "td.function(...) once and call it again, or continue in a new process")
    return ti.FieldsBuilder()


class Twins:
    """The twin of each field, in one tree."""

    def __init__(self, fields: Sequence[Field], what: str = "a program over fields") -> None:
        builder = fields_builder(what)
        self._twins: dict[int, Field] = {}
        for field in fields:
            twin = _new_like(field, is_real(field))
            offset = list(field.snode.ptr.offset) or None
            members = (twin, twin.grad) if is_real(field) else (twin,)
            for member in members:
                builder.dense(ti.axes(*range(len(field.shape))), tuple(field.shape)).place(member, offset=offset)
            self._twins[id(field)] = twin
            if extremes.is_own(field):  # NOTE: [Counts read after the kernel]
                extremes.mark_own(twin)
        self._tree = builder.finalize(raise_warning=False)
        self.originals = {id(field): field for field in fields}

    def __getitem__(self, field: Field) -> Field:
        return self._twins[id(field)]

    def as_mapping(self) -> dict[int, Field]:
        """``id(user field) -> twin``, for :mod:`.rebind`."""
        return dict(self._twins)

    def real(self) -> list[Field]:
        """Twins that have gradients."""
        return [self._twins[key] for key, field in self.originals.items() if is_real(field)]

    def destroy(self) -> None:
        """Free the twins' memory; the program cannot run afterwards."""
        self._tree.destroy()


def load(twin: Field, array: Any) -> None:
    """Write an array (already of the twin's shape and dtype) into a twin or its grad: NumPy, or a tensor on
    Taichi's device (NOTE: [Tensors in place] in ``_arrays``), read where it is."""
    array = contiguous(array)
    if is_tensor(array):
        twin.from_torch(array)
    else:
        twin.from_numpy(array)


def read(twin: Field, device: Any = None) -> Any:
    """A twin (or its grad) as an array of the user-facing shape: NumPy, or a tensor made on ``device``."""
    keep = {"keep_dims": True} if isinstance(twin, MatrixField) and twin.ndim == 2 else {}
    if device is not None:
        return twin.to_torch(device=device, **keep)
    return twin.to_numpy(**keep)


def zero(twin: Field) -> None:
    """Zero a twin (or its grad); always ``fill(0)`` so Taichi compiles one kernel per field."""
    twin.fill(0)


def zero_all(twins: Sequence[Field]) -> None:
    """Zero several twins (or grads) in one launch: one kernel compiled per list of fields, where ``fill`` compiles
    one per field (about 35 ms each on a 2-core CPU, most of a first call's excess over ``ti.ad.Tape``'s)."""
    if len(twins) == 1:
        zero(twins[0])
    elif twins:
        _zeroed(tuple(twins))


def load_all(pairs: Sequence[tuple[Field, Any]]) -> None:
    """Write several arrays into twins in one launch (as :func:`zero_all`): one kernel compiled per list of
    fields and array types, where ``from_numpy`` compiles one per field. 0-d fields and fields with an offset
    are loaded one by one."""
    many = [(twin, contiguous(array)) for twin, array in pairs if _plain(twin)]
    if len(many) < 2:
        many = []
    fused = {id(twin) for twin, _ in many}
    for twin, array in pairs:
        if id(twin) not in fused:
            load(twin, array)
    if many:
        _copier(len(many), "in")(tuple(t for t, _ in many), *(a for _, a in many))


def read_all(twins: Sequence[Field], device: Any = None) -> list[Any]:
    """Several twins (or grads) as arrays (as :func:`read`), copied out in one launch where more than one is not
    0-d (as :func:`load_all`)."""
    many = [t for t in twins if _plain(t)]
    if len(many) < 2:
        return [read(t, device) for t in twins]
    arrays = {id(t): zeros(full_shape(t), numpy_dtype(t), device) for t in many}
    _copier(len(many), "out")(tuple(many), *(arrays[id(t)] for t in many))
    return [arrays[id(t)] if id(t) in arrays else read(t, device) for t in twins]


_COPIERS: dict[tuple[int, str], Any] = {}


def _copier(n: int, way: str) -> Any:
    """``copy_n(fields, a0, ..., a{n-1})``: ``fields[k]`` from the array ``ak`` ("in") or into it ("out"); an
    array has the field's shape, then the element's."""
    if (n, way) not in _COPIERS:
        params = ", ".join(f"a{k}: ti.types.ndarray()" for k in range(n))
        body = "".join(f"    _copy_{way}(fields[{k}], a{k})\n" for k in range(n))
        namespace = {"ti": ti, "_copy_in": _copy_in, "_copy_out": _copy_out}
        _COPIERS[(n, way)] = compile_source(
            f"@ti.kernel\ndef copy_{way}_{n}(fields: ti.template(), {params}):\n{body}", f"copy_{way}_{n}",
            namespace, tag="copy")
    return _COPIERS[(n, way)]


@ti.func
def _copy_in(field: ti.template(), array: ti.template()):  # type: ignore[no-untyped-def, valid-type]
    for index in ti.grouped(field):
        if ti.static(len(element_shape(field)) == 0):
            field[index] = array[index]
        elif ti.static(len(element_shape(field)) == 1):
            for p in ti.static(range(field.n)):
                field[index][p] = array[index, p]
        else:
            for p, q in ti.static(ti.ndrange(field.n, field.m)):
                field[index][p, q] = array[index, p, q]


@ti.func
def _copy_out(field: ti.template(), array: ti.template()):  # type: ignore[no-untyped-def, valid-type]
    for index in ti.grouped(field):
        if ti.static(len(element_shape(field)) == 0):
            array[index] = field[index]
        elif ti.static(len(element_shape(field)) == 1):
            for p in ti.static(range(field.n)):
                array[index, p] = field[index][p]
        else:
            for p, q in ti.static(ti.ndrange(field.n, field.m)):
                array[index, p, q] = field[index][p, q]


def _plain(field: Field) -> bool:
    """Not 0-d and without an offset: copied by the fused kernels (others by Taichi's own, one by one)."""
    return len(field.shape) > 0 and not any(field.snode.ptr.offset)


def _is_scalar_field(field: Field) -> bool:  # a 0-d field: no struct-for over it
    return len(field.shape) == 0


@ti.kernel
def _zeroed(fields: ti.template()):  # type: ignore[no-untyped-def, valid-type]
    for k in ti.static(range(len(fields))):
        if ti.static(_is_scalar_field(fields[k])):
            fields[k][None] = ti.zero(fields[k][None])
        else:
            for index in ti.grouped(fields[k]):
                fields[k][index] = ti.zero(fields[k][index])
