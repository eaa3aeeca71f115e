"""Did a hierarchical posterior's chains converge? Rank-normalised split R-hat and the bulk
effective sample size of every parameter that matters (Vehtari, Gelman, Simpson, Carpenter and
Bürkner, "Rank-normalization, folding, and localization: an improved R-hat for assessing
convergence of MCMC", Bayesian Analysis 2021), and the divergent transitions.

Under R-hat RHAT_MAX and over ESS_MIN effective draws each, with no more than DIVERGENT_MAX
of the transitions divergent, a comparison converged; one that has not is reported in words
(harness.stats.hierarchical.NotConverged), never as a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.stats.nuts import Samples

RHAT_MAX = 1.01
ESS_MIN = 400.0
DIVERGENT_MAX = 0.01  # a share of the draws


@dataclass(frozen=True)
class Diagnostics:
    """The worst R-hat and effective sample size over delta0, std0, nu and every delta_i,
    the divergent transitions, and the draws; `exact` where nothing was sampled."""

    rhat: float
    ess: float
    divergent: int
    draws: int
    exact: bool = False
    retried: bool = False  # sampled a second time, with RETRY_WARMUP and RETRY_TARGET_ACCEPT

    @property
    def converged(self) -> bool:
        """Nothing sampled, or R-hat, ESS and divergences all within their limits."""
        return self.exact or (self.rhat < RHAT_MAX and self.ess > ESS_MIN
                              and self.divergent <= DIVERGENT_MAX * self.draws)  # fmt: skip

    def text(self) -> str:
        """`R-hat 1.002, ESS 3,120, 0 divergent of 10,000`, or `exact (nothing sampled)`."""
        if self.exact:
            return "exact (nothing sampled)"
        again = ", sampled twice" if self.retried else ""
        return (f"R-hat {self.rhat:.3f}, ESS {self.ess:,.0f}, {self.divergent} divergent of "
                f"{self.draws:,}{again}")  # fmt: skip


def _normal_scores(x: np.ndarray) -> np.ndarray:
    """The draws (chains × draws) rank-normalised: ranks over all chains mapped to normal
    quantiles, (r - 3/8) / (S + 1/4), as Vehtari et al. 2021 do."""
    from scipy.special import ndtri
    from scipy.stats import rankdata

    ranks = rankdata(x, method="average").reshape(x.shape)
    return ndtri((ranks - 0.375) / (x.size + 0.25))


def diagnostics(samples: Samples) -> Diagnostics:
    """numpyro.diagnostics' split R-hat and effective sample size of delta0, std0, nu and
    every sampled delta_i, on their draws rank-normalised (Vehtari et al., "Rank-
    normalization, folding, and localization: an improved R-hat", Bayesian Analysis 2021):
    R-hat the larger of the bulk's and the folded draws' (|x - median|, the tails'), ESS the
    bulk's; the worst of each. Plain R-hat misjudges std0 and nu, whose posteriors have tails
    out to their priors' bounds over a few protocols: one excursion of one chain moved it
    past 1.03 where the rank-normalised one said 1.004."""
    from numpyro.diagnostics import effective_sample_size, split_gelman_rubin

    chains, draws = samples.delta0.shape
    columns = [samples.delta0, samples.std0, samples.nu,
               *(samples.delta[:, :, i] for i in range(samples.delta.shape[2]))]  # fmt: skip
    rhat, ess = 0.0, math.inf
    for c in columns:
        bulk, folded = _normal_scores(c), _normal_scores(np.abs(c - np.median(c)))
        rhat = max(rhat, float(split_gelman_rubin(bulk)), float(split_gelman_rubin(folded)))
        ess = min(ess, float(effective_sample_size(bulk)))
    return Diagnostics(rhat, ess, samples.divergent, chains * draws)
