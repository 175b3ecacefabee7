"""Branches on values and runtime loops in the reverse transform (a mixin of ``Reverser``).

NOTE: [Reverse control flow] The forward sweep keeps Taichi's block structure:
a variable a branch or loop assigns gets one name that lives outside it (its
*phi*), declared before and written at the end of each side or iteration;
names made inside a block live only there, as Taichi's scoping wants. The
reverse sweep rebuilds those inner values where it needs them instead of
keeping them:

- a branch saves its condition in a local (``cond``); the reverse sweep runs
  ``if cond:`` again, recomputes the taken side's forward statements and runs
  their adjoints there, seeding the cotangent of each phi into the value the
  side left in it (the old value, for a side that does not assign it);
- a runtime loop (``for i in range(n)`` with ``n`` known only when it runs,
  and ``while``) counts its iterations. The reverse sweep runs them
  backwards: for iteration k it recomputes the loop-carried values from the
  ones the loop started with (single-assignment names keep those), runs
  iteration k's body again and its adjoints, the carried cotangents flowing
  from iteration k to k - 1. That is about ``n * n / 2`` runs of the body
  for ``n`` iterations, in code of two copies of the body, with no storage.

  With ``TAPE_ROWS`` > 0 the forward sweep also saves the start values of
  every ``stride``-th iteration on a per-thread *tape* of that many rows in
  local memory (NOTE: [Tapes] in ``_rules/helpers.py``): a ``for``
  loop picks ``stride`` from its trip count, a ``while`` loop thins a full
  tape and doubles it. The reverse sweep then recomputes from the nearest
  saved iteration, ``n * stride / 2`` runs. It is off because tapes cost
  Taichi's compile time far more than the recomputation costs at run time:
  every access is a runtime index into a local array, and Taichi's
  store-to-load forwarding compares such accesses pairwise across the
  kernel, so tapes in nested loops, copied into each reverse call of a
  Jacobian, compiled for more than ten minutes (a generated program of the
  conformance net: nested while loops over a 3x2 matrix; the same test run
  took 61 s in all without tapes). ``td.grad`` of a recurrence over a
  32-vector with a 32-iteration loop (``bench/reverse_loops.py``, B = 1000),
  first call / warm: no tape 0.68 s / 152 ms, 16 rows 1.8 s / 23 ms,
  64 rows 17 s / 31 ms; forward pushes 0.80 s / 287 ms.

Cotangents of values from outside a block that the block's adjoints add to
are declared (zero) before the block's reverse code, so that they outlive it.
Names are single-assignment outside blocks, so a recomputed side or body
reads exactly the values the forward sweep read.
"""
from __future__ import annotations

import ast
import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import taichi as ti

from .._lang.activity import assignments
from .._lang.naming import RULE_HELPERS, Namer
from .._lang.nodes import assign, augment, call, compare, for_range, if_, name, taichi, zero_of
from .._lang.parse import Parsed, resolve
from .._lang.sym import Sym, helpers
from .._rules.table import Vjp


@dataclass
class Op:
    """``target = <op>(args)`` in the forward sweep, with how to send a cotangent back."""

    target: str
    rule: Vjp | None  # (g, out, *args) -> contributions; None for a call of a reversible @ti.func
    args: list[ast.expr]  # operand nodes: Names of SSA variables, or inactive expressions
    callee: str | None = None  # for calls: the namespace name of the callee's reverse function (or custom bwd)
    positions: list[int | None] | None = None  # for calls: where each operand's cotangent stands in the result
    outputs: list[str] | None = None  # for calls with several outputs: the SSA names of the results, in order
    effect: Callable[[ast.expr], list[ast.stmt]] | None = None  # a field read's adjoint: the statements that
    # add the result's cotangent into the field's gradient (NOTE: [Reverse of a kernel] in ``kernels.py``)

    def results(self) -> list[str]:
        return self.outputs or [self.target]


