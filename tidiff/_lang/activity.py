"""Which local variables can carry a nonzero tangent (a forward activity analysis)."""
import ast
from collections.abc import Callable, Iterable, Iterator, Sequence


def root_names(target: ast.AST) -> list[str]:
    """Variables an assignment target writes: ``v`` for ``v``, ``v[i]``, ``v.x``, ``(v, w)``."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Subscript, ast.Attribute)):
        return root_names(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in root_names(elt)]
    if isinstance(target, ast.Starred):
        return root_names(target.value)
    return []


def stores(tree: ast.AST) -> Iterator[tuple[ast.stmt | ast.expr, ast.expr]]:
    """``(node, target)`` for every write in ``tree``: an assignment's target (``v = e``, ``v[i] += e``,
    ``v.x: T = e``) and the first argument of a ``ti.atomic_*`` call (``ti.atomic_add(v[i], e)``)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            yield from ((node, target) for target in (node.targets if isinstance(node, ast.Assign) else [node.target]))
        elif isinstance(node, ast.Call) and node.args and ast.unparse(node.func).split(".")[-1].startswith("atomic_"):
            yield node, node.args[0]


def written_names(tree: ast.AST) -> set[str]:
    """The variables ``tree`` writes, or writes an entry or attribute of (``v``, ``v[i]``, ``v.x``)."""
    return {name for _, target in stores(tree) for name in root_names(target)}


def loaded_names(node: ast.AST) -> set[str]:
    """Variables an expression reads."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def assignments(body: Sequence[ast.stmt]) -> tuple[list[tuple[list[str], ast.expr]], set[str]]:
    """(written variables, expression they come from) for every assignment, and loop targets."""
    writes: list[tuple[list[str], ast.expr]] = []
    loop_vars: set[str] = set()
    for node in (n for stmt in body for n in ast.walk(stmt)):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                writes.append((root_names(target), node.value))
        elif isinstance(node, ast.AugAssign):
            writes.append((root_names(node.target), ast.Tuple([node.target, node.value], ast.Load())))
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            writes.append((root_names(node.target), node.value))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "fill":
            writes.append((root_names(node.value.func.value), ast.Tuple(node.value.args, ast.Load())))  # v.fill(e)
        elif isinstance(node, (ast.For, ast.comprehension)):
            loop_vars.update(root_names(node.target))
    return writes, loop_vars


def assigned_names(body: Sequence[ast.stmt]) -> set[str]:
    """Every variable ``body`` assigns, or an entry of (``v[0] = e``, ``v.fill(e)``), or loops over."""
    writes, loop_vars = assignments(body)
    return loop_vars | {n for names, _ in writes for n in names}


def local_names(tree: ast.FunctionDef) -> set[str]:
    """Parameters and every variable the function assigns."""
    return {a.arg for a in tree.args.args} | assigned_names(tree.body)


def _is_int_constant(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool)


def integer_locals(tree: ast.FunctionDef) -> set[str]:
    """Variables Taichi types as integers for the whole function: first bound, at its top level, to an
    integer constant (``k = 0``). Taichi keeps a variable's type, so a float assigned to one later is
    truncated (with its warning "Assign may lose precision"): such a variable carries no derivative."""
    seen = {a.arg for a in tree.args.args}
    integral = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and stmt.targets[0].id not in seen and _is_int_constant(stmt.value):
            integral.add(stmt.targets[0].id)
        seen |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return integral


def active_variables(tree: ast.FunctionDef, active_params: Iterable[str]) -> set[str]:
    """Variables that depend on an active parameter through assignments (to a fixpoint).

    Loop counters never do (``for`` in Taichi runs over ranges of integers),
    but a name may be both: Taichi scopes a ``ti.static`` loop's counter to
    the loop, so ``i = 2 * x`` before ``for i in ti.static(range(3))`` is
    still ``2 * x`` after it. Such a name is active here; the transformer
    treats it as the counter, without tangent, inside the loop only. A variable
    Taichi types as an integer (:func:`integer_locals`) never is.
    """
    writes, _ = assignments(tree.body)
    active = set(active_params)
    integral = integer_locals(tree)
    changed = True
    while changed:
        changed = False
        for names, value in writes:
            if loaded_names(value) & active:
                for name in names:
                    if name not in active and name not in integral:
                        active.add(name)
                        changed = True
    return active


def stop_grad_arguments(body: list[ast.stmt], is_stop_grad: Callable[[ast.expr], bool]) -> list[ast.expr]:
    """The arguments of the ``ti.stop_grad(x)`` statements in a kernel's loop body, nested ones too: Taichi stops
    the gradient of ``x`` in that whole loop (its offloaded task). ``is_stop_grad`` says whether a call's
    function is ``ti.stop_grad``."""
    return [n.value.args[0] for stmt in body for n in ast.walk(stmt)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and len(n.value.args) == 1
            and is_stop_grad(n.value.func)]
