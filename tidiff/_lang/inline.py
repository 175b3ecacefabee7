"""A kernel's calls of ``@ti.func`` s that write fields, or are given one, written out in the kernel.

NOTE: [Funcs that write fields, inlined] The adjoint of a kernel reads and
clears the gradient of each entry the kernel writes (NOTE: [Reverse of a
kernel]); a ``@ti.func`` has no such place: its reverse function runs
inside the caller's adjoint, where its forward sweep would write the fields
again. So before the kernel is reversed, each call of a func that writes a
global field (itself or through its callees) or is given a field through a
``ti.template()`` parameter (in an ndarray kernel, one of its arrays: a
survey of kernels as users write them found ``store_row(out, i, v)``
refused, and Taichi's ``kernel.grad`` running) is replaced by the func's
body, as Taichi itself inlines every func when it compiles:

    @ti.func                                   for i in x:
    def push(y: ti.template(), i, f):              f_1 = x[i] * 2.0
        y[i] += f                    into          y[i] += f_1
    for i in x:
        push(y, i, x[i] * 2.0)

A template parameter takes the argument as written where it is a name, an
attribute chain or a constant (a field, a number Taichi specializes on); so
does a parameter without annotation that the body never assigns, given a
name or a constant (the same value, and the launch's record then sees the
index ``y[i]`` makes); every other parameter is a fresh local given the
argument's value, as Taichi passes values. The
func's own locals get fresh names; the globals it reads keep their name
where the kernel's namespace binds that name to the same object, else get
a fresh one bound there. A func ending in ``return e`` called as
``v = f(...)`` leaves ``v = e`` (and one ending in ``return e1, e2`` called as
``a, b = f(...)``, as a tangent func is, ``a, b = e1, e2``); called inside an expression, it is first
taken out to ``v = f(...)`` before the statement (``while`` tests become
``c = test; while c: ...; c = test``); a func that returns elsewhere is
left as it is (the transform then refuses it by name, and Taichi's
``kernel.grad`` runs). A
func of an object (``self.push(i, f)`` in a ``@ti.data_oriented`` class) is
written out with its object bound (NOTE: [Fields through objects]): ``self.q``
in its body becomes the field itself. Calls inside inlined bodies are
inlined in turn, to a depth of eight.

NOTE: [Funcs in conditional expressions] In ``y[i] = f(i, v) if c else e``
Taichi compiles the func's statements where the call stands, whichever side
the test takes (a field the func writes is written for every ``i``), and
evaluates only its returned expression on the side taken (``ifte``). So the
call's statements are written out before the statement and the call is
replaced by the returned expression: ``x[i - 1]`` returned for ``i > 0``
alone is read only there, as in Taichi. ``and`` / ``or`` are the same:
Taichi compiles every operand's statements, then combines their values.

NOTE: [Static branches taken when inlining] Taichi compiles one side of
``if ti.static(c):`` and nothing after a ``return``, so a func may return
inside a static branch. Where ``c`` is made of module-level names and
constants (``MODE == 1``), or of template parameters a call gives a
constant (``f(y, i, 2)``, ``ti.static(dim == 2)``), the call is written out
as Taichi compiles it: the side ``c`` takes, up to its return. A condition
on other parameters is left as written, and such a func is not written out.
"""
from __future__ import annotations

import ast
import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import taichi as ti
from taichi.lang.field import Field
from taichi.lang.struct import StructType

from .activity import assigned_names
from .callees import is_taichi_func
from .naming import Namer, names_in
from .objects import fields_of, parsed_for
from .parse import MISSING, OPERATOR_NODES, Parsed, resolve, static_call, without_docstring
from .structs import scalarized_structs

DEEPEST = 8


@dataclass(frozen=True)
class _Sites:
    """Which calls are inlined: of funcs given one of ``fields`` (template parameters) or one of ``structs``
    (locals holding a struct), writing fields, returning a struct, or for which ``also`` says so."""

    fields: set[str]
    also: Callable[[Any], bool] | None = None
    structs: frozenset[str] = frozenset()
    writers: bool = True  # funcs that write fields are sites


def inlined(parsed: Parsed, also: Callable[[Any], bool] | None = None, structs_only: bool = False) -> Parsed:
    """``parsed`` (a kernel) with its calls of funcs that write fields or are given one written out (see the
    NOTE), and of funcs for which ``also`` is true: a new Parsed over a copy, or ``parsed`` itself where there
    are none. ``structs_only``: only the calls given or returning a struct (NOTE: [Structs through funcs])."""
    structs = _struct_locals(parsed.tree, parsed.namespace)
    sites = _Sites(set(), None, structs, False) if structs_only else \
        _Sites(_template_parameters(parsed.tree, parsed.namespace), also, structs)
    if not any(isinstance(node, ast.Call) and _site(ast.Expr(node), parsed.namespace, sites)
               for node in ast.walk(parsed.tree)):
        return parsed
    tree, namespace = copy.deepcopy(parsed.tree), dict(parsed.namespace)
    namer = Namer(names_in(tree) | set(namespace))
    for _ in range(DEEPEST):
        if not _inline_block_of(tree, namespace, sites, namer):
            break
    if sites.structs:  # NOTE: [Structs through funcs]
        scalarized_structs(tree, lambda node: resolve(node, namespace), namespace)
    return Parsed(ast.fix_missing_locations(tree), parsed.filename, parsed.first_line, namespace, parsed.form)