@dataclass
class Store:
    """``field[index] = value`` (``kind`` "set"), ``+=`` ("add") or ``-=`` ("sub") into a global field, whose
    adjoint reads (and for "set" clears) the field's gradient there (NOTE: [Reverse of a kernel]);
    ``ti.atomic_max`` ("max") or ``ti.atomic_min`` ("min"), whose adjoint gives it to the entries that won
    (NOTE: [Atomic extremes in reverse])."""

    gradient: ast.expr  # the field's gradient field: a namespace name, or ``p.grad`` of a template parameter
    index: ast.expr
    value: ast.expr  # a Name of an SSA variable, or an inactive expression
    kind: str
    won: ast.expr | None = None  # "max", "min": whether ``value`` is what the field holds after the kernel
    ties: str | None = None  # "max", "min": the field counting, per entry, the iterations whose value won
    component: tuple[ast.expr | str, ...] = ()  # into one component of the entry: indices (``[0]``, ``[0, 1]``)
    # or attributes (``.x``), outermost first (NOTE: [Writes into components])

    def at(self, ctx: ast.expr_context) -> ast.expr:
        """The gradient where the store wrote: ``v.grad[i]``, ``v.grad[i][0]``, ``v.grad[i].x``."""
        at: ast.Subscript | ast.Attribute = ast.Subscript(copy.deepcopy(self.gradient), copy.deepcopy(self.index),
                                                          ast.Load())
        for part in self.component:
            at = ast.Attribute(at, part, ast.Load()) if isinstance(part, str) else \
                ast.Subscript(at, copy.deepcopy(part), ast.Load())
        at.ctx = ctx
        return at


TAPE_ROWS = 0
"""Rows of a loop's tape: how many iterations' start values are kept (even). 0, the default, keeps none: the
reverse sweep recomputes each iteration from the loop's start (NOTE: [Reverse control flow])."""


@dataclass
class Block:
    """The statements of a branch side or loop body, in the forward sweep."""

    forward: list[ast.stmt]
    ops: list[Op | Branch | Loop | Store]
    defined: set[str] = field(default_factory=set)  # SSA names made inside (they live only there)


@dataclass
class Branch:
    """``if cond:`` on a value; ``phis[v]`` holds ``v`` after it, ``finals[k][v]`` what side ``k`` left in it."""

    test: str
    sides: list[Block]  # two (the second empty for an if without else)
    finals: list[dict[str, str]]  # per side: {variable: SSA name}
    phis: dict[str, str]
    prevs: dict[str, str]  # variable -> SSA name before the branch
    static: bool = False  # ``if ti.static(...)`` on what only Taichi's compile knows (``a.n``): one side compiles

    def condition(self) -> ast.expr:
        """The branch's test as the forward and reverse sweeps write it."""
        return call(taichi("static"), self.test) if self.static else name(self.test)


@dataclass
class Loop:
    """A runtime ``for`` or ``while`` loop: the body and how its carried variables are kept (NOTE above)."""

    body: Block
    phis: dict[str, str]  # carried variable -> the name holding it between iterations (and after the loop)
    prevs: dict[str, str]  # carried variable -> SSA name before the loop
    ins: dict[str, str]  # carried variable -> the name of its value at the start of an iteration
    finals: dict[str, str]  # carried variable -> SSA name at the end of the body
    tapes: dict[str, str]  # carried variable -> the name of its tape (none without TAPE_ROWS)
    count: str
    stride: str
    counter: str | None = None  # for loops: the counter's name, and the name of the range's start
    start: str | None = None


def uses(ops: list[Op | Branch | Loop | Store]) -> set[str]:
    """Names the adjoints of ``ops`` may send cotangents to (operands, values flowing into blocks)."""
    names: set[str] = set()
    for op in ops:
        if isinstance(op, Store):
            names |= {op.value.id} if isinstance(op.value, ast.Name) else set()
        elif isinstance(op, Branch):
            for side, final in zip(op.sides, op.finals, strict=True):
                names |= uses(side.ops) | set(final.values())
            names |= set(op.prevs.values())
        elif isinstance(op, Loop):
            names |= uses(op.body.ops) | set(op.finals.values()) | set(op.prevs.values())
        else:
            names |= {a.id for a in op.args if isinstance(a, ast.Name)}
    return names


