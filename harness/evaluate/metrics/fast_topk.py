"""Exact top-K neighbours at float32 speed: a float32 matrix product proposes, float64 decides.

The float32 keys of centred embeddings, k32 = ||g - mu||^2 - 2 (q - mu).(g - mu), order each
row like the float64 keys (they differ by a per-row constant in exact arithmetic), and differ
from them by at most ``err`` (a rounding bound, about 2 (D + 4) eps32 (||q - mu|| + max ||g - mu||)^2).
So with t the m-th smallest k32 of a row, the m nearest items by the float64 keys (ties to the
lower index) are all among the candidates with k32 <= t + 2 err. The candidates' float64 keys
are computed exactly as the full pass would, and sorted by (key, index). A row whose candidates
do not all fit in the float32 top-k' falls back to the float64 keys of the whole row.
"""

from __future__ import annotations

import numpy as np
import torch

from harness.evaluate.metrics.onepass import Split, Sums, retrieval_depth
from harness.evaluate.metrics.topk import faiss, relevance, stable_topk, topk_metrics

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
    offset = 2 * (q64 @ mu) - mu @ mu  # k32 - k64 in exact arithmetic, per query row
    width = min(need + SLACK, len(split.g_ids))
    proposals = _faiss_proposals(split, qc, gc, width)
    if proposals is not None:  # faiss's distances: k32 plus ||q - mu||^2
        offset = offset + ((q64 - mu) ** 2).sum(1)
    for start in range(0, len(split.active), chunk_size):
        rows = split.active[start : start + chunk_size]
        if proposals is not None:
            values, index = (torch.from_numpy(p[start : start + chunk_size]) for p in proposals)
        else:
            k32 = torch.addmm(gc_sq.unsqueeze(0), qc[rows], gc.T, beta=1.0, alpha=-2.0)
            values, index = torch.topk(k32, width, dim=1, largest=False, sorted=True)
            del k32
        margin = 2 * err[rows].unsqueeze(1)
        order = _exact_order(need, values, index, margin, offset[rows], q64[rows], g64, g_sq64)
        order = order[:, :need]
        complete = (values[:, -1:] > values[:, need - 1 : need] + margin).squeeze(1)
        if width < len(split.g_ids) and not bool(complete.all()):
            late = torch.nonzero(~complete).squeeze(1)
            keys = torch.addmm(g_sq64.unsqueeze(0), q64[rows[late]], g64.T, alpha=-2.0)
            order[late] = stable_topk(keys, need)
        rel = relevance(order, rows, split.q_ids, split.g_ids, split.all_vs_all)
        topk_metrics(rel[:, :depth], split.r_counts[rows], ks, names, sums.add)


def _exact_order(
    need: int,
    values: torch.Tensor,
    index: torch.Tensor,
    margin: torch.Tensor,
    offset: torch.Tensor,
    q64: torch.Tensor,
    g64: torch.Tensor,
    g_sq64: torch.Tensor,
) -> torch.Tensor:
    """The candidates [n, k'] (float32 keys ``values`` ascending) in exact (key, index) order
    over the first ``need`` positions.

    Consecutive float32 keys more than ``margin`` apart are in float64 order already; only items
    in a run of closer keys need their float64 key. The others keep their float32 key, moved by
    the row's centring ``offset`` onto the float64 scale (within the margin of it)."""
    close = values[:, 1:] - values[:, :-1] <= margin
    shared = torch.zeros_like(values, dtype=torch.bool)
    shared[:, 1:] |= close
    shared[:, :-1] |= close
    first = torch.zeros(values.shape[0], 1, dtype=torch.bool, device=values.device)
    group = torch.cat([first, ~close], dim=1).cumsum(1)
    shared &= group <= group[:, need - 1 : need]  # later groups cannot reach the first m
    keys = values.to(torch.float64) - offset.unsqueeze(1)
    at = torch.nonzero(shared)
    if len(at):
        cols, rows = index[at[:, 0], at[:, 1]], at[:, 0]
        dot = torch.bmm(g64[cols].unsqueeze(1), q64[rows].unsqueeze(2)).view(-1)
        keys[at[:, 0], at[:, 1]] = g_sq64[cols] - 2 * dot
    index, perm = torch.sort(index, dim=1)  # by index, then stably by key
    return index.gather(1, torch.sort(keys.gather(1, perm), dim=1, stable=True).indices)


def _faiss_proposals(
    split: Split, qc: torch.Tensor, gc: torch.Tensor, width: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """The float32 top-``width`` of every active query by faiss IndexFlatL2 on the centred
    embeddings (squared distances ascending, indices), or None without faiss or off the CPU.
    faiss's float32 distances obey the same rounding bound as the torch float32 keys."""
    if faiss is None or qc.device.type != "cpu":
        return None
    index = faiss.IndexFlatL2(gc.shape[1])
    index.add(np.ascontiguousarray(gc.numpy()))
    values, found = index.search(np.ascontiguousarray(qc[split.active].numpy()), width)
    return values, found.astype(np.int64)


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
    # The float32 error is at most (D + 3) u (||q|| + ||g||)^2 with u = eps / 2 (dot products,
    # squared norms, rounding the centred inputs, the final sum); 4x that, to be safe.
    return 2 * (dim + 4) * (u32 * (qc_norm + gc_norm) ** 2 + u64 * (q_norm + g_norm) ** 2)
