"""Source of a ``@ti.func``, a kernel or a plain Python helper -> its AST, where it came from, and the
names it can see."""
import ast
import builtins
import copy
import inspect
import types
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any

from .callees import Quiet, is_helper, is_taichi_func, signature_of, value_node
from .chained import without_chained_assignments
from .comprehensions import unrolled
from .continues import without_continue
from .naming import Namer
from .returns import narrowing_returns_cast
from .source import source_tree
from .stages import unrolled_stages
from .structs import scalarized_structs


@dataclass
class Parsed:
    """A function ready to transform: AST, location for errors, name resolution."""

    tree: ast.FunctionDef
    filename: str
    first_line: int
    namespace: dict[str, Any]
    form: str = "func"  # "func", "kernel" or "helper" (a plain Python function, NOTE: [Python helpers])

    def lineno(self, node: ast.AST) -> int:
        """Line of ``node`` in the original file."""
        return self.first_line + getattr(node, "lineno", 1) - 1

    def name_for(self, value: object, namer: Namer, hint: str) -> str:
        """A fresh name generated code reads ``value`` by, bound in the namespace."""
        name = namer.fresh(hint)
        self.namespace[name] = value
        return name


def python_function(f: Any) -> types.FunctionType:
    """The plain Python function behind a ``@ti.func`` (or a generated one), or a plain helper itself."""
    if is_helper(f):
        return f
    if not is_taichi_func(f):
        raise TypeError(f"tidiff differentiates @ti.func code and plain Python functions, got {f!r}; "
                        "decorate it with @ti.func")
    if getattr(f, "_is_real_function", False):
        raise TypeError(real_func_refusal(f))
    return f.__wrapped__


def real_func_refusal(f: Any) -> str:
    """Why a ``@ti.real_func`` has no derivative here, naming it."""
    name = getattr(f, "__name__", None) or getattr(getattr(f, "__wrapped__", None), "__name__", repr(f))
    return (f"{name} is a @ti.real_func, which tidiff cannot differentiate (a real function is compiled on "
            "its own, not inlined into the code tidiff transforms); make it a @ti.func")


def kernel_function(k: Any) -> types.FunctionType:
    """The plain Python function behind a ``@ti.kernel``."""
    if not getattr(k, "_is_wrapped_kernel", False) or not hasattr(k, "__wrapped__"):
        raise TypeError(f"jvp_kernel(k): k must be a @ti.kernel, got {k!r}")
    if getattr(k, "_is_classkernel", False):
        raise TypeError("jvp_kernel(k): kernels of @ti.data_oriented classes are not supported")
    return k.__wrapped__


def parse(f: Any) -> Parsed:
    """Parse the source of ``f`` (a ``@ti.func``, a ``@ti.kernel`` or a plain helper) and collect its
    globals and closure variables."""
    if getattr(f, "_is_wrapped_kernel", False):
        fn, form = kernel_function(f), "kernel"
    else:
        fn, form = python_function(f), "helper" if is_helper(f) else "func"
    tree, filename, first_line = source_tree(fn)
    namespace = dict(fn.__globals__)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
        try:
            namespace[name] = cell.cell_contents
        except ValueError:  # an unfilled cell: the name is not bound yet
            pass
    _bind_annotations(tree, fn, namespace)
    if form == "kernel":
        unrolled_stages(tree, lambda node: resolve(node, namespace))  # NOTE: [Static loops around parallel loops]
    unrolled(tree, lambda node: resolve(node, namespace))  # NOTE: [Unrolled comprehensions]
    without_continue(tree)  # NOTE: [Continue as a branch]
    without_chained_assignments(tree)  # NOTE: [Chained assignments]
    scalarized_structs(tree, lambda node: resolve(node, namespace), namespace)  # NOTE: [Struct locals]
    narrowing_returns_cast(tree, lambda node: resolve(node, namespace), namespace)  # NOTE: [Narrowing return ...]
    return Parsed(tree, filename, first_line, namespace, form)


def without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    """A function's statements after its docstring (a leading string constant), if it has one."""
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        return body[1:]
    return body


MISSING = object()


def _bind_annotations(tree: ast.FunctionDef, fn: types.FunctionType, namespace: dict[str, Any]) -> None:
    """Parameter annotations the namespace cannot resolve (a type made in the enclosing function,
    which is no closure variable) are bound to their evaluated values under fresh names."""
    for arg in tree.args.args:
        if arg.annotation is None or all(resolve(n, namespace) is not MISSING for n in ast.walk(arg.annotation)
                                         if isinstance(n, ast.Name)):
            continue
        value = fn.__annotations__.get(arg.arg, MISSING)
        if value is not MISSING:
            name = f"_tidiff_annotation_{arg.arg}"
            namespace[name] = value
            arg.annotation = ast.Name(name, ast.Load())


