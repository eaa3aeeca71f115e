"""Clustering metrics: k-means (two conventions, see kmeans), NMI and pairwise F1."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from harness.core import KMEANS_BACKENDS, KMEANS_CONVENTIONS, HarnessError, closest, resolve_device
from harness.evaluate.metrics.inputs import Array, check_int, label_array, to_embeddings

try:  # faiss is optional: everything has a torch fallback.
    import faiss
except ImportError:  # pragma: no cover - depends on the environment
    faiss = None

#: Lloyd iterations of each k-means convention (see kmeans).
HARNESS_CONVENTION_NITER = 100
FAISS_CONVENTION_NITER = 20  # pytorch-metric-learning's AccuracyCalculator: FaissKMeans(niter=20)


def nmi(cluster_ids: Array | Sequence[int], labels: Array | Sequence[int]) -> float:
    """Normalised mutual information 2 I / (H(clusters) + H(classes)), natural logs.

    Invariant to renaming clusters or classes; 1.0 when both partitions have a single part.
    """
    cells, cluster_sizes, class_sizes, n = _contingency(cluster_ids, labels)
    h_cluster = _entropy(cluster_sizes, n)
    h_class = _entropy(class_sizes, n)
    if h_cluster + h_class <= 0.0:
        return 1.0
    n_ij, size_i, size_j = cells
    mutual = float(np.sum(n_ij / n * np.log(n * n_ij / (size_i * size_j))))
    return min(1.0, max(0.0, 2.0 * mutual / (h_cluster + h_class)))


def f1_pairwise(cluster_ids: Array | Sequence[int], labels: Array | Sequence[int]) -> float:
    """Pairwise clustering F1: precision/recall of 'same cluster' against 'same class' pairs.

    Counted from the contingency table with n-choose-2, never by enumerating pairs.
    """
    cells, cluster_sizes, class_sizes, _ = _contingency(cluster_ids, labels)
    true_pos = _pairs(cells[0])
    same_cluster = _pairs(cluster_sizes)
    same_class = _pairs(class_sizes)
    if same_cluster == 0 and same_class == 0:
        return 1.0
    if true_pos == 0:
        return 0.0
    precision = true_pos / same_cluster
    recall = true_pos / same_class
    return 2.0 * precision * recall / (precision + recall)


def kmeans(
    x: Array,
    k: int,
    seed: int = 0,
    *,
    convention: str = "harness",
    niter: int | None = None,
    backend: str = "auto",
    device: str | torch.device | None = None,
) -> np.ndarray:
    """Cluster the rows of ``x`` [N, D] into ``k`` clusters; returns int64 cluster ids [N].

    Two conventions, both deterministic for a fixed ``seed`` on CPU:

    * ``"harness"``: greedy k-means++ initialisation (a torch.Generator seeded with ``seed``;
      see ``_kmeans_pp_init``), then at most ``niter`` (default 100) Lloyd iterations in
      float32: faiss.Kmeans when faiss imports ("auto"), else a chunked torch implementation
      (empty clusters move to the points farthest from their centroid). Both backends start
      from the same centres; the k-means++ start replaces faiss's default random one, which
      often merges well-separated classes, so this convention reaches a lower inertia.
    * ``"faiss"``: the k-means behind the published NMI tables, see :func:`kmeans_faiss`
      (faiss's random start, ``niter`` default 20). Needs faiss; ``backend`` must be "auto"
      or "faiss".
    """
    if convention not in KMEANS_CONVENTIONS:
        raise HarnessError(
            f"unknown k-means convention {convention!r}"
            f"{closest(str(convention), KMEANS_CONVENTIONS, ignore_case=True)};"
            f" choose one of {', '.join(KMEANS_CONVENTIONS)}"
        )
    if backend not in KMEANS_BACKENDS:
        raise HarnessError(
            f"unknown k-means backend {backend!r}{closest(str(backend), KMEANS_BACKENDS, ignore_case=True)};"
            f" choose one of {', '.join(KMEANS_BACKENDS)}"
        )
    if convention == "faiss":
        if backend == "torch":
            raise HarnessError(
                "the 'faiss' k-means convention is faiss's own k-means; use backend 'auto' or"
                " 'faiss', or the 'harness' convention for the torch backend"
            )
        return kmeans_faiss(x, k, seed, niter=FAISS_CONVENTION_NITER if niter is None else niter)
    if backend == "faiss" and faiss is None:
        raise HarnessError("k-means backend 'faiss' needs faiss; install faiss-cpu or use 'torch'")
    niter = HARNESS_CONVENTION_NITER if niter is None else niter
    xt = _checked_input(x, k, seed, niter, device)
    init = _kmeans_pp_init(xt, k, seed)
    if backend == "faiss" or (backend == "auto" and faiss is not None):
        return _kmeans_faiss(xt, init, niter, seed)
    return _kmeans_torch(xt, init, niter).cpu().numpy()


def kmeans_faiss(x: Array, k: int, seed: int = 0, *, niter: int = 20) -> np.ndarray:
    """The "faiss" convention: pytorch-metric-learning 2.9.0's k-means, as its
    AccuracyCalculator runs it for NMI (``FaissKMeans(niter=20)`` in
    ``pytorch_metric_learning/utils/inference.py``), the one behind the published tables.

    faiss.Kmeans(d, k, niter=20) with faiss's other defaults: the start is k distinct points
    drawn at random by faiss's generator, one run (nredo 1), float32, and every point is then
    assigned to its nearest final centroid. Two departures, neither of which changes a label
    on the benchmarks:

    * seed: pytorch-metric-learning leaves faiss's default seed, 1234; we pass the run's
      ``seed`` (modulo 2**31, faiss's seed is a C int), so seeds vary the start as they vary
      the rest of the run. ``seed=1234`` reproduces pytorch-metric-learning's labels exactly.
    * max_points_per_centroid: faiss's default, 256, trains on a random subsample when there
      are more than 256 points per cluster; we never subsample (as pytorch-metric-learning's
      older ``stat_utils.run_kmeans`` and Roth et al. set it large). The CUB-200, Cars196, SOP
      and In-shop test sets have far fewer points per class, so no one subsamples there.
      min_points_per_centroid 1 only silences faiss's "provide at least ..." warning.

    Always faiss on CPU (pytorch-metric-learning uses faiss's GPU index on CUDA, whose float
    sums may differ in the last bits). Raises a one-line HarnessError when faiss is missing.
    """
    if faiss is None:
        raise HarnessError(
            "the 'faiss' k-means convention needs faiss; install faiss-cpu"
            " (pip install faiss-cpu) or use the 'harness' convention"
        )
    xt = _checked_input(x, k, seed, niter, "cpu")
    x_np = np.ascontiguousarray(xt.numpy(), dtype=np.float32)
    n, d = x_np.shape
    km = faiss.Kmeans(
        d, k, niter=niter, seed=seed % 2**31, verbose=False,
        min_points_per_centroid=1, max_points_per_centroid=max(n, 1),
    )  # fmt: skip
    km.train(x_np)
    _, assignment = km.index.search(x_np, 1)
    return assignment[:, 0].astype(np.int64)


def _checked_input(
    x: Array, k: int, seed: int, niter: int, device: str | torch.device | None
) -> torch.Tensor:
    """``x`` as float32 rows on the device, after checking seed, niter and k <= N."""
    check_int("seed", seed, minimum=0)
    check_int("niter", niter, minimum=1)
    dev = resolve_device(device, x)
    xt = to_embeddings(x, "k-means input", dev).to(torch.float32)
    n = xt.shape[0]
    check_int("k", k, minimum=1)
    if n < k:
        raise HarnessError(f"k-means needs at least k={k} points, got {n}; lower k")
    return xt


def _kmeans_pp_init(x: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """Greedy k-means++ (as scikit-learn): each new centre is the best of 2 + ln(k) candidates.

    The first centre is uniform; candidates are drawn with probability proportional to the
    squared distance to the nearest chosen centre, and the one that most lowers the total squared
    distance is kept. Plain k-means++ often puts two centres in one of many well-separated
    classes; the local trials make that rare. Distances use float32 expansion (one pass over x
    per centre), clamped at 0.
    """
    n = x.shape[0]
    trials = 2 + int(math.log(k))
    # The draws come from a CPU generator on every device (CUDA's generator gives other
    # numbers for the same seed), so a GPU picks the CPU's centres.
    gen = torch.Generator().manual_seed(seed)
    x_sq = (x * x).sum(1)
    chosen = torch.empty(k, dtype=torch.long, device=x.device)
    chosen[:1] = torch.randint(n, (1,), generator=gen).to(x.device)
    min_d2 = _sq_dist_to(x, x_sq, chosen[:1]).squeeze(1)
    ones = torch.ones_like(min_d2)
    for i in range(1, k):
        # When every point coincides with a centre (duplicates), draw uniformly.
        weights = torch.where(min_d2.sum() > 0, min_d2, ones)
        candidates = torch.multinomial(weights.cpu(), trials, replacement=True, generator=gen)
        candidates = candidates.to(x.device)
        new_min = torch.minimum(min_d2.unsqueeze(1), _sq_dist_to(x, x_sq, candidates))
        best = torch.argmin(new_min.sum(0, dtype=torch.float64))
        chosen[i] = candidates[best]
        min_d2 = new_min[:, best]
    return x[chosen].clone()


def _sq_dist_to(x: torch.Tensor, x_sq: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Squared distances [N, len(rows)] from every row of x to the rows ``rows`` of x."""
    d2 = torch.addmm(x_sq[rows].unsqueeze(0), x, x[rows].T, alpha=-2.0)
    return (d2 + x_sq.unsqueeze(1)).clamp_(min=0)


def _kmeans_faiss(x: torch.Tensor, init: torch.Tensor, niter: int, seed: int) -> np.ndarray:
    x_np = np.ascontiguousarray(x.cpu().numpy(), dtype=np.float32)
    init_np = np.ascontiguousarray(init.cpu().numpy(), dtype=np.float32)
    n, d = x_np.shape
    km = faiss.Kmeans(
        d,
        init_np.shape[0],
        niter=niter,
        seed=seed % 2**31,  # unused with init_centroids, but must fit a C int
        verbose=False,
        min_points_per_centroid=1,  # no "please provide more points" warning
        max_points_per_centroid=max(n, 1),  # never train on a subsample
    )
    km.train(x_np, init_centroids=init_np)
    _, assignment = km.index.search(x_np, 1)
    return assignment[:, 0].astype(np.int64)


def _kmeans_torch(x: torch.Tensor, centres: torch.Tensor, niter: int) -> torch.Tensor:
    """Lloyd iterations from the given centres; stops early when assignments stop changing."""
    k = centres.shape[0]
    assignment, dist = _assign(x, centres)
    for _ in range(niter):
        sums = torch.zeros_like(centres).index_add_(0, assignment, x)
        counts = torch.bincount(assignment, minlength=k)
        centres = sums / counts.clamp(min=1).unsqueeze(1).to(x.dtype)
        empty = torch.nonzero(counts == 0).squeeze(1)
        if len(empty) > 0:
            far = torch.topk(dist, len(empty)).indices
            centres[empty] = x[far]
        new_assignment, dist = _assign(x, centres)
        if torch.equal(new_assignment, assignment):
            break
        assignment = new_assignment
    return assignment


def _assign(x: torch.Tensor, centres: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest centre (lowest index on ties) and squared distance per row, in row chunks."""
    k = centres.shape[0]
    step = max(1, (1 << 22) // max(k, 1))
    c_sq = (centres * centres).sum(1)
    x_sq = (x * x).sum(1)
    ids, dists = [], []
    for start in range(0, x.shape[0], step):
        d = torch.addmm(c_sq.unsqueeze(0), x[start : start + step], centres.T, alpha=-2.0)
        best, arg = d.min(1)
        ids.append(arg)
        dists.append((best + x_sq[start : start + step]).clamp(min=0))
    return torch.cat(ids), torch.cat(dists)


def _contingency(
    cluster_ids: Array | Sequence[int], labels: Array | Sequence[int]
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray, np.ndarray, int]:
    """Sparse contingency table: (non-zero cells n_ij with their row/column sums), sizes, N."""
    a = label_array(cluster_ids, "cluster ids")
    b = label_array(labels, "labels")
    if len(a) != len(b):
        raise HarnessError(
            f"{len(a)} cluster ids but {len(b)} labels; pass one cluster id per labelled item"
        )
    if len(a) == 0:
        raise HarnessError("cannot score an empty clustering; pass at least 1 item")
    _, a_ids = np.unique(a, return_inverse=True)
    _, b_ids = np.unique(b, return_inverse=True)
    a_ids, b_ids = a_ids.reshape(-1), b_ids.reshape(-1)
    a_sizes = np.bincount(a_ids).astype(np.float64)
    b_sizes = np.bincount(b_ids).astype(np.float64)
    width = int(b_ids.max()) + 1
    cell_keys, cell_counts = np.unique(a_ids * width + b_ids, return_counts=True)
    cells = (
        cell_counts.astype(np.float64),
        a_sizes[cell_keys // width],
        b_sizes[cell_keys % width],
    )
    return cells, a_sizes, b_sizes, len(a)


def _entropy(sizes: np.ndarray, n: int) -> float:
    p = sizes[sizes > 0] / n
    return float(-np.sum(p * np.log(p)))


def _pairs(sizes: np.ndarray) -> float:
    return float(np.sum(sizes * (sizes - 1) / 2.0))
