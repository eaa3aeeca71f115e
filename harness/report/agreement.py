"""Do two protocols rank the methods alike? Kendall's tau (harness.stats.agreement) between
their leaderboards.

The default protocol's data is rendered glyphs; if it ranks the methods as a protocol on real
images does (omniglot's handwriting), its verdicts say something beyond glyphs. Each pair of
full-budget protocols that share at least MIN_SHARED methods is compared on the methods both
ran: Kendall's tau-b of the mean main metrics (1: the same order, 0: unrelated, -1:
reversed) with its two-sided p-value (scipy's exact test when there are no ties), and the
methods whose rank moved most. A protocol joins as soon as it has results: a pretrained one
(e.g. birds, real photographs) is compared with each protocol trained from scratch, each on
its own main metric; runs of two versions of one protocol are two protocols here.
"""

from __future__ import annotations

from itertools import combinations

import pandas as pd
from tabulate import tabulate

from harness.records import RunResult, protocol_groups, row_means
from harness.stats import kendall

MIN_SHARED = 5  # fewer methods in common: a tau means little
MOVES_SHOWN = 3


def _ranks(means: dict[str, float], rows: list[str]) -> dict[str, int]:
    order = sorted(rows, key=lambda r: -means[r])
    return {row: order.index(row) + 1 for row in rows}


def agreement_rows(groups: dict[str, list[RunResult]]) -> list[dict[str, str]]:
    """One row per pair of protocols (by name) sharing at least MIN_SHARED methods."""
    means = {name: row_means(runs) for name, runs in groups.items()}
    rows = []
    for a, b in combinations(sorted(means), 2):
        (metric_a, ma), (metric_b, mb) = means[a], means[b]
        found = kendall(ma, mb, least=MIN_SHARED)
        shared = found.shared
        if len(shared) < MIN_SHARED:
            continue
        ra, rb = _ranks(ma, shared), _ranks(mb, shared)
        moved = sorted(shared, key=lambda r: (-abs(ra[r] - rb[r]), r))[:MOVES_SHOWN]
        rows.append({
            "protocols": f"{a} ({metric_a}) vs {b} ({metric_b})",
            "methods both ran": str(len(shared)),
            "Kendall's tau": f"{found.tau:+.2f}",
            "p": f"{found.p:.2g}",
            "same top 5": str(len(set(sorted(shared, key=ra.get)[:5])
                                  & set(sorted(shared, key=rb.get)[:5]))),
            "moved most (rank a → b)": ", ".join(f"{r} {ra[r]}→{rb[r]}" for r in moved),
        })  # fmt: skip
    return rows


def agreement_section(runs: list[RunResult]) -> str:
    """The leaderboard's section on ranking agreement ('' when no two protocols share enough
    methods). Only full-budget runs (no --max-steps) and the paper-default rows take part."""
    rows = agreement_rows(protocol_groups(runs))
    if not rows:
        return ""
    table = tabulate(pd.DataFrame(rows), headers="keys", tablefmt="github", showindex=False,
                     disable_numparse=True)  # fmt: skip
    return "\n".join([
        "", "## Do the protocols agree on the ranking?", "",
        "Kendall's tau-b between two protocols' orderings of the methods both ran (by the mean "
        "of each protocol's main metric): +1 is the same order, 0 no relation, -1 the reverse; "
        "p is its two-sided p-value (no agreement beyond chance is the null hypothesis). `same "
        "top 5` counts the methods in both top fives. A high tau says a protocol's ranking "
        "carries over to the other's data; it says nothing of the gaps between methods, and "
        "rows that the verdicts call `≈ best` may swap places by seed noise alone.",
        "", table, "",
    ])  # fmt: skip