# NOTE: [Structs through funcs] A struct local is written out as one local per member where every use is a member
# access (NOTE: [Struct locals]); one given to a func (``energy(p)``) or made by one (``p = make(x, m)``) stayed a
# struct, which no transform differentiates: a kernel's derivatives were Taichi's ``kernel.grad``, checked. Such
# calls are written out in the kernel, as Taichi compiles them, and the struct locals of the result written out
# member by member: ``p`` in ``energy``'s body is the kernel's ``p`` (a parameter the body only reads), and
# ``make``'s ``return P(pos=..., m=m)`` leaves ``p = P(pos=..., m=m_1)``.
def _struct_locals(tree: ast.FunctionDef, namespace: dict[str, Any]) -> frozenset[str]:
    """Names a kernel assigns a struct: built by its type (``P(...)``) or returned by a func."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Call):
            callee = resolve(node.value.func, namespace)
            if isinstance(callee, StructType) or _returns_struct(callee):
                found.add(node.targets[0].id)
    return frozenset(found)


def _returns_struct(callee: Any) -> bool:
    """Whether a func ends by returning a struct it builds (``return P(pos=..., m=m)``)."""
    if callee is MISSING or not is_taichi_func(callee) or getattr(callee, "_is_real_function", False):
        return False
    parsed = parsed_for(callee)
    body = without_docstring(parsed.tree.body)
    last = body[-1] if body else None
    return isinstance(last, ast.Return) and isinstance(last.value, ast.Call) \
        and isinstance(resolve(last.value.func, parsed.namespace), StructType)


def _template_parameters(tree: ast.FunctionDef, namespace: dict[str, Any]) -> set[str]:
    """A kernel's ``ti.template()`` and ndarray parameters: names that may stand for fields, or arrays a func
    given one may write (NOTE: [Funcs that write fields, inlined])."""
    found = set()
    for arg in tree.args.args:
        ann = arg.annotation
        kind = resolve(ann.func if isinstance(ann, ast.Call) else ann, namespace) if ann is not None else None
        if kind is ti.template or kind is ti.types.ndarray or isinstance(kind, ti.types.ndarray):
            found.add(arg.arg)
    return found


def _site(stmt: ast.AST, namespace: dict[str, Any], sites: _Sites) -> Any:
    """The func a statement calls, where the statement is a call to inline (``f(...)``, ``v = f(...)``, or
    ``a, b = f(...)`` of a func returning a tuple of as many: a tangent func's ``(out, dout)``)."""
    unpacked = None
    if isinstance(stmt, ast.Expr):
        value = stmt.value
    elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        value = stmt.value
    elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Tuple) \
            and all(isinstance(e, ast.Name) for e in stmt.targets[0].elts):
        value, unpacked = stmt.value, len(stmt.targets[0].elts)
    else:
        return None
    if not isinstance(value, ast.Call) or value.keywords:
        return None
    callee = resolve(value.func, namespace)
    if callee is MISSING or not is_taichi_func(callee) or getattr(callee, "_is_real_function", False):
        return None
    given = any(isinstance(a, ast.Name) and (a.id in sites.structs or sites.writers and (
        a.id in sites.fields or _is_fields(resolve(a, namespace)))) for a in value.args)
    if not given and not (sites.writers and _writes_fields(callee, set())) and not _returns_struct(callee) \
            and not (sites.also is not None and sites.also(callee)):
        return None
    body = _body(callee, value.args)
    returns = [n for n in ast.walk(ast.Module(body, [])) if isinstance(n, ast.Return)]
    if any(r is not body[-1] for r in returns) or len(value.args) != len(parsed_for(callee).tree.args.args):
        return None
    if unpacked is not None and not (returns and isinstance(returns[0].value, ast.Tuple)
                                     and len(returns[0].value.elts) == unpacked):
        return None
    return callee


def _is_fields(obj: object) -> bool:
    return obj is not MISSING and bool(fields_of(obj))


