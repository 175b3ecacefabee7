"""A typed grammar of ``@ti.func`` programs, drawn as trees by hypothesis.

A program is a few helper functions and a main function; each is a list of
statements over typed values (float scalars, vectors, matrices: ``ops.SHAPES``).
The tree, not its text, is what hypothesis draws, so shrinking removes
statements, turns expressions into leaves (every choice's first option is
the simplest) and shrinks shapes towards scalars; the two renderers
(``render_taichi``, ``render_torch``) spell the same tree for Taichi and for
torch.

Which ops and statements may appear is a :class:`Grammar`; ``known.py``
switches off what currently fails.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import hypothesis.strategies as st

from . import library
from .ops import CONSTRUCTORS, OPS, SHAPES, VECTOR_SIZES, is_vector

# -- the tree -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expr:
    """An expression of core shape ``shape``.

    ``op`` is an ``ops.OPS`` key or one of: ``var`` (params: name), ``call``
    (a helper), ``lib`` (a custom_jvp/custom_vjp function of ``library``),
    ``tgrad`` (``td.grad(helper, argnums=k)(...)``), ``tjvp``
    (``td.jvp(helper, primals, tangents)[1]``), ``loop_scale``
    (``e * (i + 1.0)`` with a loop variable), ``dyn_entry`` (``v[i]`` with a
    loop variable).
    """

    op: str
    args: tuple = ()
    shape: tuple = ()
    params: tuple = ()

    def param(self, key):
        return dict(self.params)[key]


@dataclass(frozen=True)
class Assign:
    name: str
    expr: Expr


@dataclass(frozen=True)
class AugAssign:
    name: str
    op: str  # "+", "-", "*"
    expr: Expr


@dataclass(frozen=True)
class EntryWrite:
    name: str
    index: str  # "1", "0, 2", a loop variable, or an attribute ".y"
    op: str  # "=", "+", "-", "*"
    expr: Expr


@dataclass(frozen=True)
class Unpack:
    """``a, b = e0, e1`` (``values``: one Expr per name) or ``a, b = h(...)`` (``values``: one ``call`` of a
    helper returning a tuple)."""

    names: tuple
    values: tuple


@dataclass(frozen=True)
class If:
    cond: Expr
    threshold: float
    body: tuple
    orelse: tuple


@dataclass(frozen=True)
class Loop:
    kind: str  # "static", "range", "while", "runtime" (range(count) with a bound known only when it runs)
    var: str
    count: int
    body: tuple
    bound: str = ""  # "runtime": a value read for the bound, as `range(count + 0 * int(value))`


@dataclass(frozen=True)
class Func:
    name: str
    params: tuple  # ((name, shape), ...)
    body: tuple
    returns: tuple  # Exprs; more than one: a tuple return
    annotate_return: bool = False

    @property
    def out_shapes(self):
        return tuple(e.shape for e in self.returns)


@dataclass(frozen=True)
class Program:
    helpers: tuple
    main: Func

    def __repr__(self):
        # hypothesis prints drawn values: the rendered source in the failure's note says it better
        sig = ", ".join(str(s) for _, s in self.main.params)
        return f"Program(f({sig}) -> {self.main.out_shapes}, {len(self.helpers)} helpers; source below)"

    def _repr_pretty_(self, printer, cycle):
        printer.text(repr(self))

    @property
    def funcs(self):
        return self.helpers + (self.main,)

    def walk(self):
        """Every expression and statement node of every function."""
        for f in self.funcs:
            yield from _walk_block(f.body)
            for e in f.returns:
                yield from _walk_expr(e)

    @property
    def ops(self):
        return {n.op for n in self.walk() if isinstance(n, Expr)}

    @property
    def smooth(self):
        """No kinks, jumps or branches on values: finite differences are an oracle (NOTE: [Kinks])."""
        if any(isinstance(n, If) for n in self.walk()):
            return False
        return all(OPS[op].smooth for op in self.ops if op in OPS) and all(
            library.LIBRARY[n.param("func")].smooth for n in self.walk() if isinstance(n, Expr) and n.op == "lib")

    @property
    def forward_ok(self):
        """Forward mode is defined: no custom_vjp function without a jvp rule is reached (as in JAX)."""
        return forward_ok(self.main, self.helpers)

    @property
    def reaches_rules(self):
        """``td.stop_gradient`` or a custom rule is reached: Taichi's reverse mode refuses the program."""
        return reaches_rules(self.main, self.helpers)

    @property
    def writes_at_runtime_indices(self):
        """Whether a function writes an entry of a local at the counter of a loop Taichi runs at run time
        (``t1[i2] *= e`` in ``for i2 in range(n)``): Taichi 1.7.4's reverse mode fails an assertion in its scalarize
        pass there and ends the process (long runs, seeds 60001 and 80002: a chunk's programs lost with it)."""
        return any(_writes_at_counters(f.body, ()) for f in self.funcs)

    @property
    def features(self):
        """Names of what the program uses: ops, statement kinds, library functions (for reports, known.py)."""
        names = set()
        for n in self.walk():
            if isinstance(n, Expr):
                names.add(n.op if n.op != "lib" else "lib:" + n.param("func"))
            else:
                names.add(type(n).__name__ if not isinstance(n, Loop) else "loop:" + n.kind)
        return names


