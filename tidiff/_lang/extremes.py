"""The statements both transforms generate for ``ti.atomic_max`` / ``ti.atomic_min`` in a kernel: which
iteration won, the count of winners per entry, and loops over every entry of the counts.

NOTE: [Atomic extremes in reverse] (``_adjoint/kernels.py``) and NOTE: [Atomic extremes forward]
(``_tangent/kernels.py``) say how each mode uses them.

NOTE: [Winners by kept values] Which iteration won is found by comparing its value with what the field
holds, in loops after the one that computed it, which compute it again. Under Taichi's default
``fast_math`` a value computed again in another loop (where other code surrounds it, its tangent or its
adjoint) can differ in its last bits (a product fused into an add in one loop and not in the other): then
no iteration seems to win and the derivative goes to the old value (conformance net, seed 23: a dot
product under ``ti.select``). So where the parallel loop's iterations are known when the kernel is
transformed (a loop over a field, or ranges of constant integers) and the atomic runs once per iteration
(in no inner loop), the loop that computes the value keeps its bits in a field of one entry per iteration
(an integer field: no derivative of its own), and every later loop compares those bits with the field. Other
atomics keep comparing values computed again.

The adjoint of a kernel cannot keep bits from the kernel itself: its counting loop computes each value
again, in the adjoint (beside the reverse code, which LLVM compiles along with it), and the value the user's
kernel gave the atomic is gone. That too can differ in its last bit (conformance net, seed 8206: a matrix
``norm()`` one unit in the last place above the field's value, so no iteration won and the whole gradient went
to the bound set before the loop, silently). So a value counts as the field's when it is equal or within
``WINNER_TOLERANCE`` of it (``_rules/helpers.py``: 2^-40 of the larger for f64, 2^-18 for f32), in both modes:
candidates that close are tied and split the derivative, where exact arithmetic would give it to one of them.
"""
import ast
import copy
from collections.abc import Callable
from typing import Any

import taichi as ti
from taichi.lang.field import Field

from .naming import RULE_HELPERS, Namer, helper_name
from .nodes import assign, call, compare, if_, name, statement, taichi
from .parse import MISSING, resolve

#: The integer type holding a float's bits.
_BITS = {"f64": ti.i64, "f32": ti.i32, "f16": ti.i16}

#: The fields made for counts and kept values (by id; each lives as long as the kernel naming it).
_OWN: set[int] = set()


def own_field(dtype: Any, shape: tuple[int, ...], offset: tuple[int, ...] | None = None) -> Field:
    """A field of counts or kept values for a generated kernel (NOTE: [Counts read after the kernel])."""
    field = ti.field(dtype, shape=shape, offset=offset)
    mark_own(field)
    return field


def mark_own(field: Field) -> None:
    """Count ``field`` as made by :func:`own_field` (a field program's twin of one is)."""
    _OWN.add(id(field))


def is_own(field: object) -> bool:
    """Whether ``field`` was made by :func:`own_field`.

    NOTE: [Counts read after the kernel] A tangent kernel writes its counts
    of winners and kept values, then reads them in its later loops; its
    adjoint reads them as the kernel left them. Recorded as integer fields
    read anywhere in the launch (as a user's integer field is: the kernel may
    read an entry, then write it), such a launch reads what it then writes,
    and the access log stops keeping anything for the rest of the program:
    second order through atomic maxima followed by an in-place update of the
    target (``y[i] = y[i] * 0.75 + ...``) was wrong, caught by the check and
    computed by forward pushes. Nothing but the kernel's later loops reads
    them, so their reads are recorded after the launch's writes, and a later
    launch of the same kernel keeps what the earlier one left.
    """
    return id(field) in _OWN


class Kept:
    """Where a loop keeps each iteration's value of one atomic (NOTE: [Winners by kept values]): the field's
    name in the generated code, the index naming an iteration, and the names of the target's type and of the
    integer type of its bits (``ti.f64``, ``ti.i64``: the loop holding the atomic names nothing else of the
    target, which stays alone there for the transforms of this code)."""

    def __init__(self, field: str, index: ast.expr, dtype: str, bits: str) -> None:
        self.field, self.index, self.dtype, self.bits = field, index, dtype, bits

    def store(self, value: ast.expr) -> ast.stmt:
        """``kept[I] = ti.bit_cast(ti.cast(value, ti.f64), ti.i64)``."""
        cast = call(taichi("cast"), copy.deepcopy(value), taichi(self.dtype))
        return assign(self.at(), call(taichi("bit_cast"), cast, taichi(self.bits)))

    def won(self, target: ast.Subscript) -> ast.Call:
        """``wins(ti.bit_cast(kept[I], ti.f64), y[i])``."""
        return wins(call(taichi("bit_cast"), self.at(), taichi(self.dtype)), target)

    def at(self) -> ast.Subscript:
        return ast.Subscript(name(self.field), copy.deepcopy(self.index), ast.Load())


