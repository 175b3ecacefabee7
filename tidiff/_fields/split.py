"""A kernel whose loops overwrite what an earlier loop of it wrote and a later one read, run loop by loop.

NOTE: [Kernels run loop by loop] A kernel's top-level loops run one after another, as separate launches would. Its
adjoint reads the fields as the whole kernel left them, so where a loop reads what an earlier loop of the same
kernel wrote and that is then overwritten (``y[i] = ti.sin(x[i])``, then ``y[i] = y[i] * x[i] + 1``), the adjoint of
the reading loop reads the later value: the first call's check found it wrong, warned, and the gradient came by
forward pushes, one program run per input. A program's own copy of such a kernel (over its twin fields,
``rebind.py``) runs instead as one kernel per top-level loop, each with the kernel's parameters: the recorder sees a
launch per loop and keeps what each overwrites that an earlier one read (NOTE: [Overwritten values kept]), and every
launch has tidiff's adjoint. Fields are seen where the kernel and the funcs written out in it (NOTE: [Funcs that write
fields, inlined]) index them by name. Forward mode and the tangent program run the kernel whole, as their tangent
kernels are exact.

NOTE: [Top-level statements of a kernel run loop by loop] Beside its loops (each with its ``ti.loop_config``), a
kernel's top level may hold statements that write fields or call (``loss[None] = 0.0``): each runs in the part of
the loop before it (those before the first loop, in the first part), serially after that loop as in the whole
kernel and before the next part. It may also assign locals (``c = a * 2.0``) once each, which a part assigns again
before its statements where it reads them: taken where the value reads no field the kernel writes and calls only
Taichi's own functions, so that every part computes the value the kernel did, and where no loop assigns the local
but for one loop summing into it (``total = 0.0``, then ``total += e`` in a loop, then ``loss[None] = total`` after
it), read in that loop's part and later ones (NOTE: [Sums handed to a later loop]). Anything else at the top level
(a ``return``, an ``if``, a local assigned twice) runs the kernel whole, checked (NOTE: [Checking Taichi's reverse
mode]).

NOTE: [Sums handed to a later loop] A launch cannot hand a local to the next, so a sum a later loop reads (a softmax:
``total += y[i]``, then ``y[i] = y[i] / total``) made the kernel run whole, checked, found wrong and computed by
forward pushes. The part of the summing loop now ends by storing the sum in a 0-d field of its own
(``total_handed[None] = total``: of the default float type, with a gradient, in a tree made with the program's copy
of the kernel), and each later part that reads it starts by loading it, then computes again the locals computed
from it that it reads (``mean = total / N``). The field is one more field of the program: the store's adjoint
reads and clears its gradient, the loads' adjoints add into it, and a later launch overwriting it keeps what an
earlier one read (NOTE: [Overwritten values kept]). So is a top-level local whose entry a loop writes (``c[0] =
e`` in a serialized loop): it is handed on as that loop's part left it. Taken where such a local starts as floats:
``0.0``, a vector or matrix of float constants (``ti.Vector([0.0, 0.0])``: a 0-d vector field), or ``ti.zero`` of
such a local (a tangent kernel's ``dtotal``); any other start keeps the kernel whole.
"""
import ast
import copy
from typing import Any

import taichi as ti
from taichi.lang import impl
from taichi.lang.field import Field
from taichi.lang.kernel_impl import Kernel

from .._lang.activity import written_names
from .._lang.callees import is_taichi_func
from .._lang.compile import kernel_like
from .._lang.inline import inlined
from .._lang.naming import Namer, names_in, taichi_name
from .._lang.objects import bind
from .._lang.parse import MISSING, parse, resolve, without_docstring
from .._lang.serial import configures, serializes
from .twins import fields_builder


def loop_parts(kernel: Any) -> list[Any] | None:
    """One ``@ti.kernel`` per top-level loop of ``kernel`` (a program's copy of a module-level kernel) where
    a loop overwrites what a loop before it read from a loop before that (NOTE: [Kernels run loop by loop]);
    None where the kernel runs whole."""
    if getattr(kernel, "_is_classkernel", False):
        return None
    try:
        parsed = inlined(bind(parse(kernel), None))
    except Exception:  # noqa: BLE001 -- a kernel tidiff cannot read runs whole, as Taichi runs it
        return None
    namer = Namer(names_in(parsed.tree) | set(parsed.namespace))
    found = _loops(without_docstring(parsed.tree.body), parsed.namespace, _values(parsed.tree, parsed.namespace),
                   namer)
    if found is None:
        return None
    groups, handed = found
    if len(groups) < 2 or not (_overwrites_a_read_write(groups, parsed.namespace)
                               or any(_recurs(group, parsed.namespace) for group in groups)):
        return None
    namespace = dict(parsed.namespace)
    taichi = taichi_name(namer, namespace)
    namespace[taichi] = ti
    if handed:  # NOTE: [Sums handed to a later loop]
        builder = fields_builder(f"the kernel {parsed.tree.name} run loop by loop")
        for field, shape in handed.items():
            namespace[field] = _scalar_or_matrix_field(shape)
            builder.place(namespace[field], namespace[field].grad)
        builder.finalize(raise_warning=False)
    return [kernel_like(parsed.tree, f"{parsed.tree.name}_loop_{k}", copy.deepcopy(group), namespace, taichi,
                        "loop-of-kernel") for k, group in enumerate(groups)]