def _writes_at_counters(block, counters):
    for stmt in block:
        if isinstance(stmt, EntryWrite) and stmt.index in counters:
            return True
        if isinstance(stmt, Loop) and _writes_at_counters(
                stmt.body, counters + ((stmt.var,) if stmt.kind != "static" else ())):
            return True
        if isinstance(stmt, If) and (_writes_at_counters(stmt.body, counters)
                                     or _writes_at_counters(stmt.orelse, counters)):
            return True
    return False


def _calls(func):
    """Names of the helpers and library functions ``func`` calls directly."""
    nodes = list(_walk_block(func.body)) + [n for e in func.returns for n in _walk_expr(e)]
    return {n.param("func") for n in nodes if isinstance(n, Expr) and n.op in ("call", "lib", "tgrad", "tjvp", "thvp")}


def forward_ok(func, helpers):
    """Whether forward mode is defined for ``func``: it reaches no custom_vjp function without a jvp rule."""
    by_name = {h.name: h for h in helpers}
    seen, todo = set(), [func]
    while todo:
        for name in _calls(todo.pop()) - seen:
            seen.add(name)
            if name in library.LIBRARY and not library.LIBRARY[name].forward:
                return False
            if name in by_name:
                todo.append(by_name[name])
    return True


def reaches_rules(func, helpers):
    """Whether ``func`` reaches a derivative rule of the user's: ``td.stop_gradient`` or a custom_jvp/custom_vjp
    function. Taichi's own autodiff cannot apply them: the net runs it as a cross-check only on code reaching
    none."""
    by_name = {h.name: h for h in helpers}
    seen, todo = set(), [func]
    while todo:
        f = todo.pop()
        nodes = list(_walk_block(f.body)) + [n for e in f.returns for n in _walk_expr(e)]
        if any(isinstance(n, Expr) and n.op in ("stop_gradient", "lib") for n in nodes):
            return True
        for name in _calls(f) - seen:
            seen.add(name)
            if name in by_name:
                todo.append(by_name[name])
    return False


def _walk_block(block):
    for s in block:
        yield s
        if isinstance(s, (Assign, AugAssign, EntryWrite)):
            yield from _walk_expr(s.expr)
        elif isinstance(s, Unpack):
            for e in s.values:
                yield from _walk_expr(e)
        elif isinstance(s, If):
            yield from _walk_expr(s.cond)
            yield from _walk_block(s.body)
            yield from _walk_block(s.orelse)
        elif isinstance(s, Loop):
            yield from _walk_block(s.body)


def _walk_expr(e):
    yield e
    for a in e.args:
        yield from _walk_expr(a)


# -- what may be drawn --------------------------------------------------------------------------

# runtime_for: a for loop whose bound the transforms cannot evaluate (reversed with its carried values recomputed,
# where range_for's constant bound is unrolled; long run at 99050c0's successors: never drawn before, and
# reverse mode read a carried value's final value through products, tests/test_reverse_control.py)
STATEMENTS = ("assign", "aug", "entry_write", "unpack", "if", "static_for", "range_for", "while", "runtime_for")
LOOPS = ("static_for", "range_for", "while", "runtime_for")


@dataclass(frozen=True)
class Grammar:
    """What programs may contain; known.py removes what currently fails.

    ``transform_calls``: ``tgrad``, ``tjvp`` (``td.jvp`` of helpers whose output is a scalar or whose
    return is annotated), ``tjvp_unannotated`` (of any helper) and ``thvp`` (an argument's entry of
    ``td.hvp`` of a helper with a scalar output).
    """

    ops: tuple = tuple(OPS)
    statements: tuple = STATEMENTS
    library: tuple = tuple(library.LIBRARY)
    transform_calls: tuple = ("tgrad", "tjvp", "tjvp_unannotated", "thvp")
    max_depth: int = 3
    max_statements: int = 4
    max_helpers: int = 2
    max_params: int = 3
    max_outputs: int = 2
    shapes: tuple = SHAPES

    def without(self, *names):
        """This grammar without the named ops, statements, library functions or transform calls."""
        return replace(self, ops=tuple(o for o in self.ops if o not in names),
                       statements=tuple(s for s in self.statements if s not in names),
                       library=tuple(x for x in self.library if x not in names),
                       transform_calls=tuple(x for x in self.transform_calls if x not in names))


