"""Which methods are practically equivalent: Bayesian comparisons with a region of practical
equivalence (ROPE), after Benavoli, Corani, Demšar and Zaffalon, "Time for a change: a
tutorial for comparing multiple classifiers through Bayesian analysis" (JMLR 2017).

A ROPE of r points says that two methods whose main metrics differ by less than r are, for
practical purposes, the same. Each comparison gives three probabilities: that the first is
worse by more than r, that the two are within r, and that it is better by more than r. A
frequentist `≈ best` cannot tell "equivalent" from "too few seeds to tell"; these can.

- Within a protocol: the Bayesian correlated t-test (Corani and Benavoli, Machine Learning
  2015) on the seeds two methods share, paired by seed, with correlation 0. The seeds are
  independent trainings evaluated on one fixed split, not cross-validation folds that share
  training data: nothing correlates their errors but the test set, which every seed shares
  and whose uncertainty the seeds do not measure. The posterior of the mean difference is a
  Student t with n - 1 degrees of freedom, centred on the mean difference, with scale
  s / sqrt(n) (Jeffreys' prior); its masses below -r, within ±r and above r are exact. The
  test-set bootstrap does not enter: the probabilities speak of this test set.
- Across protocols: the Bayesian signed-rank test (Benavoli et al., ICML 2014) over the
  protocols' means, each method against the reference (the best average rank, as in the
  critical-difference diagram). Its probabilities are the shares of 50,000 posterior samples
  (seeded) in which each region is the most probable. The hierarchical model (Corani et al.,
  Machine Learning 2017), which would pool every seed of every protocol, is not used: see
  docs/verdicts.md for why and what is lost.

Both follow baycomp 1.0.3, the authors' library, formula for formula and draw for draw (the
tests hold its outputs). It is not a dependency: its distribution installs a top-level
`tests` package into site-packages, which shadows this project's own `tests` package (and
any other project's), so the two small computations live here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.core.pairing import shared_seeds

DEFAULT_ROPE = 1.0  # points of the main metric; a protocol's evaluation.rope
ROPES = (0.5, 1.0, 2.0)  # the sensitivity table's
DECISIVE = 0.95  # a verdict needs this posterior probability
SAMPLES = 50_000  # posterior samples of the signed-rank test (baycomp's default)
SEED = 0  # of those samples: the tables and figures regenerate byte for byte
PRIOR = 0.5  # the signed-rank test's prior pseudo-observation, at 0 (baycomp's default)
SCALE = 100.0  # metrics are fractions; the ROPE and the differences are in points


@dataclass(frozen=True)
class Probs:
    """One method against another: P(worse by more than the ROPE), P(within it), P(better
    by more than it), from `n` paired values (seeds, or protocols)."""

    worse: float
    equivalent: float
    better: float
    n: int

    def verdict(self, threshold: float = DECISIVE) -> str:
        """`worse`, `equivalent` or `better` where that probability reaches `threshold`,
        else `undecided` (the data cannot say at this ROPE)."""
        for name, p in (("equivalent", self.equivalent), ("worse", self.worse),
                        ("better", self.better)):  # fmt: skip
            if p >= threshold:
                return name
        return "undecided"

    def cell(self) -> str:
        """`0.12 · 0.80 · 0.08`: P(worse) · P(≈) · P(better), two decimals."""
        return " · ".join(f"{p:.2f}" for p in (self.worse, self.equivalent, self.better))


def protocol_rope(content: Mapping[str, Any] | None) -> float:
    """A protocol's ROPE in points (evaluation.rope), from its recorded content."""
    return float(((content or {}).get("evaluation") or {}).get("rope", DEFAULT_ROPE))


