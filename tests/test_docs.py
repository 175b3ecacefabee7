"""Every Python block of README.md and docs/*.md runs, and asserts what its text says.

A page's ```python blocks run in order in one namespace, like the cells of a
notebook, so a later block uses what an earlier one defined; each page
starts from nothing (its first block imports and calls ``ti.init``, as a
reader copying it would). A block that states a value asserts it.

Conventions in the markdown:

- ```python: runs.
- ```bash, ```text (shell commands, diagrams, printed output): never run.
- A ```python block that cannot run (a signature with its defaults, a
  sketch) is marked on the line just before its fence::

      <!-- not run: the reason -->

  The comment is invisible on the rendered page and says why in the
  source. Use it sparingly: a fragment that can be made runnable should be.
- A ```text block marked ``<!-- output -->`` just before its fence is what
  the ```python block right before it prints: the test compares the two,
  with ``...`` in the text matching anything (doctest's ELLIPSIS), so
  printed generated code and error messages shown on a page stay true.

Relative links between pages must point at files that exist, and their
``#anchors`` at headings that exist (GitHub's spelling of a heading); a
source file named in backticks (```_modes.py```, ```tidiff/_fields/tape.py```)
must exist, and a ``NOTE: [Name]`` a page points to must be in the code.

Each page runs in a subprocess of its own (this file, run as a script).
Pages call ``ti.init``, which would reset the runtime of the test process
and kill the fields and kernels of every other test (tests/conftest.py
initializes once for the whole suite); stripping those calls instead would
run the pages under settings they do not state. A subprocess pays Taichi's
start-up (about a second) per page, and kernels come from the offline cache
after the first run. Code is compiled with the markdown file's name and
line numbers (Taichi reads a ``@ti.func``'s source from there, too), so a
traceback points into the page itself, and a failure names the page, the
block and the line.
"""
from __future__ import annotations

import contextlib
import doctest
import io
import pathlib
import re
import subprocess
import sys
import traceback
from dataclasses import dataclass

import pytest
from child_env import child_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<why>\S.*?)\s*-->\s*$")
OUTPUT = re.compile(r"^<!--\s*output\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>[^`]*)$")
LANGUAGES = {"python", "bash", "text"}  # the only fences the docs use (a bare ``` says nothing)


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, first code line (1-based) and code; why it is not run; whether it is output."""

    language: str
    line: int
    code: str
    not_run: str | None
    output: bool = False


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a markdown text, in order; a fence indented in a list item keeps its code dedented."""
    lines = text.splitlines()
    out: list[Block] = []
    k = 0
    while k < len(lines):
        m = FENCE.match(lines[k])
        if not m:
            k += 1
            continue
        indent, language = m["indent"], m["info"].strip()
        before = lines[k - 1].strip() if k else ""
        marker = NOT_RUN.match(before)
        end = k + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise ValueError(f"line {k + 1}: a ``` fence is never closed")
        code = "\n".join(line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[k + 1:end])
        out.append(Block(language, k + 2, code, marker["why"] if marker else None, bool(OUTPUT.match(before))))
        k = end + 1
    return out


def runnable(path: pathlib.Path) -> list[tuple[Block, Block | None]]:
    """The page's Python blocks that run, each with the output block that follows it (or None)."""
    found = blocks(path.read_text())
    pairs = []
    for k, block in enumerate(found):
        if block.language == "python" and block.not_run is None:
            after = found[k + 1] if k + 1 < len(found) and found[k + 1].output else None
            pairs.append((block, after))
    return pairs


def matches(want: str, got: str) -> bool:
    """Printed text against a page's output block: ``...`` matches anything; trailing spaces are ignored."""
    def tidy(text: str) -> str:
        return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"

    return doctest.OutputChecker().check_output(tidy(want), tidy(got), doctest.ELLIPSIS)


