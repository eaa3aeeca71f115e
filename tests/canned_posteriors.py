"""A stand-in for the hierarchical model (harness.stats.hierarchical.compare) in tests of
the tables, captions and figures around it: instant, deterministic and easy to reason
about, so that those tests need no sampling. The model itself is tested against known
answers in tests/harness/stats/test_hierarchical.py.

The stand-in's next-protocol difference is normal, centred on the mean of the protocols'
mean differences (shared seeds), with the protocols' standard deviation of them, at least
SPREAD points."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats

from harness.stats import Diagnostics, Posterior, Probs, Shrunk
from harness.stats.hierarchical import shared_differences

SPREAD = 0.1  # points


def canned_compare(
    a: Mapping[str, Mapping[int, float]], b: Mapping[str, Mapping[int, float]],
    ropes: Sequence[float], **_: object,
) -> Posterior | None:  # fmt: skip
    """A Posterior shaped like the model's (converged, R-hat 1.001, ESS 5,000)."""
    differences, left_out = shared_differences(a, b)
    if not differences:
        return None
    means = [float(np.mean(d)) for d in differences.values()]
    centre, spread = float(np.mean(means)), max(float(np.std(means)), SPREAD)
    normal = stats.norm(centre, spread)
    probs = {}
    for r in ropes:
        worse, better = float(normal.cdf(-r)), float(normal.sf(r))
        probs[r] = Probs(worse, 1 - worse - better, better, len(differences))
    shrunk = [Shrunk(p, m, m - 0.1, m + 0.1, len(differences[p]))
              for p, m in zip(differences, means, strict=True)]  # fmt: skip
    return Posterior(probs, probs, shrunk, Diagnostics(1.001, 5000.0, 0, 10_000), left_out)
