"""Source of a ``@ti.func`` -> its AST, where it came from, and the names it can see."""
import ast
import builtins
import copy
import inspect
import textwrap
from dataclasses import dataclass


@dataclass
class Parsed:
    """A function ready to transform: AST, location for errors, name resolution."""

    tree: ast.FunctionDef
    filename: str
    first_line: int
    namespace: dict

    def lineno(self, node):
        """Line of ``node`` in the original file."""
        return self.first_line + getattr(node, "lineno", 1) - 1


def python_function(f):
    """The plain Python function behind a ``@ti.func`` (or a generated one)."""
    if not getattr(f, "_is_taichi_function", False) or not hasattr(f, "__wrapped__"):
        raise TypeError(
            f"jvp_func(f): f must be a @ti.func, got {f!r}; decorate it with @ti.func"
        )
    if getattr(f, "_is_real_function", False):
        raise TypeError("jvp_func(f): real functions (@ti.real_func) are not supported")
    return f.__wrapped__


def kernel_function(k):
    """The plain Python function behind a ``@ti.kernel``."""
    if not getattr(k, "_is_wrapped_kernel", False) or not hasattr(k, "__wrapped__"):
        raise TypeError(f"jvp_kernel(k): k must be a @ti.kernel, got {k!r}")
    if getattr(k, "_is_classkernel", False):
        raise TypeError("jvp_kernel(k): kernels of @ti.data_oriented classes are not supported")
    return k.__wrapped__


def parse(f):
    """Parse the source of ``f`` (a ``@ti.func`` or ``@ti.kernel``) and collect its globals and closure variables."""
    fn = kernel_function(f) if getattr(f, "_is_wrapped_kernel", False) else python_function(f)
    lines, first_line = inspect.getsourcelines(fn)
    module = ast.parse(textwrap.dedent("".join(lines)))
    tree = next(node for node in module.body if isinstance(node, ast.FunctionDef))
    tree.decorator_list = []
    namespace = dict(fn.__globals__)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            namespace[name] = cell.cell_contents
        except ValueError:  # an unfilled cell: the name is not bound yet
            pass
    _bind_annotations(tree, fn, namespace)
    return Parsed(tree, inspect.getsourcefile(fn) or fn.__code__.co_filename, first_line, namespace)


MISSING = object()


def _bind_annotations(tree, fn, namespace):
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


def resolve(node, namespace):
    """The object a dotted name (``ti.math.sin``, ``h``, ``abs``) stands for, or MISSING."""
    if isinstance(node, ast.Name):
        if node.id in namespace:
            return namespace[node.id]
        return getattr(builtins, node.id, MISSING)
    if isinstance(node, ast.Attribute):
        base = resolve(node.value, namespace)
        return MISSING if base is MISSING else getattr(base, node.attr, MISSING)
    return MISSING


_STATIC_NODES = (ast.Call, ast.Name, ast.Attribute, ast.Constant, ast.Tuple, ast.List, ast.keyword, ast.Load,
                 ast.UnaryOp, ast.USub)


def static_call(node, namespace, local_names):
    """The value of a call made only of module-level names and constants (``td.grad(E, argnums=1)``),
    evaluated now as Taichi would evaluate it when it compiles; MISSING for anything else."""
    if not isinstance(node, ast.Call):
        return MISSING
    for sub in ast.walk(node):
        if not isinstance(sub, _STATIC_NODES):
            return MISSING
        if isinstance(sub, ast.Name) and (sub.id in local_names or resolve(sub, namespace) is MISSING):
            return MISSING
    try:
        code = compile(ast.fix_missing_locations(ast.Expression(copy.deepcopy(node))), "<static call>", "eval")
        return eval(code, dict(namespace))  # names checked above: module-level objects and constants
    except Exception:
        return MISSING


def hashable(obj):
    """Whether ``obj`` can be looked up in a rule table."""
    try:
        hash(obj)
    except TypeError:
        return False
    return True


def positional(node, callee):
    """A call's arguments in parameter order, keywords bound by the callee's signature."""
    if not node.keywords:
        return node.args
    signature = inspect.signature(python_function(callee))
    bound = signature.bind(*node.args, **{k.arg: k.value for k in node.keywords})
    return list(bound.arguments.values())
