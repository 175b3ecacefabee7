"""A ``@ti.func`` -> its reverse (vjp) function, or the reason it has none.

The reverse function of ``f(x, mu)`` with ``x`` active reads::

    @ti.func
    def f_vjp(x, mu, ct_out):
        <f's statements, one op per line, each variable assigned once outside blocks>
        <for each op, last first: add its operands' cotangents>
        return (out, ct_x)

Supported: assignments (plain, augmented, annotated, tuple to tuple, and
into an entry, ``v[i, j] = e``), one final ``return``,
the ops with a reverse rule in ``_rules/ops.py``, calls of other reversible
``@ti.func`` s, of ``td.custom_vjp`` functions (their ``bwd``) and of
``td.custom_jvp`` functions (their jvp rule transposed, ``linearize.py``),
``for`` loops over ranges of constants (unrolled), ``if`` on a condition of
constants (after unrolling: ``ti.static(i == j)``), and branches on values,
runtime ``for`` loops and ``while`` loops (``control.py``, NOTE: [Reverse
control flow]; ``continue`` is read as a branch: NOTE: [Continue as a branch]; ``break`` as a flag:
NOTE: [Break as a flag]). A ``for`` over ``ti.static(...)`` that breaks makes a function not reversible:
its derivatives then come from forward pushes (``_codegen/bodies.py``), which handle everything.
"""
import ast
import builtins
import copy
import itertools
from collections.abc import Callable, Sequence
from typing import Any, TypeGuard

import taichi as ti
from taichi.lang.matrix import MatrixType

from .._lang import extremes
from .._lang.activity import integer_locals, loaded_names
from .._lang.breaks import without_break
from .._lang.callees import callable_positional, callee_hint, expand_partial, hint_name, is_helper, quiet
from .._lang.compile import info
from .._lang.dead_branches import without_dead_branches
from .._lang.naming import RULE_HELPERS, TAICHI, Namer, helper_name, names_in, spell_taichi, taichi_name
from .._lang.nodes import assign as _assign
from .._lang.nodes import call, taichi, zero_of
from .._lang.nodes import name as _name
from .._lang.parse import MISSING, Parsed, annotation_value, hashable, positional, resolve, without_docstring
from .._lang.rebinding import rebound_call
from .._lang.sym import Sym, helpers
from .._rules.calls import CUSTOM_JVPS, CUSTOM_VJPS, Callee, Sort, callable_rule, classify
from .._rules.helpers import is_integral
from .._rules.table import (
    TABLE,
    Contributions,
    Rule,
    Shape,
    Vjp,
    copy_vjp,
    is_constructor,
    is_dtype,
    lookup,
    pairwise,
    zero,
)
from . import results
from .control import Branch, ControlFlow, Loop, Op, Store
from .linearize import linearized, pushed


class NotReversible(Exception):
    """The function uses a construct the reverse transform does not handle (the message says which; ``where``,
    set by the statement it stands in, says where: ``(file, line)``)."""

    where: tuple[str, int] | None = None

    def described(self) -> str:
        """The construct, and where it stands when known."""
        return str(self) if self.where is None else f"{self}, line {self.where[1]} of {self.where[0]}"


Path = tuple[int, ...]
"""Where a value stands in a nested tuple of results: ``(1, 0)`` is ``r[1][0]``, ``()`` the result itself."""


def _not_reversible(node: ast.AST, construct: str, hint: str | None = None) -> NotReversible:
    return NotReversible(f"{construct} ({hint})" if hint else construct)


_SIMPLE = (ast.Name, ast.Constant, ast.Attribute)
_COMPONENTS = {"x": 0, "y": 1, "z": 2, "w": 3}
_ZERO_ATTRIBUTES = {"n", "m", "shape", "dtype", "ndim"}


