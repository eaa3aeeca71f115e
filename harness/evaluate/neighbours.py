"""What each test query retrieves: its top-k gallery rows as the run ranked them (Euclidean
distance, or the method's learned scorer), and its own MAP@R, for `run --save-embeddings`
and the retrieval grid (`show`).

The keys are the metric pass's (harness.evaluate.metrics.onepass): float64 ||g||^2 - 2 q.g,
or the learned scorer's negated similarities, ascending, ties to the lower gallery index,
the query itself left out all-vs-all. The scorer given here must not be the counted one that
ranked the metrics, so the result's `pair_scores` stays what the metrics cost.
"""

from __future__ import annotations

import numpy as np
import torch

from harness.core import Scorer
from harness.evaluate.metrics.topk import check_scores, scorer_dtype

#: the neighbours saved per query: at least this many, more when the protocol's recall K is larger
MIN_NEIGHBOURS = 10
#: the per-query value saved as average_precision.npy: MAP@R (Musgrave et al.), the main metric
AVERAGE_PRECISION = "map@r"


@torch.no_grad()
def top_neighbours(
    queries: torch.Tensor,
    gallery: torch.Tensor | None,
    k: int,
    scorer: Scorer | None = None,
    chunk_size: int = 1024,
) -> np.ndarray:
    """int64 [Q, k]: each query's k nearest gallery rows, best first. Without a gallery
    (all-vs-all) the queries are the gallery and each query is left out of its own ranking
    (k <= Q - 1). `scorer(q, g)` gives [q, G] similarities, higher meaning closer."""
    all_vs_all = gallery is None
    gallery_rows = queries if gallery is None else gallery
    size = len(gallery_rows) - int(all_vs_all)
    if not 1 <= k <= size:
        raise ValueError(f"k={k} must be between 1 and the {size} gallery rows each query ranks")
    dtype = torch.float32 if queries.device.type == "mps" else torch.float64
    q, g = queries.to(dtype), gallery_rows.to(dtype)
    g_sq = (g * g).sum(1)
    out = []
    for start in range(0, len(q), chunk_size):
        rows = torch.arange(start, min(start + chunk_size, len(q)), device=q.device)
        if scorer is None:
            keys = torch.addmm(g_sq.unsqueeze(0), q[rows], g.T, beta=1.0, alpha=-2.0)
        else:
            scores = scorer(scorer_dtype(queries[rows]), scorer_dtype(gallery_rows))
            check_scores(scores, len(rows), len(gallery_rows))
            keys = -scores.detach().to(device=q.device, dtype=dtype)
        if all_vs_all:
            keys[torch.arange(len(rows), device=q.device), rows] = float("inf")
        # a stable sort of the keys: ties to the lower gallery index, as the metrics rank
        order = torch.sort(keys, dim=1, stable=True).indices[:, :k]
        out.append(order.cpu())
    return torch.cat(out).numpy().astype(np.int64)


def neighbour_count(recall_ks: list[int] | tuple[int, ...], gallery_size: int) -> int:
    """How many neighbours to keep: max(10, the largest recall K), at most the gallery."""
    return max(1, min(max(MIN_NEIGHBOURS, *recall_ks), gallery_size))


def per_query_values(values: np.ndarray, query_labels: np.ndarray,
                     gallery_labels: np.ndarray | None) -> np.ndarray:  # fmt: skip
    """float64 [Q]: a per-query metric given for the queries with a relevant gallery item
    only (the metrics' per-query order: those queries ascending), NaN for the others (a
    query alone in its class has no defined retrieval metric)."""
    query_labels = np.asarray(query_labels)
    if gallery_labels is None:
        _, inverse, counts = np.unique(query_labels, return_inverse=True, return_counts=True)
        active = counts[inverse] > 1
    else:
        active = np.isin(query_labels, np.asarray(gallery_labels))
    out = np.full(len(query_labels), np.nan)
    if int(active.sum()) != len(values):
        raise ValueError(f"{len(values)} per-query values for {int(active.sum())} queries")
    out[active] = values
    return out
