"""The one builder of generated statements: AST nodes, with expressions as :class:`~.sym.Sym` (operators) or
``ast.expr``. Generated code is never text: a name cannot break it, and what is built is what is compiled."""
import ast
from collections.abc import Iterable, Sequence

from .naming import TAICHI
from .sym import Sym, node_of

Value = Sym | ast.expr | int | float | str
"""An expression: a Sym, an AST expression, a number, or the name of a variable (a str)."""


def name(identifier: str) -> ast.Name:
    return ast.Name(identifier, ast.Load())


def expr(value: Value) -> ast.expr:
    """The AST of a value; a str is the variable of that name."""
    return name(value) if isinstance(value, str) else node_of(value)


def _target(target: str | Sym | ast.expr) -> ast.expr:
    if isinstance(target, str):
        return ast.Name(target, ast.Store())
    stored = ast.parse(ast.unparse(node_of(target)), mode="eval").body  # a fresh copy whose context is set below
    assert isinstance(stored, (ast.Name, ast.Subscript, ast.Attribute, ast.Tuple))
    stored.ctx = ast.Store()
    return stored


def assign(target: str | Sym | ast.expr, value: Value, annotation: ast.expr | None = None) -> ast.stmt:
    """``target = value`` (``target: annotation = value``); ``target`` a name, or an entry ``v[i]``."""
    if annotation is not None:
        assert isinstance(target, str)
        return ast.AnnAssign(ast.Name(target, ast.Store()), annotation, expr(value), 1)
    return ast.Assign([_target(target)], expr(value))


def unpack(targets: Sequence[str], value: Value) -> ast.stmt:
    """``a, b = value``."""
    return ast.Assign([ast.Tuple([ast.Name(t, ast.Store()) for t in targets], ast.Store())], expr(value))


def augment(target: str, op: ast.operator, value: Value) -> ast.stmt:
    """``target op= value``."""
    return ast.AugAssign(ast.Name(target, ast.Store()), op, expr(value))


def statement(value: Value) -> ast.stmt:
    """A call (or any expression) as a statement."""
    return ast.Expr(expr(value))


def call(func: Value, *args: Value) -> ast.Call:
    """``func(*args)``; ``func`` a name or an expression."""
    return ast.Call(expr(func), [expr(a) for a in args], [])


def taichi(attr: str) -> Sym:
    """``ti.<attr>`` as rules and builders spell Taichi (a placeholder the generated namespace names)."""
    return Sym(ast.Attribute(name(TAICHI), attr, ast.Load()))


def zero_of(identifier: str) -> ast.Call:
    """``ti.zero(v)``: a zero shaped like the variable ``v``."""
    return call(taichi("zero"), identifier)


def for_range(counter: str, bounds: Sequence[Value], body: Sequence[ast.stmt], static: bool = False) -> ast.For:
    """``for counter in range(*bounds): body`` (``ti.static(range(...))`` with ``static``)."""
    iterated: ast.expr = call("range", *bounds)
    if static:
        iterated = call(taichi("static"), iterated)
    return ast.For(ast.Name(counter, ast.Store()), iterated, list(body) or [ast.Pass()], [])


def if_(test: Value, body: Sequence[ast.stmt], orelse: Sequence[ast.stmt] = ()) -> ast.If:
    """``if test: body else: orelse``."""
    return ast.If(expr(test), list(body) or [ast.Pass()], list(orelse))


def compare(left: Value, op: ast.cmpop, right: Value) -> ast.Compare:
    return ast.Compare(expr(left), [op], [expr(right)])


def function(fn_name: str, params: Iterable[tuple[str, ast.expr | None]], body: Sequence[ast.stmt],
             decorator: ast.expr | None, returns: ast.expr | None = None) -> ast.FunctionDef:
    """``@decorator def fn_name(p: annotation, ...) -> returns: body``, with source positions set."""
    args = ast.arguments([], [ast.arg(p, a) for p, a in params], None, [], [], None, [])
    fn = ast.FunctionDef(fn_name, args, list(body) or [ast.Pass()], [] if decorator is None else [decorator],
                         returns)
    return ast.fix_missing_locations(fn)


def entry_root(node: ast.expr) -> tuple[ast.expr, bool]:
    """The value an entry or attribute chain starts from (``x`` of ``x[i].norm``), and whether the chain
    indexes it (an element of a field is a local value, the field itself is not)."""
    subscripted = False
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        subscripted = subscripted or isinstance(node, ast.Subscript)
        node = node.value
    return node, subscripted


def holds_counters(index: ast.expr, counters: Iterable[str]) -> bool:
    """Whether the index ``index`` (of ``x[index]``) holds each of ``counters`` as a name of its own."""
    parts = index.elts if isinstance(index, ast.Tuple) else [index]
    return set(counters) <= {p.id for p in parts if isinstance(p, ast.Name)}


def own_index(entries: Sequence[ast.Subscript], counters: Iterable[str], assigned: set[str]) -> bool:
    """Whether every entry is at one index holding each of ``counters`` as a name of its own and made of no name
    in ``assigned``: each iteration of the loop those counters run reaches an entry of its own."""
    if len({ast.dump(e.slice) for e in entries}) != 1:
        return False
    index = entries[0].slice
    return holds_counters(index, counters) and not assigned & {n.id for n in ast.walk(index)
                                                               if isinstance(n, ast.Name)}
