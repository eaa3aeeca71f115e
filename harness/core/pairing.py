"""Which seeds of two rows pair: the one rule for `compare`, the leaderboard's tests and
`--reference` (harness.stats.compare, and every posterior beside it, ask here).

Seed k fixes a run's initial weights, its batch order and its augmentation draws, whatever
machine runs it: torch's CPU generator and the samplers' seeded generators give the same
numbers everywhere. Another machine fingerprint (another instruction set, thread count or
BLAS) only rounds floats differently, which adds a little noise to each paired difference;
the paired test already counts that noise in the differences' spread. So seed k of two rows
pairs whatever machines made them. Measured on the committed runs: the birds tuned runs were
made where torch took AVX2 kernels and the paper-default runs on AVX-512, yet a method's
tuned and default MAP@R on the same seed correlate at a median 0.98 over the 28 methods;
on cars, 5 methods whose tuned configuration is the paper default gave the same numbers to
the last digit on two fingerprints (1 and 2 torch threads). An unpaired test would throw
that shared seed noise away.

Rows that share fewer than `MIN_SHARED` seeds have nothing to pair: their test is unpaired
(Welch's t-test, and the Welch posterior of the difference of the means).
"""

from __future__ import annotations

from collections.abc import Mapping

MIN_SHARED = 2  # a paired t-test needs a spread of differences: two seeds at least


def shared_seeds(a: Mapping, b: Mapping) -> list | None:
    """The seeds (keys) on which `a` and `b` pair, sorted, or None when the two share fewer
    than MIN_SHARED and must be compared unpaired. The machines that made them do not enter."""
    shared = sorted(set(a) & set(b))
    return shared if len(shared) >= MIN_SHARED else None
