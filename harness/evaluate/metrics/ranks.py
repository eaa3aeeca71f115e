"""Exact ranks of each query's relevant items, from one sort of each chunk of keys.

Every retrieval metric is a function of where the R relevant items of a query land in its
ranking (by key ascending, ties to the lower gallery index, the query itself removed in
all-vs-all mode): recall@K needs the first rank, R-precision and MAP@R the ranks up to R, MAP
all of them. So each chunk's key rows are sorted once (values only, as float32; numpy's vectorised sort on
the CPU; a full sort of the row is cheaper there than binary-searching every item among the R
relevant keys) and each relevant key is located in its sorted row by binary search:

    rank_t = t + #{irrelevant items with a smaller key}

for the t-th relevant item in (key, index) order. Rounding to float32 is monotone, so the count
is exact unless an irrelevant item rounds to the float32 of a relevant key: such rows (a few
percent) are counted again from their float64 keys, and rows where an irrelevant key equals a
relevant one exactly (its place then depends on indices) are ranked by a full stable sort.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from harness.evaluate.metrics.topk import topk_metrics


def class_members(ids: torch.Tensor, num_ids: int) -> torch.Tensor:
    """[num_ids, largest class] gallery indices of each class, ascending, padded with -1."""
    order = torch.sort(ids, stable=True).indices
    counts = torch.bincount(ids, minlength=num_ids)
    starts = torch.cumsum(counts, 0) - counts
    width = int(counts.max()) if len(counts) else 0
    slot = torch.arange(len(ids), device=ids.device) - starts[ids[order]]
    table = torch.full((num_ids, max(width, 1)), -1, dtype=torch.long, device=ids.device)
    table[ids[order], slot] = order
    return table


def relevant_ranks(
    keys: torch.Tensor, rows: torch.Tensor, partners: torch.Tensor, all_vs_all: bool
) -> torch.Tensor:
    """[n, W] float64 ranks (1-based) of each row's relevant items in ascending order, +inf
    padded; ``partners`` [n, W] are the rows' same-class gallery indices (-1 padded).

    The rows are sorted as float32 first (rounding is monotone, so counts below a relevant key
    stay exact unless an irrelevant item rounds to the same float32); rows where one does are
    counted again at the keys' own precision, and rows with a true tie by a stable sort."""
    valid = partners >= 0
    if all_vs_all:
        valid &= partners != rows.unsqueeze(1)
    rel_keys = torch.where(valid, keys.gather(1, partners.clamp(min=0)), float("inf"))
    # partners ascend within a row, so a stable sort by key orders them by (key, index)
    rel_keys, perm = torch.sort(rel_keys, dim=1, stable=True)
    valid = valid.gather(1, perm)
    own = keys.gather(1, rows.unsqueeze(1)) if all_vs_all else None  # the query's own key
    narrow = torch.float32 if keys.dtype == torch.float64 else keys.dtype
    ranks, unsure = _counted_ranks(
        keys.to(narrow), rel_keys.to(narrow), None if own is None else own.to(narrow), valid
    )
    if bool(unsure.any()):
        at = torch.nonzero(unsure).squeeze(1)
        ranks[at], tied = _counted_ranks(
            keys[at], rel_keys[at], None if own is None else own[at], valid[at]
        )
        if bool(tied.any()):
            at = at[tied]
            ranks[at] = _ranks_by_stable_sort(
                keys[at], rows[at], partners.gather(1, perm)[at], valid[at], all_vs_all
            )
    return ranks


def _counted_ranks(
    keys: torch.Tensor, rel_keys: torch.Tensor, own: torch.Tensor | None, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ranks [n, W], rows where an irrelevant item's key equals a relevant one's): rank_t =
    t + the count of irrelevant keys below the t-th relevant key, from one sort of each row."""
    ordered = _sorted_rows(keys)
    below = torch.searchsorted(ordered, rel_keys, side="left")
    equal = torch.searchsorted(ordered, rel_keys, side="right") - below
    rel_below = torch.searchsorted(rel_keys, rel_keys, side="left")
    rel_equal = torch.searchsorted(rel_keys, rel_keys, side="right") - rel_below
    if own is not None:
        below -= (own < rel_keys).long()
        equal -= (own == rel_keys).long()
    t = torch.arange(1, rel_keys.shape[1] + 1, device=keys.device, dtype=torch.float64)
    ranks = (below - rel_below).to(torch.float64) + t.unsqueeze(0)
    ranks = torch.where(valid, ranks, float("inf"))
    # an infinite key (a scorer's) would be confused with the padding: rank such rows by sort
    finite = torch.isfinite(ordered[:, 0]) & torch.isfinite(ordered[:, -1])
    return ranks, ((equal > rel_equal) & valid).any(1) | ~finite


def _sorted_rows(keys: torch.Tensor) -> torch.Tensor:
    """Each row's keys ascending (values only): numpy's vectorised sort on the CPU."""
    if keys.device.type == "cpu":
        return torch.from_numpy(np.sort(keys.numpy(), axis=1))
    return torch.sort(keys, dim=1).values


def _ranks_by_stable_sort(
    keys: torch.Tensor,
    rows: torch.Tensor,
    partners: torch.Tensor,
    valid: torch.Tensor,
    all_vs_all: bool,
) -> torch.Tensor:
    """Reference ranks by a full stable sort (rows with ties between relevant and irrelevant)."""
    order = torch.sort(keys, dim=1, stable=True).indices
    place = torch.empty_like(order)
    place.scatter_(1, order, torch.arange(keys.shape[1], device=keys.device).expand_as(order))
    at = place.gather(1, partners.clamp(min=0))
    ranks = at + 1
    if all_vs_all:
        ranks -= (place.gather(1, rows.unsqueeze(1)) < at).long()
    # the relevant items, in (key, index) order, are in ascending place order already
    ranks = ranks.to(torch.float64)
    return torch.where(valid, ranks, float("inf"))


def rank_metrics(
    ranks: torch.Tensor,
    r: torch.Tensor,
    ks: list[int],
    names: set[str],
    depth: int,
    add: Callable[[str, torch.Tensor], None],
) -> None:
    """Add the requested per-query metrics from the relevant items' ranks [n, W] and R [n]."""
    if depth > 0:
        rel = torch.zeros(ranks.shape[0], depth + 1, dtype=torch.bool, device=ranks.device)
        column = torch.where(ranks <= depth, ranks - 1, torch.full_like(ranks, depth)).long()
        rel.scatter_(1, column, True)
        topk_metrics(rel[:, :depth], r, ks, names, add)
    if "map" in names:
        t = torch.arange(1, ranks.shape[1] + 1, device=ranks.device, dtype=torch.float64)
        add("map", (t.unsqueeze(0) / ranks).sum(1) / r.to(torch.float64))