class Reverser(ControlFlow):
    """Builds the reverse function of one parsed ``@ti.func`` for one activity pattern.

    ``vjp_of(callee, active, n_outputs)`` gives a callee's reverse function, or the NotReversible
    saying why it has none (named in this function's own refusal).
    """

    def __init__(self, parsed: Parsed, active: Sequence[bool], n_outputs: int,
                 vjp_of: Callable[[Any, tuple[bool, ...], int], Any]) -> None:
        self.parsed = parsed
        self.tree = without_break(parsed.tree, self._is_static_range,  # NOTE: [Break as a flag]
                                  keep_top_level=parsed.form == "kernel")
        self.params = [a.arg for a in self.tree.args.args]
        self.n_outputs = n_outputs
        self.vjp_of = vjp_of
        self.namer = Namer(names_in(self.tree))
        self.env = {p: p for p in self.params}  # variable -> the SSA name holding its current value
        self.defined = set(self.params)
        self.integral = integer_locals(self.tree)  # the first binding, at the top level, keeps the name
        self.active = {p for p, a in zip(self.params, active, strict=False) if a}
        self.temps: set[str] = set()
        self.tuples: dict[str, dict[Path, ast.expr]] = {}  # SSA name of a tuple-valued call result ->
        # {index path: the Name of that element}
        self.uses_bwd = False  # whether a custom_vjp rule is called (here or in a callee's reverse)
        self.recomputes = False  # whether a runtime loop is reversed by recomputation (here or in a callee)
        self.forward: list[ast.stmt] = []  # the forward lists are the current block's
        self.backward: list[ast.stmt] = []
        self.ops: list[Op | Branch | Loop | Store] = []
        self.cts: dict[str, str] = {}  # SSA name -> the name of its cotangent, in the reverse sweep
        self.entries: dict[str, tuple[ast.expr, dict[tuple[int, ...], ast.expr]]] = {}  # SSA name -> (its
        # shape's model, {index: its cotangent's contribution}): entry contributions waiting to be added
        self.in_block = 0  # how deep the reverse sweep is in branches and loops
        self.shapes: dict[str, Shape] = {}  # SSA name -> its shape, where the code says (NOTE: [Known shapes])
        for arg in self.tree.args.args:
            shape = _annotated_shape(arg.annotation, parsed.namespace)
            if shape is not None:
                self.shapes[arg.arg] = shape
        self.borrowed: set[str] = set()  # SSA names whose cotangent is another's name (NOTE: [Known shapes])
        self.straight = True  # no branch or runtime loop: cotangent names may be shared
        self.helpers: dict[str, Any] = {}
        self.taichi_name = taichi_name(self.namer, parsed.namespace)

    def run(self) -> ast.FunctionDef:
        args = self.tree.args
        if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
            raise NotReversible("a parameter list with *args, **kwargs or keyword-only parameters")
        body = without_docstring(self.tree.body)
        if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
            raise NotReversible("no single return statement at the end")
        for stmt in body[:-1]:
            self.statement(stmt)
        outputs = self.outputs(body[-1].value)
        ct_params = [self.namer.fresh("ct_out" if self.n_outputs == 1 else f"ct_out{k}")
                     for k in range(self.n_outputs)]
        cts = self.sweep(outputs, ct_params)
        result = outputs[0] if self.n_outputs == 1 else ast.Tuple(outputs, ast.Load())
        grads: list[ast.expr] = [
            _name(cts[p]) if p in cts else ast.Call(ast.Attribute(_name(TAICHI), "zero", ast.Load()), [_name(p)], [])
            for p in self.params
            if p in self.active
        ]
        self.backward.append(ast.Return(ast.Tuple([result] + grads, ast.Load())))
        name = self.namer.fresh(self.tree.name + "_vjp")
        decorator = ast.Attribute(_name(TAICHI), "func", ast.Load())
        fn = ast.FunctionDef(
            name,
            ast.arguments([], args.args + [ast.arg(c) for c in ct_params], None, [], [], None, []),
            without_dead_branches(self.tree, self.forward + self.backward, self.parsed.namespace),
            [decorator],
            None,
        )
        return ast.fix_missing_locations(spell_taichi(fn, self.taichi_name))

    def generated(self) -> dict[str, Any]:
        """What the reverse function's record says of it (``_lang/compile.py``)."""
        return {"reverse": True, "uses_bwd": self.uses_bwd, "recomputes": self.recomputes}

    # --- statements: the forward sweep -----------------------------------------
    def statement(self, node: ast.stmt) -> None:
        handler = getattr(self, "stmt_" + type(node).__name__, None)
        try:
            if handler is None:
                raise NotReversible(f"a `{type(node).__name__}` statement")
            handler(node)
        except NotReversible as reason:
            if reason.where is None:  # the innermost statement says where
                reason.where = (self.parsed.filename, self.parsed.lineno(node))
            raise

    def stmt_Assign(self, node: ast.Assign) -> None:
        if len(node.targets) != 1:
            raise NotReversible("a chained assignment into an entry or attribute (NOTE: [Chained assignments])")
        target = node.targets[0]
        if isinstance(target, ast.Name):
            paths = self.returned_paths(node.value)
            if len(paths) > 1 and isinstance(node.value, ast.Call) and self.reads_active(node.value):
                # r = h(x), h returning a tuple; r[k] later
                names = self.call_outputs(node.value, paths)
                self.bind(target.id, _name(self.last_op().target))
                self.tuples[self.ssa(target.id)] = dict(zip(paths, names, strict=True))
                return
            if isinstance(node.value, (ast.Tuple, ast.List)):  # w = [a, b, c] (MLS-MPM weights), read as w[i][0]
                return self.bind(target.id, ast.Tuple([self.operand(e) for e in node.value.elts], ast.Load()))
            return self.bind(target.id, self.value(node.value))
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(node.value, (ast.Tuple, ast.List)) \
                and len(target.elts) == len(node.value.elts) and _all_names(target.elts):
            values = [self.operand(v) for v in node.value.elts]  # all read before any is written
            for t, v in zip(target.elts, values, strict=False):
                self.bind(t.id, v)
            return
        if isinstance(target, (ast.Tuple, ast.List)) and _all_names(target.elts) \
                and isinstance(node.value, ast.Call) and self._is_static_range(node.value):
            statics = self.static_values(node.value, len(target.elts))  # i1, i2 = ti.static(i + 1, i + 2)
            if statics is None:
                raise NotReversible(f"the compile-time assignment `{ast.unparse(node)}`")
            for t, v in zip(target.elts, statics, strict=True):
                self.env[t.id] = ast.Constant(v)
            return
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(node.value, ast.Call) \
                and _all_names(target.elts):
            paths = self.returned_paths(node.value)
            if sorted({p[0] for p in paths if p}) != list(range(len(target.elts))):
                paths = _top_level(len(target.elts))
            leaves = self.call_outputs(node.value, paths)
            for k, t in enumerate(target.elts):
                part = {p[1:]: v for p, v in zip(paths, leaves, strict=True) if p[:1] == (k,)}
                if list(part) == [()]:
                    self.bind(t.id, part[()])
                else:  # a tuple inside the results (NOTE: [Nested results]): its leaves keep their names
                    self.bind(t.id, _nested(part))
                    self.tuples[self.ssa(t.id)] = part
            return
        if isinstance(target, (ast.Subscript, ast.Attribute)):
            return self.write_entry(target, node.value)
        raise NotReversible(f"the assignment to `{ast.unparse(target)}`")

    def stmt_AugAssign(self, node: ast.AugAssign) -> None:
        load = ast.parse(ast.unparse(node.target), mode="eval").body
        value = ast.BinOp(load, node.op, node.value)
        if isinstance(node.target, ast.Name):
            return self.bind(node.target.id, self.value(value))
        if isinstance(node.target, (ast.Subscript, ast.Attribute)):
            return self.write_entry(node.target, value)
        raise NotReversible(f"the update of `{ast.unparse(node.target)}`")

    def write_entry(self, target: ast.Subscript | ast.Attribute, value: ast.expr) -> None:
        """``v[i, j] = e`` as a new value of ``v``: ``v_1 = v; v_1[i, j] = e``.

        Its adjoint sends ``ct[i, j]`` to ``e`` and ``ct`` with that entry zeroed to the old ``v``.
        """
        base = target.value
        index = self.index(target)
        current = self.env.get(base.id) if isinstance(base, ast.Name) else None
        if not (isinstance(base, ast.Name) and isinstance(current, str)):  # not a loop counter
            raise NotReversible(f"the assignment to `{ast.unparse(target)}`")
        entry = self.operand(value)
        old = _name(current)
        new = self.namer.fresh(base.id)
        self.defined.add(new)
        self.forward.append(_assign(new, old))
        slot = index[0] if len(index) == 1 else ast.Tuple(index, ast.Load())
        self.forward.append(ast.Assign([ast.Subscript(ast.Name(new, ast.Load()), slot, ast.Store())], entry))
        self.env[base.id] = new
        if not (self.is_active(old) or self.is_active(entry)):
            return
        without = helpers.without if len(index) == 1 else helpers.without2
        keys = [Sym(i) for i in index]
        rule = lambda g, out, v, e: [without(g, *keys), g[slot]]  # noqa: E731
        self.ops.append(Op(new, rule, [old, entry]))
        self.active.add(new)

    def stmt_AnnAssign(self, node: ast.AnnAssign) -> None:
        if not isinstance(node.target, ast.Name) or node.value is None:
            raise NotReversible(f"the declaration of `{ast.unparse(node.target)}`")
        self.bind(node.target.id, self.value(node.value), annotation=self.rename(node.annotation))

    def stmt_Expr(self, node: ast.Expr) -> None:
        """A statement of inactive values, or a compile-time one (``ti.static(check(pair))``), as written;
        ``v.fill(e)`` of a differentiable value as the new value ``v = ti.zero(v) + e``."""
        value = node.value
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "fill" \
                and isinstance(value.func.value, ast.Name) and value.func.value.id in self.env \
                and len(value.args) == 1 and not value.keywords and self.reads_active(value) \
                and value.func.value.id not in self.integral:
            local = value.func.value.id
            filled = ast.BinOp(call(taichi("zero"), _name(local)), ast.Add(), value.args[0])
            return self.stmt_Assign(ast.Assign([ast.Name(local, ast.Store())], filled))
        if self.reads_active(node.value) and not self.compile_time_statement(node):
            raise NotReversible(f"the statement `{ast.unparse(node)}`")
        self.forward.append(ast.Expr(self.rename(node.value)))

    def compile_time_statement(self, node: ast.Expr) -> bool:
        """``ti.static(...)`` as a statement: Taichi evaluates it while it compiles (a check), nothing runs."""
        value = node.value
        return isinstance(value, ast.Call) and not self._is_local(value.func) \
            and resolve(value.func, self.parsed.namespace) is ti.static

    def _is_static_range(self, node: ast.expr) -> bool:
        """Whether a loop's iterable is ``ti.static(...)`` (Taichi unrolls the loop)."""
        return isinstance(node, ast.Call) and resolve(node.func, self.parsed.namespace) is ti.static

    def stmt_Pass(self, node: ast.Pass) -> None:
        pass

    def stmt_For(self, node: ast.For) -> None:
        """A loop over a range of constants, unrolled: the counter is a constant in each copy; a loop over
        ``range(n)`` with ``n`` known only at run time is a runtime loop (NOTE: [Reverse control flow])."""
        values = self.constant(node.iter, "range")
        counters = [node.target] if isinstance(node.target, ast.Name) else node.target.elts \
            if values is not None and isinstance(node.target, ast.Tuple) and _all_names(node.target.elts) else None
        if counters is None or node.orelse:
            raise NotReversible(f"a `For` statement over `{ast.unparse(node.iter)}` with this target or an else")
        if values is not None:  # ti.static(ti.ndrange(3, 3)) gives tuples for `for i, j in ...`
            names = [c.id for c in counters if isinstance(c, ast.Name)]
            outer = {n: self.env.get(n) for n in names}  # Taichi scopes the counters to the loop: restored after it
            for value in values:
                for n, v in zip(names, value if len(names) > 1 else (value,), strict=True):
                    self.env[n] = ast.Constant(v)
                for stmt in node.body:
                    self.statement(stmt)
            for n, before in outer.items():
                if before is None:
                    self.env.pop(n, None)
                else:
                    self.env[n] = before
            return
        assert isinstance(node.target, ast.Name)
        bounds = self.runtime_range(node.iter)
        if bounds is None:
            raise NotReversible(f"a `For` statement over `{ast.unparse(node.iter)}` (not a range)")
        self.loop(node, node.target.id, bounds)

    def stmt_While(self, node: ast.While) -> None:
        self.loop(node)

    def stmt_If(self, node: ast.If) -> None:
        """A branch on a condition of constants (``ti.static(i == j)`` in an unrolled loop): the taken side;
        on a value, both sides (NOTE: [Reverse control flow])."""
        taken = self.constant(node.test, "test")
        if taken is None:
            return self.branch(node)
        for stmt in node.body if taken else node.orelse:
            self.statement(stmt)

    @staticmethod
    def not_reversible(construct: str) -> NotReversible:
        return NotReversible(construct)

    def constant(self, node: ast.expr, kind: str) -> Any:
        """The value of ``range(...)`` (a list of ints, ``kind`` "range"), of an int (``kind`` "int") or of a
        condition made of constants, else None."""
        node = self.rename(node)
        static = isinstance(node, ast.Call) and resolve(node.func, self.parsed.namespace) is ti.static \
            and len(node.args) == 1
        if static and isinstance(node, ast.Call):
            node = node.args[0]
        if kind == "range":
            if static and not isinstance(node, ast.Call):  # ti.static(("a", "b")), ti.static(KEYS): its entries
                return self._static_entries(node)
            if not isinstance(node, ast.Call):
                return None
            func = resolve(node.func, self.parsed.namespace)
            if func is not range and func is not ti.ndrange:
                return None
            args = [self.constant(a, "int") for a in node.args]
            if None in args or not args:
                return None
            if func is ti.ndrange:  # tuples of indices, the last fastest
                return list(itertools.product(*(range(a) for a in args)))
            return list(range(*args)) if len(args) <= 3 else None
        names = self._constant_names(node, sequences=False)
        if names is None:
            return None
        code = compile(ast.fix_missing_locations(ast.Expression(node)), "<constant>", "eval")
        value = eval(code, {"__builtins__": {}}, names)  # constants and operators only, checked above
        return value if kind != "int" or isinstance(value, int) else None

    def _static_entries(self, node: ast.expr) -> list[Any] | None:
        """What a static loop over a Python sequence takes, where it is a tuple or list written out or a global
        one, of numbers and strings; else None."""
        if isinstance(node, (ast.Tuple, ast.List)):
            values: Any = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
        elif isinstance(node, ast.Name) and node.id not in self.env and node.id not in self.defined:
            values = resolve(node, self.parsed.namespace)
        else:
            return None
        if not isinstance(values, (tuple, list)):
            return None
        return list(values) if all(type(v) in (int, float, bool, str) for v in values) else None

    def static_values(self, node: ast.Call, count: int) -> list[Any] | None:
        """The ``count`` values of ``ti.static(a, b, ...)`` (one argument each) or ``ti.static(seq)`` (a Python
        sequence of them: ``OTHERS[i]`` with ``i`` a constant), evaluated as Taichi does while it compiles; None
        where an argument is not made of constants and module-level sequences."""
        values = [self._static(a) for a in node.args]
        if len(values) == 1 and count != 1:
            values = list(values[0]) if isinstance(values[0], (list, tuple)) and len(values[0]) == count else [None]
        return None if len(values) != count or any(v is None for v in values) else values

    def _static(self, node: ast.expr) -> Any:
        """The value of an expression of constants, loop counters and module-level sequences indexed by them."""
        node = self.rename(node)
        names = self._constant_names(node, sequences=True)
        if names is None:
            return None
        code = compile(ast.fix_missing_locations(ast.Expression(node)), "<static>", "eval")
        try:
            return eval(code, {"__builtins__": {}}, names)  # constants, operators and plain sequences, checked above
        except Exception:  # noqa: BLE001 -- an index out of range, a type error: Taichi reports it when it compiles
            return None

    def _constant_names(self, node: ast.expr, sequences: bool) -> dict[str, Any] | None:
        """The global names a renamed expression reads, with their values, where it is made only of constants,
        operators and global numbers (and, with ``sequences``, tuples and entries of global sequences of numbers);
        else None."""
        allowed = _CONSTANT_NODES + ((ast.Subscript, ast.Tuple) if sequences else ())
        names: dict[str, Any] = {}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                value = resolve(sub, self.parsed.namespace)
                plain = _plain_constant(value) if sequences else isinstance(value, (int, float, bool))
                if sub.id in self.env or sub.id in self.defined or not plain:
                    return None
                names[sub.id] = value
            elif not isinstance(sub, allowed):
                return None
        return names

    def bind(self, variable: str, value: ast.expr, annotation: ast.expr | None = None) -> None:
        """``variable = value`` as a fresh SSA name (an op's own temporary is renamed instead)."""
        ssa = variable if variable not in self.defined else self.namer.fresh(variable)
        if variable in self.integral and ssa != variable:  # Taichi keeps the integer type: no derivative
            self.forward.append(_assign(ssa, rebound_call(value, variable)))
            self.defined.add(ssa)
            self.env[variable] = ssa
            return
        if isinstance(value, ast.Name) and value.id in self.tuples:  # r = s, s a tuple: r names the same elements
            self.tuples[ssa] = self.tuples[value.id]
        elif isinstance(value, ast.Tuple):  # t = r[0], a tuple inside a call's results (NOTE: [Nested results])
            self.tuples[ssa] = _leaves(value)
        self.defined.add(ssa)
        last = self.ops[-1] if self.ops else None
        if (annotation is None and isinstance(value, ast.Name) and value.id in self.temps
                and isinstance(last, Op) and last.target == value.id and isinstance(self.forward[-1], ast.Assign)
                and isinstance(self.forward[-1].targets[0], ast.Name) and self.forward[-1].targets[0].id == value.id):
            self.forward[-1].targets[0].id = last.target = ssa  # the op computes the variable itself
            self.active.add(ssa)
            if value.id in self.shapes:
                self.shapes[ssa] = self.shapes.pop(value.id)
        else:
            shape = self.shape_of(value)
            if shape is not None and annotation is None:
                self.shapes[ssa] = shape
            self.forward.append(_assign(ssa, value, annotation))
            if self.is_active(value):
                self.ops.append(Op(ssa, copy_vjp, [value]))
                self.active.add(ssa)
        self.env[variable] = ssa

    def outputs(self, node: ast.expr) -> list[ast.expr]:
        if self.n_outputs > 1 and isinstance(node, ast.Call):  # return h(x), h returning a tuple
            paths = self.returned_paths(node)
            return self.call_outputs(node, paths if len(paths) == self.n_outputs else _top_level(self.n_outputs))
        if isinstance(node, ast.Name) and self.env.get(node.id) in self.tuples:
            names = list(self.tuples[self.ssa(node.id)].values())
            if len(names) != self.n_outputs:
                raise NotReversible(f"a return of {len(names)} values where {self.n_outputs} are expected")
            return names
        values = node.elts if isinstance(node, ast.Tuple) else [node]
        if len(values) != self.n_outputs and len(self.leaves(node)) == self.n_outputs:
            values = self.leaves(node)  # NOTE: [Nested results]
        if len(values) != self.n_outputs:
            raise NotReversible(f"a return of {len(values)} values where {self.n_outputs} are expected")
        return [self.operand(v) for v in values]

    def leaves(self, node: ast.expr) -> list[ast.expr]:
        """The leaves of a returned value: tuples flattened, names bound to a call's results too."""
        if isinstance(node, ast.Tuple):
            return [leaf for e in node.elts for leaf in self.leaves(e)]
        if isinstance(node, ast.Name) and self.env.get(node.id) in self.tuples:
            return list(self.tuples[self.ssa(node.id)].values())
        return [node]

    # --- expressions -------------------------------------------------------------
    def is_active(self, node: ast.expr) -> TypeGuard[ast.Name]:
        return isinstance(node, ast.Name) and node.id in self.active

    def reads_active(self, node: ast.expr) -> bool:
        return any(self._active_ssa(self.env.get(n)) for n in loaded_names(node))

    def _active_ssa(self, ssa: object) -> bool:
        """Whether the value named ``ssa`` carries a derivative: an active name, or a tuple of call results
        with an active leaf (``t, dt = f_jvp_jvp(x, ...)``; NOTE: [Nested results])."""
        if ssa in self.active:
            return True
        leaves = self.tuples.get(ssa) if isinstance(ssa, str) else None
        return leaves is not None and any(self.is_active(leaf) for leaf in leaves.values())

    def rename(self, node: ast.expr) -> ast.expr:
        """A copy of an expression reading the current SSA names of local variables."""
        return _RenameLocals(self.env, self.parsed.namespace).visit(ast.parse(ast.unparse(node), mode="eval").body)

    def operand(self, node: ast.expr) -> ast.expr:
        """An expression as a Name (active, or an inactive value computed once) or a simple inactive node."""
        value = self.value(node)
        if self.is_active(value) or isinstance(value, _SIMPLE) or _is_number(value):
            return value
        name = self.namer.fresh("c")
        self.forward.append(_assign(name, value))
        return _name(name)

    def value(self, node: ast.expr) -> ast.expr:
        """Lower an expression: an active Name, or (no derivative) a renamed copy."""
        if not self.reads_active(node):
            return self.rename(node)
        handler = getattr(self, "expr_" + type(node).__name__, None)
        if handler is None:
            raise NotReversible(f"the expression `{ast.unparse(node)}`")
        return handler(node)

    def op(self, rule: Vjp | None, node: ast.expr, args: list[ast.expr], hint: str, callee: str | None = None,
           positions: list[int | None] | None = None, shape: Shape | None = None) -> ast.Name:
        """Emit ``t = node`` and remember how to send its cotangent to ``args`` (``shape``: its shape, where
        known)."""
        target = self.namer.fresh(hint)
        if shape is not None:
            self.shapes[target] = shape
        self.forward.append(_assign(target, node))
        self.ops.append(Op(target, rule, args, callee, positions))
        self.active.add(target)
        self.temps.add(target)
        self.defined.add(target)
        return _name(target)

    def shape_of(self, node: ast.expr) -> Shape | None:
        """The shape of an operand, where the code says: a number's, or a name's (NOTE: [Known shapes])."""
        if isinstance(node, ast.Name):
            return self.shapes.get(node.id)
        return () if _is_number(node) or (isinstance(node, ast.Constant) and type(node.value) in (int, float)) \
            else None

    def result_shape(self, rule: Rule, args: list[ast.expr]) -> Shape | None:
        return None if rule.result_shape is None else rule.result_shape([self.shape_of(a) for a in args])

    def expr_Name(self, node: ast.Name) -> ast.expr:
        return _name(self.ssa(node.id))

    def expr_BinOp(self, node: ast.BinOp) -> ast.expr:
        rule = TABLE.get(type(node.op))
        if rule is not None and rule.jvp is zero:  # x // y
            return self.rename(node)
        if rule is None or rule.vjp is None:
            raise NotReversible(f"the operator in `{ast.unparse(node)}`")
        a, b = self.operand(node.left), self.operand(node.right)
        return self.op(rule.vjp, ast.BinOp(a, node.op, b), [a, b], _OP_HINTS.get(type(node.op), "t"),
                       shape=self.result_shape(rule, [a, b]))

    def expr_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
        if isinstance(node.op, (ast.Not, ast.Invert)):
            return self.rename(node)
        a = self.operand(node.operand)
        rule = TABLE[type(node.op)]
        return self.op(rule.vjp, ast.UnaryOp(node.op, a), [a], "neg", shape=self.result_shape(rule, [a]))

    def expr_Compare(self, node: ast.expr) -> ast.expr:
        return self.rename(node)

    expr_BoolOp = expr_Compare

    def index(self, node: ast.Subscript | ast.Attribute) -> list[ast.expr]:
        """The index nodes of an entry ``v[i]``, ``v[i, j]`` or ``v.x`` (with loop counters as constants)."""
        if isinstance(node, ast.Attribute):
            if node.attr not in _COMPONENTS:
                raise NotReversible(f"the attribute `{ast.unparse(node)}`")
            return [ast.Constant(_COMPONENTS[node.attr])]
        if any(isinstance(n, ast.Slice) for n in ast.walk(node.slice)) or self.reads_active(node.slice):
            raise NotReversible(f"the subscript `{ast.unparse(node)}`")
        renamed = self.rename(node.slice)
        index = renamed.elts if isinstance(renamed, ast.Tuple) else [renamed]
        if len(index) not in (1, 2):
            raise NotReversible(f"the subscript `{ast.unparse(node)}`")
        return index

    def expr_IfExp(self, node: ast.IfExp) -> ast.expr:
        """``a if c else b``: Taichi evaluates only the side the test takes (``ifte``), so the value is a branch
        binding a fresh local on each side (NOTE: [Reverse control flow]), declared first by the expression
        itself without a derivative (``u[i - 1] if i > 0 else 0.0`` reads no entry outside ``u``)."""
        taken = self.constant(node.test, "test")
        if taken is not None:
            return self.value(node.body if taken else node.orelse)
        local = self.namer.fresh("picked")
        self.forward.append(_assign(local, self.rename(node)))
        self.env[local] = local
        self.defined.add(local)
        self.statement(ast.If(node.test, [ast.Assign([ast.Name(local, ast.Store())], node.body)],
                              [ast.Assign([ast.Name(local, ast.Store())], node.orelse)]))
        picked = self.env[local]
        assert isinstance(picked, str)  # bound by the branch, a name
        return _name(picked)

    def expr_Subscript(self, node: ast.Subscript) -> ast.expr:
        return self.read_entry(node)

    def expr_Attribute(self, node: ast.Attribute) -> ast.expr:
        if node.attr in _ZERO_ATTRIBUTES:
            return self.rename(node)
        return self.read_entry(node)

    def read_slice(self, node: ast.Subscript) -> ast.expr:
        """``m[i, :]``, ``m[:, j]``, ``m[1:, :2]``, ``v[1:3]`` (NOTE: [Slices]): the adjoint puts the cotangent
        at the entries read, in a zero shaped like the base."""
        base = self.operand(node.value)
        whole = self.shape_of(base)
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if whole is None or len(parts) != len(whole) or len(parts) not in (1, 2) or self.reads_active(node.slice):
            raise NotReversible(f"the subscript `{ast.unparse(node)}` (a slice of a value whose shape the code "
                                "does not say)")
        picks: list[ast.expr] = []
        shape: list[int] = []
        for part, n in zip(parts, whole, strict=True):
            if not isinstance(part, ast.Slice):
                picks.append(self.rename(part))
                continue
            bounds = [None if b is None else _static_int(b) for b in (part.lower, part.upper, part.step)]
            if any(b is False for b in bounds):
                raise NotReversible(f"the subscript `{ast.unparse(node)}` (slice bounds must be integers)")
            taken = list(range(*slice(*bounds).indices(n)))
            picks.append(ast.Tuple([ast.Constant(k) for k in taken], ast.Load()))
            shape.append(len(taken))
        read = ast.Subscript(base, node.slice, ast.Load())
        scatter = helpers.scatter_picks if len(parts) == 1 else helpers.scatter_picks2

        def rule(g: Sym, out: Sym, x: Sym) -> Contributions:
            return [scatter(x, g, *[Sym(p) for p in picks])]

        return self.op(rule, read, [base], f"{_hint(base)}_slice", shape=tuple(shape))

    def read_swizzle(self, node: ast.Attribute) -> ast.expr:
        """``v.yx``, ``v.xyz``, ``v.xx``: a vector of the entries named; the adjoint adds the cotangent's entries
        at theirs, in a zero shaped like ``v``."""
        base = self.operand(node.value)
        picks = ast.Tuple([ast.Constant(_COMPONENTS[c]) for c in node.attr], ast.Load())

        def rule(g: Sym, out: Sym, x: Sym) -> Contributions:
            return [helpers.scatter_picks(x, g, Sym(picks))]

        return self.op(rule, ast.Attribute(base, node.attr, ast.Load()), [base], f"{_hint(base)}_{node.attr}",
                       shape=(len(node.attr),))

    def read_entry(self, node: ast.Subscript | ast.Attribute) -> ast.expr:
        """``v[i, j]``: the adjoint puts the cotangent at ``[i, j]`` of a zero shaped like ``v``."""
        if isinstance(node, ast.Subscript) and any(isinstance(n, ast.Slice) for n in ast.walk(node.slice)):
            return self.read_slice(node)
        if isinstance(node, ast.Attribute) and 1 < len(node.attr) <= 4 and set(node.attr) <= set(_COMPONENTS):
            return self.read_swizzle(node)
        element = self.tuple_element(node)
        if element is not None:
            return element
        index = self.index(node)
        base = self.operand(node.value)
        read = ast.Attribute(base, node.attr, ast.Load()) if isinstance(node, ast.Attribute) else \
            ast.Subscript(base, index[0] if len(index) == 1 else ast.Tuple(index, ast.Load()), ast.Load())
        scatter = helpers.scatter if len(index) == 1 else helpers.scatter2

        def rule(g: Sym, out: Sym, x: Sym) -> Contributions:
            return [scatter(x, g, *[Sym(i) for i in index])]

        whole = self.shape_of(base)
        entry = () if whole is not None and len(whole) == len(index) else None
        return self.op(rule, read, [base], f"{_hint(base)}_entry", shape=entry)

    def expr_Call(self, node: ast.Call) -> ast.expr:
        callee = self.classify(node)
        return getattr(self, "call_" + callee.sort.name.lower())(node, callee)

    def classify(self, node: ast.Call) -> Callee:
        """What a call goes to (``_rules/calls.py``), with the names bound so far as locals."""
        return classify(node, self.parsed.namespace, set(self.env) | self.defined, self._is_local)

    # one handler per kind of callee, each ``(node, callee) -> the value's name or a copy of the call``
    def call_local(self, node: ast.Call, callee: Callee) -> ast.expr:
        raise NotReversible(f"a call of the local value `{ast.unparse(node.func)}`")

    def call_unknown(self, node: ast.Call, callee: Callee) -> ast.expr:
        raise NotReversible(f"a call of the unknown name `{ast.unparse(node.func)}`")

    def call_partial(self, node: ast.Call, callee: Callee) -> ast.expr:
        """``p(x)`` -> ``h(2.0, x)``, as Python calls it."""
        if any(k.arg is None for k in node.keywords):
            raise NotReversible(f"the call `{ast.unparse(node)}`")
        return self.value(expand_partial(node, callee.obj, self.bind_value))

    def call_static(self, node: ast.Call, callee: Callee) -> ast.expr:
        return self.rename(node)

    call_constant = call_static

    def call_custom(self, node: ast.Call, callee: Callee) -> ast.expr:
        """A td.custom_vjp function (its bwd rule) or a td.custom_jvp one (its jvp rule, transposed)."""
        return self.call_reverse(node, callee.obj)

    def call_function(self, node: ast.Call, callee: Callee) -> ast.expr:
        """A tidiff Function: a call of its value and cotangent map (``_inline.py``)."""
        return self.call_reverse(node, callee.obj)

    def call_func(self, node: ast.Call, callee: Callee) -> ast.expr:
        """A @ti.func or a plain Python helper: a call of its reverse function (keywords bound to parameters)."""
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise NotReversible(f"the call `{ast.unparse(node)}`")
        return self.call_reverse(node, callee.obj)

    def call_refused(self, node: ast.Call, callee: Callee) -> ast.expr:
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise NotReversible(f"the call `{ast.unparse(node)}`")
        raise NotReversible(f"a call of `{ast.unparse(node.func)}` (no reverse rule)")

    def call_op(self, node: ast.Call, callee: Callee) -> ast.expr:
        func, op = node.func, callee.obj
        if op is ti.cast and not self._float_cast(node):
            return self.rename(node)
        if any(isinstance(a, ast.Starred) for a in node.args) or any(self.reads_active(k.value) for k in node.keywords):
            raise NotReversible(f"the call `{ast.unparse(node)}`")
        keywords = [ast.keyword(k.arg, self.rename(k.value)) for k in node.keywords]
        if op in (ti.Vector, ti.Matrix):
            return self.construct(node, keywords)
        if op in (ti.Matrix.rows, ti.Matrix.cols):
            return self.construct_rows(node, keywords)
        if is_constructor(op):
            return self.construct_typed(node, op, keywords)
        if op in (min, max, ti.min, ti.max) and len(node.args) > 2:
            return self.value(pairwise(ast.Call(func, node.args, [])))
        rule = lookup(op)
        if rule is not None and rule.n_outputs > 1:
            raise NotReversible(f"the call `{ast.unparse(node)}` inside an expression (assign its {rule.n_outputs} "
                                f"results to names)")
        if rule is None or rule.vjp is None:
            raise NotReversible(f"a call of `{ast.unparse(func)}` (no reverse rule)")
        args = [self.operand(a) for a in node.args]
        return self.op(rule.vjp, ast.Call(func, args, keywords), args, _call_hint(func, args),
                       shape=self.result_shape(rule, args))

    def _float_cast(self, node: ast.Call) -> bool:
        """Whether ``ti.cast(x, dtype)`` may have a derivative: not a cast to an integer type the transform
        can see (a parameter's ``dt`` is known only when Taichi compiles: the rule's ``cast_adjoint`` decides)."""
        if len(node.args) != 2:
            return False
        if self._is_local(node.args[1]):
            return True
        dtype = resolve(node.args[1], self.parsed.namespace)
        return dtype is not MISSING and is_dtype(dtype) and not is_integral(dtype)

    def call_method(self, node: ast.Call, callee: Callee) -> ast.expr:
        """``v.dot(w)`` and the other methods with a rule."""
        func = node.func
        assert isinstance(func, ast.Attribute)  # classify says METHOD of attributes only
        rule = TABLE.get(("method", func.attr))
        if rule is not None and rule.jvp is zero:
            return self.rename(node)
        if rule is None or rule.vjp is None:
            raise NotReversible(f"the method `.{func.attr}()`")
        if any(self.reads_active(k.value) for k in node.keywords):
            raise NotReversible(f"the call `{ast.unparse(node)}`")
        receiver = self.operand(func.value)
        args = [self.operand(a) for a in node.args]
        call = ast.Call(ast.Attribute(receiver, func.attr, ast.Load()), args,
                        [ast.keyword(k.arg, self.rename(k.value)) for k in node.keywords])
        return self.op(rule.vjp, call, [receiver] + args, f"{func.attr.lower()}_{_hint(receiver)}",
                       shape=self.result_shape(rule, [receiver] + args))

    def construct(self, node: ast.Call, keywords: list[ast.keyword]) -> ast.expr:
        """``ti.Vector([a, b])``, ``ti.Matrix([[a, b], [c, d]], dt)``: entry k gets ``g[k]``."""
        if len(node.args) not in (1, 2) or not isinstance(node.args[0], (ast.List, ast.Tuple)):
            raise NotReversible(f"the constructor `{ast.unparse(node)}`")
        dtype = [self.rename(a) for a in node.args[1:]]  # ti.Vector([...], ti.f64): a dtype, no operand
        rows = node.args[0].elts
        index: list[tuple[int, ...]]
        if _all_sequences(rows):
            index = [(i, j) for i, r in enumerate(rows) for j in range(len(r.elts))]
            entries = [e for r in rows for e in r.elts]
            if any(isinstance(e, (ast.List, ast.Tuple)) for e in entries):
                raise NotReversible(f"the constructor `{ast.unparse(node)}`")
            args = [self.operand(e) for e in entries]
            it = iter(args)
            literal = ast.List([ast.List([next(it) for _ in r.elts], ast.Load()) for r in rows], ast.Load())
        else:
            index = [(k,) for k in range(len(rows))]
            args = [self.operand(e) for e in rows]
            literal = ast.List(args, ast.Load())
        return self._constructed(ast.Call(node.func, [literal] + dtype, keywords), args, index)

    def construct_rows(self, node: ast.Call, keywords: list[ast.keyword]) -> ast.expr:
        """``ti.Matrix.rows([u, v])`` (``cols``) of vectors: vector k gets row (column) k of ``g``."""
        if len(node.args) != 1 or not isinstance(node.args[0], (ast.List, ast.Tuple)) \
                or any(isinstance(e, (ast.List, ast.Tuple)) for e in node.args[0].elts):
            raise NotReversible(f"the constructor `{ast.unparse(node)}`")
        args = [self.operand(e) for e in node.args[0].elts]
        rows = resolve(node.func, self.parsed.namespace) is ti.Matrix.rows
        part = helpers.row_of if rows else helpers.col_of
        def rule(g: Sym, out: Sym, *xs: Sym) -> Contributions:
            return [part(g, k) for k in range(len(xs))]

        return self.op(rule, ast.Call(node.func, [ast.List(args, ast.Load())], keywords), args, "mat")

    def construct_typed(self, node: ast.Call, callee: Any, keywords: list[ast.keyword]) -> ast.expr:
        """``ti.math.vec3(a, b, c)`` with one scalar per entry, a list of them, or parts of any shape
        (``ti.math.vec4(v.xyz, 1.0)``); ``ti.math.ivec3``: no derivative."""
        if is_integral(callee.dtype):
            return self.rename(node)
        if len(node.args) == 1 and isinstance(node.args[0], (ast.List, ast.Tuple)):  # ti.math.mat2([[a, b], [c, d]])
            return self.construct(node, keywords)
        if len(node.args) == 1:  # ti.math.vec3(x): x in every entry, or a copy of a vector x
            arg = self.operand(node.args[0])
            return self.op(_constructor_of_one, ast.Call(node.func, [arg], keywords), [arg], "vec")
        shape = (callee.n,) if callee.ndim == 1 else (callee.n, callee.m)
        size = shape[0] if len(shape) == 1 else shape[0] * shape[1]
        if len(node.args) != size:  # ti.math.vec4(v.xyz, 1.0): parts of any shape (NOTE: [Constructors from parts])
            if any(isinstance(a, (ast.List, ast.Tuple, ast.Starred)) for a in node.args):
                raise NotReversible(f"the constructor `{ast.unparse(node)}` (lists among several parts)")
            parts = [self.operand(a) for a in node.args]
            def rule(g: Sym, out: Sym, *xs: Sym) -> Contributions:
                return [helpers.part_of(g, k, *xs) for k in range(len(xs))]

            return self.op(rule, ast.Call(node.func, parts, keywords), parts, "vec" if len(shape) == 1 else "mat",
                           shape=shape)
        args = [self.operand(a) for a in node.args]
        index = [(k,) for k in range(size)] if len(shape) == 1 else [divmod(k, shape[1]) for k in range(size)]
        return self._constructed(ast.Call(node.func, args, keywords), args, index)

    def _constructed(self, call: ast.Call, args: list[ast.expr], index: list[Path]) -> ast.expr:
        keys = [ast.Constant(i[0]) if len(i) == 1 else ast.Tuple([ast.Constant(k) for k in i], ast.Load())
                for i in index]
        rule = lambda g, out, *xs: [g[key] for key in keys]  # noqa: E731
        return self.op(rule, call, args, "vec" if len(index[0]) == 1 else "mat")

    @staticmethod
    def flat_call(node: ast.Call, callee: Any, rule: Any) -> Any:
        """The form of a call with tuple arguments written out (``td.jvp``, ``td.hvp``) taking their entries one
        by one, whose reverse gives each entry its cotangent; None for other calls."""
        if rule is None or node.keywords or not hasattr(rule, "flat"):
            return None
        return rule.flat(callee, tuple(len(a.elts) if isinstance(a, ast.Tuple) else None for a in node.args))

    def call_reverse(self, node: ast.Call, callee: Any, n_outputs: int = 1) -> ast.Name:
        """``y = h(x)`` forward; in the sweep ``h_vjp(x, g)`` gives the operands' cotangents.

        A ``td.custom_vjp`` function's own ``bwd(x, g)`` is called instead, with the real
        cotangent ``g``: it returns one cotangent per operand.
        """
        rule = callable_rule(callee)
        as_written: set[int] = set()  # arguments kept as written: compile-time values (``ti.func(g)``)
        flat = self.flat_call(node, callee, rule)
        if flat is not None:  # td.jvp(F, (x, s), (t, 0.0)) -> a call of F's tangent at (F, x, s, t, 0.0)
            callee, rule, as_written = flat, callable_rule(flat), {0}
            node = ast.Call(_name(helper_name(self.helpers, self.namer, flat, callee_hint(node.func, callee))),
                            [e for a in node.args for e in (a.elts if isinstance(a, ast.Tuple) else [a])], [])
        if rule is not None:
            nodes = callable_positional(node, callee, _not_reversible)
        else:
            try:
                nodes = positional(node, callee, self.bind_value)
            except TypeError as e:
                raise NotReversible(f"the call `{ast.unparse(node)}` ({e})") from None
        # an inactive argument of compile-time values stays as written: a helper may need it as a
        # constant (NOTE: [Python helpers]), and reading it again in the sweep costs nothing
        args = [self.rename(a) if self._compile_time(a) or k in as_written else self.operand(a)
                for k, a in enumerate(nodes)]
        base = callee_hint(node.func, callee)
        positions: list[int | None]
        if hashable(callee) and callee in CUSTOM_VJPS:
            reverse, hint, positions = CUSTOM_VJPS[callee], base + "_bwd", list(range(len(args)))
            self.uses_bwd = True
        elif hashable(callee) and callee in CUSTOM_JVPS:  # its jvp rule, transposed
            mask = tuple(self.is_active(a) for a in args)
            reverse = linearized(callee, CUSTOM_JVPS[callee], mask, n_outputs)
            rank = iter(range(1, len(args) + 1))
            hint, positions = base + "_linear_vjp", [next(rank) if active else None for active in mask]
        else:
            mask = tuple(self.is_active(a) for a in args)
            reverse = (
                rule.reverse(callee, mask, n_outputs) if rule is not None else self.vjp_of(callee, mask, n_outputs)
            )
            if isinstance(reverse, NotReversible) and rule is None:  # NOTE: [Calls reversed by pushes]
                reverse = pushed(callee, mask, n_outputs) or reverse
            if reverse is None or isinstance(reverse, NotReversible):
                why = f": {reverse}" if isinstance(reverse, NotReversible) else ""
                raise NotReversible(f"the call of `{ast.unparse(node.func)}`, which is not reversible{why}")
            self.uses_bwd = self.uses_bwd or info(reverse).uses_bwd
            self.recomputes = self.recomputes or info(reverse).recomputes
            rank = iter(range(1, len(args) + 1))  # the result is (out, ct of each active operand...)
            hint, positions = base + "_vjp", [next(rank) if active else None for active in mask]
        helper = helper_name(self.helpers, self.namer, reverse, hint)
        func = node.func
        if is_helper(callee):  # called as Taichi would, without its warning (NOTE: [Python helpers])
            func = _name(helper_name(self.helpers, self.namer, quiet(callee), base))
        elif hashable(callee) and callee in CUSTOM_VJPS and callee not in CUSTOM_JVPS:
            # NOTE: [The forward sweep of a custom_vjp call] the value comes from the function's own code, as
            # JAX's comes from its fwd rule: a derivative of this reverse function (hessian = jacfwd of
            # jacrev, jacrev of grad) differentiates that code and the bwd rule's, as JAX does
            func = _name(helper_name(self.helpers, self.namer, callee.tifunc, base + "_fwd"))
        return self.op(None, ast.Call(func, args, []), args, _call_hint(node.func, args), callee=helper,
                       positions=positions)

    def bind_value(self, value: object) -> str:
        """The name generated code reads a Python value by (a partial's bound value, a default)."""
        return self.parsed.name_for(value, self.namer, hint_name(value))

    def _compile_time(self, node: ast.expr) -> bool:
        """An inactive expression whose calls are all ``ti.static`` or Python builtins (``len(v)``)."""
        if self.reads_active(node):
            return False
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                callee = resolve(sub.func, self.parsed.namespace) if not self._is_local(sub.func) else MISSING
                builtin = getattr(builtins, getattr(callee, "__name__", ""), None) is callee
                if callee is not ti.static and not builtin:
                    return False
        return True

    def tuple_element(self, node: ast.Subscript | ast.Attribute) -> ast.expr | None:
        """``r[k]`` (or ``r[k][j]``) of a tuple-valued call result ``r``: the name bound to that leaf, a tuple
        of the names of a tuple inside the results, or None where ``r`` is no such result."""
        path: list[int] = []
        base: ast.expr = node
        while isinstance(base, ast.Subscript):
            if any(isinstance(n, ast.Slice) for n in ast.walk(base.slice)):
                return None  # a slice of a matrix, ``m[1, :]``: no call's results are sliced
            index = self.rename(base.slice)
            if not (isinstance(index, ast.Constant) and isinstance(index.value, int)):
                return None
            path.insert(0, index.value)
            base = base.value
        if not path:
            return None
        if isinstance(base, ast.Call):  # td.jvp(F, (x,), (t,))[1]: the call's results bound to names first
            paths = self.returned_paths(base)
            if paths == [()]:
                return None
            names: dict[Path, ast.expr] | None = dict(zip(paths, self.call_outputs(base, paths), strict=True))
        else:
            current = self.env.get(base.id) if isinstance(base, ast.Name) else None
            names = self.tuples.get(current) if isinstance(current, str) else None
        if names is None:
            return None
        key = tuple(path)
        if key in names:
            return names[key]
        if any(key[:k] in names for k in range(1, len(key))):
            return None  # ``w[0][1]``: an entry of the element ``w[0]``, read as such
        part = {p[len(key):]: v for p, v in names.items() if p[:len(key)] == key}
        if not part:
            raise NotReversible(f"the read of `{ast.unparse(node)}`, past the end of a call's results")
        return _nested(part)  # NOTE: [Nested results]

    def returned_paths(self, node: ast.expr) -> list[Path]:
        """Index paths of the values a call returns: ``[(0,), (1,)]`` for a callee returning ``(a, b)``,
        ``[(0, 0), (0, 1), (1,)]`` for ``((a, b), c)`` (NOTE: [Nested results]), ``[()]`` for one value."""
        if not isinstance(node, ast.Call):
            return [()]
        return results.paths(results.call_shape(node, self.parsed, set(self.env) | self.defined))

    def call_outputs(self, node: ast.Call, paths: list[Path]) -> list[ast.expr]:
        """``a, b = h(x)`` for a @ti.func (or custom_vjp function, or tidiff Function) returning the values at
        these index ``paths``: one call op whose results are bound to names of their own."""
        count = len(paths)
        callee = self.classify(node)
        rule = lookup(callee.obj) if callee.sort is Sort.OP else None
        if not (callee.sort in (Sort.CUSTOM, Sort.FUNCTION, Sort.FUNC) or getattr(rule, "n_outputs", 1) == count):
            raise NotReversible(f"the call `{ast.unparse(node)}` returning {count} values")
        if not self.reads_active(node):  # (a kernel's: nor a func reading fields, whose reads have adjoints)
            value = self.operand(node)
            return [_element(value, path) for path in paths]
        if callee.sort is Sort.OP:  # an op with a rule: U, S, V = ti.svd(A)
            if any(self.reads_active(k.value) for k in node.keywords):
                raise NotReversible(f"the call `{ast.unparse(node)}`")
            args = [self.operand(a) for a in node.args]
            keywords = [ast.keyword(k.arg, self.rename(k.value)) for k in node.keywords]
            assert rule is not None and rule.vjp is not None  # an op of several results has a reverse rule
            tuple_name = self.op(rule.vjp, ast.Call(node.func, args, keywords), args, _call_hint(node.func, args))
        else:
            tuple_name = self.call_reverse(node, callee.obj, n_outputs=count)
        op = self.last_op()
        op.outputs = []
        for path in paths:
            name = self.namer.fresh(f"{tuple_name.id}_{'_'.join(map(str, path))}")
            self.forward.append(_assign(name, _element(tuple_name, path)))
            self.active.add(name)
            self.defined.add(name)
            op.outputs.append(name)
        return [_name(n) for n in op.outputs]

    def last_op(self) -> Op:
        """The op just emitted (an expression's: blocks emit theirs when they end)."""
        op = self.ops[-1]
        assert isinstance(op, Op)
        return op

    def _is_local(self, node: ast.expr) -> bool:
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return not isinstance(node, ast.Name) or node.id in self.env

    # --- the reverse sweep ---------------------------------------------------------
    def sweep(self, outputs: list[ast.expr], ct_params: list[str]) -> dict[str, str]:
        """Cotangent statements, last op first; returns {SSA name: the name of its cotangent}."""
        self.straight = not any(isinstance(op, (Branch, Loop)) for op in self.ops)
        for out, ct in zip(outputs, ct_params, strict=False):
            if self.is_active(out):
                self.add(out.id, Sym(_name(ct)))
        self.sweep_ops(self.ops)
        self.flush()
        return self.cts

    def add(self, variable: str, contribution: Sym) -> None:
        """``ct_variable += contribution`` (declared by its first contribution). A contribution to one entry
        (``scatter(x, g, 3)``) waits beside the others to that variable's entries, in straight-line code,
        until the cotangent is read (NOTE: [Entries in one value] in ``_rules/helpers.py``)."""
        entry = _entry_contribution(contribution) if not self.in_block else None
        if entry is not None:
            like, index, value = entry
            waiting = self.entries.setdefault(variable, (like, {}))[1]
            if index in waiting:  # a second read of the entry: its contributions summed in order
                total = self.namer.fresh(f"ct_{variable}_at")
                self.backward.append(_assign(total, ast.BinOp(waiting[index], ast.Add(), value)))
                value = _name(total)
            waiting[index] = value
            return
        self.flush(variable)
        if isinstance(contribution.node, ast.Name) and variable not in self.cts and self.straight:
            self.cts[variable] = contribution.node.id  # the same value: its name, no copy (NOTE: [Known shapes])
            self.borrowed.add(variable)
            return
        self.add_now(variable, contribution)

    def add_now(self, variable: str, contribution: Sym) -> None:
        value: ast.expr
        if variable in self.borrowed:  # its name is another's cotangent: a sum of the two is a name of its own
            self.borrowed.discard(variable)
            total = self.namer.fresh("ct_" + variable)
            self.backward.append(_assign(total, ast.BinOp(_name(self.cts[variable]), ast.Add(), contribution.node)))
            self.cts[variable] = total
            return
        if variable in self.cts:
            value = ast.BinOp(_name(self.cts[variable]), ast.Add(), contribution.node)
        else:
            self.cts[variable] = self.namer.fresh("ct_" + variable)
            value = contribution.node
        self.backward.append(_assign(self.cts[variable], value))

    def flush(self, *variables: str) -> None:
        """Add the waiting entry contributions to the cotangents of ``variables`` (all, by default): one
        ``scatter`` where one entry waits, else one ``scattered`` value of all of them."""
        for variable in variables or list(self.entries):
            if variable not in self.entries:
                continue
            like, waiting = self.entries.pop(variable)
            if len(waiting) == 1:
                (index, value), = waiting.items()
                self.add_now(variable, Sym(_scatter(like, index, value)))
            else:
                spread = "scattered" if len(next(iter(waiting))) == 1 else "scattered2"
                parts = [part for index, value in waiting.items() for part in (*map(ast.Constant, index), value)]
                self.add_now(variable, Sym(ast.Call(ast.Attribute(_name(RULE_HELPERS), spread, ast.Load()),
                                                    [like] + parts, [])))

    def sweep_ops(self, ops: list[Op | Branch | Loop | Store]) -> None:
        """The adjoints of a block's ops, last first, into ``self.backward``."""
        cts = self.cts
        for op in reversed(ops):
            if isinstance(op, Store):
                self.reverse_store(op)
                continue
            if isinstance(op, Branch):
                self.flush()
                self.reverse_branch(op)
                continue
            if isinstance(op, Loop):
                self.flush()
                self.reverse_loop(op)
                continue
            self.flush(*op.results())
            if not any(r in cts for r in op.results()):
                continue
            if op.effect is not None:
                self.backward.extend(op.effect(_name(cts[op.target])))
                continue
            contributions: Contributions
            if op.callee is not None:
                assert op.positions is not None  # set for every call
                gs: list[ast.expr] = [_name(cts[r]) if r in cts else zero_of(r) for r in op.results()]
                result = self.namer.fresh(f"adj_{op.target}")
                self.backward.append(_assign(result, ast.Call(_name(op.callee), op.args + gs, [])))
                contributions = [None if k is None else Sym(_name(result))[k] for k in op.positions]
            elif op.outputs:  # an op with several results: the rule takes all their cotangents
                assert op.rule is not None  # only calls have none
                g_all = [Sym(_name(cts[r])) if r in cts else Sym(_name(TAICHI)).zero(Sym(_name(r))) for r in op.outputs]
                contributions = op.rule(g_all, [Sym(_name(r)) for r in op.outputs], *[Sym(a) for a in op.args])
            else:
                assert op.rule is not None
                g = Sym(_name(cts[op.target]))
                contributions = op.rule(g, Sym(_name(op.target)), *[Sym(a) for a in op.args])
                shape = self.shapes.get(op.target)
                if shape is not None:  # a sum back to an operand of the result's shape is the value itself
                    contributions = [_summed_to(c, a, shape, self.shape_of(a))
                                     for c, a in zip(contributions, op.args, strict=False)]
            for arg, contribution in zip(op.args, contributions, strict=False):
                if contribution is not None and self.is_active(arg):
                    self.add(arg.id, contribution)


    def reverse_store(self, store: Store) -> None:
        """The adjoint of a store into a field: the stored value's cotangent is the field's gradient there
        (negated for ``-=``); a "set" clears it, as the old value no longer matters (NOTE: [Reverse of a
        kernel] in ``kernels.py``)."""
        at = store.at(ast.Load())
        read = self.namer.fresh("ct_stored")
        if store.ties is not None:  # NOTE: [Atomic extremes in reverse]
            assert store.won is not None and isinstance(at, ast.Subscript)
            at = call(taichi("select"), copy.deepcopy(store.won), extremes.share(at, store.ties, at), 0.0)
        self.backward.append(_assign(read, ast.UnaryOp(ast.USub(), at) if store.kind == "sub" else at))
        if store.kind == "set":
            self.backward.append(ast.Assign([store.at(ast.Store())], helpers.zeros_like(_name(read)).node))
        if self.is_active(store.value):
            self.add(store.value.id, Sym(_name(read)))