def resolve(node: ast.AST, namespace: dict[str, Any]) -> Any:
    """The object a dotted name (``ti.math.sin``, ``h``, ``abs``, ``OPS["sin"]``) stands for, or MISSING."""
    if isinstance(node, ast.Name):
        if node.id in namespace:
            value = namespace[node.id]
            return value.helper if isinstance(value, Quiet) else value
        return getattr(builtins, node.id, MISSING)
    if isinstance(node, ast.Attribute):
        base = resolve(node.value, namespace)
        return MISSING if base is MISSING else getattr(base, node.attr, MISSING)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        # OPS["sin"]: an entry of a Python container (never of a field: that is a runtime read)
        return entry(resolve(node.value, namespace), node.slice.value)
    return MISSING


def entry(container: object, key: object) -> Any:
    """``container[key]`` of a Python dict, list or tuple and a literal key; MISSING where there is none."""
    try:
        if isinstance(container, dict):
            return container[key]
        if isinstance(container, (list, tuple)) and isinstance(key, int):
            return container[key]
    except (KeyError, IndexError, TypeError):
        pass
    return MISSING


_STATIC_NODES = (ast.Call, ast.Name, ast.Attribute, ast.Constant, ast.Tuple, ast.List, ast.keyword, ast.Load,
                 ast.UnaryOp, ast.USub)
#: What else a compile-time condition may hold (``ti.static(MODE == 1)``).
OPERATOR_NODES = (ast.Compare, ast.BoolOp, ast.BinOp, ast.cmpop, ast.boolop, ast.operator, ast.unaryop)


def static_call(node: ast.AST, namespace: dict[str, Any], local_names: Container[str],
                allowed: tuple[type, ...] = ()) -> Any:
    """The value of a call made only of module-level names and constants (``td.grad(E, argnums=1)``), and of
    the nodes ``allowed`` besides, evaluated now as Taichi would evaluate it when it compiles; MISSING for
    anything else."""
    if not isinstance(node, ast.Call):
        return MISSING
    for sub in ast.walk(node):
        if not isinstance(sub, _STATIC_NODES + allowed):
            return MISSING
        if isinstance(sub, ast.Name) and (sub.id in local_names or resolve(sub, namespace) is MISSING):
            return MISSING
    try:
        code = compile(ast.fix_missing_locations(ast.Expression(copy.deepcopy(node))), "<static call>", "eval")
        return eval(code, dict(namespace))  # names checked above: module-level objects and constants
    except Exception:
        return MISSING


def annotation_value(annotation: ast.expr | None, namespace: dict[str, Any]) -> Any:
    """What a parameter's annotation stands for: a name's value, or a call of module-level names evaluated
    (``ti.types.ndarray(dtype=ti.f64, ndim=1)``, ``ti.types.vector(3, ti.f64)``); MISSING where unknown."""
    if annotation is None:
        return MISSING
    value = resolve(annotation, namespace)
    return static_call(annotation, namespace, ()) if value is MISSING else value


def hashable(obj: object) -> bool:
    """Whether ``obj`` can be looked up in a rule table."""
    try:
        hash(obj)
    except TypeError:
        return False
    return True


def positional(node: ast.Call, callee: Any, name_of: Callable[[object], str] | None = None) -> list[ast.expr]:
    """A call's arguments in parameter order: keywords bound by the callee's signature, defaults filled in.

    ``name_of(value)`` binds a default that is not a literal in the generated
    namespace (see :func:`~.callees.value_node`). Raises TypeError when the
    arguments do not fit the signature.
    """
    code = getattr(python_function(callee), "__code__", None) if is_helper(callee) or is_taichi_func(callee) else None
    passed = None if code is None else code.co_argcount - isinstance(callee, types.MethodType)  # a bound `self`
    if not node.keywords and (code is None or len(node.args) == passed):
        return list(node.args)
    keywords = {k.arg: k.value for k in node.keywords if k.arg is not None}
    if len(keywords) < len(node.keywords):
        raise TypeError("**kwargs at a call")
    signature = signature_of(callee)
    bound = signature.bind(*node.args, **keywords)
    for name, parameter in signature.parameters.items():
        if name not in bound.arguments and parameter.default is not inspect.Parameter.empty:
            if name_of is None:
                raise TypeError(f"no value for the parameter {name!r}, which has a default")
            bound.arguments[name] = value_node(parameter.default, name_of)
    return [bound.arguments[name] for name in signature.parameters if name in bound.arguments]