def run_page(path: pathlib.Path) -> None:
    """Run a page's Python blocks in one namespace; on an error, name the block and line and exit 1."""
    name = str(path.relative_to(ROOT))
    namespace: dict = {"__name__": "__main__"}
    for number, (block, output) in enumerate(runnable(path), 1):
        source = "\n" * (block.line - 1) + block.code  # line numbers of the page itself
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                exec(compile(source, str(path), "exec", dont_inherit=True), namespace)
        except BaseException as error:  # reported with its place, then the page fails
            frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == str(path)]
            line = frames[-1].lineno if frames else block.line
            print(f"{name}, block {number} (starting at line {block.line}), line {line}: "
                  f"{type(error).__name__}: {error}", file=sys.stderr)
            traceback.print_exception(error, file=sys.stderr)
            sys.exit(1)
        if output is not None and not matches(output.code, printed.getvalue()):
            print(f"{name}, block {number} (starting at line {block.line}) printed what the output block at "
                  f"line {output.line} does not show.\n--- the page shows:\n{output.code}\n--- it printed:\n"
                  f"{printed.getvalue()}", file=sys.stderr)
            sys.exit(1)


@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_page_runs(path):
    env = child_env(OMP_WAIT_POLICY="PASSIVE")
    result = subprocess.run([sys.executable, __file__, str(path)], capture_output=True, text=True, timeout=600,
                            env=env, cwd=ROOT)
    if result.returncode != 0:
        pytest.fail(result.stderr[-6000:], pytrace=False)


@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_page_follows_the_conventions(path):
    """Fences name a known language; a "not run" marker stands before a Python block and gives a reason."""
    text = path.read_text()
    for block in blocks(text):
        assert block.language in LANGUAGES, (
            f"{path.name}, line {block.line - 1}: a ``` fence must name one of {sorted(LANGUAGES)}, "
            f"got {block.language!r}")
        assert block.not_run is None or block.language == "python", (
            f"{path.name}, line {block.line - 2}: a 'not run' marker only applies to a python block")
    found = blocks(text)
    for k, block in enumerate(found):
        assert not block.output or (block.language == "text" and k and found[k - 1].language == "python"
                                    and found[k - 1].not_run is None), (
            f"{path.name}, line {block.line - 2}: an 'output' marker stands before a text block that directly "
            "follows a python block that runs")
    markers = [k + 1 for k, line in enumerate(text.splitlines()) if NOT_RUN.match(line.strip()) or
               OUTPUT.match(line.strip()) or "<!-- not run" in line]
    marked = [b.line - 2 for b in found if b.not_run is not None or b.output]
    assert markers == marked, f"{path.name}: markers not just before a fence, lines {markers}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    """The anchors of a page's headings (outside fenced blocks); repeats get -1, -2, ... as on GitHub."""
    counts: dict[str, int] = {}
    found: set[str] = set()
    inside = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            inside = not inside
        elif not inside and line.startswith("#"):
            base = slug(line.lstrip("#"))
            n = counts.get(base, 0)
            found.add(f"{base}-{n}" if n else base)
            counts[base] = n + 1
    return found


