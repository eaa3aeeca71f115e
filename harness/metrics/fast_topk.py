"""Exact top-K neighbours at float32 speed: a float32 matrix product proposes, float64 decides.

The float32 keys of centred embeddings, k32 = ||g - mu||^2 - 2 (q - mu).(g - mu), order each
row like the float64 keys (they differ by a per-row constant in exact arithmetic), and differ
from them by at most ``err`` (a rounding bound, about 4 (D + 4) u32 (||q - mu|| + max ||g - mu||)^2).
So with t the m-th smallest k32 of a row, the m nearest items by the float64 keys (ties to the
lower index) are all among the candidates with k32 <= t + 2 err. The candidates' float64 keys
are computed exactly as the full pass would, and sorted by (key, index). A row whose candidates
do not all fit in the float32 top-k' falls back to the float64 keys of the whole row.
"""

from __future__ import annotations

import torch

from harness.metrics.onepass import Split, Sums, retrieval_depth
from harness.metrics.topk import relevance, stable_topk, topk_metrics

#: Candidates fetched beyond the m needed, so that most rows' margin fits in one top-k.
SLACK = 16


def fast_topk_pass(
    split: Split, *, ks: list[int], names: set[str], chunk_size: int, sums: Sums
) -> None:
    """Top-K metrics over the active queries, exactly as the float64 ranking gives them."""
    depth = retrieval_depth(split, ks, names)
    need = min(depth + (1 if split.all_vs_all else 0), len(split.g_ids))
    q64, g64 = split.q_emb.to(torch.float64), split.g_emb.to(torch.float64)
    g_sq64 = (g64 * g64).sum(1)
    mu = g64.mean(0)
    qc, gc = (q64 - mu).to(torch.float32), (g64 - mu).to(torch.float32)
    gc_sq = (gc * gc).sum(1)
    err = _rounding_bound(q64, g64, qc, gc)
    width = min(need + SLACK, len(split.g_ids))
    for start in range(0, len(split.active), chunk_size):
        rows = split.active[start : start + chunk_size]
        k32 = torch.addmm(gc_sq.unsqueeze(0), qc[rows], gc.T, beta=1.0, alpha=-2.0)
        values, index = torch.topk(k32, width, dim=1, largest=False, sorted=True)
        del k32
        limit = values[:, need - 1] + 2 * err[rows]
        complete = (values[:, -1] > limit) | (width == len(split.g_ids))
        exact = g_sq64[index] - 2 * torch.bmm(g64[index], q64[rows].unsqueeze(2)).squeeze(2)
        exact.masked_fill_(values > limit.unsqueeze(1), float("inf"))
        index, perm = torch.sort(index, dim=1)  # (key, index) order: by index, then stably
        exact = exact.gather(1, perm)
        order = index.gather(1, torch.sort(exact, dim=1, stable=True).indices)[:, :need]
        if not bool(complete.all()):
            late = torch.nonzero(~complete).squeeze(1)
            keys = torch.addmm(g_sq64.unsqueeze(0), q64[rows[late]], g64.T, alpha=-2.0)
            order[late] = stable_topk(keys, need)
        rel = relevance(order, rows, split.q_ids, split.g_ids, split.all_vs_all)
        topk_metrics(rel[:, :depth], split.r_counts[rows], ks, names, sums.add)


def _rounding_bound(
    q64: torch.Tensor, g64: torch.Tensor, qc: torch.Tensor, gc: torch.Tensor
) -> torch.Tensor:
    """Per query row, a bound on |k32 - (k64 + row constant)| (float32 and float64 rounding)."""
    dim = q64.shape[1]
    u32, u64 = torch.finfo(torch.float32).eps, torch.finfo(torch.float64).eps
    qc_norm = qc.to(torch.float64).norm(dim=1)
    gc_norm = float(gc.to(torch.float64).norm(dim=1).max())
    q_norm = q64.norm(dim=1)
    g_norm = float(g64.norm(dim=1).max())
    return 4 * (dim + 4) * (u32 * (qc_norm + gc_norm) ** 2 + u64 * (q_norm + g_norm) ** 2)