def _body(callee: Any, args: list[ast.expr]) -> list[ast.stmt]:
    """A func's statements as Taichi compiles them for a call with ``args``: a ``ti.static`` branch on what is
    known now (module-level names, constants, template parameters given a constant) replaced by the side it
    takes, and nothing after a return (NOTE: [Static branches taken when inlining])."""
    parsed = parsed_for(callee)
    params = [a.arg for a in parsed.tree.args.args]
    templates = _template_parameters(parsed.tree, parsed.namespace)
    given = {p: a.value for p, a in zip(params, args, strict=False) if p in templates and isinstance(a, ast.Constant)}
    local = set(params) | {n.id for n in ast.walk(parsed.tree) if isinstance(n, ast.Name)
                           and isinstance(n.ctx, ast.Store)}
    return _taken(without_docstring(parsed.tree.body), {**parsed.namespace, **given}, local - set(given))


def _taken(stmts: list[ast.stmt], namespace: dict[str, Any], local: set[str]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for stmt in stmts:
        test = _static_test(stmt.test, namespace, local) if isinstance(stmt, ast.If) else MISSING
        if isinstance(stmt, ast.If) and test is not MISSING:
            out += _taken(stmt.body if test else stmt.orelse, namespace, local)
        else:
            out.append(stmt)
        if out and isinstance(out[-1], ast.Return):  # Taichi compiles nothing after a return
            break
    return out


def _static_test(test: ast.expr, namespace: dict[str, Any], local: set[str]) -> Any:
    """The value of ``ti.static(c)``'s ``c`` where it is made of module-level names and constants, else MISSING."""
    if not (isinstance(test, ast.Call) and resolve(test.func, namespace) is ti.static and len(test.args) == 1
            and not test.keywords):
        return MISSING
    value = static_call(test, namespace, local, OPERATOR_NODES)  # ti.static(c) is c outside Taichi's compile
    return value if value is MISSING else bool(value)


def _writes_fields(callee: Any, seen: set[int]) -> bool:
    """Whether a func writes a global field, itself or through the funcs it calls."""
    if id(callee) in seen:
        return False
    seen.add(id(callee))
    parsed = parsed_for(callee)
    for node in ast.walk(parsed.tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        if isinstance(node, ast.Call) and node.args and \
                getattr(resolve(node.func, parsed.namespace), "__name__", "").startswith("atomic_"):
            targets = [node.args[0]]
        for target in targets:
            root = target
            while isinstance(root, (ast.Subscript, ast.Attribute)):
                root = root.value
            if isinstance(root, ast.Name) and isinstance(resolve(root, parsed.namespace), Field):
                return True
        if isinstance(node, ast.Call):
            inner = resolve(node.func, parsed.namespace)
            if inner is not MISSING and is_taichi_func(inner) and _writes_fields(inner, seen):
                return True
    return False


def _inline_block_of(node: ast.AST, namespace: dict[str, Any], sites: _Sites, namer: Namer) -> bool:
    """Inline the sites in every statement list under ``node``; whether any was."""
    done = False
    for child in ast.walk(node):
        for attr in ("body", "orelse"):
            stmts = getattr(child, attr, None)
            if not isinstance(stmts, list) or not stmts or not isinstance(stmts[0], ast.stmt):
                continue
            out: list[ast.stmt] = []
            for stmt in stmts:
                if isinstance(stmt, ast.While) and any(isinstance(n, ast.Call) and _site(ast.Expr(n), namespace, sites)
                                                       for n in ast.walk(stmt.test)):
                    test = namer.fresh("test")  # c = test; while c: body; c = test (its calls are inlined next)
                    out += [ast.Assign([ast.Name(test, ast.Store())], stmt.test),
                            ast.While(ast.Name(test, ast.Load()), stmt.body + [
                                ast.Assign([ast.Name(test, ast.Store())], copy.deepcopy(stmt.test))], stmt.orelse)]
                    done = True
                    continue
                for hoisted in [*_hoisted(stmt, namespace, sites, namer), stmt]:
                    callee = _site(hoisted, namespace, sites)
                    if callee is None:
                        out.append(hoisted)
                        continue
                    out += _written_out(hoisted, callee, namespace, namer)
                    done = True
            setattr(child, attr, out)
    return done


def _hoisted(stmt: ast.stmt, namespace: dict[str, Any], sites: _Sites, namer: Namer) -> list[ast.stmt]:
    """``v = f(...)`` for each call to inline inside the expressions of a simple statement or a branch's test
    (evaluated once, before the rest of it), the call replaced by ``v`` there; inside a conditional expression
    or ``and`` / ``or``, the call's statements, the call replaced by what it returns (NOTE: [Funcs in
    conditional expressions]). A while loop's test is left alone."""
    out: list[ast.stmt] = []

    class Hoist(ast.NodeTransformer):
        inside_ifexp = 0  # how many conditional expressions or ``and`` / ``or`` stand around the node

        def visit_IfExp(self, node: ast.IfExp | ast.BoolOp) -> ast.AST:
            self.inside_ifexp += 1
            self.generic_visit(node)
            self.inside_ifexp -= 1
            return node

        visit_BoolOp = visit_IfExp

        def visit_Call(self, node: ast.Call) -> ast.AST:
            self.generic_visit(node)
            assignment = ast.Assign([ast.Name("_", ast.Store())], node)
            callee = _site(assignment, namespace, sites)
            if callee is None:
                return node
            if self.inside_ifexp:  # NOTE: [Funcs in conditional expressions]
                body, value = _expanded(node, callee, namespace, namer)
                if value is None:  # a func returning nothing has no value to select: Taichi refuses it
                    return node
                out.extend(body)
                return value
            fresh = namer.fresh("inlined")
            out.append(ast.Assign([ast.Name(fresh, ast.Store())], node))
            return ast.Name(fresh, ast.Load())

    hoist = Hoist()
    if isinstance(stmt, (ast.Expr, ast.Assign)) and isinstance(stmt.value, ast.Call) \
            and _site(stmt, namespace, sites) is not None:
        stmt.value.args = [hoist.visit(arg) for arg in stmt.value.args]  # the call itself is a site
    elif isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr)) and stmt.value is not None:
        stmt.value = hoist.visit(stmt.value)
    elif isinstance(stmt, ast.If):
        stmt.test = hoist.visit(stmt.test)
    return out