class KeptValue(Kept):
    """Kept as values in an array of the target's own type (an ndarray's, which a tangent kernel's code cannot
    name; NOTE: [Scratch arrays]): stored as the atomic stores them, compared as they are."""

    def __init__(self, field: str, index: ast.expr) -> None:
        super().__init__(field, index, "", "")

    def store(self, value: ast.expr) -> ast.stmt:
        """``kept[I] = value``."""
        return assign(self.at(), copy.deepcopy(value))

    def won(self, target: ast.Subscript) -> ast.Call:
        """``wins(kept[I], y[i])``."""
        return wins(self.at(), target)


def kept_field(loop: ast.For, namespace: dict[str, Any], target: Field, helpers: dict[str, Any], namer: Namer,
               hint: str) -> Kept | None:
    """Where the parallel loop ``loop`` keeps the bits of values of ``target``'s type, one integer entry per
    iteration (a new field, named after ``hint`` in ``helpers``); None where the iterations are not known when
    the kernel is transformed."""
    space = iterations(loop, namespace)
    dtype = str(target.dtype)
    bits = _BITS.get(dtype)
    index = loop_index(loop)
    if space is None or bits is None or index is None:
        return None
    shape, offset = space
    field = own_field(bits, shape, offset if any(offset) else None)
    return Kept(helper_name(helpers, namer, field, hint), index, dtype, str(bits))


def loop_index(loop: ast.For) -> ast.expr | None:
    """The index naming one iteration of ``loop``: its counter, or the tuple of its counters; None for any other
    target."""
    target = loop.target
    if isinstance(target, ast.Name):
        return name(target.id)
    if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
        return ast.Tuple([name(e.id) for e in target.elts if isinstance(e, ast.Name)], ast.Load())
    return None


def bits_of(dtype: Any) -> Any:
    """The integer type holding the bits of a float type (``ti.f64`` -> ``ti.i64``), or None."""
    return _BITS.get(str(dtype))


def array_extents(loop: ast.For, arrays: set[str], namespace: dict[str, Any]
                  ) -> str | list[int | tuple[str, int]] | None:
    """The extents of a parallel loop of an ndarray kernel from 0, each a constant or ``(array, axis)`` for
    ``a.shape[axis]`` of an ndarray parameter ``a`` (``range(x.shape[0])``, ``ti.ndrange(n, x.shape[1])``), or the
    name of the array a loop runs over (``for i in a``, ``ti.grouped(a)``, ``a`` of scalars): known at each launch;
    None for other loops (NOTE: [Winners by kept values])."""
    over = loop.iter
    if isinstance(over, ast.Call) and len(over.args) == 1 and resolve(over.func, namespace) is ti.grouped:
        over = over.args[0]
    if isinstance(over, ast.Name) and over.id in arrays:
        return over.id
    if not isinstance(over, ast.Call) or over.keywords:
        return None
    func = resolve(over.func, namespace)
    if not (func is range and len(over.args) == 1 or func is ti.ndrange):
        return None
    extents: list[int | tuple[str, int]] = []
    for arg in over.args:
        if isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Attribute) and arg.value.attr == "shape" \
                and isinstance(arg.value.value, ast.Name) and arg.value.value.id in arrays \
                and isinstance(arg.slice, ast.Constant) and type(arg.slice.value) is int:
            extents.append((arg.value.value.id, arg.slice.value))
            continue
        if any(isinstance(n, ast.Name) and n.id in arrays for n in ast.walk(arg)):
            return None  # (a parameter, not the module's global of that name)
        constant = _constant(arg, namespace)
        if constant is None:
            return None
        extents.append(constant)
    return extents


