"""Statements and control flow of a function -> primal statements paired with tangent ones.

Every differentiable subexpression is lifted into a named temporary with its
tangent beside it (``sin_y = ti.sin(y)`` then ``dsin_y = dy * ti.cos(y)``), so
each generated line is one op, readable, and nothing is computed twice.
Expressions without an active variable are copied verbatim: conditions, loop
ranges, integer arithmetic and ``ti.static`` stay exactly as written.
"""
import ast
import copy
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import taichi as ti
from taichi.lang._ndarray import Ndarray
from taichi.lang.field import Field

from .._errors import NoForwardRule, TransformError, where_hint
from .._lang.activity import active_variables, loaded_names, local_names, root_names
from .._lang.callees import callable_positional, callee_hint, expand_partial, hint_name
from .._lang.compile import info
from .._lang.naming import TAICHI, Namer, helper_name, names_in, spell_taichi, taichi_name
from .._lang.parse import MISSING, Parsed, hashable, positional, resolve, without_docstring
from .._lang.rebinding import rename_rebindings
from .._lang.sym import Sym, zero_like
from .._rules.calls import Callee, Sort, callable_rule, classify
from .._rules.kept import KEPT
from .._rules.table import TABLE, Call, Jvp, lookup, pairwise
from .lanes import CALL_MARK, Lanes, lane_cost, widened_name

_ATOMIC_SUMS = (ti.atomic_add, ti.atomic_sub)
"""Atomic updates whose tangent is the same update of the tangent (as statements)."""
_ZERO_ATTRIBUTES = {"n", "m", "shape", "dtype", "ndim"}
_OP_NAMES = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.Pow: "pow",
             ast.MatMult: "matmul", ast.Mod: "mod", ast.FloorDiv: "floordiv",
             ast.USub: "neg", ast.UAdd: "pos"}

Pair = tuple[ast.expr, ast.expr | None]
"""An expression and its tangent (None: a zero tangent)."""
_Expr = TypeVar("_Expr", bound=ast.expr)


def load(node: ast.expr) -> ast.expr:
    """A copy of an assignment target usable as an expression."""
    node = copy.deepcopy(node)
    for sub in ast.walk(node):
        if hasattr(sub, "ctx"):
            sub.ctx = ast.Load()
    return node


def store(node: _Expr) -> _Expr:
    """A copy of a target expression usable on the left of ``=``."""
    node = copy.deepcopy(node)
    assert isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Tuple, ast.List, ast.Starred))  # targets
    node.ctx = ast.Store()
    return node


def retarget(target: _Expr, name: str) -> _Expr | ast.Name:
    """``v[i]`` with its root variable replaced: ``dv[i]``."""
    node = copy.deepcopy(target)
    inner: ast.expr = node
    while isinstance(inner, (ast.Subscript, ast.Attribute)) and not isinstance(inner.value, ast.Name):
        inner = inner.value
    if isinstance(inner, ast.Name):
        return ast.Name(name, ast.Load())
    assert isinstance(inner, (ast.Subscript, ast.Attribute)), "an active target's root is a variable"
    inner.value = ast.Name(name, ast.Load())
    return node


def is_atomic(node: ast.expr) -> bool:
    """Cheap, pure expressions that may be repeated: names, constants, ``v[i]``, ``v.x``."""
    if isinstance(node, (ast.Name, ast.Constant)):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return isinstance(node.operand, ast.Constant)
    if isinstance(node, ast.Attribute):
        return is_atomic(node.value)
    if isinstance(node, ast.Subscript):
        return is_atomic(node.value) and not _has_call(node.slice)
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(is_atomic(e) for e in node.elts)
    return False


def _has_call(node: ast.AST, namespace: dict[str, Any] | None = None) -> bool:
    """Calls other than ``ti.static(...)`` may be impure (``ti.random()``) or costly."""
    return any(isinstance(n, ast.Call) and resolve(n.func, namespace or {}) is not ti.static
               for n in ast.walk(node))


def _assign(target: str | ast.expr, value: ast.expr) -> ast.Assign:
    target = ast.Name(target, ast.Store()) if isinstance(target, str) else store(target)
    return ast.Assign([target], value)


def _name(identifier: str) -> ast.Name:
    return ast.Name(identifier, ast.Load())