_OP_HINTS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.Pow: "pow",
             ast.MatMult: "matmul", ast.Mod: "mod"}


# The leaves of a call's results (NOTE: [Nested results] in ``results.py``).


def _constructor_of_one(g: Sym, out: Sym, x: Sym) -> Contributions:
    """The adjoint of ``ti.math.vec3(x)``: Taichi puts a scalar ``x`` in every entry and copies a vector."""
    return [helpers.sum_to(g, x)]


_SCATTERS = {"scatter": 1, "scatter2": 2}


def _entry_contribution(contribution: Sym) -> tuple[ast.expr, tuple[int, ...], ast.expr] | None:
    """``(like, index, value)`` of a contribution ``scatter(like, value, i)`` (``scatter2``: ``i, j``) at
    constant indices, else None."""
    node = contribution.node
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _SCATTERS
            and isinstance(node.func.value, ast.Name) and node.func.value.id == RULE_HELPERS):
        return None
    like, value, *index = node.args
    at = tuple(i.value for i in index if isinstance(i, ast.Constant) and type(i.value) is int)
    return (like, at, value) if len(at) == len(index) == _SCATTERS[node.func.attr] else None


# NOTE: [Known shapes] Shapes are not in the source, so a reverse rule sums a contribution back to its
# operand's shape (``sum_to(v, x)``), and each cotangent is a variable of its own: code over scalars was
# mostly copies (``ct_s_3 = sum_to(ct_s_4, s_3)``: 258 of the 885 lines of the tangent of a gradient reading
# 64 entries, every copy a statement Taichi compiles). Where the code says a shape (annotated parameters,
# numbers, entries of those, results of ops whose rule gives theirs: ``Rule.result_shape``), a sum to an
# operand of the result's own shape is dropped, and in code without branches or runtime loops a cotangent
# that is another's value is that value's name: the copies are gone.
def _summed_to(contribution: Sym | None, arg: ast.expr, shape: Shape, arg_shape: Shape | None) -> Sym | None:
    """``v`` for a contribution ``sum_to(v, arg)`` where ``arg`` has the result's ``shape``, else the contribution."""
    node = None if contribution is None else contribution.node
    if (arg_shape == shape and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "sum_to" and isinstance(node.func.value, ast.Name)
            and node.func.value.id == RULE_HELPERS and len(node.args) == 2
            and ast.dump(node.args[1]) == ast.dump(arg)):
        return Sym(node.args[0])
    return contribution


