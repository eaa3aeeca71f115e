"""Top-K retrieval pieces: the relevance of ranked neighbours, the per-query top-K metrics,
exact stable top-K selection, the faiss neighbours and the learned scorer's checks."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from harness.core import HarnessError

try:  # faiss is optional: everything has a torch fallback.
    import faiss
except ImportError:  # pragma: no cover - depends on the environment
    faiss = None


def topk_metrics(
    rel: torch.Tensor,
    r: torch.Tensor,
    ks: list[int],
    names: set[str],
    add: Callable[[str, torch.Tensor], None],
) -> None:
    """Per-query top-K metrics from rel [n, depth] (rank order, self removed) and R [n]."""
    for k in ks:
        add(f"recall@{k}", rel[:, :k].any(1))
    if "precision@1" in names:
        add("precision@1", rel[:, 0])
    if "r_precision" in names or "map@r" in names:
        positions = torch.arange(1, rel.shape[1] + 1, device=rel.device, dtype=torch.float64)
        within = rel & (positions.unsqueeze(0) <= r.unsqueeze(1))
        r64 = r.to(torch.float64)
        if "r_precision" in names:
            add("r_precision", within.sum(1) / r64)
        if "map@r" in names:
            precision_at = rel.cumsum(1) / positions.unsqueeze(0)
            add("map@r", (precision_at * within).sum(1) / r64)


def relevance(
    order: torch.Tensor,
    rows: torch.Tensor,
    q_ids: torch.Tensor,
    g_ids: torch.Tensor,
    all_vs_all: bool,
) -> torch.Tensor:
    """rel [n, m'] for neighbour indices order [n, m]; in all-vs-all the query is removed.

    order holds one more column than needed in all-vs-all: the query's own column is dropped,
    or the last one when the query is not among them (removal keeps everyone else's order).
    """
    rel = g_ids[order] == q_ids[rows].unsqueeze(1)
    if not all_vs_all:
        return rel
    keep = order != rows.unsqueeze(1)
    no_self = keep.all(1)
    keep[no_self, -1] = False
    return rel[keep].view(len(rows), order.shape[1] - 1)


def stable_topk(keys: torch.Tensor, m: int) -> torch.Tensor:
    """Indices of the m smallest keys per row, ordered by (key, index): exact, ties included.

    torch.topk is not stable, so rows whose m-th key is tied with an unselected item fall back
    to a full stable sort; in the other rows the selected set is unique and is re-ordered.
    """
    g = keys.shape[1]
    if m >= g:
        return torch.sort(keys, dim=1, stable=True).indices[:, :m]
    values, index = torch.topk(keys, m, dim=1, largest=False, sorted=True)
    ambiguous = (keys <= values[:, -1:]).sum(1) > m
    index, perm = torch.sort(index, dim=1)
    values = values.gather(1, perm)
    index = index.gather(1, torch.sort(values, dim=1, stable=True).indices)
    if bool(ambiguous.any()):
        rows = torch.nonzero(ambiguous).squeeze(1)
        index[rows] = torch.sort(keys[rows], dim=1, stable=True).indices[:, :m]
    return index


# faiss's GPU flat index returns at most this many neighbours per query
FAISS_GPU_MAX_K = 2048
_GPU_RESOURCES: list = []


def faiss_gpus() -> int:
    """GPUs faiss can use: 0 without faiss or with the CPU build (faiss-cpu)."""
    get = getattr(faiss, "get_num_gpus", None)
    return int(get()) if get is not None else 0


def _flat_index(dim: int, on_gpu: bool, m: int) -> object:
    """IndexFlatL2, on the GPU (faiss-gpu, from the `gpu` extra) when the embeddings are
    there and faiss can reach it, else on the CPU."""
    if on_gpu and m <= FAISS_GPU_MAX_K and faiss_gpus() > 0:
        if not _GPU_RESOURCES:  # one set of scratch buffers for the process
            _GPU_RESOURCES.append(faiss.StandardGpuResources())
        return faiss.GpuIndexFlatL2(_GPU_RESOURCES[0], dim)
    return faiss.IndexFlatL2(dim)


def faiss_topk(
    q_emb: torch.Tensor, g_emb: torch.Tensor, active: torch.Tensor, m: int
) -> torch.Tensor:
    """[len(active), m] neighbour indices from faiss IndexFlatL2 (its GPU index for CUDA
    embeddings when faiss has GPUs), re-sorted by (distance, index)."""
    g32 = np.ascontiguousarray(g_emb.detach().float().cpu().numpy())  # bf16 has no numpy
    q32 = np.ascontiguousarray(q_emb[active].detach().float().cpu().numpy())
    index = _flat_index(g32.shape[1], q_emb.device.type == "cuda", m)
    index.add(g32)
    dist, idx = index.search(q32, m)
    order = np.lexsort((idx, dist), axis=1)
    idx = np.take_along_axis(idx, order, axis=1)
    return torch.from_numpy(idx.astype(np.int64)).to(q_emb.device)


def scorer_dtype(x: torch.Tensor) -> torch.Tensor:
    """The embeddings as the scorer sees them: their floating dtype, at least float32."""
    if x.is_floating_point() and x.dtype not in (torch.float16, torch.bfloat16):
        return x
    return x.to(torch.float32)


def check_scores(scores: object, n: int, g: int) -> None:
    if not isinstance(scores, torch.Tensor):
        raise HarnessError(
            f"scorer returned {type(scores).__name__}; it must return a torch.Tensor [q, G]"
        )
    if tuple(scores.shape) != (n, g):
        raise HarnessError(
            f"scorer returned shape {tuple(scores.shape)} for {n} queries and {g} gallery items;"
            " it must return one similarity per (query, gallery item) pair"
        )
    if not (scores.is_floating_point() or scores.dtype in (torch.int32, torch.int64)):
        raise HarnessError(f"scorer returned dtype {scores.dtype}; return real similarities")
    if scores.is_floating_point() and bool(torch.isnan(scores).any()):
        raise HarnessError("scorer returned NaN similarities; fix the scorer")
