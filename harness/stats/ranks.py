"""Which method is best over several protocols: average ranks, the Friedman test and Nemenyi's
post-hoc test with its critical difference (Demšar, "Statistical Comparisons of Classifiers
over Multiple Data Sets", JMLR 2006).

Each protocol is one block (Demšar's data set): each method's mean main metric. Within a
block the methods are ranked (1 = best, ties share the mean rank), and the ranks are averaged
over the blocks. The Friedman test asks whether the average ranks differ more than chance
would make them; the Nemenyi test (scikit-posthocs' posthoc_nemenyi_friedman) tells which
pairs differ: two methods differ at 5 % when their average ranks are more than the critical
difference CD = q_0.05 sqrt(k (k + 1) / (6 N)) apart (k methods, N blocks).

Why Nemenyi and not Holm-corrected Wilcoxon signed-rank tests (Benavoli et al., JMLR 2016,
prefer the latter): with N blocks the smallest two-sided p-value a Wilcoxon signed-rank test
can give is 2 / 2^N, 0.125 for four protocols, so no pair could ever differ, whatever the
numbers; the Nemenyi test can say something with few blocks, and says it conservatively.
Its caveat, that a pair's verdict depends on which other methods are in the comparison, is
why the diagram (harness.report.ranks) names every method in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from harness.stats.bayes import DEFAULT_ROPE

if TYPE_CHECKING:  # pandas loads with the first ranking, not with every command
    import pandas as pd

ALPHA = 0.05
MIN_METHODS = 3  # the Friedman test needs three methods; fewer: no diagram


@dataclass(frozen=True)
class Block:
    """One protocol's ranking: its name (`tuning (tuned)` for a tuned ranking), main metric,
    each row's mean over its finished seeds (and the seeds' values), and when its first run
    started (the order of the bump chart)."""

    name: str
    metric: str
    means: dict[str, float]
    started: str
    setting: str = ""  # SETTINGS: from scratch, or pretrained on real photos
    rope: float = DEFAULT_ROPE  # the protocol's evaluation.rope (harness.stats.bayes)
    seeds: int = 0  # the most finished seeds behind one of its means
    # row -> seed -> main metric behind each mean (the hierarchical model's input)
    values: dict[str, dict[int, float]] = field(default_factory=dict)


def shared_blocks(blocks: list[Block]) -> tuple[list[Block], list[str], list[Block]]:
    """(blocks kept, the methods every kept block ran, blocks left out): the methods all
    blocks share; while they are fewer than MIN_METHODS and more than two blocks remain, the
    block with the fewest methods is left out (a small test protocol must not shrink the
    comparison to nothing)."""
    kept, left_out = list(blocks), []
    while True:
        shared = sorted(set.intersection(*(set(b.means) for b in kept))) if kept else []
        if len(shared) >= MIN_METHODS or len(kept) <= 2:
            return kept, shared, left_out
        smallest = min(kept, key=lambda b: (len(b.means), b.name))
        kept.remove(smallest)
        left_out.append(smallest)


def missing_from(kept: list[Block], shared: list[str]) -> dict[str, list[str]]:
    """Each method some kept block ran but not all (not `shared`), with the blocks that lack
    it: a method that cannot run on a dataset (say, without coarse labels) is named, not lost."""
    return {m: [b.name for b in kept if m not in b.means]
            for m in sorted({m for b in kept for m in b.means} - set(shared))}  # fmt: skip


def average_ranks(table: pd.DataFrame) -> pd.Series:
    """Each method's (column's) rank averaged over the blocks (rows): rank 1 is the highest
    value of a block, tied values share their mean rank (Demšar's convention)."""
    import pandas as pd
    from scipy.stats import rankdata

    ranks = rankdata(-table.to_numpy(dtype=np.float64), axis=1, method="average")
    return pd.Series(ranks.mean(axis=0), index=table.columns)


def critical_difference(methods: int, blocks: int, alpha: float = ALPHA) -> float:
    """Nemenyi's critical difference of average ranks: q_alpha sqrt(k (k+1) / (6 N)), q_alpha
    the studentized range quantile for k groups and infinite degrees of freedom over sqrt 2
    (Demšar's Table 5a: 2.343 for k = 3, 2.569 for 4, 3.164 for 10)."""
    from scipy.stats import studentized_range

    q = studentized_range.ppf(1 - alpha, methods, math.inf) / math.sqrt(2)
    return float(q * math.sqrt(methods * (methods + 1) / (6 * blocks)))


@dataclass(frozen=True)
class RankTest:
    """The critical-difference diagram's numbers: the blocks × methods table of means, the
    average ranks, Friedman's chi-square and p, Nemenyi's CD and pairwise p-values, and the
    blocks left out for lack of shared methods, and the methods left out because some kept
    block lacks them (each with those blocks: a method that cannot run on a dataset)."""

    table: pd.DataFrame
    ranks: pd.Series
    chi_square: float
    p: float
    cd: float
    pairwise: pd.DataFrame
    left_out: list[Block]
    unranked: dict[str, list[str]] = field(default_factory=dict)

    @property
    def blocks(self) -> list[str]:
        """The names of the blocks ranked."""
        return list(self.table.index)

    def resolved(self) -> list[tuple[str, str]]:
        """The pairs of methods the Nemenyi test tells apart at 5 %, better-ranked first."""
        names = list(self.pairwise.index)
        pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]
                 if self.pairwise.loc[a, b] < ALPHA]  # fmt: skip
        return [(a, b) if self.ranks[a] <= self.ranks[b] else (b, a) for a, b in pairs]


def rank_test(blocks: list[Block]) -> RankTest | None:
    """Friedman and Nemenyi over the blocks' shared methods; None with fewer than two blocks
    or MIN_METHODS shared methods (nothing to rank across)."""
    import pandas as pd
    import scikit_posthocs
    from scipy.stats import friedmanchisquare

    kept, shared, left_out = shared_blocks(blocks)
    if len(kept) < 2 or len(shared) < MIN_METHODS:
        return None
    table = pd.DataFrame([[b.means[m] for m in shared] for b in kept],
                         index=[b.name for b in kept], columns=shared)  # fmt: skip
    chi_square, p = friedmanchisquare(*(table[m].to_numpy() for m in shared))
    pairwise = scikit_posthocs.posthoc_nemenyi_friedman(table.to_numpy())
    pairwise.index = pairwise.columns = shared
    return RankTest(table, average_ranks(table), float(chi_square), float(p),
                    critical_difference(len(shared), len(kept)), pairwise, left_out,
                    missing_from(kept, shared))  # fmt: skip


def blocks_to_resolve(test: RankTest, gap: float) -> int:
    """How many blocks the Nemenyi test needs before average ranks `gap` apart differ at 5 %
    (the CD shrinks as 1 / sqrt N): what more protocols would buy."""
    k = len(test.ranks)
    per_block = critical_difference(k, 1)
    return math.ceil((per_block / gap) ** 2)


def block_ranks(blocks: list[Block]) -> dict[str, dict[str, float]]:
    """Each block's ranks of its own rows (1 = best, ties share the mean rank)."""
    from scipy.stats import rankdata

    out = {}
    for b in blocks:
        rows = sorted(b.means)
        ranks = rankdata([-b.means[r] for r in rows], method="average")
        out[b.name] = {r: float(x) for r, x in zip(rows, ranks, strict=True)}
    return out
