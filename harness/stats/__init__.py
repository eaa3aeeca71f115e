"""The statistics: tests and models as functions of numbers, each returning a typed result.

Intervals over seeds and over test queries, the paired and Welch t-tests with
Benjamini-Hochberg (`frequentist`); the Bayesian correlated t-test and signed-rank test with
a region of practical equivalence (`bayes`); Friedman, Nemenyi and the critical difference
(`ranks`); Kendall's tau (`agreement`); the hierarchical model across protocols
(`hierarchical`, its NumPyro sampler `nuts`, its `convergence` checks), the comparisons over
protocols it makes (`equivalence`) and its posteriors kept between runs (`posteriors`); the
protocols as blocks of those comparisons, read from the result records (`blocks`).

Nothing here writes markdown or draws: harness.report decides how a number is shown, so a new
figure never touches a test and a new test never touches a table. Numbers come in as plain
mappings (row -> seed -> value) and arrays; only `blocks` reads result records, and only the
posterior cache reads and writes a file.
"""

from harness.stats import hierarchical, nuts
from harness.stats.agreement import Agreement, kendall, neighbour_taus
from harness.stats.bayes import (
    DECISIVE,
    DEFAULT_ROPE,
    ROPES,
    SAMPLES,
    SCALE,
    Probs,
    protocol_rope,
    seed_probs,
    signed_rank_probs,
    signed_rank_samples,
    unpaired_probs,
)
from harness.stats.blocks import (
    PRETRAINED,
    PRETRAINED_DEFAULT,
    SCRATCH,
    by_setting,
    main_blocks,
    protocol_blocks,
)
from harness.stats.convergence import ESS_MIN, RHAT_MAX, Diagnostics
from harness.stats.equivalence import ALL, Across, Verdict, across, comparisons
from harness.stats.frequentist import (
    BOOTSTRAP_RESAMPLES,
    CONFIDENCE,
    Comparison,
    benjamini_hochberg,
    bootstrap_intervals,
    compare,
    flipped_pairs,
    t_interval,
)
from harness.stats.hierarchical import NotConverged, Posterior, Shrunk, check_rope
from harness.stats.posteriors import CACHE_FILE, PosteriorCache, cache_for
from harness.stats.ranks import (
    ALPHA,
    MIN_METHODS,
    Block,
    RankTest,
    average_ranks,
    block_ranks,
    blocks_to_resolve,
    critical_difference,
    rank_test,
    shared_blocks,
)

__all__ = [
    "comparisons",
    "protocol_blocks",
    "main_blocks",
    "by_setting",
    "SCRATCH",
    "PRETRAINED_DEFAULT",
    "PRETRAINED",
    "ALL",
    "ALPHA",
    "BOOTSTRAP_RESAMPLES",
    "CACHE_FILE",
    "CONFIDENCE",
    "DECISIVE",
    "DEFAULT_ROPE",
    "ESS_MIN",
    "MIN_METHODS",
    "RHAT_MAX",
    "ROPES",
    "SAMPLES",
    "SCALE",
    "Across",
    "Agreement",
    "Block",
    "Comparison",
    "Diagnostics",
    "NotConverged",
    "Posterior",
    "PosteriorCache",
    "Probs",
    "RankTest",
    "Shrunk",
    "Verdict",
    "across",
    "average_ranks",
    "benjamini_hochberg",
    "block_ranks",
    "blocks_to_resolve",
    "bootstrap_intervals",
    "cache_for",
    "check_rope",
    "compare",
    "critical_difference",
    "flipped_pairs",
    "hierarchical",
    "kendall",
    "neighbour_taus",
    "nuts",
    "protocol_rope",
    "rank_test",
    "seed_probs",
    "shared_blocks",
    "signed_rank_probs",
    "signed_rank_samples",
    "t_interval",
    "unpaired_probs",
]
