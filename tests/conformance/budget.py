"""How many examples each test draws: a few in CI, as many as asked in a long run.

CI (the default): each test runs ``ci`` examples, derandomized (the same
programs every run, so the offline cache makes reruns fast) and without the
example database. A long run sets ``TIDIFF_CONFORMANCE_EXAMPLES=N``: the
tests share N examples by weight, randomized (``--hypothesis-seed`` picks
the programs; ``run_long.py`` runs chunks in separate processes with
different seeds) and with the database on, so failures replay.
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

EXAMPLES_ENV = "TIDIFF_CONFORMANCE_EXAMPLES"

LONG = int(os.environ.get(EXAMPLES_ENV, "0") or 0)

NO_SHRINK = bool(os.environ.get("TIDIFF_CONFORMANCE_NO_SHRINK"))
"""Report the first failure as drawn: shrinking compiles many programs, and Taichi may crash on one."""

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large,
             HealthCheck.large_base_example]


def examples(ci: int, share: float) -> settings:
    """Settings for a test that draws ``ci`` examples in CI and ``share`` of the long run's total."""
    if LONG:
        phases = [p for p in Phase if not (NO_SHRINK and p in (Phase.shrink, Phase.explain))]
        return settings(max_examples=max(1, round(LONG * share)), deadline=None, derandomize=False, phases=phases,
                        suppress_health_check=_SUPPRESS, print_blob=True, report_multiple_bugs=True)
    return settings(max_examples=ci, deadline=None, derandomize=True, database=None,
                    suppress_health_check=_SUPPRESS, print_blob=True)