def seed_probs(a: Mapping[int, float], b: Mapping[int, float], rope: float) -> Probs | None:
    """`a` against `b` (seed -> value, in points) within one protocol: the correlated t-test
    with correlation 0 over the seeds both ran; None with fewer than two shared seeds. As
    baycomp's `Posterior.probs`: t masses below -rope and above +rope, the rest within; no
    spread at all puts the whole mass on the mean difference."""
    from scipy import stats

    _check_rope(rope)
    shared = shared_seeds(a, b)  # the one pairing rule (harness.core.pairing)
    if shared is None:
        return None
    d = np.array([a[s] - b[s] for s in shared], dtype=np.float64)
    mean, variance = float(d.mean()), float(d.var(ddof=1)) / len(d)
    if variance == 0:
        worse, better = float(mean < -rope), float(mean > rope)
    else:
        t = stats.t(len(d) - 1, mean, math.sqrt(variance))
        worse, better = float(t.cdf(-rope)), float(1 - t.cdf(rope))
    return Probs(worse, 1 - worse - better, better, len(d))


def signed_rank_samples(
    x: Sequence[float], y: Sequence[float], rope: float,
    nsamples: int = SAMPLES, seed: int = SEED,
) -> np.ndarray:  # fmt: skip
    """baycomp's SignedRankTest.sample for `y` against `x` (rows: P(y worse), P(within),
    P(y better) of one posterior sample), the same Dirichlet draws, computed for all samples
    at once instead of one Python iteration per sample (50,000 samples in milliseconds)."""
    _check_rope(rope)
    diff = np.concatenate(([0.0], np.asarray(y, np.float64) - np.asarray(x, np.float64)))
    sums = diff[:, None] + diff[None, :]

    def heaviside(a: np.ndarray) -> np.ndarray:
        return (a > 2 * rope).astype(float) + 0.5 * (a == 2 * rope).astype(float)

    weights = np.ones(len(diff))
    weights[0] = PRIOR
    draws = np.random.RandomState(seed).dirichlet(weights, nsamples)
    samples = np.empty((nsamples, 3))
    samples[:, 0] = np.einsum("si,ij,sj->s", draws, heaviside(-sums), draws)
    samples[:, 2] = np.einsum("si,ij,sj->s", draws, heaviside(sums), draws)
    samples[:, 1] = 1 - samples[:, 0] - samples[:, 2]
    return samples


def signed_rank_probs(x: Sequence[float], y: Sequence[float], rope: float) -> Probs:
    """`y` against `x` over data sets (paired means, in points): the Bayesian signed-rank
    test's share of samples in which each region is the most probable (baycomp's
    `Posterior.probs`)."""
    winners = np.argmax(signed_rank_samples(x, y, rope), axis=1)
    worse, equivalent, better = np.bincount(winners, minlength=3) / len(winners)
    return Probs(float(worse), float(equivalent), float(better), len(x))


def unpaired_probs(
    a: Mapping[object, float], b: Mapping[object, float], rope: float
) -> Probs | None:
    """P(a worse by more than `rope` · within it · better) from two independent samples: the
    Welch posterior of the difference of the means (Student t, Welch-Satterthwaite degrees
    of freedom, scale the standard error). None with fewer than two values on a side."""
    from scipy import stats

    xa, xb = list(a.values()), list(b.values())
    if len(xa) < 2 or len(xb) < 2:
        return None
    va, vb = _var(xa) / len(xa), _var(xb) / len(xb)
    diff = sum(xa) / len(xa) - sum(xb) / len(xb)
    if va + vb == 0:
        worse, better = float(diff < -rope), float(diff > rope)
    else:
        dof = (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1))
        t = stats.t(dof, diff, math.sqrt(va + vb))
        worse, better = float(t.cdf(-rope)), float(1 - t.cdf(rope))
    return Probs(worse, 1 - worse - better, better, min(len(xa), len(xb)))


def _var(x: list[float]) -> float:
    mean = sum(x) / len(x)
    return sum((v - mean) ** 2 for v in x) / (len(x) - 1)


def _check_rope(rope: float) -> None:
    if not (rope > 0 and math.isfinite(rope)):
        raise ValueError(f"the ROPE must be a positive number of points, got {rope!r}")