class Transformer:
    """Builds the tangent function of one parsed ``@ti.func`` for one activity pattern."""

    decorator = "func"  # the generated function is a ``@ti.func`` ...
    returns: ast.expr | None = None  # ... without a return annotation (it returns a (primal, tangent) pair)

    def __init__(self, parsed: Parsed, active: Sequence[bool], jvp_of: Callable[..., Any], width: int = 1,
                 through_vjp_rules: bool = False) -> None:
        self.parsed = parsed
        self.through_vjp_rules = through_vjp_rules  # NOTE: [Forward mode of a gradient's code] in emit.py
        self.width = width
        self.tree = parsed.tree
        self.params = [a.arg for a in self.tree.args.args]
        self.active_params = [p for p, a in zip(self.params, active, strict=False) if a]
        self.locals = local_names(self.tree)
        self.assigned_once = _assigned_once(self.tree)
        self.zero: set[str] = set()  # variables assigned once, at the top level, with a zero tangent: no dx at all
        self.shared: set[str] = set()  # temporaries holding an op's result its tangent reads (_share_result)
        self.depth = 0
        self.active = active_variables(self.tree, self.active_params)
        self.namer = Namer(names_in(self.tree))
        self.jvp_of = jvp_of
        self.helpers: dict[str, Any] = {}
        self.block: list[ast.stmt] = []
        self.taichi_name = taichi_name(self.namer, parsed.namespace)

    # --- errors --------------------------------------------------------------
    def error(self, node: ast.AST, construct: str, hint: str | None = None, call: bool = False) -> TransformError:
        """A TransformError at ``node``; the default hint fits where it stands (kernel, @ti.func, helper)."""
        if hint is None:
            name = None if getattr(self.parsed.tree, "is_lambda", False) else self.parsed.tree.name
            hint = where_hint(self.parsed.form, name, call)
        return TransformError(construct, self.parsed.filename, self.parsed.lineno(node), hint)

    # --- the function --------------------------------------------------------
    def run(self) -> ast.FunctionDef:
        """The tangent ``FunctionDef``: primal params, then one tangent per active param."""
        args = self.tree.args
        if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
            raise self.error(self.tree, "a parameter list with *args, **kwargs or keyword-only parameters",
                             "name the parameters one by one (Taichi passes them positionally)")
        self._check_fields()
        tangent_args = [ast.arg(self.namer.tangent(a.arg), a.annotation)
                        for a in args.args if a.arg in self.active_params]
        name = self.namer.fresh(widened_name(self.tree.name + "_jvp", self.width))
        for param in self.params:
            if param in self.active and param not in self.active_params:
                self.emit(_assign(self.namer.tangent(param), zero_like(_name(param)).node))
        body = without_docstring(self.tree.body)
        for stmt in body:
            self.statement(stmt)
        self.lane_cost = lane_cost(self.block, set(self.namer.tangents.values()), self._callee_cost)
        if self.width > 1:
            lanes = Lanes(self.namer, self.width)
            self.block = lanes.block(self.block)
            tangent_args = [ast.arg(lanes.names[a.arg][k], a.annotation)
                            for k in range(self.width) for a in tangent_args]
        # NOTE: [Rebinding in straight-line code]
        self.block = rename_rebindings(self.block, [a.arg for a in args.args + tangent_args], self.namer,
                                       self.kept_sums())
        decorator = ast.Attribute(_name(TAICHI), self.decorator, ast.Load())
        fn = ast.FunctionDef(name, ast.arguments([], args.args + tangent_args, None, [], [], None, []),
                             self.block or [ast.Pass()], [decorator], self.returns)
        return ast.fix_missing_locations(spell_taichi(fn, self.taichi_name))

    def kept_sums(self) -> frozenset[str]:
        """Names whose updates the renaming keeps as written (a kernel's sums: ``kernels.py``); a func's: none."""
        return frozenset()

    def generated(self) -> dict[str, Any]:
        """What the tangent function's record says of it (``_lang/compile.py``)."""
        return {"lane_cost": self.lane_cost, "reverse": self.through_vjp_rules}

    def _callee_cost(self, stmt: ast.stmt) -> int:
        """Lane cost of the tangent function (or custom rule) a call statement calls."""
        call = stmt.value if isinstance(stmt, ast.Assign) else None
        assert isinstance(call, ast.Call) and isinstance(call.func, ast.Name)  # as call_tangent writes it
        fn = self.helpers[call.func.id]
        cost = info(fn).lane_cost
        return len(call.args) if cost is None else cost

    def _check_fields(self) -> None:
        """Global fields and ndarrays are program state, not function inputs: refuse them."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Subscript) and not self._is_local(node.value):
                base = resolve(node.value, self.parsed.namespace)
                if isinstance(base, (Field, Ndarray)):
                    where = "a @ti.func" if self.parsed.form == "func" else "a Python helper"
                    raise self.error(node, f"field access `{ast.unparse(node)}` inside {where}",
                                     "pass the values in as arguments, or wrap the function with td.custom_jvp")

    def _is_local(self, node: ast.expr) -> bool:
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return not isinstance(node, ast.Name) or node.id in self.locals

    # --- statements ----------------------------------------------------------
    def emit(self, stmt: ast.stmt) -> None:
        self.block.append(stmt)

    def nested(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        """Transform a block (a loop or branch body) into a fresh statement list."""
        outer, self.block = self.block, []
        self.depth += 1
        for stmt in stmts:
            self.statement(stmt)
        self.depth -= 1
        inner, self.block = self.block or [ast.Pass()], outer
        return inner

    def statement(self, node: ast.stmt) -> None:
        handler = getattr(self, "stmt_" + type(node).__name__, None)
        if handler is None:
            raise self.error(node, f"a `{type(node).__name__}` statement")
        handler(node)

    def stmt_Assign(self, node: ast.Assign) -> None:
        if not set(root_names(ast.Tuple(node.targets, ast.Store()))) & self.active:
            return self.emit(node)
        if len(node.targets) > 1:
            value = self.lift(*self.expr(node.value), hint="value")
            for target in node.targets:
                self.assign(target, *value)
            return
        target = node.targets[0]
        if isinstance(target, (ast.Tuple, ast.List)):
            return self.unpack(target, node.value)
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Call):
            callee = self._nested_callee(node.value)
            if callee is not None:  # y = h(x): the call's results go straight into y, dy
                self.call_tangent(node.value, callee.obj, custom=callee.jvp if callee.sort is Sort.CUSTOM else None,
                                  into=(target.id, self.namer.tangent(target.id)))
                return
        p, dp = self.expr(node.value)
        if isinstance(target, ast.Name) and (bound := self._bound_into(target.id, p, dp)) is not None:
            self.emit(_assign(self.namer.tangent(target.id), bound))
            return
        self.assign(target, p, dp)

    def _bound_into(self, target: str, p: ast.expr, dp: ast.expr | None) -> ast.expr | None:
        """``y = p`` binding the op's result to ``y`` itself where ``p`` is the temporary just bound to it
        (``_share_result``) and the tangent reads no old value of ``y``: ``y = ti.exp(x); dy = dx * y``, not a
        copy ``y = exp_x`` more. Returns the tangent reading ``y``, or None (and changes nothing)."""
        last = self.block[-1] if self.block else None
        if not (dp is not None and isinstance(p, ast.Name) and p.id in self.shared and self.depth == 0
                and target in self.active and target not in self.zero and target not in loaded_names(dp)
                and isinstance(last, ast.Assign) and isinstance(last.targets[0], ast.Name)
                and last.targets[0].id == p.id):
            return None
        last.targets[0] = ast.Name(target, ast.Store())
        return _Rename(p.id, target).visit(dp)

    def assign(self, target: ast.expr, p: ast.expr, dp: ast.expr | None) -> None:
        """``target = p`` with its tangent, ordered so both read the old values."""
        root = root_names(target)[0]
        if root not in self.active:
            return self.emit(_assign(target, p))
        if dp is None and isinstance(target, ast.Name) and root in self.assigned_once and self.depth == 0:
            self.zero.add(root)  # known zero for good: ops on it drop their tangent terms
            return self.emit(_assign(target, p))
        dtarget = retarget(target, self.namer.tangent(root))
        if dp is None:
            self.emit(_assign(target, p))
            self.emit(_assign(dtarget, zero_like(load(target)).node))
        elif root in loaded_names(dp):
            self.emit(_assign(dtarget, dp))
            self.emit(_assign(target, p))
        else:
            self.emit(_assign(target, p))
            self.emit(_assign(dtarget, dp))

    def unpack(self, targets: ast.Tuple | ast.List, value: ast.expr) -> None:
        """``a, b = ...`` assigns one element at a time (Taichi cannot unpack nested tuples)."""
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(targets.elts):
            written = set(root_names(targets))
            # a, b = b, a: read every right-hand side before writing any target
            parts = [self.atom(elt) for elt in value.elts]
            parts = [self.lift(p, dp, hint="value", force=bool(loaded_names(p) & written))
                     for p, dp in parts]
            for target, (p, dp) in zip(targets.elts, parts, strict=False):
                self.split(target, p, dp)
        else:
            p, dp = self.lift(*self.expr(value), hint="value")
            if dp is not None and not is_atomic(dp):  # split reads it once per element: compute it once
                dname = self.namer.tangent(p.id) if isinstance(p, ast.Name) else self.namer.fresh("dvalue")
                self.emit(_assign(dname, dp))
                dp = _name(dname)
            self.split(targets, p, dp)

    def split(self, target: ast.expr, p: ast.expr, dp: ast.expr | None) -> None:
        """Assign ``p`` (a tuple for a tuple target) by indexing, never nested unpacking."""
        if not isinstance(target, (ast.Tuple, ast.List)):
            return self.assign(target, p, dp)
        for i, elt in enumerate(target.elts):
            self.split(elt, ast.Subscript(p, ast.Constant(i), ast.Load()),
                       None if dp is None else ast.Subscript(dp, ast.Constant(i), ast.Load()))

    def stmt_AugAssign(self, node: ast.AugAssign) -> None:
        target = node.target
        root = root_names(target)[0]
        if root not in self.active:
            return self.emit(node)
        value, dvalue = self.atom(node.value)
        dtarget = retarget(target, self.namer.tangent(root))
        if isinstance(node.op, (ast.Add, ast.Sub)):
            if dvalue is not None:
                self.emit(ast.AugAssign(store(dtarget), node.op, dvalue))
        else:
            call = Call(None, [Sym(load(target)), Sym(value)],
                        [Sym(load(dtarget)), None if dvalue is None else Sym(dvalue)],
                        out=Sym(ast.BinOp(load(target), node.op, copy.deepcopy(value))))
            dp = TABLE[type(node.op)].jvp(call)
            self.emit(_assign(dtarget, zero_like(load(target)).node if dp is None else dp.node))
        self.emit(ast.AugAssign(store(target), node.op, value))

    def stmt_AnnAssign(self, node: ast.AnnAssign) -> None:
        root = root_names(node.target)[0]
        if node.value is None or root not in self.active:
            return self.emit(node)
        p, dp = self.expr(node.value)
        self.emit(ast.AnnAssign(store(node.target), node.annotation, p, node.simple))
        dtarget = store(retarget(node.target, self.namer.tangent(root)))
        self.emit(
            ast.AnnAssign(
                dtarget, node.annotation, dp if dp is not None else zero_like(load(node.target)).node, node.simple
            )
        )

    def stmt_If(self, node: ast.If) -> None:
        self.emit(ast.If(node.test, self.nested(node.body), self.nested(node.orelse) if node.orelse else []))

    def stmt_For(self, node: ast.For) -> None:
        if self.is_active(node.iter) and not self._is_range(node.iter):
            raise self.error(node, f"a for loop over differentiable values `{ast.unparse(node.iter)}`",
                             "loop over indices instead: for i in ti.static(range(n))")
        # the counter shadows a variable of that name inside the loop only (Taichi scopes a static loop's
        # counter): inside it carries no tangent, after it the variable is itself again
        shadowed = set(root_names(node.target)) & self.active
        self.active -= shadowed
        body = self.nested(node.body)
        self.active |= shadowed
        self.emit(ast.For(node.target, node.iter, body, self.nested(node.orelse) if node.orelse else []))

    def _is_range(self, node: ast.expr) -> bool:
        """``range(...)`` or ``ti.static(range(...))``: its integers carry no derivative, whatever they are
        computed from (``range(x.n)``)."""
        if isinstance(node, ast.Call) and len(node.args) == 1 and not self._is_local(node.func) \
                and resolve(node.func, self.parsed.namespace) is ti.static:
            node = node.args[0]
        return isinstance(node, ast.Call) and not self._is_local(node.func) \
            and resolve(node.func, self.parsed.namespace) is range

    def stmt_While(self, node: ast.While) -> None:
        self.emit(ast.While(node.test, self.nested(node.body), []))

    def stmt_Return(self, node: ast.Return) -> None:
        if node.value is None:
            raise self.error(node, "a function without a return value")
        p, dp = self.output(node.value)
        self.emit(ast.Return(ast.Tuple([p, dp], ast.Load())))

    def output(self, node: ast.expr) -> tuple[ast.expr, ast.expr]:
        """A returned value and its tangent, zeros spelled out, tuples kept as tuples."""
        if isinstance(node, ast.Tuple):
            parts = [self.output(e) for e in node.elts]
            return (ast.Tuple([p for p, _ in parts], ast.Load()),
                    ast.Tuple([dp for _, dp in parts], ast.Load()))
        p, dp = self.expr(node)
        if dp is None:
            p, _ = self.lift(p, None, hint="out")
            dp = zero_like(p).node
        return p, dp

    def stmt_Expr(self, node: ast.Expr) -> None:
        value = node.value
        if isinstance(value, ast.Call) and self.is_active(value) and not self._is_local(value.func):
            callee = resolve(value.func, self.parsed.namespace)
            if any(callee is op for op in _ATOMIC_SUMS):
                return self.atomic_sum(value)
            if getattr(callee, "__name__", "").startswith("atomic_") and getattr(callee, "__module__", "").startswith(
                "taichi"
            ):
                self.expr(value)  # atomic_max & co. have no rule: the usual error names them
        receiver = _fill_receiver(value)
        if receiver is not None and isinstance(value, ast.Call) and root_names(receiver)[0] in self.active:
            self.fill(value, receiver)
        self.emit(node)

    def fill(self, node: ast.Call, receiver: ast.expr) -> None:
        """``v.fill(e)`` writes every entry of ``v``: ``dv.fill(de)`` beside it (``dv.fill(0)`` for constant ``e``)."""
        if len(node.args) != 1 or node.keywords:
            raise self.error(node, f"the call `{ast.unparse(node)}`", "pass exactly one positional argument")
        root = root_names(receiver)[0]
        _, dvalue = self.atom(node.args[0])
        dtarget = retarget(receiver, self.namer.tangent(root))
        fill = ast.Attribute(dtarget, "fill", ast.Load())
        self.emit(ast.Expr(ast.Call(fill, [ast.Constant(0.0) if dvalue is None else dvalue], [])))

    def atomic_sum(self, node: ast.Call) -> None:
        """``ti.atomic_add(v[i], e)`` -> also ``ti.atomic_add(dv[i], de)`` (the same for atomic_sub)."""
        if len(node.args) != 2 or node.keywords:
            raise self.error(node, f"the call `{ast.unparse(node)}`", "pass exactly two positional arguments")
        target, value = node.args
        root = root_names(target)[0] if root_names(target) else None
        if root not in self.active:
            return self.emit(ast.Expr(node))
        p, dp = self.atom(value)
        if dp is not None:
            dtarget = retarget(target, self.namer.tangent(root))
            self.emit(ast.Expr(ast.Call(node.func, [dtarget, dp], [])))
        self.emit(ast.Expr(ast.Call(node.func, [target, p], [])))

    def stmt_Pass(self, node: ast.stmt) -> None:
        self.emit(node)

    stmt_Break = stmt_Continue = stmt_Assert = stmt_Pass

    # --- expressions ---------------------------------------------------------
    def is_active(self, node: ast.AST) -> bool:
        return bool(loaded_names(node) & self.active)

    def atom(self, node: ast.expr) -> Pair:
        """An expression as (primal, tangent) that are cheap to repeat, lifting if needed."""
        p, dp = self.expr(node)
        return self.lift(p, dp, hint=_hint(node))

    def lift(self, p: ast.expr, dp: ast.expr | None, hint: str = "t", force: bool = False) -> Pair:
        """Bind ``p`` (and ``dp``) to fresh temporaries unless already atomic."""
        if not force and (is_atomic(p) or isinstance(p, (ast.List, ast.Tuple))
                          or (dp is None and not _has_call(p, self.parsed.namespace))):
            return p, dp  # a list literal (rows of a constructor) has atoms as entries and stays a literal
        name = self.namer.fresh(hint)
        self.emit(_assign(name, p))
        if dp is None:
            return _name(name), None
        dname = self.namer.tangent(name)
        self.emit(_assign(dname, dp))
        return _name(name), _name(dname)

    def expr(self, node: ast.expr) -> Pair:
        """(primal, tangent or None) for an expression, emitting lifted temporaries."""
        if not self.is_active(node):
            return node, None
        handler = getattr(self, "expr_" + type(node).__name__, None)
        if handler is None:
            raise self.error(node, f"the expression `{ast.unparse(node)}`")
        return handler(node)

    def expr_Name(self, node: ast.Name) -> Pair:
        if node.id in self.zero:
            return node, None
        return node, _name(self.namer.tangent(node.id))

    def expr_BinOp(self, node: ast.BinOp) -> Pair:
        (a, da), (b, db) = self.atom(node.left), self.atom(node.right)
        return self.apply(TABLE[type(node.op)].jvp, ast.BinOp(a, node.op, b), None, [a, b], [da, db])

    def expr_UnaryOp(self, node: ast.UnaryOp) -> Pair:
        if isinstance(node.op, (ast.Not, ast.Invert)):
            return node, None
        a, da = self.atom(node.operand)
        return self.apply(TABLE[type(node.op)].jvp, ast.UnaryOp(node.op, a), None, [a], [da])

    def expr_Compare(self, node: ast.expr) -> Pair:
        return node, None

    expr_BoolOp = expr_Compare

    def expr_IfExp(self, node: ast.IfExp) -> Pair:
        (a, da), (b, db) = self.atom(node.body), self.atom(node.orelse)
        p = ast.IfExp(node.test, a, b)
        if da is None and db is None:
            return p, None
        da = zero_like(a).node if da is None else da
        db = zero_like(b).node if db is None else db
        return p, ast.IfExp(node.test, da, db)

    def expr_Subscript(self, node: ast.Subscript) -> Pair:
        base, dbase = self.atom(node.value)
        p = ast.Subscript(base, node.slice, ast.Load())
        return p, None if dbase is None else ast.Subscript(dbase, node.slice, ast.Load())

    def expr_Attribute(self, node: ast.Attribute) -> Pair:
        if not self._is_local(node):
            raise self.error(node, f"the attribute `{ast.unparse(node)}`")
        base, dbase = self.atom(node.value)
        p = ast.Attribute(base, node.attr, ast.Load())
        if dbase is None or node.attr in _ZERO_ATTRIBUTES:
            return p, None
        return p, ast.Attribute(dbase, node.attr, ast.Load())

    def expr_Tuple(self, node: ast.Tuple | ast.List) -> Pair:
        parts = [self.atom(e) for e in node.elts]
        p = type(node)([p for p, _ in parts], ast.Load())
        if all(dp is None for _, dp in parts):
            return p, None
        return p, type(node)([zero_like(p).node if dp is None else dp for p, dp in parts], ast.Load())

    expr_List = expr_Tuple

    def apply(self, rule: Jvp, p: ast.expr, fn: Sym | None, args: list[ast.expr], tangents: list[ast.expr | None],
              keywords: Sequence[ast.keyword] = (), static_args: Sequence[Any] = ()) -> Pair:
        """Run a forward rule on atoms; returns (primal, tangent node or None). A rule reading the result
        gets a copy of ``p``, which :meth:`_share_result` binds once."""
        call = Call(fn, [Sym(a) for a in args], [None if t is None else Sym(t) for t in tangents],
                    {k.arg: Sym(k.value) for k in keywords if k.arg is not None}, list(static_args),
                    out=Sym(copy.deepcopy(p)))
        tangent = rule(call)
        if tangent is None:
            return p, None
        p, dp = self._share_result(p, tangent.node)
        return p, dp if self.width == 1 else self._hoist(dp)

    def _share_result(self, p: ast.expr, dp: ast.expr) -> tuple[ast.expr, ast.expr]:
        """Bind a call's result once when its tangent repeats it (``tanh``, ``exp``, ``inverse``)."""
        if not isinstance(p, ast.Call):
            return p, dp
        same: Callable[[ast.AST], bool]
        kept = None  # the call a decomposition's rule makes of it (NOTE: [Decompositions kept across products])
        if self._is_local(p.func):  # a method: the rule spells it the same way
            key = ast.dump(p)
            same = lambda node: ast.dump(node) == key  # noqa: E731
        else:  # rules spell ``ti`` as a placeholder: compare callees resolved
            namespace = {**self.parsed.namespace, TAICHI: ti}
            callee = resolve(p.func, namespace)
            if callee is MISSING:
                return p, dp
            kept = KEPT.get(callee) if hashable(callee) else None
            args = ast.dump(ast.Tuple(p.args + [k.value for k in p.keywords], ast.Load()))
            same = lambda node: (  # noqa: E731
                isinstance(node, ast.Call) and resolve(node.func, namespace) in (callee, kept or callee)
                and ast.dump(ast.Tuple(node.args + [k.value for k in node.keywords], ast.Load())) == args)
        found = next((sub for sub in ast.walk(dp) if isinstance(sub, ast.expr) and same(sub)), None)
        if found is None:
            return p, dp
        name = self.namer.fresh(_hint(p))
        self.emit(_assign(name, p if kept is None else copy.deepcopy(found)))
        self.shared.add(name)
        return _name(name), _Replace(same, name).visit(dp)

    def _hoist(self, dp: ast.expr) -> ast.expr:
        """Bind the tangent-free parts of a tangent to primal temporaries (``1 - tanh_x ** 2``).

        They are then computed once, not once per tangent lane (``lanes.py``).
        """
        tangents = set(self.namer.tangents.values())
        hoisted: dict[str, str] = {}  # ast.dump of a part -> the temporary holding it

        def visit(node: ast.expr) -> ast.expr:
            if isinstance(node, ast.Call):
                if resolve(node.func, self.parsed.namespace) is ti.static:
                    return node
            elif not isinstance(node, (ast.BinOp, ast.UnaryOp, ast.IfExp, ast.Tuple, ast.List)):
                return node  # names, constants, subscripts and comparisons stay as written
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if names and not names & tangents and not is_atomic(node) and not isinstance(node, (ast.Tuple, ast.List)):
                key = ast.dump(node)
                if key not in hoisted:
                    hoisted[key] = self.namer.fresh(_hint(node))
                    self.emit(_assign(hoisted[key], node))
                return _name(hoisted[key])
            for field, value in ast.iter_fields(node):
                if field == "func":  # keep callees, but look into a method's receiver
                    if isinstance(value, ast.Attribute):
                        value.value = visit(value.value)
                    continue
                if isinstance(value, list):
                    setattr(node, field, [visit(v) if isinstance(v, ast.expr) else v for v in value])
                elif isinstance(value, ast.expr):
                    setattr(node, field, visit(value))
            return node

        return visit(dp)

    # --- calls ---------------------------------------------------------------
    def expr_Call(self, node: ast.Call) -> Pair:
        callee = classify(node, self.parsed.namespace, self.locals, self._is_local)
        return getattr(self, "call_" + callee.sort.name.lower())(node, callee)

    # one handler per kind of callee (``_rules/calls.py``), each ``(node, callee) -> (primal, tangent)``
    def call_method(self, node: ast.Call, callee: Callee) -> Pair:
        func = node.func
        assert isinstance(func, ast.Attribute)  # classify says METHOD of attributes only
        receiver, dreceiver = self.atom(func.value)
        parts = [self.atom(a) for a in node.args]
        rule = TABLE.get(("method", func.attr))
        if rule is None:
            raise self.error(node, f"the method `.{func.attr}()`", call=True)
        method = ast.Attribute(receiver, func.attr, ast.Load())
        args = [p for p, _ in parts]
        return self.apply(rule.jvp, ast.Call(method, args, node.keywords), Sym(method),
                          [receiver] + args, [dreceiver] + [dp for _, dp in parts], node.keywords,
                          [None] + [self._static(a) for a in args])

    def call_local(self, node: ast.Call, callee: Callee) -> Pair:
        raise self.error(node, f"a call to local value `{ast.unparse(node.func)}`",
                         "call the function by its global name (a table entry `OPS[\"sin\"](x)` works too), "
                         "not through a local variable")

    def call_unknown(self, node: ast.Call, callee: Callee) -> Pair:
        raise self.error(node, f"a call to unknown name `{ast.unparse(node.func)}`",
                         "call the function by a global or closure name, an attribute (`mod.h`) or a table "
                         "entry with a constant key (`OPS[\"sin\"](x)`)")

    def call_partial(self, node: ast.Call, callee: Callee) -> Pair:
        """``p(x)`` -> ``h(2.0, x)`` for ``p = functools.partial(h, 2.0)`` (NOTE: [Python helpers])."""
        if any(k.arg is None for k in node.keywords):
            raise self.error(node, "a call with **kwargs", "pass the keyword arguments one by one")
        return self.expr_Call(expand_partial(node, callee.obj, self.bind_value))

    def call_static(self, node: ast.Call, callee: Callee) -> Pair:
        return node, None

    call_constant = call_static

    def call_custom(self, node: ast.Call, callee: Callee) -> Pair:
        """A td.custom_jvp function, or a td.custom_vjp one with a jvp rule: a call of that rule.

        NOTE: [Custom rules wherever called] Every call of such a callee calls its
        rule, bound to a name (``y = c(x)``) as well as inside an expression: a
        custom Function is also a tidiff Function, and calling through that (its
        tangent call) is not the rule itself.
        """
        if callee.jvp is not None:
            return self.call_tangent(node, callee.obj, custom=callee.jvp)
        if self.through_vjp_rules:  # NOTE: [Forward mode of a gradient's code] in emit.py
            return self.call_tangent(node, callee.obj.tifunc)
        raise NoForwardRule(
            getattr(callee.obj, "name", ast.unparse(node.func)), self.parsed.filename, self.parsed.lineno(node))

    def call_function(self, node: ast.Call, callee: Callee) -> Pair:
        """A tidiff Function: a call of its tangent call (NOTE: [Tangent calls lane by lane])."""
        return self.call_tangent(node, callee.obj)

    def call_func(self, node: ast.Call, callee: Callee) -> Pair:
        """A @ti.func or a plain Python helper (NOTE: [Python helpers]): a call of its tangent function."""
        return self.call_tangent(node, callee.obj)

    def call_op(self, node: ast.Call, callee: Callee) -> Pair:
        rule = lookup(callee.obj)
        assert rule is not None
        if len(node.args) > 2 and (rule is TABLE[min] or rule is TABLE[max]):
            node = pairwise(node)
        for keyword in node.keywords:
            if self.is_active(keyword.value):
                raise self.error(node, f"a differentiable keyword argument `{keyword.arg}=`",
                                 f"pass `{keyword.arg}` as a positional argument")
        parts = [self.atom(a) for a in node.args]
        args = [p for p, _ in parts]
        static_args = [self._static(a) for a in node.args]
        return self.apply(rule.jvp, ast.Call(node.func, args, node.keywords), Sym(node.func), args,
                          [dp for _, dp in parts], node.keywords, static_args)

    def call_refused(self, node: ast.Call, callee: Callee) -> Pair:
        if (getattr(callee.obj, "__module__", None) or "").startswith("taichi"):
            raise self.error(node, f"a call to Taichi op `{ast.unparse(node.func)}` ({callee.reason})", call=True)
        raise self.error(node, f"a call to `{ast.unparse(node.func)}`: {callee.reason}", call=True)

    def bind_value(self, value: object) -> str:
        """The name generated code reads a Python value by (a partial's bound value, a default)."""
        return self.parsed.name_for(value, self.namer, hint_name(value))

    def _static(self, node: ast.expr) -> Any:
        """The compile-time value of a global argument (a dtype), or None."""
        if self._is_local(node) or not isinstance(node, (ast.Name, ast.Attribute)):
            return None
        value = resolve(node, self.parsed.namespace)
        return None if value is MISSING else value

    def _nested_callee(self, node: ast.expr) -> Any:
        """The @ti.func, helper, jvp rule or tidiff Function a call goes to when its tangent is called, else None."""
        if not isinstance(node, ast.Call):
            return None
        callee = classify(node, self.parsed.namespace, self.locals, self._is_local)
        if callee.sort in (Sort.FUNCTION, Sort.FUNC) or (callee.sort is Sort.CUSTOM and callee.jvp is not None):
            return callee
        return None

    def call_tangent(self, node: ast.Call, callee: Any, custom: Any = None,
                     into: tuple[str, str] | None = None) -> Pair:
        """``y, dy = h_jvp(x, dx)``: call the tangent function of a @ti.func (or a custom rule)."""
        arg_nodes = self._positional(node, callee)
        # an inactive argument is passed as written: it is read once, and a helper may need it as
        # a compile-time value (NOTE: [Python helpers]); a custom rule repeats it in zero tangents
        parts = [self.atom(a) if custom is not None or self.is_active(a) else (a, None) for a in arg_nodes]
        rule = callable_rule(callee) if custom is None else None
        if custom is None:
            mask = tuple(dp is not None for _, dp in parts)
            tangents = [dp for _, dp in parts if dp is not None]
            if rule is not None:
                fn = rule.tangent(callee, mask)  # NOTE: [Tangent calls lane by lane]
            else:
                fn = self.jvp_of(callee, mask) if self.width == 1 else self.jvp_of(callee, mask, self.width)
        else:
            fn = custom
            tangents = [zero_like(p).node if dp is None else dp for p, dp in parts]
        by_lane = custom is not None or rule is not None
        base = callee_hint(node.func, callee)
        helper = helper_name(self.helpers, self.namer, fn, widened_name(base + "_jvp", 1 if by_lane else self.width))
        call = ast.Call(_name(helper), [p for p, _ in parts] + tangents, [])
        if into is None:
            out = self.namer.fresh(_hint(node))
            into = (out, self.namer.tangent(out))
        stmt = ast.Assign([ast.Tuple([ast.Name(n, ast.Store()) for n in into], ast.Store())], call)
        setattr(stmt, CALL_MARK, (len(parts), by_lane))
        self.emit(stmt)
        return _name(into[0]), _name(into[1])

    def _positional(self, node: ast.Call, callee: Any) -> list[ast.expr]:
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise self.error(node, "a call with *args", "pass the arguments one by one")
        if callable_rule(callee) is not None:
            return callable_positional(node, callee, self.error)
        if getattr(callee, "_is_real_function", False):
            raise self.error(node, f"the call `{ast.unparse(node)}` of a @ti.real_func",
                             "make it a @ti.func: tidiff transforms the source it inlines")
        try:
            return positional(node, callee, self.bind_value)
        except TypeError as e:
            raise self.error(node, f"the call `{ast.unparse(node)}` ({e})",
                             "pass the arguments the callee takes") from None


