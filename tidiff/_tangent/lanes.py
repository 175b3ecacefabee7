"""Vector-mode tangents: one primal pass carrying ``width`` tangent directions ("lanes").

The transformer writes every tangent statement for a single direction
(``dx``); :meth:`Lanes.block` then repeats each tangent statement once per lane
with its tangent names renamed (``dx_0``, ``dx_1``, ...), while primal
statements and control flow stay single. A Jacobian of an ``n``-vector
input is then one call carrying the ``n`` basis tangents at once: the primal
work is done once instead of ``n`` times, and every lane is straight-line
code LLVM can keep in registers (W1, a 4x8 tanh layer at B=1e4, in
bench/experiments/w1_tangent_codegen.py: 0.84 ms against 2.0 ms for a
runtime loop of single pushes).

The widened function takes the primals, then the tangents lane by lane
(lane 0's tangent of every active parameter, then lane 1's, ...), and
returns the flat tuple ``(out, dout_0, ..., dout_{width-1})``.
"""
import ast
import copy as copy_module
from collections.abc import Callable, Container, Sequence

from .._lang.naming import ASTNode, Namer

CALL_MARK = "_tidiff_jvp_call"
"""Attribute on ``(y, dy) = h_jvp(...)`` statements: (number of primal args, called once per lane: a custom
rule or a call through a tidiff Function, NOTE: [Tangent calls lane by lane])."""
MATMUL_WEIGHT = 8
"""Extra cost of a ``@`` in :func:`lane_cost`: Taichi expands it into one op per entry."""


def widened_name(jvp_name: str, width: int) -> str:
    """The name of a tangent function carrying ``width`` directions: ``f_jvp``, ``f_jvp8``."""
    return jvp_name if width == 1 else f"{jvp_name}{width}"


def mentions(node: ast.AST, names: Container[str]) -> bool:
    """Whether ``node`` reads or writes a variable in ``names``."""
    return any(isinstance(sub, ast.Name) and sub.id in names for sub in ast.walk(node))


def lane_cost(stmts: Sequence[ast.stmt], tangent_names: Container[str], callee_cost: Callable[[ast.stmt], int]) -> int:
    """Size of one lane of a tangent function: AST nodes of its tangent statements.

    ``callee_cost(stmt)`` gives the lane cost of the function a marked call
    statement calls. Taichi's compile time grows with the square of a
    kernel's straight-line size, so widening is bounded by this (see
    NOTE: [Vector-mode pushes] in ``_modes.py``).
    """
    total = 0
    for stmt in stmts:
        if isinstance(stmt, (ast.If, ast.For, ast.While)):
            total += lane_cost(stmt.body + stmt.orelse, tangent_names, callee_cost)
        elif hasattr(stmt, CALL_MARK):
            total += callee_cost(stmt)
        elif mentions(stmt, tangent_names):
            total += sum(1 + MATMUL_WEIGHT * (isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult))
                         for n in ast.walk(stmt))
    return total


class Lanes:
    """Renames single-direction tangent code into ``width`` lanes."""

    def __init__(self, namer: Namer, width: int) -> None:
        self.width = width
        self.namer = namer
        self.names = {d: [namer.fresh(f"{d}_{k}") for k in range(width)] for d in namer.tangents.values()}

    def lane(self, node: ASTNode, k: int) -> ASTNode:
        """A copy of ``node`` with every tangent name replaced by its lane-``k`` name."""
        copy = copy_module.deepcopy(node)
        for sub in ast.walk(copy):
            if isinstance(sub, ast.Name) and sub.id in self.names:
                sub.id = self.names[sub.id][k]
        return copy

    def block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for stmt in stmts:
            if isinstance(stmt, (ast.If, ast.For, ast.While)):
                stmt.body = self.block(stmt.body)
                stmt.orelse = self.block(stmt.orelse)
                out.append(stmt)
            elif hasattr(stmt, CALL_MARK):
                out.extend(self._call(stmt))
            elif isinstance(stmt, ast.Return):
                assert isinstance(stmt.value, ast.Tuple)  # a tangent function returns (value, tangent)
                p, dp = stmt.value.elts
                out.append(ast.Return(ast.Tuple([p] + [self.lane(dp, k) for k in range(self.width)], ast.Load())))
            elif mentions(stmt, self.names):
                out.extend(self.lane(stmt, k) for k in range(self.width))
            else:
                out.append(stmt)
        return out

    def _call(self, stmt: ast.stmt) -> list[ast.stmt]:
        """``(y, dy) = h_jvp(x, dx)`` -> one call of h's widened tangent (already named by the
        transformer), or one call per lane of a custom rule or a call through a Function."""
        n_primals, by_lane = getattr(stmt, CALL_MARK)
        assert isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Tuple)  # as the mark promises
        assert isinstance(stmt.value, ast.Call)
        (y, dy), call = stmt.targets[0].elts, stmt.value
        assert isinstance(y, ast.Name) and isinstance(dy, ast.Name)
        primals, tangents = call.args[:n_primals], call.args[n_primals:]
        if by_lane:
            # every lane's call reads the primals as they were: the result goes to y from the last lane only
            # (``y = c(y)`` would otherwise feed lane 0's result to lane 1); the others to a name each, which
            # Taichi assigns once where the result is a tuple (a td.hvp call's: long run, seed 12031)
            results = [ast.Name(self.namer.fresh(f"{y.id}_lane"), ast.Store()) for _ in range(self.width - 1)] + [y]
            return [ast.Assign([ast.Tuple([results[k], self.lane(dy, k)], ast.Store())],
                               ast.Call(call.func, primals + [self.lane(t, k) for t in tangents], []))
                    for k in range(self.width)]
        lanes = [self.lane(t, k) for k in range(self.width) for t in tangents]
        names = [y] + [self.lane(dy, k) for k in range(self.width)]
        for name in names:
            name.ctx = ast.Store()
        targets: list[ast.expr] = list(names)
        return [ast.Assign([ast.Tuple(targets, ast.Store())], ast.Call(call.func, primals + lanes, []))]