def has_effects(ops: list[Op | Branch | Loop | Store]) -> bool:
    """Whether the adjoints of ``ops`` touch field gradients: a block's reverse must then run even where no
    cotangent of a local leaves it."""
    for op in ops:
        if isinstance(op, Store) or (isinstance(op, Op) and op.effect is not None):
            return True
        if isinstance(op, Branch) and any(has_effects(side.ops) for side in op.sides):
            return True
        if isinstance(op, Loop) and has_effects(op.body.ops):
            return True
    return False


class ControlFlow:
    """The Reverser's statements for branches and loops, and their reverse sweeps."""

    # what the Reverser this is mixed into holds and does (``transform.py``)
    parsed: Parsed
    namer: Namer
    env: dict[str, str | ast.Constant]  # an unrolled loop's counter stands for a constant
    defined: set[str]
    active: set[str]
    temps: set[str]
    tuples: dict[str, dict[tuple[int, ...], ast.expr]]
    forward: list[ast.stmt]
    ops: list[Op | Branch | Loop | Store]
    backward: list[ast.stmt]
    cts: dict[str, str]
    in_block: int
    recomputes: bool
    statement: Callable[[ast.stmt], None]
    rename: Callable[[ast.expr], ast.expr]
    is_active: Callable[[ast.expr], bool]
    add: Callable[[str, Sym], None]
    sweep_ops: Callable[[list[Op | Branch | Loop | Store]], None]
    not_reversible: Callable[[str], Exception]
    _is_local: Callable[[ast.expr], bool]

    # --- forward sweep ------------------------------------------------------------
    def nested(self, stmts: list[ast.stmt]) -> Block:
        """Transform a block into a Block of its own (the current lists are kept aside meanwhile)."""
        outer, before = (self.forward, self.ops), set(self.defined)
        self.forward, self.ops = [], []
        for stmt in stmts:
            self.statement(stmt)
        block = Block(self.forward, self.ops, self.defined - before)
        self.forward, self.ops = outer
        return block

    def ssa(self, variable: str) -> str:
        """The SSA name holding ``variable`` now; not reversible where it stands for an unrolled loop's counter
        (a constant) at the end of a block that assigns it."""
        value = self.env[variable]
        if not isinstance(value, str):
            raise self.not_reversible(f"the variable `{variable}` used as the counter of an unrolled loop inside "
                                      "a branch or loop that assigns it")
        return value

    def fresh(self, hint: str) -> str:
        identifier = self.namer.fresh(hint)
        self.defined.add(identifier)
        return identifier

    def carried(self, stmts: list[ast.stmt]) -> list[str]:
        """Variables defined before ``stmts`` that they assign: their new values flow out of the block."""
        writes, _ = assignments(stmts)
        variables = sorted({v for targets, _ in writes for v in targets if isinstance(self.env.get(v), str)})
        for v in variables:
            if self.env[v] in self.tuples:
                raise self.not_reversible(f"the tuple `{v}` assigned inside a branch or loop")
        return variables

    def control_value(self, node: ast.expr, again: bool = False) -> ast.expr:
        """A branch's test or a loop's bounds (``again``: a while loop's test, computed before every pass), which
        carry no derivative: the expression as written, in SSA names (a kernel's adjoint overrides it for the
        fields it reads)."""
        return self.rename(node)

    def branch(self, node: ast.If) -> None:
        """``if test: ... else: ...`` on a value (NOTE: [Reverse control flow]), or on ``ti.static(...)`` of what
        only Taichi knows when it compiles (a parameter's shape ``a.n``): the test stays static in both sweeps, so
        only the taken side compiles (the other may not type-check)."""
        test = self.fresh("cond")
        static = isinstance(node.test, ast.Call) and resolve(node.test.func, self.parsed.namespace) is ti.static
        self.forward.append(assign(test, self.control_value(node.test)))
        variables = self.carried(node.body + node.orelse)
        prevs = {v: self.ssa(v) for v in variables}
        phis = {v: self.fresh(v) for v in variables}
        self.forward.extend(assign(phis[v], name(prevs[v])) for v in variables)
        env, sides, finals = self.env, [], []
        for stmts in (node.body, node.orelse):
            self.env = dict(env)
            block = self.nested(stmts)
            final = {v: self.ssa(v) for v in variables}
            merges = [assign(phis[v], name(final[v])) for v in variables if final[v] != prevs[v]]
            sides.append((block, merges))
            finals.append(final)
        self.env = env
        self.env.update(phis)
        for v in variables:
            if any(self.is_active(name(n)) for n in [prevs[v]] + [f[v] for f in finals]):
                self.active.add(phis[v])
        (body, body_merges), (orelse, orelse_merges) = sides
        branch = Branch(test, [body, orelse], finals, phis, prevs, static)
        self.forward.append(ast.If(branch.condition(), body.forward + body_merges or [ast.Pass()],
                                   orelse.forward + orelse_merges))
        self.ops.append(branch)

    def runtime_range(self, node: ast.expr) -> list[ast.expr] | None:
        """The arguments of ``range(stop)`` or ``range(start, stop)``, else None."""
        if not (isinstance(node, ast.Call) and not self._is_local(node.func) and not node.keywords
                and resolve(node.func, self.parsed.namespace) is range and 1 <= len(node.args) <= 2):
            return None
        return node.args

    def loop(self, node: ast.For | ast.While, counter: str | None = None,
             bounds: list[ast.expr] | None = None) -> None:
        """A runtime ``for`` (``counter``, ``bounds``) or ``while`` loop (NOTE: [Reverse control flow])."""
        if node.orelse:
            raise self.not_reversible("a loop with an `else` block")
        variables = self.carried(node.body)
        if counter in variables:
            raise self.not_reversible(f"an assignment to the loop counter `{counter}`")
        prevs = {v: self.ssa(v) for v in variables}
        start = stop = None
        if counter is not None:
            assert bounds is not None  # a for loop
            start, stop = self.fresh("start"), self.fresh("stop")
            self.forward.append(assign(start, self.control_value(bounds[0]) if len(bounds) == 2
                                       else ast.Constant(0)))
            self.forward.append(assign(stop, self.control_value(bounds[-1])))
        phis = {v: self.fresh(v) for v in variables}
        count, stride = self.fresh("count"), self.fresh("stride")
        for v in variables:
            self.forward.append(assign(phis[v], name(prevs[v])))
            if self.is_active(name(prevs[v])):
                self.active.add(phis[v])
        self.forward.append(assign(count, ast.Constant(0)))
        env = dict(self.env)
        env.update(phis)
        self.env = dict(env)
        test = self.control_value(node.test, again=True) if isinstance(node, ast.While) else None
        while True:  # until the activity of the carried values settles: y = 0.0; y += x makes y active
            saved = set(self.active), set(self.temps), dict(self.tuples)
            self.env = dict(env)
            ins = {v: self.fresh(v + "_in") for v in variables}
            for v in variables:
                if phis[v] in self.active:
                    self.active.add(ins[v])
            self.env.update(ins)
            counter_name = None
            if counter is not None:
                counter_name = self.fresh(counter)
                self.env[counter] = counter_name
            body = self.nested(node.body)
            body.defined |= set(ins.values()) | ({counter_name} if counter_name else set())
            finals = {v: self.ssa(v) for v in variables}
            late = [v for v in variables if self.is_active(name(finals[v])) and phis[v] not in self.active]
            if not late:
                break
            self.active, self.temps, self.tuples = saved
            self.active.update(phis[v] for v in late)
        self.env = env
        tapes = {}  # none where no cotangent can leave the loop: its reverse sweep never runs
        if TAPE_ROWS and any(phis[v] in self.active for v in variables):
            tapes = {v: self.fresh("tape_" + v) for v in variables}
            for v in variables:
                self.forward.append(assign(tapes[v], helpers.tape_of(name(phis[v]), TAPE_ROWS)))
            if counter is not None:  # the trip count is known: every stride-th iteration fits the tape
                assert start is not None and stop is not None  # set with the counter
                rows = (Sym(name(stop)) - Sym(name(start)) + TAPE_ROWS - 1) // TAPE_ROWS
                self.forward.append(assign(stride, taichi("max")(1, rows)))
            else:  # a while loop: the stride grows as the tape fills
                self.forward.append(assign(stride, ast.Constant(1)))
        loop = Loop(body, phis, prevs, ins, finals, tapes, count, stride, counter_name, start)
        stmts = (self.checkpoint(loop) + [assign(ins[v], name(phis[v])) for v in variables] + body.forward
                 + [assign(phis[v], name(finals[v])) for v in variables]
                 + [augment(count, ast.Add(), 1)])
        if counter_name is not None:
            assert start is not None and stop is not None  # set with the counter
            self.forward.append(for_range(counter_name, [start, stop], stmts))
        else:
            assert test is not None  # a while loop
            self.forward.append(ast.While(test, stmts, []))
        self.ops.append(loop)

    def checkpoint(self, loop: Loop) -> list[ast.stmt]:
        """Save the carried values at the start of every ``stride``-th iteration; in a while loop a full
        tape keeps every other row and doubles ``stride`` (NOTE: [Reverse control flow], [Tapes])."""
        if not loop.tapes:
            return []
        r, j = self.namer.fresh("r"), self.namer.fresh("j")
        count, stride = Sym(name(loop.count)), Sym(name(loop.stride))
        rows = {v: self.namer.fresh("row_" + v) for v in loop.tapes}
        body: list[ast.stmt] = []
        if loop.counter is None:
            thin = [for_range(j, [Sym(name("len"))(name(t))], [assign(Sym(name(t))[Sym(name(j))][Sym(name(r))],
                                                                      Sym(name(t))[Sym(name(j))][2 * Sym(name(r))])],
                              static=True) for t in loop.tapes.values()]
            body.append(if_(compare(count, ast.Eq(), TAPE_ROWS * stride),
                            [for_range(r, [TAPE_ROWS // 2], thin), augment(loop.stride, ast.Mult(), 2)]))
        for v, t in loop.tapes.items():
            body += [assign(rows[v], helpers.entries(name(loop.phis[v]))),
                     for_range(j, [Sym(name("len"))(name(t))],
                               [assign(Sym(name(t))[Sym(name(j))][count // stride], Sym(name(rows[v]))[Sym(name(j))])],
                               static=True)]
        return [if_(compare(count % stride, ast.Eq(), 0), body)]

    def restore(self, loop: Loop, state: dict[str, str], c: str) -> list[ast.stmt]:
        """``state_v = <tape row c of v>`` for each carried variable (NOTE: [Tapes])."""
        stmts: list[ast.stmt] = []
        for v, tape in loop.tapes.items():
            row, j = self.namer.fresh("row_" + v), self.namer.fresh("j")
            phi = name(loop.phis[v])
            stmts += [assign(row, taichi("zero")(helpers.entries(phi))),
                      for_range(j, [Sym(name("len"))(name(tape))],
                                [assign(Sym(name(row))[Sym(name(j))], Sym(name(tape))[Sym(name(j))][Sym(name(c))])],
                                static=True),
                      assign(state[v], helpers.unflat_any(name(row), phi))]
        return stmts

    # --- reverse sweep --------------------------------------------------------------
    def emitted(self, write: Callable[[], None]) -> list[ast.stmt]:
        """The reverse statements ``write()`` emits, as a list of their own (a block: entry contributions are
        added at once, NOTE: [Entries in one value] in ``_rules/helpers.py``)."""
        outer, self.backward = self.backward, []
        self.in_block += 1
        write()
        self.in_block -= 1
        stmts, self.backward = self.backward, outer
        return stmts

    def declare(self, names: set[str]) -> None:
        """Zero cotangents, here, for the active names a block's adjoints will add to (they must outlive it)."""
        for n in sorted(names):
            if n not in self.cts and self.is_active(name(n)):
                self.cts[n] = self.namer.fresh("ct_" + n)
                self.backward.append(assign(self.cts[n], zero_of(n)))

    def flowing(self, phis: dict[str, str]) -> list[str]:
        return [v for v, phi in phis.items() if phi in self.cts and self.is_active(name(phi))]

    def reverse_branch(self, branch: Branch) -> None:
        flowing = self.flowing(branch.phis)
        if not flowing and not any(has_effects(side.ops) for side in branch.sides):
            return  # no cotangent leaves the branch
        for side, final in zip(branch.sides, branch.finals, strict=True):
            self.declare((uses(side.ops) | {final[v] for v in flowing}) - side.defined)

        def adjoint(side: Block, final: dict[str, str]) -> None:
            for v in flowing:
                if self.is_active(name(final[v])):
                    self.add(final[v], Sym(name(self.cts[branch.phis[v]])))
            self.sweep_ops(side.ops)

        code = [copy.deepcopy(side.forward) + self.emitted(functools.partial(adjoint, side, final))
                for side, final in zip(branch.sides, branch.finals, strict=True)]
        self.backward.append(ast.If(branch.condition(), code[0] or [ast.Pass()], code[1]))

    def reverse_loop(self, loop: Loop) -> None:
        if not self.flowing(loop.phis) and not has_effects(loop.body.ops):
            return  # no cotangent leaves the loop
        body = loop.body
        carried = [v for v, phi in loop.phis.items() if self.is_active(name(phi))]
        self.declare({loop.phis[v] for v in carried})
        self.declare((uses(body.ops) | set(loop.finals.values())) - body.defined)
        ct = {v: self.cts[loop.phis[v]] for v in carried}
        r, k, c, m = (self.namer.fresh(h) for h in ("r", "k", "c", "m"))
        state = {v: self.namer.fresh("state_" + v) for v in loop.phis}

        def adjoint() -> None:
            for v in carried:
                if self.is_active(name(loop.finals[v])):
                    self.add(loop.finals[v], Sym(name(ct[v])))
            self.sweep_ops(body.ops)
            for v in carried:  # the cotangent of the values iteration k started from goes to iteration k - 1
                started = loop.ins[v]
                self.backward.append(assign(ct[v], name(self.cts[started]) if started in self.cts
                                            else zero_of(loop.phis[v])))

        code = self.emitted(adjoint)
        if loop.counter is not None and not loop.tapes and not _reads(code, _carried_values(loop)):
            # NOTE: [Loops whose adjoint reads no carried value] an accumulation (s += f(x, j)): the adjoint of
            # iteration k needs the values the body makes from the counter and from outside only, so the
            # body runs once per iteration, from whatever the carried variables hold (typed values)
            assert loop.start is not None  # set with the counter
            once = [assign(loop.ins[v], name(loop.phis[v])) for v in loop.phis]
            once.append(assign(loop.counter, Sym(name(loop.start)) + Sym(name(loop.count)) - 1 - Sym(name(r))))
            self.backward.append(for_range(r, [loop.count], once + copy.deepcopy(body.forward) + code))
            for v in carried:
                if self.is_active(name(loop.prevs[v])):
                    self.add(loop.prevs[v], Sym(name(ct[v])))
            return
        if not loop.tapes:
            self.recomputes = True  # NOTE: [Loops in reverse cost their square] in tidiff/_modes.py
        rerun = [assign(loop.ins[v], name(state[v])) for v in loop.phis]
        if loop.counter is not None:
            assert loop.start is not None  # set with the counter
            rerun.append(assign(loop.counter, ast.BinOp(name(loop.start), ast.Add(), name(m))))
        rerun += copy.deepcopy(body.forward)
        rerun.append(if_(compare(m, ast.Eq(), k), code))
        rerun += [assign(state[v], name(loop.finals[v])) for v in loop.phis]
        iteration: list[ast.stmt] = [assign(k, Sym(name(loop.count)) - 1 - Sym(name(r)))]
        if loop.tapes:  # from the nearest saved iteration
            iteration.append(assign(c, Sym(name(k)) // Sym(name(loop.stride))))
            iteration += self.restore(loop, state, c)
            iteration.append(for_range(m, [Sym(name(c)) * Sym(name(loop.stride)), Sym(name(k)) + 1], rerun))
        else:  # from the values the loop started with
            iteration += [assign(state[v], name(loop.prevs[v])) for v in loop.phis]
            iteration.append(for_range(m, [Sym(name(k)) + 1], rerun))
        self.backward.append(for_range(r, [loop.count], iteration))
        for v in carried:
            if self.is_active(name(loop.prevs[v])):
                self.add(loop.prevs[v], Sym(name(ct[v])))


def _carried_values(loop: Loop) -> set[str]:
    """The names a loop body computes from the values its carried variables start the iteration with."""
    found = set(loop.ins.values())
    statements = [stmt for top in loop.body.forward for stmt in ast.walk(top) if isinstance(stmt, ast.stmt)]
    changed = True
    while changed:  # to a fixpoint: nested loops feed values back
        changed = False
        for stmt in statements:
            if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                read = {n.id for n in ast.walk(stmt.value) if isinstance(n, ast.Name)}
                if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                    read.add(stmt.target.id)
                if read & found:
                    for target in targets:
                        new = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)} - found
                        if new:
                            found |= new
                            changed = True
            elif isinstance(stmt, (ast.If, ast.While)):
                if {n.id for n in ast.walk(stmt.test) if isinstance(n, ast.Name)} & found:
                    inside = {n.id for s in stmt.body + stmt.orelse for n in ast.walk(s)
                              if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} - found
                    if inside:  # values assigned under a condition on carried values depend on them
                        found |= inside
                        changed = True
    return found


_SHAPE_ONLY = {"sum_to": 1, "zeros_like": 0}  # rule helpers reading an argument's type only, by position


def _reads(code: list[ast.stmt], names: set[str]) -> bool:
    """Whether ``code`` reads the value of one of ``names`` (not just its type, as ``sum_to(v, like)`` does)."""
    return any(value_reads(stmt) & names for stmt in code)


def value_reads(node: ast.AST) -> set[str]:
    """The variables ``node`` reads the value of (not just the type, as ``sum_to(v, like)`` reads ``like``'s).
    Walked occurrence by occurrence: generated code may hold one node object in several places (``sum_to(ct *
    h, h)`` with both ``h`` one node), and only the occurrence in the shape-only position is skipped."""
    if isinstance(node, ast.Name):
        return {node.id} if isinstance(node.ctx, ast.Load) else set()
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _SHAPE_ONLY \
            and isinstance(node.func.value, ast.Name) and node.func.value.id == RULE_HELPERS \
            and len(node.args) > _SHAPE_ONLY[node.func.attr]:
        skip = _SHAPE_ONLY[node.func.attr]
        parts = [a for k, a in enumerate(node.args) if k != skip] + [k.value for k in node.keywords]
        return {node.func.value.id}.union(*(value_reads(p) for p in parts))
    return set().union(*(value_reads(child) for child in ast.iter_child_nodes(node)))
