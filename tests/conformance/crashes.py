"""What the conformance tests and the long-run script (which runs without the package) both know of crashes."""

TAICHI_CRASHES = {
    "current_container_stmt": "Taichi 1.7.4's IR verifier rejects a branch calling a func in a static loop of three "
                              "or more iterations inside a func (tests/test_taichi_pitfalls.py)",
    "ckd->check() == CompiledKernelData::Err::kNoError": "Taichi 1.7.4's LLVM backend emits invalid LLVM IR "
                                                         "('Instruction does not dominate all uses!') for some "
                                                         "code in a parallel loop under fast_math "
                                                         "(tests/test_taichi_pitfalls.py)",
    "offset->template is<ConstStmt>": "Taichi 1.7.4's reverse mode (kernel.grad) fails an assertion in its "
                                      "scalarize pass on a write at a runtime index into a local vector "
                                      "inside a loop (docs/limits.md)",
}
"""A crash's signature in Taichi's message -> the known Taichi bug (NOTE: [Taichi pitfalls] in checks). The
same bug sometimes ends the process (a C++ exception escaping: signal 6); the long run then finds the
signature in the chunk's output."""

TAICHI_ALONE = "[Taichi alone, no tidiff]"
"""Begins the name of a check that runs only Taichi's code (``ti.ad.Tape`` of a plain field program): a process
that dies in it died of a Taichi bug (long run, seeds 10102 and 10106: Taichi's reverse mode warns "Loading
variable ... before anything is stored to it", then a segfault or bus error at launch), and an error it raises is
Taichi's (seed 10707: Taichi's reverse mode of a plain ndarray kernel fails its own IR verifier, "IR broken: stmt
BinaryOpStmt ... cannot have operand BinaryOpStmt ...")."""

CURRENT_ENV = "TIDIFF_CONFORMANCE_CURRENT"
"""The variable naming the file where each check writes its reproduction while it runs."""


def known_crash(output: str, under_way: str) -> str | None:
    """Why a process that died was killed by a known Taichi bug, or None (then it is a failure to look at).

    ``output``: what the process wrote; ``under_way``: the reproduction of the check it was in (the file
    named by ``CURRENT_ENV``). Known: a signature of ``TAICHI_CRASHES`` in the output, a death inside a
    check of Taichi alone (``TAICHI_ALONE``), or one right after Taichi's reverse-mode warning in a check of
    a program whose reverse mode is Taichi's (``TAICHI_REVERSE_CHECKS``).
    """
    known = _signature(output)
    if known is None and TAICHI_ALONE in under_way:
        check = under_way.split(TAICHI_ALONE)[1].split("\n")[0].strip()
        known = f"Taichi alone (no tidiff code) ended the process in: {check}"
    if known is None and _last_words_are_the_reverse_warning(output) and any(
            f"\n{kind}:" in under_way for kind in TAICHI_REVERSE_CHECKS):
        known = ("Taichi's reverse mode warned 'Loading variable ... before anything is stored to it' compiling the "
                 "last kernel, then ended the process (docs/limits.md)")
    return known


REVERSE_WARNING = "before anything is stored to it"
TAICHI_REVERSE_CHECKS = ("field program", "ndarray kernel")
"""Checks of programs whose reverse mode is Taichi's (kernel.grad over tidiff's kernels: a field program's gradient,
an ndarray kernel's vjp, and second derivatives by reverse mode over their tangent kernels). Where the last thing
Taichi wrote before the process died is its warning that a compiled gradient kernel loads a variable before
anything is stored to it, the death is that Taichi bug (long run, seed 10835: ``td.hvp`` of a field program,
Taichi's reverse mode of tidiff's tangent kernel warns, then a bus error at launch; seeds 10102 and 10106 the
same in ``ti.ad.Tape`` alone)."""


def _last_words_are_the_reverse_warning(output: str) -> bool:
    """Whether Taichi's last line before the process died (and before Python's fault handler's report) is its
    warning of a load before any store."""
    lines = [line for line in output.rsplit("Fatal Python error", 1)[0].splitlines() if line.strip()]
    return bool(lines) and REVERSE_WARNING in lines[-1]


def known_error(message: str, call: str) -> str | None:
    """Why Taichi raised an error with ``message`` in the check ``call``, or None (then it is a failure to look
    at). Known: a signature of ``TAICHI_CRASHES``, or any error in a check of Taichi alone (``TAICHI_ALONE``)."""
    known = _signature(message)
    if known is None and call.startswith(TAICHI_ALONE):
        known = "Taichi alone (no tidiff code) raised it"
    return known


def _signature(text: str) -> str | None:
    return next((why for sign, why in TAICHI_CRASHES.items() if sign in text), None)