def _annotated_shape(annotation: ast.expr | None, namespace: dict[str, Any]) -> Shape | None:
    """The shape a parameter's annotation gives (``ti.f64``: ``()``, ``ti.math.vec3``: ``(3,)``), or None."""
    value = annotation_value(annotation, namespace)  # ti.math.vec3, ti.types.vector(3, ti.f64)
    if isinstance(value, MatrixType):
        return (value.n,) if value.ndim == 1 else (value.n, value.m)
    return () if value in (float, int) or isinstance(value, type(ti.f64)) else None


def _scatter(like: ast.expr, index: tuple[int, ...], value: ast.expr) -> ast.Call:
    """``scatter(like, value, i)`` (``scatter2`` for two indices)."""
    func = ast.Attribute(_name(RULE_HELPERS), "scatter" if len(index) == 1 else "scatter2", ast.Load())
    return ast.Call(func, [like, value] + [ast.Constant(i) for i in index], [])


def _top_level(count: int) -> list[Path]:
    return [()] if count == 1 else [(k,) for k in range(count)]


def _nested(leaves: dict[Path, ast.expr]) -> ast.expr:
    """The tuple expression whose leaf at each path is ``leaves[path]``."""
    if () in leaves:
        return leaves[()]
    count = max(p[0] for p in leaves) + 1
    return ast.Tuple([_nested({p[1:]: v for p, v in leaves.items() if p[0] == k}) for k in range(count)], ast.Load())


