"""What the conformance tests and the long-run script (which runs without the package) both know of crashes."""

TAICHI_CRASHES = {
    "current_container_stmt": "Taichi 1.7.4's IR verifier rejects a branch calling a func in a static loop of three "
                              "or more iterations inside a func (tests/test_taichi_pitfalls.py)",
    "offset->template is<ConstStmt>": "Taichi 1.7.4's reverse mode (kernel.grad) fails an assertion in its "
                                      "scalarize pass on a write at a runtime index into a local vector "
                                      "inside a loop (docs/limits.md)",
}
"""A crash's signature in Taichi's message -> the known Taichi bug (NOTE: [Taichi pitfalls] in checks). The
same bug sometimes ends the process (a C++ exception escaping: signal 6); the long run then finds the
signature in the chunk's output."""

CURRENT_ENV = "TIDIFF_CONFORMANCE_CURRENT"
"""The variable naming the file where each check writes its reproduction while it runs."""