def _loops(body: list[ast.stmt], namespace: dict[str, Any], values: set[str], namer: Namer
           ) -> tuple[list[list[ast.stmt]], dict[str, tuple[int, ...]]] | None:
    """The kernel's top-level loops, each with the statements after it up to the next loop (those before the first
    loop and each ``ti.loop_config(...)`` with the loop after them), and before them again every top-level local
    they read (NOTE: [Top-level statements of a kernel run loop by loop]), and the 0-d fields that hand sums on,
    by name, with the shape of their element (NOTE: [Sums handed to a later loop]); None where the kernel cannot
    be run so."""
    groups: list[list[ast.stmt]] = []
    definitions: dict[str, ast.stmt] = {}
    stood: dict[str, int] = {}
    pending: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, ast.For) and not stmt.orelse:
            groups.append(pending + [stmt])
            pending = []
        elif pending and configures(pending[-1], namespace):  # a loop's configuration comes right before it
            return None
        elif configures(stmt, namespace):
            pending.append(stmt)
        elif _stores_no_name(stmt) and not written_names(stmt) & definitions.keys():  # not into a local's entry
            (groups[-1] if groups else pending).append(stmt)
        elif (name := _defined(stmt)) is not None and name not in definitions:
            definitions[name] = stmt
            stood[name] = len(groups) - 1  # after which loop (-1: before the first)
            (groups[-1] if groups else pending).append(stmt)
        else:
            return None
    if not groups or pending:
        return None
    homes = _homes(definitions, groups, namespace, values)
    if homes is None or any(stood[name] > home for name, home in homes.items()):
        return None
    def stays(stmt: ast.stmt, k: int) -> bool:  # in part k where it stood: not a local's assignment, but for one
        name = _defined(stmt)  # computed from the part's sum after its loop
        return name is None or homes.get(name) == k and stood[name] == k

    parts, sums, handed, shapes = [], set(homes), {}, {}
    summed = {n for group in groups for stmt in group if isinstance(stmt, ast.For)  # (``c[0] = e`` too)
              for n in _names(stmt, ast.Store) | written_names(stmt)}
    for k, group in enumerate(groups):  # the sum's start before the part's statements; other locals assigned
        kept = [stmt for stmt in group if stays(stmt, k)]  # again before the statements that read them
        starts = [definitions[name] for name, home in homes.items() if home == k and stood[name] < k]
        earlier = _handed_in(starts + kept, definitions, {n: h for n, h in homes.items() if h < k}, summed,
                             namespace)
        if earlier is None:
            return None
        for name in earlier:
            if name in summed and name not in handed:
                handed[name] = namer.fresh(f"{name}_handed")
                shapes[handed[name]] = _start_shape(definitions[name], definitions, namespace) or ()
        received = [ast.Assign([ast.Name(n, ast.Store())], _entry(handed[n], ast.Load())) for n in earlier
                    if n in summed] + [copy.deepcopy(definitions[n]) for n in earlier if n not in summed]
        parts.append(_defined_before(received + starts + kept, definitions, sums) + received + copy.deepcopy(starts)
                     + kept)  # (a local computed from a sum may read one computed from the parameters)
    for k, part in enumerate(parts):  # each sum a later part reads, handed on by the part it is summed in
        part += [ast.Assign([_entry(field, ast.Store())], ast.Name(n, ast.Load())) for n, field in handed.items()
                 if homes[n] == k]
    return parts, shapes


def _handed_in(stmts: list[ast.stmt], definitions: dict[str, ast.stmt], earlier: dict[str, int], summed: set[str],
               namespace: dict[str, Any]) -> list[str] | None:
    """The locals an earlier part sums (``summed``: a loop assigns them) or computes from its sums that the
    statements read, with those they are computed from, in the kernel's order; None where a sum is not a float
    scalar (``0.0``, or ``ti.zero`` of one: a tangent kernel's), which a 0-d field of the default float holds."""
    needed: set[str] = set()
    frontier = [n for stmt in stmts for n in _names(stmt, ast.Load) if n in earlier]
    while frontier:
        name = frontier.pop()
        if name not in needed:
            needed.add(name)
            if name not in summed:
                frontier += [n for n in _names(definitions[name], ast.Load) if n in earlier]
    if any(_start_shape(definitions[n], definitions, namespace) is None for n in needed & summed):
        return None
    return [name for name in definitions if name in needed]


