"""One chunked pass over the query rows: keys once per chunk, every requested metric from it.

This float64 pass serves a learned scorer (and MPS); Euclidean ranking takes the counted pass
(harness.evaluate.metrics.counted), which gives the same ranks from float32 products. The
tests hold the two to the same numbers.

Per chunk of query rows the pass computes the float64 keys ||g||^2 - 2 q.g (one matrix
product; or the learned scorer's negated similarities), then from that one matrix:
    * the exact ranks of the relevant items (one sort of the chunk, see harness.evaluate.metrics.ranks),
      which give recall@K, precision@1, R-precision, MAP@R and MAP together;
    * the LDA score's positive and negative distance moments (harness.evaluate.metrics.distances).
When only top-K metrics are asked for, a cheaper float32 pass finds the neighbours instead
(harness.evaluate.metrics.fast_topk), exact all the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from harness.core import Scorer
from harness.evaluate.metrics.distances import PairMoments, add_chunk_pairs
from harness.evaluate.metrics.ranks import class_members, rank_metrics, relevant_ranks
from harness.evaluate.metrics.topk import (
    check_scores,
    faiss_topk,
    relevance,
    scorer_dtype,
    topk_metrics,
)


@dataclass(frozen=True)
class Split:
    """Queries and gallery as the pass sees them (labels as contiguous ids)."""

    q_emb: torch.Tensor
    g_emb: torch.Tensor
    q_ids: torch.Tensor
    g_ids: torch.Tensor
    r_counts: torch.Tensor  # relevant items per query (the query itself excluded)
    active: torch.Tensor  # queries with R > 0
    all_vs_all: bool
    num_ids: int

    @property
    def num_ranked(self) -> int:
        return len(self.g_ids) - (1 if self.all_vs_all else 0)

    @property
    def exact_dtype(self) -> torch.dtype:
        return torch.float32 if self.q_emb.device.type == "mps" else torch.float64


class Sums:
    """Per-metric float64 sums over queries (divided by the number of queries at the end),
    and the per-query values themselves (in the order of the active queries), which the
    bootstrap over test queries resamples."""

    def __init__(self) -> None:
        self.totals: dict[str, torch.Tensor] = {}
        self.values: dict[str, list[torch.Tensor]] = {}

    def add(self, name: str, values: torch.Tensor) -> None:
        values = values.to(torch.float64)
        self.totals[name] = self.totals.get(name, 0.0) + values.sum()
        self.values.setdefault(name, []).append(values.detach())

    def per_query(self) -> dict[str, np.ndarray]:
        return {name: torch.cat(parts).cpu().numpy() for name, parts in self.values.items()}

    def means(self, count: int) -> dict[str, float]:
        return {name: float(total) / float(count) for name, total in self.totals.items()}


def retrieval_depth(split: Split, ks: list[int], names: set[str]) -> int:
    """How many leading neighbours the top-K metrics read."""
    depth = max(ks, default=0)
    if "precision@1" in names:
        depth = max(depth, 1)
    if "r_precision" in names or "map@r" in names:
        depth = max(depth, int(split.r_counts[split.active].max()))
    return min(depth, split.num_ranked)


def exact_pass(
    split: Split,
    *,
    ks: list[int],
    names: set[str],
    scorer: Scorer | None,
    chunk_size: int,
    retrieval: bool,
    lda: PairMoments | None,
    sums: Sums,
) -> None:
    """Retrieval metrics over the active queries and/or LDA moments over every query row."""
    dtype = split.exact_dtype
    q, g = split.q_emb.to(dtype), split.g_emb.to(dtype)
    # identical gallery rows must get identical keys (ties to the lower index): BLAS may
    # round the same dot product differently in another column, so each distinct row is
    # computed once and its key copied to its duplicates
    g, copies = distinct_rows(g)
    g_sq, q_sq = (g * g).sum(1), (q * q).sum(1)
    members = class_members(split.g_ids, split.num_ids)
    depth = retrieval_depth(split, ks, names) if retrieval else 0
    rows_all = torch.arange(len(split.q_ids), device=q.device)
    rows_pool = rows_all if lda is not None else split.active
    is_active = torch.zeros(len(split.q_ids), dtype=torch.bool, device=q.device)
    is_active[split.active] = True
    if scorer is not None:
        q_in, g_in = scorer_dtype(split.q_emb), scorer_dtype(split.g_emb)
    for start in range(0, len(rows_pool), chunk_size):
        rows = rows_pool[start : start + chunk_size]
        keys = None
        if scorer is None or lda is not None:
            keys = torch.addmm(g_sq.unsqueeze(0), q[rows], g.T, beta=1.0, alpha=-2.0)
            keys = keys if copies is None else keys[:, copies]
        if retrieval:
            ranked = rows[is_active[rows]]
            if len(ranked):
                if scorer is not None:
                    scores = scorer(q_in[ranked], g_in)
                    check_scores(scores, len(ranked), len(split.g_ids))
                    rank_keys = -scores.detach().to(device=q.device, dtype=dtype)
                else:
                    rank_keys = keys if len(ranked) == len(rows) else keys[is_active[rows]]
                ranks = relevant_ranks(rank_keys, ranked, members[split.q_ids[ranked]],
                                       split.all_vs_all)  # fmt: skip
                rank_metrics(ranks, split.r_counts[ranked], ks, names, depth, sums.add)
        if lda is not None:  # last: it overwrites the keys
            add_chunk_pairs(lda, keys, rows, q_sq, split.q_ids, split.g_ids, members,
                            all_vs_all=split.all_vs_all)  # fmt: skip


def distinct_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The distinct rows of x and, when some repeat, the index of each row's distinct row
    (None: all distinct, x itself)."""
    unique, inverse = torch.unique(x, dim=0, return_inverse=True)
    return (x, None) if len(unique) == len(x) else (unique, inverse)


def faiss_pass(
    split: Split, *, ks: list[int], names: set[str], chunk_size: int, sums: Sums
) -> None:
    """Top-K metrics from faiss IndexFlatL2 neighbours (float32; ties at the K-th boundary are
    faiss's choice)."""
    depth = retrieval_depth(split, ks, names)
    extra = 1 if split.all_vs_all else 0
    order = faiss_topk(split.q_emb, split.g_emb, split.active, depth + extra)
    for start in range(0, len(split.active), chunk_size):
        rows = split.active[start : start + chunk_size]
        rel = relevance(order[start : start + chunk_size], rows, split.q_ids, split.g_ids,
                        split.all_vs_all)  # fmt: skip
        topk_metrics(rel[:, :depth], split.r_counts[rows], ks, names, sums.add)
