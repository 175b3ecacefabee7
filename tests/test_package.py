"""The package's shape: no import cycles, no imports hidden in functions (but listed optional ones), a typed
public API."""
import ast
import inspect
import pathlib

from taichi.lang.kernel_impl import Func

import tidiff as td

ROOT = pathlib.Path(td.__file__).parent


def module_name(path):
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(module, level, name, is_package):
    """The absolute name a relative import in ``module`` refers to."""
    if level == 0:
        return name
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imports(path):
    """``(top-level imports of tidiff modules, every import inside a function)``, by absolute module name."""
    module = module_name(path)
    tree = ast.parse(path.read_text())
    top, nested = set(), []
    is_package = path.name == "__init__.py"

    def targets(node):
        if isinstance(node, ast.ImportFrom):
            base = resolve(module, node.level, node.module, is_package)
            found = {base}
            for alias in node.names:  # ``from . import x`` imports the submodule x
                candidate = f"{base}.{alias.name}"
                if (ROOT.parent / (candidate.replace(".", "/") + ".py")).exists() or \
                        (ROOT.parent / candidate.replace(".", "/") / "__init__.py").exists():
                    found.add(candidate)
            return found
        return {a.name for a in node.names}

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if in_function:
                    nested.extend(targets(child))
                else:
                    top.update(t for t in targets(child) if t.startswith("tidiff"))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return top, nested


def graph():
    edges = {}
    for path in ROOT.rglob("*.py"):
        module = module_name(path)
        top, _ = imports(path)
        deps = set()
        for target in top:  # importing a.b.c runs a, a.b and a.b.c
            parts = target.split(".")
            deps.update(".".join(parts[:k]) for k in range(2, len(parts) + 1))
        # a module's own packages are initializing when it runs (``from . import sibling`` is no cycle)
        ancestors = {".".join(module.split(".")[:k]) for k in range(1, module.count(".") + 2)}
        edges[module] = deps - ancestors
    return edges


def test_no_import_cycle_inside_the_package():
    edges = graph()
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for dep in sorted(edges.get(node, ())):
            if dep not in edges:
                continue
            if state.get(dep) == "open":
                cycle = stack[stack.index(dep):] + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)


#: (module file, imported module) -> why it is imported inside a function. A cycle is never a reason:
#: restructure the modules instead (move the shared piece into the lower one, or pass it in).
IMPORTS_INSIDE_FUNCTIONS = {
    ("__init__.py", "importlib"): "td.torch loads on first use: it imports torch, an optional dependency",
    ("_elements/colouring.py", "scipy.sparse"): "scipy is optional (tidiff[sparse]): only sparse results need it",
    ("_elements/pattern.py", "scipy.sparse"): "scipy is optional (tidiff[sparse]): only the scipy formats need it",
    ("_elements/detected.py", "scipy.sparse"): "scipy is optional (tidiff[sparse]): only sparse results need it",
    ("_kinds/ndarray.py", "torch"): "torch is optional: ndarray kernels run on NumPy arrays without it",
    ("_testing/against_torch.py", "torch"): "torch is optional: only check_against_torch needs it",
    ("_testing/strategies.py", "hypothesis"): "hypothesis is a test dependency, not a dependency of tidiff",
    ("_testing/strategies.py", "hypothesis.extra"): "hypothesis is a test dependency, not a dependency of tidiff",
}


def test_no_import_inside_a_function_but_the_listed_ones():
    found = set()
    for path in ROOT.rglob("*.py"):
        _, nested = imports(path)
        found.update((str(path.relative_to(ROOT)), target) for target in nested)
    unexplained = sorted(found - set(IMPORTS_INSIDE_FUNCTIONS))
    assert not unexplained, f"imports inside functions (a cycle being dodged?): {unexplained}"
    stale = sorted(set(IMPORTS_INSIDE_FUNCTIONS) - found)
    assert not stale, f"IMPORTS_INSIDE_FUNCTIONS lists imports that are gone: {stale}"


def untyped(fn):
    """Whether ``fn`` lacks a return annotation or one on a parameter (``self``/``cls`` aside)."""
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.name not in ("self", "cls")]
    return sig.return_annotation is inspect.Signature.empty or any(
        p.annotation is inspect.Parameter.empty for p in params)


def public_functions():
    """``(name, function)`` for every function of td, td.testing and td.torch, and the public methods
    (``__init__`` and ``__call__`` included) of their classes."""
    for module in (td, td.testing, td.torch):
        for name in module.__all__:
            obj = getattr(module, name)
            where = f"{module.__name__}.{name}"
            if inspect.isfunction(obj) and not isinstance(getattr(obj, "func", None), Func):  # a @ti.func's
                yield where, obj  # annotations are Taichi's (stop_gradient)
            elif inspect.isclass(obj):
                for attr, value in vars(obj).items():
                    if inspect.isfunction(value) and (not attr.startswith("_") or attr in ("__init__", "__call__")):
                        yield f"{where}.{attr}", value


def test_public_api_is_typed():
    assert (ROOT / "py.typed").exists()
    found = dict(public_functions())
    assert {"tidiff.grad", "tidiff.testing.check_grads", "tidiff.torch.function", "tidiff.Function.vjp",
            "tidiff.Function.tangent", "tidiff.testing.arguments"} <= set(found)
    missing = sorted(name for name, fn in found.items() if untyped(fn))
    assert not missing, f"public functions without type hints: {missing}"


def test_every_note_is_written_once():
    """A ``NOTE: [Name]`` followed by its text is the note; every other mention points to it."""
    import collections
    import re

    written = collections.Counter(m.group(1) for path in ROOT.rglob("*.py")
                                  for m in re.finditer(r"NOTE: \[([^\]]+)\] [A-Z`]", path.read_text()))
    assert not [name for name, count in written.items() if count > 1], written.most_common(3)
