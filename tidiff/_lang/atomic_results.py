"""Atomics whose result the code uses: the entry's old value, which depends on the order the iterations ran in.

NOTE: [Atomic results] ``k = ti.atomic_add(count[None], 1)`` hands each iteration the counter's old value: a slot
of its own (stream compaction, particle emission). Which iteration gets which slot is the order the threads ran
in, which a reverse pass, computing the kernel's values again, does not repeat: tidiff's adjoint ran the atomic
again on the counter the kernel left, read slots past the end of the output and corrupted memory (a survey of
kernels as users write them, once an integer output took no cotangent), and Taichi's ``kernel.grad`` does the
same. So reverse mode of a kernel using an atomic's result is refused by name, as are the forward pushes that would
stand in for it (each run may hand out other slots); forward mode has no rule for the result either.
"""
import ast
from collections.abc import Callable
from typing import Any

import taichi as ti

_ATOMICS = {getattr(ti, f"atomic_{op}") for op in ("add", "sub", "mul", "min", "max", "and", "or", "xor")}


def used_atomic_result(tree: ast.AST, resolve: Callable[[ast.AST], Any]) -> ast.Call | None:
    """The first atomic call of ``tree`` whose result is used (not a statement of its own), or None."""
    statements = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and id(node) not in statements and resolve(node.func) in _ATOMICS:
            return node
    return None
