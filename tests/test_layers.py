"""One import direction through the package (issue 39): the language layer, then the rules, then the two
modes, then mode choice, then code generation, then the kinds and transforms. A module imports only from
its own layer or the ones below, and the two modes never import each other."""
import ast
import pathlib

import tidiff as td

ROOT = pathlib.Path(td.__file__).parent

LAYERS = [
    ("helpers every layer uses", {"_errors", "_signature", "_tree", "_arrays", "_cache"}),
    ("the language layer", {"_lang"}),
    ("the rules", {"_rules"}),
    ("the two modes", {"_tangent", "_adjoint"}),
    ("mode choice", {"_modes"}),
    ("code generation", {"_codegen"}),
]
"""From the bottom; every other module (kinds, transforms, programs over fields, td.torch) is above them all."""


def layer(module: str) -> int:
    parts = module.split(".")
    for k, (_, names) in enumerate(LAYERS):
        if len(parts) > 1 and parts[1] in names:
            return k
    return len(LAYERS)


def imported(path: pathlib.Path) -> set[str]:
    """The tidiff modules ``path`` imports (a ``from . import x`` of a submodule names the submodule)."""
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    package = parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = list(package[:len(package) - (node.level - 1)]) + ([node.module] if node.module else [])
        for alias in node.names:
            sub = ROOT.parent.joinpath(*base, alias.name)
            found.add(".".join(base + [alias.name]) if sub.with_suffix(".py").exists() or sub.is_dir()
                      else ".".join(base))
    return found


def module_of(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_imports_go_down_the_layers():
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        module = module_of(path)
        for target in imported(path):
            if layer(target) > layer(module):
                upward.append(f"{module} ({LAYERS[layer(module)][0]}) imports {target}")
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_the_two_modes_do_not_import_each_other():
    crossing = [f"{module_of(p)} imports {t}" for mode, other in (("_tangent", "_adjoint"), ("_adjoint", "_tangent"))
                for p in (ROOT / mode).rglob("*.py") for t in imported(p) if t.startswith(f"tidiff.{other}")]
    assert not crossing, crossing


def test_the_check_sees_an_upward_import():
    assert layer("tidiff._lang.parse") < layer("tidiff._rules.table") < layer("tidiff._tangent.transform")
    assert layer("tidiff._modes") < layer("tidiff._codegen.bodies") < layer("tidiff._api")
    assert "tidiff._rules.table" in imported(ROOT / "_adjoint" / "transform.py")