# -- drawing ------------------------------------------------------------------------------------


@dataclass
class Scope:
    """What an expression may read and a statement may write, while one function is drawn."""

    grammar: Grammar
    env: list  # [(name, shape)] readable
    locals: list  # [(name, shape)] assignable (not parameters)
    helpers: tuple  # Funcs callable from here
    loops: list = field(default_factory=list)  # [(name, count, kind)]
    counter: itertools.count = field(default_factory=itertools.count)

    def fresh(self, prefix):
        return f"{prefix}{next(self.counter)}"


def _index(draw, n):
    return draw(st.integers(0, n - 1))


def draw_leaf(draw, T, scope):
    """A variable of shape T, an entry of one (for scalars), or a constructor of entries."""
    exact = [(n, s) for n, s in scope.env if s == T]
    if exact:
        name, _ = exact[_index(draw, len(exact))]
        return Expr("var", (), T, (("name", name),))
    if T == ():
        name, S = scope.env[_index(draw, len(scope.env))]
        var = Expr("var", (), S, (("name", name),))
        params = OPS["entry"].params(draw, T, (S,))
        return Expr("entry", (var,), (), tuple(params.items()))
    op = "vector" if is_vector(T) else "matrix"
    shapes = OPS[op].shapes(T)[0]
    args = tuple(draw_leaf(draw, (), scope) for _ in shapes)
    return Expr(op, args, T, tuple(OPS[op].params(draw, T, shapes).items()))


def _special_options(T, scope):
    """Calls and loop-variable ops that can give a T here: (kind, detail) pairs."""
    g = scope.grammar
    options = []
    for h in scope.helpers:
        if len(h.returns) == 1 and h.out_shapes[0] == T:
            options.append(("call", h))
        if h.out_shapes == ((),) and "tgrad" in g.transform_calls:
            options.extend(("tgrad", (h, k)) for k, (_, s) in enumerate(h.params) if s == T)
        if h.out_shapes == ((),) and "thvp" in g.transform_calls and forward_ok(h, scope.helpers):
            options.extend(("thvp", (h, k)) for k, (_, s) in enumerate(h.params) if s == T)
        annotated = h.annotate_return or h.out_shapes == ((),) or "tjvp_unannotated" in g.transform_calls
        if (len(h.returns) == 1 and h.out_shapes[0] == T and "tjvp" in g.transform_calls and annotated
                and forward_ok(h, scope.helpers)):
            options.append(("tjvp", h))
    for name in g.library:
        if library.LIBRARY[name].out_shape == T:
            options.append(("lib", name))
    for var, count, _ in scope.loops:
        options.append(("loop_scale", var))
        if T == ():
            options.extend(("dyn_entry", (var, n)) for n, s in scope.env if is_vector(s) and s[0] >= count)
    return options


def draw_expr(draw, T, depth, scope):
    """An expression of shape T with at most ``depth`` levels of ops above the leaves."""
    if depth <= 0:
        return draw_leaf(draw, T, scope)
    ops = [op for op in scope.grammar.ops if OPS[op].shapes(T)]
    specials = _special_options(T, scope)
    choice = draw(st.integers(0, len(ops) + len(specials)))
    if choice == 0:
        return draw_leaf(draw, T, scope)
    if choice <= len(ops):
        op = ops[choice - 1]
        shapes = draw(st.sampled_from(OPS[op].shapes(T)))
        params = OPS[op].params(draw, T, shapes) if OPS[op].params else {}
        sub = 0 if op in CONSTRUCTORS else depth - 1
        args = tuple(draw_expr(draw, S, sub, scope) for S in shapes)
        return Expr(op, args, T, tuple(params.items()))
    kind, detail = specials[choice - len(ops) - 1]
    sub = depth - 1
    if kind == "call":
        args = tuple(draw_expr(draw, s, sub, scope) for _, s in detail.params)
        return Expr("call", args, T, (("func", detail.name),))
    if kind == "tgrad":
        h, k = detail
        args = tuple(draw_expr(draw, s, sub, scope) for _, s in h.params)
        return Expr("tgrad", args, T, (("func", h.name), ("argnum", k)))
    if kind == "thvp":
        h, k = detail
        primals = tuple(draw_expr(draw, s, sub, scope) for _, s in h.params)
        tangents = tuple(draw_expr(draw, s, 0, scope) for _, s in h.params)
        return Expr("thvp", primals + tangents, T, (("func", h.name), ("argnum", k)))
    if kind == "tjvp":
        primals = tuple(draw_expr(draw, s, sub, scope) for _, s in detail.params)
        tangents = tuple(draw_expr(draw, s, 0, scope) for _, s in detail.params)
        return Expr("tjvp", primals + tangents, T, (("func", detail.name),))
    if kind == "lib":
        entry = library.LIBRARY[detail]
        args = tuple(draw_expr(draw, s, sub, scope) for s in entry.param_shapes)
        return Expr("lib", args, T, (("func", detail),))
    if kind == "loop_scale":
        return Expr("loop_scale", (draw_expr(draw, T, sub, scope),), T, (("var", detail),))
    var, vec = detail
    return Expr("dyn_entry", (), (), (("var", var), ("vector", vec)))


