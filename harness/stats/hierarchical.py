"""Two methods over several protocols, every seed of every protocol: the hierarchical Bayesian
model of Corani, Benavoli, Demšar, Mangili and Zaffalon, "Statistical comparison of
classifiers through Bayesian hierarchical modelling" (Machine Learning 106, 2017). The model
and its sampler are harness.stats.nuts (NumPyro's NUTS from a fixed PRNG key); whether the
chains converged, harness.stats.convergence; this module makes one comparison of them.

Where the paper's model has no answer, the harness says what it does instead:

- A protocol whose differences have no spread at all (twins: a copy of a method with its
  seeds) has a likelihood without bound at sigma_i = 0; its delta_i enters as known (the
  limit sigma_i -> 0), like the within-protocol test, which puts the whole mass on the mean
  difference. When every protocol is so and all share one value, nothing is sampled: the
  whole mass is on that value (`exact`).
- A protocol with fewer than 2 shared seeds for the pair has no within-protocol spread (the
  Stan program needs 2) and is left out; the result names it. When no protocol has 2, each
  protocol's one difference enters as a known delta_i: the model is then a Student-t over the
  protocols' differences, the information the signed-rank test uses (`means_only`).
- s_among of 0 (every protocol the same mean difference) would make std0's prior a point;
  s_within takes its place.

What a comparison returns: P(worse · ≈ · better), the posterior predictive probability that
the next protocol's mean difference delta_new ~ Student-t(nu, delta0, std0) lies below -ROPE,
within it, or above (the mean over the draws of each draw's three t masses: the question of
the paper's Section 4, "the next data set"; baycomp instead counts the draws in which each
region is the most probable, which `winner_shares` gives for comparison with it); each
protocol's shrunk mean difference delta_i with its 95 % central interval; and the
diagnostics: split R-hat and effective sample size (numpyro.diagnostics, on rank-normalised
draws) of delta0, std0, nu and every delta_i, and the divergent transitions. Under R-hat
1.01 and over 400 effective draws each (Vehtari et al., "Rank-normalization, folding, and
localization", Bayesian Analysis 2021) with no more than 1 % of the transitions divergent,
the comparison converged. One that has not is sampled once more, with a longer warmup and
smaller steps; if it still has not, its probabilities are not reported (`NotConverged`),
never as a number.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.core import HarnessError
from harness.stats.bayes import DECISIVE, Probs
from harness.stats.convergence import Diagnostics, diagnostics
from harness.stats.nuts import RETRY_TARGET_ACCEPT, RETRY_WARMUP, Samples, sample

log = logging.getLogger(__name__)

INTERVAL = 0.95  # of the shrunk means


@dataclass(frozen=True)
class NotConverged:
    """A comparison whose chains did not agree: its diagnostics, shown as words."""

    rhat: float
    ess: float
    divergent: int

    def verdict(self, threshold: float = DECISIVE) -> str:
        return "not converged"

    def cell(self) -> str:
        """`not converged (R-hat 1.04, ESS 180)`: no probability is shown."""
        return f"not converged (R-hat {self.rhat:.2f}, ESS {self.ess:.0f})"


@dataclass(frozen=True)
class Shrunk:
    """One protocol's mean difference after shrinkage (points): posterior mean and the 95 %
    central interval; `known` where it entered as known (no spread, or means only)."""

    protocol: str
    mean: float
    low: float
    high: float
    seeds: int
    known: bool = False


@dataclass(frozen=True)
class Posterior:
    """A comparison's posterior, summarised: the predictive probabilities at each ROPE asked
    for, the shrunk means, the protocols left out, the diagnostics and what it cost."""

    probs: dict[float, Probs]
    shares: dict[float, Probs]
    shrunk: list[Shrunk]
    diagnostics: Diagnostics
    left_out: list[str] = field(default_factory=list)
    means_only: bool = False
    seconds: float = 0.0

    def at(self, rope: float) -> Probs | NotConverged:
        """The predictive probabilities at `rope`, or NotConverged: a table shows words, not
        numbers."""
        d = self.diagnostics
        if not d.converged:
            return NotConverged(d.rhat, d.ess, d.divergent)
        return self.probs[rope]

    def shares_at(self, rope: float) -> Probs | NotConverged:
        """baycomp's convention at `rope` (winner_shares), or NotConverged."""
        d = self.diagnostics
        if not d.converged:
            return NotConverged(d.rhat, d.ess, d.divergent)
        return self.shares[rope]


def check_rope(rope: float) -> None:
    """A ROPE must be a positive, finite number of points."""
    if not (isinstance(rope, (int, float)) and math.isfinite(rope) and rope > 0):
        raise HarnessError(f"the ROPE must be a positive number of points, got {rope!r}: set "
                           "evaluation.rope in the protocol (or the ROPE asked for) above 0")  # fmt: skip


