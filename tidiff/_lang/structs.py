"""Local struct values (``ti.types.struct``, ``@ti.dataclass``) written out as one local per member.

NOTE: [Struct locals] A struct in Taichi code is a Python-side bundle of
named values; ``p = Particle(pos=x * 2.0, mass=m)`` then ``p.mass * p.pos``
is the same program as ``p_pos = (x * 2.0).cast(f64); p_mass = ti.cast(m,
f64)`` then ``p_mass * p_pos``, which every transform already
differentiates (Warp's struct tests: the transforms had no rule for the
constructor and refused it). The parsed tree holds that form for each local
whose every use is a member read or write (``p.mass``, ``p.pos[0] = ...``,
``p.mass += ...``), a construction (``p = S(...)``, members by position or
keyword, missing ones zero, each cast to its member's type as Taichi's
``StructType.__call__`` does) or a copy from another such local (``q = p``).
A struct passed to a function, returned, or with methods called (a
``@ti.dataclass``'s ``p.kinetic()``) stays as written, and is refused by name
where it is differentiated; so are structs with struct members.
"""
import ast
from collections.abc import Callable
from typing import Any

import taichi as ti
from taichi.lang.matrix import MatrixType
from taichi.lang.struct import StructType

from .naming import bound


def scalarized_structs(tree: ast.FunctionDef, resolve: Callable[[ast.AST], Any], namespace: dict[str, Any]) -> None:
    """Write out, in place, each local struct of ``tree`` as one local per member (see the NOTE); member types are
    bound in ``namespace``."""
    types = _struct_locals(tree, resolve)
    if not types:
        return
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {a.arg for a in ast.walk(tree)
                                                                          if isinstance(a, ast.arg)}
    names: dict[tuple[str, str], str] = {}
    for var, struct in types.items():
        for member in struct.members:
            name = f"{var}_{member}"
            while name in taken or name in namespace:
                name += "_"
            taken.add(name)
            names[var, member] = name
    _Scalarize(types, names, resolve, namespace).visit(tree)
    ast.fix_missing_locations(tree)


def _flat(struct: object) -> bool:
    return isinstance(struct, StructType) and not struct.methods \
        and not any(isinstance(t, StructType) for t in struct.members.values())


def _struct_locals(tree: ast.FunctionDef, resolve: Callable[[ast.AST], Any]) -> dict[str, StructType]:
    """Locals that hold a struct and are used only as the NOTE says, with their struct types."""
    params = {a.arg for a in tree.args.args + tree.args.kwonlyargs}
    types: dict[str, StructType] = {}
    mixed: set[str] = set()  # assigned structs of two types: left as written
    copies: list[tuple[str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
            if isinstance(value, ast.Call) and _flat(struct := resolve(value.func)) \
                    and not any(k.arg is None for k in value.keywords) \
                    and not any(isinstance(a, ast.Starred) for a in value.args):
                if types.setdefault(target, struct) is not struct:
                    mixed.add(target)
            elif isinstance(value, ast.Name):
                copies.append((target, value.id))
    changed = True
    while changed:  # q = p: q holds p's type; a copy between other values drops both
        changed = False
        for target, source in copies:
            if source in types and target not in types:
                types[target] = types[source]
                changed = True
    types = {k: v for k, v in types.items() if k not in mixed and k not in params}
    while True:
        bad = _misused(tree, types, resolve) | {t for t, s in copies if (t in types) != (s in types)} \
            | {s for t, s in copies if (t in types) != (s in types)} \
            | {t for t, s in copies if t in types and s in types and types[t] is not types[s]}
        bad &= set(types)
        if not bad:
            return types
        for name in bad:
            del types[name]


def _misused(tree: ast.FunctionDef, types: dict[str, StructType], resolve: Callable[[ast.AST], Any]) -> set[str]:
    """The candidates some use of which is neither a member access, a construction nor a copy."""
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in types:
            if node.attr in types[node.value.id].members:
                allowed.add(id(node.value))
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in types:
            value = node.value
            if isinstance(value, ast.Name) or (isinstance(value, ast.Call)
                                               and resolve(value.func) is types[node.targets[0].id]):
                allowed.add(id(node.targets[0]))
                if isinstance(value, ast.Name):
                    allowed.add(id(value))
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in types and id(n) not in allowed}


class _Scalarize(ast.NodeTransformer):
    def __init__(self, types: dict[str, StructType], names: dict[tuple[str, str], str],
                 resolve: Callable[[ast.AST], Any], namespace: dict[str, Any]) -> None:
        self.types, self.names, self.resolve, self.namespace = types, names, resolve, namespace

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id in self.types:
            return ast.copy_location(ast.Name(self.names[node.value.id, node.attr], node.ctx), node)
        self.generic_visit(node)
        return node

    def visit_Assign(self, node: ast.Assign) -> Any:
        target = node.targets[0] if len(node.targets) == 1 else None
        if not isinstance(target, ast.Name) or target.id not in self.types:
            self.generic_visit(node)
            return node
        var, struct = target.id, self.types[target.id]
        members = list(struct.members)
        if isinstance(node.value, ast.Name):  # q = p
            values: list[ast.expr] = [ast.Name(self.names[node.value.id, m], ast.Load()) for m in members]
        else:
            call = node.value
            assert isinstance(call, ast.Call)  # a construction: _misused allows nothing else
            given = dict(zip(members, call.args, strict=False)) | {k.arg: k.value for k in call.keywords}
            values = [self._member_value(struct, m, self.visit(given[m]) if m in given else None) for m in members]
        reads_itself = any(isinstance(n, ast.Name) and n.id in {self.names[var, m] for m in members}
                           for v in values for n in ast.walk(v))
        if not reads_itself:
            return [ast.copy_location(ast.Assign([ast.Name(self.names[var, m], ast.Store())], v), node)
                    for m, v in zip(members, values, strict=True)]
        temps = [f"{self.names[var, m]}_new" for m in members]  # p = S(a=p.b, b=p.a): all read before any write
        return [ast.copy_location(ast.Assign([ast.Name(t, ast.Store())], v), node) for t, v in zip(temps, values,
                                                                                               strict=True)] + \
            [ast.copy_location(ast.Assign([ast.Name(self.names[var, m], ast.Store())], ast.Name(t, ast.Load())), node)
             for m, t in zip(members, temps, strict=True)]

    def _member_value(self, struct: StructType, member: str, value: ast.expr | None) -> ast.expr:
        """``value`` as Taichi stores it in ``member``: cast to the member's type (zero where none is given)."""
        dtype = struct.members[member]
        if isinstance(dtype, MatrixType):
            kind = self._bind(dtype, member)
            if value is None:
                return ast.Call(kind, [ast.Constant(0)], [])
            if isinstance(value, (ast.List, ast.Tuple)):
                return ast.Call(kind, [value], [])
            return ast.Call(ast.Attribute(value, "cast", ast.Load()), [self._bind(dtype.dtype, member + "_dtype")], [])
        given = ast.Constant(0) if value is None else value
        return ast.Call(self._bind(ti.cast, "cast"), [given, self._bind(dtype, member + "_dtype")], [])

    def _bind(self, value: object, hint: str) -> ast.Name:
        return bound(self.namespace, value, f"_tidiff_struct_{hint}")