def _start_shape(stmt: ast.stmt, definitions: dict[str, ast.stmt], namespace: dict[str, Any]
                 ) -> tuple[int, ...] | None:
    """The element shape of a sum that starts as floats: ``()`` for ``total = 0.0``, ``(n,)`` for ``ti.Vector([0.0,
    ...])``, ``(n, m)`` for ``ti.Matrix([[0.0, ...], ...])``, that of ``total`` for ``dtotal = ti.zero(total)`` (a
    tangent kernel's); None for any other start."""
    value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
    if isinstance(value, ast.Constant):
        return () if type(value.value) is float else None
    if not isinstance(value, ast.Call) or len(value.args) != 1 or value.keywords:
        return None
    func, arg = resolve(value.func, namespace), value.args[0]
    if func is ti.zero:
        return _start_shape(definitions[arg.id], definitions, namespace) \
            if isinstance(arg, ast.Name) and arg.id in definitions else None
    rows = _floats(arg) if func is ti.Vector else None
    if rows is not None:
        return (len(rows),)
    if func is ti.Matrix and isinstance(arg, ast.List) and arg.elts:
        table = [_floats(row) for row in arg.elts]
        if all(row is not None and len(row) == len(table[0] or ()) for row in table) and table[0]:
            return (len(table), len(table[0]))
    return None


def _floats(node: ast.expr) -> list[float] | None:
    """The numbers of a list of float constants (``[0.0, 0.0]``), else None."""
    if not isinstance(node, ast.List) or not node.elts:
        return None
    found = [e.value for e in node.elts if isinstance(e, ast.Constant) and type(e.value) is float]
    return found if len(found) == len(node.elts) else None


def _scalar_or_matrix_field(shape: tuple[int, ...]) -> Any:
    """An unplaced 0-d field of the default float type, with a gradient, of this element shape."""
    dtype = impl.get_runtime().default_fp
    if not shape:
        return ti.field(dtype, needs_grad=True)
    if len(shape) == 1:
        return ti.Vector.field(shape[0], dtype, needs_grad=True)
    return ti.Matrix.field(shape[0], shape[1], dtype, needs_grad=True)


def _entry(field: str, ctx: ast.expr_context) -> ast.Subscript:
    """``field[None]``."""
    return ast.Subscript(ast.Name(field, ast.Load()), ast.Constant(None), ctx)


def _values(tree: ast.FunctionDef, namespace: dict[str, Any]) -> set[str]:
    """The kernel's parameters that are values (numbers, vectors, matrices), not ``ti.template()`` or ndarrays."""
    def holds_data(note: ast.expr) -> bool:
        found = resolve(note.func if isinstance(note, ast.Call) else note, namespace)
        return found is ti.template or found is ti.types.ndarray

    return {arg.arg for arg in tree.args.args if arg.annotation is not None and not holds_data(arg.annotation)}


def _stores_no_name(stmt: ast.stmt) -> bool:
    """A statement of the top level that a part runs as the kernel did: a call, or an assignment into fields."""
    if isinstance(stmt, (ast.Expr, ast.Pass)):
        return not any(isinstance(n, ast.NamedExpr) for n in ast.walk(stmt))
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] \
        if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) else None
    return targets is not None and all(isinstance(t, ast.Subscript) for t in targets) \
        and not any(isinstance(n, ast.NamedExpr) for n in ast.walk(stmt))