def _written_out(stmt: ast.Expr | ast.Assign, callee: Any, namespace: dict[str, Any], namer: Namer) -> list[ast.stmt]:
    """The statements a call site stands for (see the NOTE)."""
    call = stmt.value
    assert isinstance(call, ast.Call)
    body, value = _expanded(call, callee, namespace, namer)
    if value is not None:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else ast.Name(namer.fresh("unused"), ast.Store())
        body.append(ast.Assign([copy.deepcopy(target)], value))
    return body or [ast.Pass()]


def _expanded(call: ast.Call, callee: Any, namespace: dict[str, Any], namer: Namer) -> tuple[list[ast.stmt],
                                                                                           ast.expr | None]:
    """The statements of a call of ``callee`` written out, and the value its final ``return`` gives (None where
    it returns nothing)."""
    parsed = parsed_for(callee)
    params = [a.arg for a in parsed.tree.args.args]
    templates = _template_parameters(parsed.tree, parsed.namespace)
    local = set(params) | {n.id for n in ast.walk(parsed.tree) if isinstance(n, ast.Name)
                           and isinstance(n.ctx, ast.Store)}
    renamed: dict[str, ast.expr] = {}
    prologue: list[ast.stmt] = []
    assigned = assigned_names(parsed.tree.body)  # by name or by entry (``v[0] = e``)
    annotated = {a.arg for a in parsed.tree.args.args if a.annotation is not None}
    for param, arg in zip(params, call.args, strict=True):
        if param in templates and isinstance(arg, (ast.Name, ast.Attribute, ast.Constant)):
            renamed[param] = arg  # as written: a field (by name or attribute chain), a number Taichi specializes on
            continue
        if isinstance(arg, (ast.Name, ast.Constant)) and param not in assigned | annotated:
            renamed[param] = arg  # a name (or number) the body only reads: the same value, and the launch's record
            continue  # sees the index it makes (``x[t, i]``, not ``x[t_1, i_1]``: NOTE: [Func reads at their indices])
        fresh = namer.fresh(param)
        renamed[param] = ast.Name(fresh, ast.Load())
        prologue.append(ast.Assign([ast.Name(fresh, ast.Store())], copy.deepcopy(arg)))
    for name in sorted(local - set(params)):
        renamed[name] = ast.Name(namer.fresh(name), ast.Load())
    for name in sorted({n.id for n in ast.walk(parsed.tree) if isinstance(n, ast.Name)} - local):
        obj = resolve(ast.Name(name, ast.Load()), parsed.namespace)
        if obj is MISSING or namespace.get(name, MISSING) is obj:
            continue
        fresh = name if name not in namespace and name not in namer.taken else namer.fresh(name)
        namer.taken.add(fresh)
        namespace[fresh] = obj
        renamed[name] = ast.Name(fresh, ast.Load())
    body = [Renamed(renamed).visit(copy.deepcopy(s)) for s in _body(callee, call.args)]
    value = body.pop().value if body and isinstance(body[-1], ast.Return) else None
    return prologue + body, value


class Renamed(ast.NodeTransformer):
    """Names replaced: a parameter by its argument, a local or a global by its fresh name."""

    def __init__(self, renamed: dict[str, ast.expr]) -> None:
        self.renamed = renamed

    def visit_Name(self, node: ast.Name) -> ast.expr:
        new = self.renamed.get(node.id)
        if new is None:
            return node
        if isinstance(new, ast.Name):
            return ast.copy_location(ast.Name(new.id, node.ctx), node)
        return ast.copy_location(copy.deepcopy(new), node)