def draw_statement(draw, scope, in_block, block_depth):
    g = scope.grammar
    kinds = [k for k in g.statements
             if (k != "assign" or not in_block or scope.locals)
             and (k != "unpack" or not in_block or len(scope.locals) >= 2)
             and (k not in ("aug", "if", *LOOPS) or scope.locals)
             and (k != "entry_write" or any(s != () for _, s in scope.locals))
             and (k not in ("if", *LOOPS) or block_depth < 2)]
    kind = kinds[_index(draw, len(kinds))]
    depth = g.max_depth
    if kind == "assign":
        if in_block or (scope.locals and draw(st.booleans())):
            name, T = scope.locals[_index(draw, len(scope.locals))]
            return Assign(name, draw_expr(draw, T, depth, scope))
        T = draw(st.sampled_from(g.shapes))
        expr = draw_expr(draw, T, depth, scope)
        name = scope.fresh("t")
        scope.env.append((name, T))
        scope.locals.append((name, T))
        return Assign(name, expr)
    if kind == "unpack":
        return _draw_unpack(draw, scope, in_block, depth)
    if kind == "aug":
        name, T = scope.locals[_index(draw, len(scope.locals))]
        op = draw(st.sampled_from("+-*"))
        E = T if T == () or draw(st.booleans()) else ()
        return AugAssign(name, op, draw_expr(draw, E, depth - 1, scope))
    if kind == "entry_write":
        targets = [(n, s) for n, s in scope.locals if s != ()]
        name, T = targets[_index(draw, len(targets))]
        index = _entry_index(draw, T, scope)
        op = draw(st.sampled_from(["=", "+", "-", "*"]))
        return EntryWrite(name, index, op, draw_expr(draw, (), depth - 1, scope))
    if kind == "if":
        cond = draw_expr(draw, (), depth - 1, scope)
        threshold = draw(st.sampled_from([0.3, -0.2, 0.0]))
        body = _draw_block(draw, scope, 1, block_depth + 1)
        orelse = _draw_block(draw, scope, 0, block_depth + 1)
        return If(cond, threshold, body, orelse)
    loop_kind = {"static_for": "static", "range_for": "range", "while": "while", "runtime_for": "runtime"}[kind]
    count = draw(st.integers(1, 3))
    bound = ""
    if loop_kind == "runtime":
        name, S = scope.env[_index(draw, len(scope.env))]
        bound = name if S == () else f"{name}[{', '.join('0' for _ in S)}]"
    var = scope.fresh("i" if loop_kind != "while" else "j")
    scope.loops.append((var, count, loop_kind))
    body = _draw_block(draw, scope, 1, block_depth + 1)
    scope.loops.pop()
    return Loop(loop_kind, var, count, body, bound)


def _draw_unpack(draw, scope, in_block, depth):
    """``a, b = ...``: two distinct targets, each an existing local or (outside blocks: Taichi's scoping) a
    new one; the value is a call of a helper returning a pair, or a pair of expressions. Every value is
    drawn before a target is declared: the right-hand side reads the old values."""
    pairs = [h for h in scope.helpers if len(h.returns) == 2]
    helper = pairs[_index(draw, len(pairs))] if pairs and draw(st.booleans()) else None
    targets = []
    for k in range(2):
        T = helper.out_shapes[k] if helper else None
        free = [(n, s) for n, s in scope.locals if n not in [t for t, _ in targets] and T in (None, s)]
        if free and (in_block or draw(st.booleans())):
            targets.append(free[_index(draw, len(free))])
        elif in_block:  # no local of the helper's shape: a pair of expressions instead
            return _draw_unpack_values(draw, scope, depth)
        else:
            targets.append((None, T if helper else draw(st.sampled_from(scope.grammar.shapes))))
    shapes = tuple(T for _, T in targets)
    if helper:
        args = tuple(draw_expr(draw, s, depth - 1, scope) for _, s in helper.params)
        values = (Expr("call", args, shapes, (("func", helper.name),)),)
    else:
        values = tuple(draw_expr(draw, T, depth - 1, scope) for T in shapes)
    return Unpack(_declare(scope, targets), values)