@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_links_point_at_files_and_headings_that_exist(path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans: `OPS["sin"](x)` is no link
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{path.name}: the link {target!r} points at nothing"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked), f"{path.name}: no heading of {linked.name} has the anchor #{anchor}"


PACKAGE = ROOT / "tidiff"
HOW_IT_WORKS = ROOT / "docs" / "how-it-works.md"


def layout_modules(block: str) -> set[str]:
    """The modules a layout block (``tidiff/`` then one entry per line) lists, as paths in the package.

    A line indented two spaces names a top-level module or opens a package
    (``_tangent/``); the ``*.py`` names on it and on the lines under it that
    follow belong to that package.
    """
    found, package = set(), ""
    for line in block.splitlines()[1:]:
        if not line.strip():
            continue
        if len(line) - len(line.lstrip()) == 2:
            head = line.split()[0]
            package = head if head.endswith("/") else ""
        found.update(package + name for name in re.findall(r"\b\w+\.py\b", line))
    return found


def test_how_it_works_diagrams_name_real_modules_and_the_layout_lists_every_one():
    """Issue 12: the diagrams of docs/how-it-works.md match the files of the package."""
    modules = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}
    packages = {p.relative_to(PACKAGE).as_posix() + "/" for p in PACKAGE.iterdir() if p.is_dir()
                and p.name != "__pycache__"}
    diagrams = [b for b in blocks(HOW_IT_WORKS.read_text()) if b.language == "text" and not b.output]
    for block in diagrams:
        for path in re.findall(r"(?<![\w./])((?:_?\w+/)*\w+\.py)\b", block.code):
            assert any(m == path or m.endswith("/" + path) for m in modules), \
                f"how-it-works.md, line {block.line}: {path} is no module of tidiff/"
        for package in re.findall(r"(?<![\w./])(_\w+/)(?![\w.])", block.code):
            assert package in packages, f"how-it-works.md, line {block.line}: {package} is no package of tidiff/"
    (layout,) = [b for b in diagrams if b.code.startswith("tidiff/")]
    listed = layout_modules(layout.code)
    assert listed <= modules, f"the layout lists modules that do not exist: {sorted(listed - modules)}"
    unlisted = {m for m in modules - listed if not m.endswith("/__init__.py")}
    assert not unlisted, f"the layout in how-it-works.md misses {sorted(unlisted)}"


def test_layout_modules_reads_packages_and_their_lines():
    block = "tidiff/\n  __init__.py   api\n  _a/   x.py, y.py\n    z.py   more\n  b.py   top\n"
    assert layout_modules(block) == {"__init__.py", "_a/x.py", "_a/y.py", "_a/z.py", "b.py"}


def test_blocks_markers_output_matching_and_anchors():
    text = "\n".join([
        "# Page",                    # 1
        "```python",                 # 2
        "x = 1",                     # 3
        "```",                       # 4
        "<!-- not run: a sketch -->",  # 5
        "```python",                 # 6
        "def f(x, y=...): ...",      # 7
        "```",                       # 8
        "- item:",                   # 9
        "  ```python",               # 10
        "  y = x + 1",               # 11
        "  ```",                     # 12
        "```bash",                   # 13
        "ls",                        # 14
        "```",                       # 15
    ])
    found = blocks(text)
    assert [(b.language, b.line, b.code, b.not_run) for b in found] == [
        ("python", 3, "x = 1", None),
        ("python", 7, "def f(x, y=...): ...", "a sketch"),
        ("python", 11, "y = x + 1", None),
        ("bash", 14, "ls", None),
    ]
    assert matches("a ...\nc", "a b  \nc\n") and not matches("a\nc", "a b\nc")
    assert slug("Reverse: the adjoint transform of `@ti.func` code") == "reverse-the-adjoint-transform-of-tifunc-code"
    with pytest.raises(ValueError, match="never closed"):
        blocks("```python\nx = 1\n")


SOURCES = [p for p in ROOT.rglob("*.py") if ".venv" not in p.parts and "build" not in p.parts]


@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_named_files_and_notes_exist(path):
    """Every ``file.py`` a page names (from the repository root or inside ``tidiff/``) and every NOTE it points to."""
    text = " ".join(path.read_text().split())  # a note's name may wrap across lines
    files = {str(p.relative_to(ROOT)) for p in SOURCES}
    for named in set(re.findall(r"`([\w./]+\.py)`", text)):
        assert any(f == named or f.endswith("/" + named) for f in files), (
            f"{path.name} names `{named}`, which is no file of the repository")
    code = " ".join(" ".join(p.read_text().split()) for p in (ROOT / "tidiff").rglob("*.py"))
    for note in set(re.findall(r"NOTE: \[([^\]]+)\]", text)) - {"Name"}:
        assert f"NOTE: [{note}]" in code, f"{path.name} points to NOTE: [{note}], which no module of tidiff holds"


if __name__ == "__main__":
    run_page(pathlib.Path(sys.argv[1]).resolve())