def shared_differences(
    a: Mapping[str, Mapping[int, float]], b: Mapping[str, Mapping[int, float]],
) -> tuple[dict[str, list[float]], list[str]]:  # fmt: skip
    """Per protocol (a: protocol -> seed -> value, in points), a minus b on the seeds both
    ran, in seed order; and the protocols left out for fewer than 2 shared seeds (kept, as
    one difference each, when no protocol has 2: then the model sees the means only)."""
    every = {p: [a[p][s] - b[p][s] for s in sorted(set(a[p]) & set(b.get(p, {})))]
             for p in a}  # fmt: skip
    kept = {p: d for p, d in every.items() if len(d) >= 2}
    if kept:
        return kept, sorted(p for p in every if p not in kept)
    return {p: d for p, d in every.items() if d}, sorted(p for p, d in every.items() if not d)


def predictive(samples: Samples, rope: float) -> tuple[np.ndarray, np.ndarray]:
    """Each draw's t masses of delta_new below -rope and above +rope."""
    from scipy import stats

    t = stats.t(samples.nu.ravel(), samples.delta0.ravel(), samples.std0.ravel())
    return t.cdf(-rope), t.sf(rope)


def predictive_probs(samples: Samples, rope: float, n: int) -> Probs:
    """P(worse · ≈ · better) of the next protocol's mean difference: the draws' mean masses."""
    worse, better = (float(p.mean()) for p in predictive(samples, rope))
    return Probs(worse, 1 - worse - better, better, n)


def winner_shares(samples: Samples, rope: float) -> tuple[float, float, float]:
    """baycomp's `Posterior.probs` of the same draws: the share of draws in which each region
    is the most probable (its documentation's numbers are these)."""
    worse, better = predictive(samples, rope)
    triple = np.stack([worse, 1 - worse - better, better], axis=1)
    shares = np.bincount(np.argmax(triple, axis=1), minlength=3) / len(triple)
    return float(shares[0]), float(shares[1]), float(shares[2])


def compare(
    a: Mapping[str, Mapping[int, float]], b: Mapping[str, Mapping[int, float]],
    ropes: Sequence[float], **options: Any,
) -> Posterior | None:  # fmt: skip
    """`a` against `b` (protocol -> seed -> main metric, in points) by the hierarchical model:
    the predictive probabilities at each of `ropes`, the shrunk means and the diagnostics;
    None when no protocol has a shared seed. `options` go to `sample` (rho, seed, chains,
    warmup, draws)."""
    for rope in ropes:
        check_rope(rope)
    start = time.perf_counter()
    differences, left_out = shared_differences(a, b)
    if not differences:
        return None
    means_only = all(len(d) < 2 for d in differences.values())
    known = {p: float(np.mean(d)) for p, d in differences.items()
             if means_only or float(np.std(d)) == 0}  # fmt: skip
    sampled = {p: d for p, d in differences.items() if p not in known}
    n = len(differences)
    values = set(known.values())
    if not sampled and len(values) == 1:  # nothing to sample: every difference one value
        value = values.pop()
        shrunk = [Shrunk(p, value, value, value, len(differences[p]), True) for p in differences]
        # the whole mass on one value (as seed_probs does for no spread at all)
        exact = {r: Probs(float(value < -r), float(abs(value) <= r), float(value > r), n)
                 for r in ropes}  # fmt: skip
        return Posterior(exact, exact, shrunk, Diagnostics(1.0, 0.0, 0, 0, exact=True),
                         left_out, means_only, time.perf_counter() - start)  # fmt: skip
    samples = sample(sampled, known, **options)
    checked = diagnostics(samples)
    if not checked.converged:  # once more, longer and with smaller steps
        log.info("hierarchical model: not converged (%s); sampling once more with %d warmup "
                 "iterations and a step-size target of %g", checked.text(), RETRY_WARMUP,
                 RETRY_TARGET_ACCEPT)  # fmt: skip
        retry = {**options, "warmup": RETRY_WARMUP, "target_accept": RETRY_TARGET_ACCEPT}
        samples = sample(sampled, known, **retry)
        checked = dataclasses.replace(diagnostics(samples), retried=True)
    tail = (1 - INTERVAL) / 2 * 100
    shrunk = []
    for p, d in differences.items():
        if p in known:
            shrunk.append(Shrunk(p, known[p], known[p], known[p], len(d), True))
            continue
        draws = samples.delta[:, :, list(sampled).index(p)].ravel()
        low, high = np.percentile(draws, [tail, 100 - tail])
        shrunk.append(Shrunk(p, float(draws.mean()), float(low), float(high), len(d)))
    probs = {r: predictive_probs(samples, r, n) for r in ropes}
    shares = {r: Probs(*winner_shares(samples, r), n) for r in ropes}
    return Posterior(probs, shares, shrunk, checked, left_out, means_only,
                     time.perf_counter() - start)  # fmt: skip
