"""Every Python block of README.md and docs/*.md runs, and asserts what its text says.

A page's ```python blocks run in order in one namespace, like the cells of a
notebook, so a later block uses what an earlier one defined; each page
starts from nothing (its first block imports and calls ``ti.init``, as a
reader copying it would). A block that states a value asserts it.

Conventions in the markdown:

- ```python: runs.
- ```bash, ```text (shell commands, printed output): never run.
- A ```python block that cannot run (a signature with its defaults, a
  sketch) is marked on the line just before its fence::

      <!-- not run: the reason -->

  The comment is invisible on the rendered page and says why in the
  source. Use it sparingly: a fragment that can be made runnable should be.

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

import os
import pathlib
import re
import subprocess
import sys
import traceback
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<why>\S.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>[^`]*)$")
LANGUAGES = {"python", "bash", "text"}  # the only fences the docs use (a bare ``` says nothing)


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, first code line (1-based) and code, and why it is not run."""

    language: str
    line: int
    code: str
    not_run: str | None


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
        marker = NOT_RUN.match(lines[k - 1].strip()) if k else None
        end = k + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise ValueError(f"line {k + 1}: a ``` fence is never closed")
        code = "\n".join(line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[k + 1:end])
        out.append(Block(language, k + 2, code, marker["why"] if marker else None))
        k = end + 1
    return out


def python_blocks(path: pathlib.Path) -> list[Block]:
    return [b for b in blocks(path.read_text()) if b.language == "python" and b.not_run is None]


def run_page(path: pathlib.Path) -> None:
    """Run a page's Python blocks in one namespace; on an error, name the block and line and exit 1."""
    name = str(path.relative_to(ROOT))
    namespace: dict = {"__name__": "__main__"}
    for number, block in enumerate(python_blocks(path), 1):
        source = "\n" * (block.line - 1) + block.code  # line numbers of the page itself
        try:
            exec(compile(source, str(path), "exec", dont_inherit=True), namespace)
        except BaseException as error:  # noqa: BLE001 - reported with its place, then the test fails
            frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == str(path)]
            line = frames[-1].lineno if frames else block.line
            print(f"{name}, block {number} (starting at line {block.line}), line {line}: "
                  f"{type(error).__name__}: {error}", file=sys.stderr)
            traceback.print_exception(error, file=sys.stderr)
            sys.exit(1)


@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_page_runs(path):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
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
    markers = [k + 1 for k, line in enumerate(text.splitlines()) if "<!-- not run" in line]
    marked = [b.line - 2 for b in blocks(text) if b.not_run is not None]
    assert markers == marked, f"{path.name}: 'not run' markers not just before a fence, lines {markers}"


def test_blocks_reads_markers_indented_fences_and_line_numbers():
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
    with pytest.raises(ValueError, match="never closed"):
        blocks("```python\nx = 1\n")


if __name__ == "__main__":
    run_page(pathlib.Path(sys.argv[1]).resolve())