def _leaves(value: ast.expr) -> dict[Path, ast.expr]:
    """The leaves of a (nested) tuple expression by index path: the inverse of :func:`_nested`."""
    if not isinstance(value, ast.Tuple):
        return {(): value}
    return {(k,) + p: leaf for k, e in enumerate(value.elts) for p, leaf in _leaves(e).items()}


def _element(value: ast.expr, path: Path) -> ast.expr:
    for k in path:
        value = ast.Subscript(value, ast.Constant(k), ast.Load())
    return value


def _hint(node: ast.expr) -> str:
    """A name hint for a temporary made from ``node``: its identifier, ``v`` for ``p.v``, else ``v``."""
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else "v"


def _call_hint(func: ast.expr, args: list[ast.expr]) -> str:
    base = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "call")
    return f"{base}_{args[0].id}" if len(args) == 1 and isinstance(args[0], ast.Name) else base


_CONSTANT_NODES: tuple[type, ...] = (ast.Constant, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.expr_context,
                                     ast.operator, ast.unaryop, ast.cmpop, ast.boolop)


def _plain_constant(value: Any) -> bool:
    """A number, or a list or tuple of them (nested): what a compile-time index may read."""
    if isinstance(value, (list, tuple)):
        return all(_plain_constant(v) for v in value)
    return isinstance(value, (int, float, bool))


