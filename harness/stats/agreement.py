"""Do two rankings agree? Kendall's tau-b between two sets of scores over the names both have
(1: the same order, 0: unrelated, -1: reversed), with its two-sided p-value (scipy's exact
test when there are no ties): between two protocols' leaderboards, between neighbouring
protocols of the bump chart, between the two settings' average ranks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from harness.stats.ranks import MIN_METHODS, Block


@dataclass(frozen=True)
class Agreement:
    """Kendall's tau-b and its p-value over `shared` (the names both rankings hold, sorted);
    NaN where they share too few names for a tau worth stating."""

    tau: float
    p: float
    shared: list[str]


def kendall(a: Mapping[str, float], b: Mapping[str, float], least: int = MIN_METHODS) -> Agreement:
    """Kendall's tau-b between `a` and `b` (name -> score) over the names both hold; tau and p
    are NaN with fewer than `least` of them."""
    from scipy.stats import kendalltau  # on first use: it costs every command 0.4 s to import

    shared = sorted(set(a) & set(b))
    if len(shared) < least:
        return Agreement(math.nan, math.nan, shared)
    tau, p = kendalltau([a[m] for m in shared], [b[m] for m in shared])
    return Agreement(float(tau), float(p), shared)


def neighbour_taus(blocks: list[Block]) -> list[tuple[str, str, float, float, int]]:
    """Kendall's tau-b (and its p-value) between each block and the next, over the methods
    both ran: (first, second, tau, p, methods); tau and p are NaN where the two share fewer
    than MIN_METHODS methods (no tau is worth stating over two)."""
    out = []
    for a, b in zip(blocks, blocks[1:], strict=False):
        found = kendall(a.means, b.means)
        out.append((a.name, b.name, found.tau, found.p, len(found.shared)))
    return out