def _assigned_once(tree: ast.FunctionDef) -> set[str]:
    """Variables written by exactly one statement (and no loop header) of a function."""
    counts: dict[str, int] = {}
    targets: list[str]
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = [n for t in node.targets for n in root_names(t)]
        elif isinstance(node, ast.Expr) and (receiver := _fill_receiver(node.value)) is not None:
            targets = root_names(receiver)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For)):
            targets = root_names(node.target)
        elif isinstance(node, ast.arg):
            targets = [node.arg]
        else:
            continue
        for name in targets:
            counts[name] = counts.get(name, 0) + 1
    return {name for name, n in counts.items() if n == 1}


def _fill_receiver(node: ast.expr) -> ast.expr | None:
    """``v`` of ``v.fill(e)``, a call that writes every entry of ``v`` (Taichi's only mutating method), else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "fill" \
            and root_names(node.func.value):
        return node.func.value
    return None


def _hint(node: ast.expr) -> str:
    """A readable temporary name for an expression: ``sin_y``, ``mul``, ``dot``."""
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name):  # h(x, y): the name h itself is taken
            base = func.id
            suffix = node.args[0].id if len(node.args) == 1 and isinstance(node.args[0], ast.Name) else "out"
            return f"{base}_{suffix}"
        base = func.attr.lower() if isinstance(func, ast.Attribute) else "call"
        if len(node.args) == 1 and isinstance(node.args[0], ast.Name):
            return f"{base}_{node.args[0].id}"
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and not node.args:
            return f"{base}_{func.value.id}"
        return base
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        return _OP_NAMES.get(type(node.op), "t")
    return "t"


class _Rename(ast.NodeTransformer):
    """Every read of the variable ``old`` reads ``new`` instead."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(self.new, node.ctx) if node.id == self.old else node


class _Replace(ast.NodeTransformer):
    """Replace every subtree ``same(node)`` accepts by the variable ``name``."""

    def __init__(self, same: Callable[[ast.AST], bool], name: str) -> None:
        self.same, self.name = same, name

    def visit(self, node: ast.AST) -> Any:
        if isinstance(node, ast.expr) and self.same(node):
            return _name(self.name)
        return super().visit(node)