def _static_int(node: ast.expr) -> int | bool:
    """A slice bound written as an integer (``2``, ``-1``), or False."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _static_int(node.operand)
        return False if inner is False else -inner
    return node.value if isinstance(node, ast.Constant) and type(node.value) is int else False


def _is_number(node: ast.expr) -> bool:
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant)


class _RenameLocals(ast.NodeTransformer):
    """Variables -> their SSA names (or the constant an unrolled loop counter stands for), global integers ->
    their values, with arithmetic on integer constants done (NOTE: [Constant indices])."""

    def __init__(self, env: dict[str, str | ast.Constant], namespace: dict[str, Any]) -> None:
        self.env, self.namespace = env, namespace

    def visit_Name(self, node: ast.Name) -> ast.expr:
        value = self.env.get(node.id)
        if isinstance(value, str):
            return ast.Name(value, node.ctx)
        if value is None:
            found = self.namespace.get(node.id)
            return ast.Constant(found) if type(found) is int and isinstance(node.ctx, ast.Load) else node
        return ast.Constant(value.value)

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        return _folded(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
        self.generic_visit(node)
        return _folded(node)


# NOTE: [Constant indices] In an unrolled loop the counter is a constant, so ``x[(i + 1) % n]`` reads
# ``x[(3 + 1) % N]``: an entry at a constant index (Taichi reads a global integer as a constant too), which
# Taichi works out as Python while it compiles.
# Left as an expression, its contribution was one whole-vector scatter per read (NOTE: [Entries in one
# value] takes constant indices only): a gradient of an 80-vector function reading x[(i + 1) % 80] compiled
# in 45 s, against 0.26 s for its value (1.5 s now). Global integers are read and arithmetic of integer
# constants is done here, as Python does it (``%`` and ``//`` floor, as Taichi's on Python ints): x[4].
_FOLDED: dict[type, Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}


def _folded(node: ast.BinOp | ast.UnaryOp) -> ast.expr:
    """``node`` as one constant where it is arithmetic on integer constants, else ``node``."""
    def integer(n: ast.expr) -> bool:
        return isinstance(n, ast.Constant) and type(n.value) is int

    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.USub) and integer(node.operand):
            return ast.Constant(-node.operand.value)  # type: ignore[attr-defined]
        return node
    op = _FOLDED.get(type(node.op))
    if op is None or not (integer(node.left) and integer(node.right)):
        return node
    try:
        return ast.Constant(op(node.left.value, node.right.value))  # type: ignore[attr-defined]
    except ZeroDivisionError:
        return node  # Taichi reports it where it compiles


def _all_names(nodes: list[ast.expr]) -> TypeGuard[list[ast.Name]]:
    return all(isinstance(n, ast.Name) for n in nodes)


def _all_sequences(nodes: list[ast.expr]) -> TypeGuard[list[ast.List | ast.Tuple]]:
    """Whether every node is a list or tuple literal (the rows of a matrix constructor)."""
    return all(isinstance(n, (ast.List, ast.Tuple)) for n in nodes)