def _defined(stmt: ast.stmt) -> str | None:
    """The local a top-level ``name = value`` (or ``name: T = value``) assigns."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None and isinstance(stmt.target, ast.Name):
        return stmt.target.id
    return None


def _homes(definitions: dict[str, ast.stmt], groups: list[list[ast.stmt]], namespace: dict[str, Any],
           values: set[str]) -> dict[str, int] | None:
    """The part each top-level local a loop sums into (``total += e``) belongs to, with the locals computed from it
    (None where a local cannot be had by every part that reads it). Every other local is assigned again where a
    part reads it: its value must read no field the kernel writes (by name or through a ``ti.template()``
    parameter) and call only Taichi's own functions and tidiff's rule helpers. ``values``: the kernel's
    parameters that are values."""
    loops = [[stmt for stmt in group if isinstance(stmt, ast.For)] for group in groups]
    stored = [set().union(*(_names(stmt, ast.Store) | written_names(stmt) for stmt in loop))  # ``v[0] = e`` too
              for loop in loops]
    homes: dict[str, int] = {}
    for name, stmt in definitions.items():
        found = {k for k, names in enumerate(stored) if name in names} | \
            {homes[n] for n in _names(stmt, ast.Load) if n in homes}
        if len(found) > 1:
            return None
        if found:
            homes[name] = found.pop()
    for name, home in homes.items():  # read by the statements of its part and later ones (handed on: NOTE: [Sums
        # handed to a later loop]; locals computed from it share its part)
        readers = {k for k, group in enumerate(groups) for stmt in group
                   if _defined(stmt) is None and name in _names(stmt, ast.Load)}
        if any(k < home for k in readers):
            return None
    written = _fields([stmt for group in groups for stmt in group], namespace, ast.Store)
    for stmt in definitions.values():
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and not _reads_no_field(resolve(node.func, namespace)):
                return None
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in definitions \
                    and node.id not in values:
                found_obj = resolve(node, namespace)
                if found_obj is MISSING or isinstance(found_obj, Field) and id(found_obj) in written:
                    return None
    return homes


def _names(stmt: ast.stmt, ctx: type) -> set[str]:
    """The names the statement reads (``ast.Load``) or assigns (``ast.Store``)."""
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


def _reads_no_field(obj: Any) -> bool:
    """A function of Taichi's own (``ti.sqrt``, ``ti.Vector``, ``ti.static``), a builtin (``int``, ``abs``) or a
    rule helper of tidiff's (a function of its arguments), never a user's ``@ti.func`` or kernel, which may read
    fields."""
    module = getattr(obj, "__module__", None) or ""
    if module.startswith("tidiff._rules"):
        return True
    if obj is MISSING or is_taichi_func(obj) or isinstance(obj, Kernel) or hasattr(obj, "_primal"):
        return False
    return module in ("builtins", "taichi") or module.startswith("taichi.")


def _defined_before(stmts: list[ast.stmt], definitions: dict[str, ast.stmt], homed: set[str]) -> list[ast.stmt]:
    """The top-level assignments the statements read (but those of a part's sum, ``homed``), with those they
    read, in the kernel's order."""
    needed: set[str] = set()
    frontier = [n for stmt in stmts for n in _names(stmt, ast.Load) if n in definitions and n not in homed]
    while frontier:
        name = frontier.pop()
        if name not in needed:
            needed.add(name)
            frontier += [n for n in _names(definitions[name], ast.Load) if n in definitions and n not in homed]
    return [copy.deepcopy(stmt) for name, stmt in definitions.items() if name in needed]


def _overwrites_a_read_write(groups: list[list[ast.stmt]], namespace: dict[str, Any]) -> bool:
    """Whether a loop writes a field that a loop (it or one before it) reads after a loop before that wrote it."""
    writes = [_fields(group, namespace, ast.Store) for group in groups]
    reads = [_fields(group, namespace, ast.Load) for group in groups]
    return any(writes[i] & reads[j] & writes[k]
               for k in range(len(groups)) for j in range(1, k + 1) for i in range(j))


def _recurs(group: list[ast.stmt], namespace: dict[str, Any]) -> bool:
    """Whether the group's loop is serialized and reads a field it writes (``y[i] = a * y[i - 1] + x[i]``): alone
    in its kernel it is taken as one iteration (NOTE: [Serialized kernels as one iteration])."""
    at = next(k for k, stmt in enumerate(group) if isinstance(stmt, ast.For))  # a group holds one loop
    return at > 0 and serializes(group[at - 1], namespace) \
        and bool(_fields(group[at:at + 1], namespace, ast.Store) & _fields(group[at:at + 1], namespace, ast.Load))


def _fields(stmts: list[ast.stmt], namespace: dict[str, Any], ctx: type) -> set[int]:
    """The fields (by id) the statements index by name to read (``ast.Load``) or to write (``ast.Store``: an
    assignment's target, an atomic's first argument); an atomic's target is not a read, nor is ``+=``'s (their
    adjoints need no old value), ``*=``'s is."""
    atomic_targets, updated = set(), set()
    for node in ast.walk(ast.Module(stmts, [])):
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute) \
                and node.func.attr.startswith("atomic_"):
            atomic_targets.add(id(node.args[0]))
        elif isinstance(node, ast.AugAssign) and not isinstance(node.op, (ast.Add, ast.Sub)):
            updated.add(id(node.target))
    found = set()
    for node in ast.walk(ast.Module(stmts, [])):
        if not isinstance(node, ast.Subscript):
            continue
        writes = isinstance(node.ctx, ast.Store) or id(node) in atomic_targets
        if not (writes == (ctx is ast.Store) or ctx is ast.Load and id(node) in updated):
            continue
        root: ast.expr = node.value
        while isinstance(root, ast.Subscript):  # v[i][0]
            root = root.value
        field = resolve(root, namespace)
        if isinstance(field, Field):
            found.add(id(field))
    return found
