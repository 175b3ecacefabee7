"""What the net leaves out because tidiff currently gets it wrong: one flag per known failure.

``KNOWN_FAILING`` maps a feature (an op, statement kind, library function or
transform call of the grammar, or a check named below) to what goes wrong.
The grammar and the checks skip flagged features, so CI stays green; each
flag has a strict xfail regression test in ``test_known_failures.py`` that
starts passing, and so fails, when the fix lands: then delete the flag here.

``REVERSE_GAPS`` are constructs tidiff's reverse transform does not take.
They matter only where forward mode is impossible (code reaching a
``td.custom_vjp`` function without a jvp rule), so the net leaves them out
of such programs only; they too have xfail tests.
"""
from __future__ import annotations

from . import library
from .grammar import Grammar

KNOWN_FAILING: dict[str, str] = {}
"""feature -> what goes wrong. Remove an entry when its xfail test in test_known_failures.py passes."""

REVERSE_GAPS: dict[str, str] = {}
"""construct -> why tidiff cannot differentiate it in code that also reaches a custom_vjp without a jvp rule."""

FIELD_REVERSE_GAPS: dict[str, str] = {
    "tan": "Taichi 1.7.4's reverse mode has no rule for ti.tan",
    "while": "nor for while loops",
}
"""op -> why Taichi's own reverse mode (the tape, kernel.grad) cannot run programs using it: the net runs it as
a cross-check only on programs without them; tidiff's adjoints take them."""

FORWARDLESS = tuple(name for name, entry in library.LIBRARY.items() if not entry.forward)
"""Library functions without a jvp rule: forward mode through them is an error, as in JAX."""


def enabled(feature: str) -> bool:
    return feature not in KNOWN_FAILING


def grammar(reverse_only: bool = False, **overrides) -> Grammar:
    """The grammar without known failures; ``reverse_only`` admits custom_vjp functions without a jvp rule
    and leaves out what reverse mode cannot take (REVERSE_GAPS), else those functions are left out."""
    g = Grammar(**overrides).without(*KNOWN_FAILING)
    return g.without(*REVERSE_GAPS) if reverse_only else g.without(*FORWARDLESS)