def _draw_unpack_values(draw, scope, depth):
    """``a, b = e0, e1`` over two existing locals."""
    k = _index(draw, len(scope.locals))
    first = scope.locals[k]
    rest = scope.locals[:k] + scope.locals[k + 1:]
    second = rest[_index(draw, len(rest))]
    values = tuple(draw_expr(draw, T, depth - 1, scope) for _, T in (first, second))
    return Unpack((first[0], second[0]), values)


def _declare(scope, targets):
    """The targets' names, new ones (name None) made and declared in the scope."""
    names = []
    for name, T in targets:
        if name is None:
            name = scope.fresh("t")
            scope.env.append((name, T))
            scope.locals.append((name, T))
        names.append(name)
    return tuple(names)


def _entry_index(draw, T, scope):
    """``v[1]``, ``m[0, 2]``, ``v.y``, or ``v[i]`` with a loop variable that stays in range."""
    loop_vars = [v for v, count, _ in scope.loops if is_vector(T) and count <= T[0]]
    choice = draw(st.integers(0, 1 + len(loop_vars) + (1 if is_vector(T) else 0)))
    if len(T) == 2:
        return f"{_index(draw, T[0])}, {_index(draw, T[1])}"
    if choice <= 1:
        return str(_index(draw, T[0]))
    if choice - 2 < len(loop_vars):
        return loop_vars[choice - 2]
    return "." + "xyzw"[_index(draw, T[0])]


def _draw_block(draw, scope, min_size, block_depth):
    n = draw(st.integers(min_size, 2))
    return tuple(draw_statement(draw, scope, True, block_depth) for _ in range(n))


def draw_func(draw, grammar, name, helpers, param_shapes, out_shapes, max_statements):
    params = tuple((f"x{k}", s) for k, s in enumerate(param_shapes))
    scope = Scope(grammar, list(params), [], helpers)
    n = draw(st.integers(0, max_statements))
    body = tuple(draw_statement(draw, scope, False, 0) for _ in range(n))
    returns = tuple(draw_expr(draw, T, grammar.max_depth, scope) for T in out_shapes)
    annotate = len(out_shapes) == 1 and draw(st.booleans())
    return Func(name, params, body, returns, annotate)


@st.composite
def programs(draw, grammar=Grammar(), out_shapes=None, param_shapes=None):
    """A Program: up to ``max_helpers`` helpers, then ``main`` named ``f``.

    ``out_shapes`` / ``param_shapes`` (strategies or None) fix what ``main``
    takes and returns: e.g. ``st.just(((),))`` for a scalar output.
    """
    helpers = []
    for k in range(draw(st.integers(0, grammar.max_helpers))):
        shapes = draw(st.lists(st.sampled_from(grammar.shapes), min_size=1, max_size=2))
        out = tuple(draw(st.lists(st.sampled_from(grammar.shapes), min_size=1, max_size=2)))
        helpers.append(draw_func(draw, grammar, f"h{k}", tuple(helpers), tuple(shapes), out, 2))
    if param_shapes is None:
        param_shapes = st.lists(st.sampled_from(grammar.shapes), min_size=1, max_size=grammar.max_params).map(tuple)
    if out_shapes is None:
        out_shapes = st.lists(st.sampled_from(grammar.shapes), min_size=1, max_size=grammar.max_outputs).map(tuple)
    main = draw_func(draw, grammar, "f", tuple(helpers), draw(param_shapes), draw(out_shapes),
                     grammar.max_statements)
    return Program(tuple(helpers), main)


SCALAR_OUT = st.just(((),))
"""``out_shapes`` for a main function with one scalar output (grad, hessian, hvp)."""

SCALAR_WITH_AUX = st.sampled_from(SHAPES).map(lambda aux: ((), aux))
"""``out_shapes`` for ``(scalar, aux)``: has_aux transforms."""

SMALL_SHAPES = ((),) + tuple((n,) for n in VECTOR_SIZES if n <= 3) + ((2, 2),)
"""Argument shapes for third-order checks: the torch oracle's cost grows with the cube of the size."""