def iterations(loop: ast.For, namespace: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``(shape, offset)`` of a loop over a field (``for i in x``, ``for I in ti.grouped(x)``) or over ranges of
    constant integers (``range``, ``ti.ndrange``)."""
    over = loop.iter
    if isinstance(over, ast.Call) and resolve(over.func, namespace) is ti.grouped and len(over.args) == 1:
        over = over.args[0]
    found = resolve(over, namespace)
    if isinstance(found, Field):
        offset = tuple(found.snode.ptr.offset) or (0,) * len(found.shape)
        return tuple(found.shape), offset
    if not isinstance(over, ast.Call) or over.keywords:
        return None
    func = resolve(over.func, namespace)
    if func is range:
        bounds = [_constant(a, namespace) for a in over.args]
        if not 1 <= len(bounds) <= 2 or any(b is None for b in bounds):
            return None
        lo, hi = (0, bounds[0]) if len(bounds) == 1 else (bounds[0], bounds[1])
        assert lo is not None and hi is not None
        return (max(hi - lo, 0),), (lo,)
    if func is ti.ndrange:
        extents: list[int] = []
        starts: list[int] = []
        for a in over.args:
            pair = [_constant(e, namespace) for e in a.elts] if isinstance(a, ast.Tuple) else [0, _constant(a,
                                                                                                           namespace)]
            if len(pair) != 2 or pair[0] is None or pair[1] is None:
                return None
            extents.append(max(pair[1] - pair[0], 0))
            starts.append(pair[0])
        return tuple(extents), tuple(starts)
    return None


def _constant(node: ast.expr, namespace: dict[str, Any]) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _constant(node.operand, namespace)
        return None if inner is None else -inner
    found = resolve(node, namespace)
    return found if type(found) is int and found is not MISSING else None


def once_per_iteration(loop: ast.For, site: ast.AST) -> bool:
    """Whether the statement ``site`` stands once in the loop's body, in no loop inside it."""
    wanted = ast.dump(site)
    found: list[bool] = []  # per place it stands: whether inside an inner loop

    def walk(node: ast.AST, inner: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if ast.dump(child) == wanted:
                found.append(inner)
            walk(child, inner or isinstance(child, (ast.For, ast.While)))

    for stmt in loop.body:
        if ast.dump(stmt) == wanted:
            found.append(False)
        walk(stmt, isinstance(stmt, (ast.For, ast.While)))
    return found == [False]


def type_of(field: str) -> ast.Attribute:
    """``field.dtype``: a global field's element type, as the code names it."""
    return ast.Attribute(name(field), "dtype", ast.Load())


def won(value: ast.expr, dtype: ast.expr, target: ast.Subscript) -> ast.Call:
    """``wins(ti.cast(value, dtype), field[i])``: whether ``value`` is what the field (or array) holds after the
    kernel (compared in its element type ``dtype``, as the atomic compared them)."""
    return wins(call(taichi("cast"), copy.deepcopy(value), copy.deepcopy(dtype)), target)


def wins(value: ast.expr, target: ast.Subscript) -> ast.Call:
    """``_tidiff_rules.wins(value, field[i])``: the value, computed again, is the one the atomic left (NOTE:
    [Winners by kept values])."""
    return call(ast.Attribute(name(RULE_HELPERS), "wins", ast.Load()), value, copy.deepcopy(target))


def counted(value: ast.expr, dtype: ast.expr, target: ast.Subscript, ties: str, kept: Kept | None = None) -> ast.If:
    """``if <won>: ti.atomic_add(ties[i], 1)``: one more winner of entry ``i`` (by the kept bits, if any)."""
    at = ast.Subscript(name(ties), copy.deepcopy(target.slice), ast.Load())
    test = won(value, dtype, target) if kept is None else kept.won(target)
    return if_(test, [statement(call(taichi("atomic_add"), at, 1))])


def share(amount: ast.expr, ties: str, target: ast.Subscript) -> ast.BinOp:
    """``amount / ties[i]``: a winner's part of what entry ``i`` has (a tie splits it evenly)."""
    return ast.BinOp(copy.deepcopy(amount), ast.Div(),
                     call(taichi("max"), ast.Subscript(name(ties), copy.deepcopy(target.slice), ast.Load()), 1))


def counts_ndim(helpers: dict[str, Any], ties: str) -> int:
    """How many axes the counts ``ties`` have: a field's (named in ``helpers``), or an array's (at least one:
    NOTE: [Scratch arrays])."""
    return len(helpers[ties].shape) if ties in helpers else 1


def each_entry(ties: str, ndim: int, fresh: Callable[[str], str],
               body: Callable[[ast.expr], list[ast.stmt]]) -> list[ast.stmt]:
    """``body(index)`` for every entry of the counts ``ties`` (a field or an ndarray of ``ndim`` axes): a loop over
    ``ti.grouped(ties)``, or the statements alone for a 0-d field (index ``None``)."""
    if not ndim:
        return body(ast.Constant(None))
    entry = fresh("entry")
    return [ast.For(ast.Name(entry, ast.Store()), call(taichi("grouped"), ties), body(name(entry)), [])]


def zeroed(ties: str, ndim: int, fresh: Callable[[str], str]) -> list[ast.stmt]:
    """Every count back to 0."""
    return each_entry(ties, ndim, fresh, lambda at: [assign(ast.Subscript(name(ties), at, ast.Load()), 0)])


def lost(ties: str, ndim: int, fresh: Callable[[str], str], gradient: ast.expr) -> list[ast.stmt]:
    """``gradient[i] = 0`` wherever an iteration won entry ``i`` (the old value lost)."""
    def body(at: ast.expr) -> list[ast.stmt]:
        some = compare(ast.Subscript(name(ties), at, ast.Load()), ast.Gt(), 0)
        return [if_(some, [assign(ast.Subscript(copy.deepcopy(gradient), copy.deepcopy(at), ast.Load()), 0.0)])]
    return each_entry(ties, ndim, fresh, body)

