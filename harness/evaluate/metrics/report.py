"""The entry points: validate the inputs, run one pass over the distances, cluster, report."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from harness.core import (
    CLUSTERING_METRICS,
    KMEANS_CONVENTIONS,
    KNN_BACKENDS,
    METRIC_NAMES,
    RETRIEVAL_METRICS,
    UNBOUNDED_METRICS,
    HarnessError,
    Scorer,
    closest,
    resolve_device,
)
from harness.evaluate.metrics import clustering, topk
from harness.evaluate.metrics.counted import counted_pass
from harness.evaluate.metrics.distances import PairMoments
from harness.evaluate.metrics.fast_topk import fast_topk_pass
from harness.evaluate.metrics.inputs import (
    Array,
    check_counts,
    check_int,
    parse_metrics,
    to_embeddings,
    to_labels,
)
from harness.evaluate.metrics.onepass import Split, Sums, exact_pass, faiss_pass

#: With ``knn_backend="auto"``, faiss serves the top-K when the gallery has more items than this.
FAISS_AUTO_MIN_GALLERY = 20_000


@dataclass(frozen=True)
class MetricReport:
    """The metrics plus the counts behind them (for logs; ``metrics`` alone is the result)."""

    metrics: dict[str, float]
    num_queries: int  # queries given
    num_lone_queries: int  # queries with R = 0, excluded from the retrieval metrics
    num_gallery: int  # items each query ranks (the query itself excluded in all-vs-all)
    num_clusters: int | None  # k used by k-means; None when no clustering metric was requested
    knn_backend: str | None  # backend that served the top-K neighbours; None when not needed
    # each retrieval metric's value per non-lone query (one order for all): for the bootstrap
    per_query: dict[str, np.ndarray] = field(default_factory=dict)
    kmeans_convention: str | None = None  # "harness" or "faiss"; None without clustering metrics


@dataclass(frozen=True)
class MetricOptions:
    """How the metrics are computed, beyond which ones (each has a default that suits a
    user's embeddings; the harness's runs set seed and kmeans_convention from the protocol).

    knn_backend: "auto", "torch" or "faiss" (see the package docstring); num_clusters: k of
    k-means (None: the number of distinct labels); seed: k-means' seed; kmeans_convention:
    "harness" (k-means++ start, up to 100 iterations) or "faiss" (the published tables' faiss
    k-means); device: where the distances are computed (None: the embeddings' device, CUDA
    when they are there); chunk_size: queries per chunk of the one pass."""

    knn_backend: str = "auto"
    num_clusters: int | None = None
    seed: int = 0
    kmeans_convention: str = "harness"
    device: str | torch.device | None = None
    chunk_size: int = 1024


DEFAULT_OPTIONS = MetricOptions()


def compute_metrics(
    query_embeddings: Array,
    query_labels: Array,
    gallery_embeddings: Array | None = None,
    gallery_labels: Array | None = None,
    *,
    recall_ks: Iterable[int] = (1, 2, 4, 8),
    metrics: Iterable[str] | str | None = None,
    scorer: Scorer | None = None,
    options: MetricOptions = DEFAULT_OPTIONS,
) -> dict[str, float]:
    """Compute the requested metrics (all by default) as python floats in [0, 1] (``lda``: >= 0).

    Without a gallery every query ranks all other queries (all-vs-all). ``scorer(q, g)`` may
    replace Euclidean ranking: it gets a chunk of queries [q, D] and the gallery [G, D] as tensors
    on ``options.device`` (the embeddings' floating dtype, at least float32) and returns [q, G]
    similarities, higher meaning closer. ``options`` (:class:`MetricOptions`) says how: the
    top-K backend, the k-means convention behind nmi and f1 and its seed, the device, the
    chunk size. See the package docstring for every definition.
    """
    return compute_report(
        query_embeddings, query_labels, gallery_embeddings, gallery_labels,
        recall_ks=recall_ks, metrics=metrics, scorer=scorer, options=options,
    ).metrics  # fmt: skip


def compute_report(
    query_embeddings: Array,
    query_labels: Array,
    gallery_embeddings: Array | None = None,
    gallery_labels: Array | None = None,
    *,
    recall_ks: Iterable[int] = (1, 2, 4, 8),
    metrics: Iterable[str] | str | None = None,
    scorer: Scorer | None = None,
    options: MetricOptions = DEFAULT_OPTIONS,
) -> MetricReport:
    """Like :func:`compute_metrics`, but also returns the query, lone-query and cluster counts."""
    if not isinstance(options, MetricOptions):
        raise HarnessError(f"options must be a MetricOptions, got {type(options).__name__}")
    knn_backend, seed, chunk_size = options.knn_backend, options.seed, options.chunk_size
    kmeans_convention = options.kmeans_convention
    ks, names = parse_metrics(metrics, recall_ks)
    _check_options(chunk_size, seed, knn_backend, scorer)
    _check_convention(kmeans_convention, names)
    dev = resolve_device(options.device, query_embeddings)
    split = _split(query_embeddings, query_labels, gallery_embeddings, gallery_labels, dev)
    result: dict[str, float] = {}
    per_query: dict[str, np.ndarray] = {}
    backend = _distance_metrics(
        split, ks, names, scorer, knn_backend, chunk_size, result, per_query
    )
    k_used = _clustering_metrics(
        split, names, options.num_clusters, seed, kmeans_convention, result
    )
    order = [f"recall@{k}" for k in ks] + [n for n in METRIC_NAMES if n != "recall@K"]
    ordered = {
        key: float(result[key])
        if key in UNBOUNDED_METRICS
        else min(1.0, max(0.0, float(result[key])))
        for key in order
        if key in result
    }
    return MetricReport(
        metrics=ordered,
        num_queries=len(split.q_ids),
        num_lone_queries=len(split.q_ids) - len(split.active),
        num_gallery=split.num_ranked,
        num_clusters=k_used,
        knn_backend=backend,
        per_query=per_query,
        kmeans_convention=kmeans_convention if k_used is not None else None,
    )


def lda_score(
    embeddings: Array,
    labels: Array,
    gallery_embeddings: Array | None = None,
    gallery_labels: Array | None = None,
) -> float:
    """(m- - m+)^2 / (v+ + v-) of the positive and negative pair distances (HDC's LDA score);
    all-vs-all without a gallery. See the package docstring."""
    dev = resolve_device(None, embeddings)
    q_emb, q_lab = to_embeddings(embeddings, "embeddings", dev), to_labels(labels, "labels", dev)
    check_counts(q_emb, q_lab, "query")
    if gallery_embeddings is None or gallery_labels is None:
        return _lda(q_emb, q_lab, q_emb, q_lab, all_vs_all=True)
    g_emb = to_embeddings(gallery_embeddings, "gallery embeddings", dev)
    g_lab = to_labels(gallery_labels, "gallery labels", dev)
    check_counts(g_emb, g_lab, "gallery")
    return _lda(q_emb, q_lab, g_emb, g_lab, all_vs_all=False)


def _lda(
    q_emb: Array,
    q_labels: Array,
    g_emb: Array,
    g_labels: Array,
    *,
    all_vs_all: bool,
    chunk_elements: int = 1 << 22,
) -> float:
    """Exact LDA score over every positive and negative pair, in row chunks of about
    ``chunk_elements`` distances."""
    dev = resolve_device(None, q_emb)
    q_emb, g_emb = (
        to_embeddings(q_emb, "query embeddings", dev),
        to_embeddings(g_emb, "gallery embeddings", dev),
    )
    q_lab, g_lab = (
        to_labels(q_labels, "query labels", dev),
        to_labels(g_labels, "gallery labels", dev),
    )
    split = _with_ids(q_emb, q_lab, g_emb, g_lab, all_vs_all)
    moments = PairMoments()
    rows = max(1, chunk_elements // max(1, len(g_lab)))
    exact_pass(split, ks=[], names=set(), scorer=None, chunk_size=rows, retrieval=False,
               lda=moments, sums=Sums())  # fmt: skip
    return moments.lda()


def _check_options(chunk_size: object, seed: object, knn_backend: str, scorer: object) -> None:
    check_int("chunk_size", chunk_size, minimum=1)
    check_int("seed", seed, minimum=0)
    if knn_backend not in KNN_BACKENDS:
        raise HarnessError(
            f"unknown knn_backend {knn_backend!r}"
            f"{closest(str(knn_backend), KNN_BACKENDS, ignore_case=True)};"
            f" choose one of {', '.join(KNN_BACKENDS)}"
        )
    if scorer is not None and not callable(scorer):
        raise HarnessError("scorer must be a callable(queries [q, D], gallery [G, D]) -> [q, G]")
    if scorer is not None and knn_backend == "faiss":
        raise HarnessError(
            "knn_backend='faiss' ranks by Euclidean distance and cannot use a scorer;"
            " use knn_backend='torch' or 'auto'"
        )
    if knn_backend == "faiss" and topk.faiss is None:
        raise HarnessError(
            "knn_backend='faiss' needs the faiss package; install faiss-cpu or use 'torch'"
        )


def _check_convention(convention: object, names: set[str]) -> None:
    """A known k-means convention; "faiss" needs faiss when a clustering metric is asked for."""
    if convention not in KMEANS_CONVENTIONS:
        raise HarnessError(
            f"unknown kmeans_convention {convention!r}"
            f"{closest(str(convention), KMEANS_CONVENTIONS, ignore_case=True)};"
            f" choose one of {', '.join(KMEANS_CONVENTIONS)}"
        )
    if convention == "faiss" and clustering.faiss is None and names & set(CLUSTERING_METRICS):
        raise HarnessError(
            "kmeans_convention='faiss' needs the faiss package; install faiss-cpu"
            " (pip install faiss-cpu) or use 'harness'"
        )


def _split(
    query_embeddings: Array,
    query_labels: Array,
    gallery_embeddings: Array | None,
    gallery_labels: Array | None,
    dev: torch.device,
) -> Split:
    """Checked tensors on ``dev``, with labels as ids shared by queries and gallery."""
    what = "query" if gallery_embeddings is not None else "the"  # all-vs-all: no queries as such
    q_emb = to_embeddings(query_embeddings, f"{what} embeddings", dev)
    q_lab = to_labels(query_labels, f"{what} labels", dev)
    check_counts(q_emb, q_lab, what)
    if (gallery_embeddings is None) != (gallery_labels is None):
        given, missing = (
            ("gallery_embeddings", "gallery_labels")
            if gallery_labels is None
            else ("gallery_labels", "gallery_embeddings")
        )
        raise HarnessError(f"{given} given without {missing}; pass both or neither")
    if gallery_embeddings is None:
        if len(q_lab) < 2:
            raise HarnessError(f"need at least 2 items to evaluate all-vs-all, got {len(q_lab)}")
        return _with_ids(q_emb, q_lab, q_emb, q_lab, True)
    g_emb = to_embeddings(gallery_embeddings, "gallery embeddings", dev)
    g_lab = to_labels(gallery_labels, "gallery labels", dev)
    check_counts(g_emb, g_lab, "gallery")
    if q_emb.shape[1] != g_emb.shape[1]:
        raise HarnessError(
            f"query embeddings have dimension {q_emb.shape[1]} but gallery embeddings have"
            f" {g_emb.shape[1]}; embed both with the same model"
        )
    for what, n in (("query", len(q_lab)), ("gallery", len(g_lab))):
        if n < 1:
            raise HarnessError(f"the {what} set is empty; need at least 1 {what} item")
    return _with_ids(q_emb, q_lab, g_emb, g_lab, False)


def _with_ids(
    q_emb: torch.Tensor, q_lab: torch.Tensor, g_emb: torch.Tensor, g_lab: torch.Tensor,
    all_vs_all: bool,
) -> Split:  # fmt: skip
    if all_vs_all:
        _, q_ids = torch.unique(q_lab, return_inverse=True)
        g_ids = q_ids
    else:
        _, ids = torch.unique(torch.cat([q_lab, g_lab]), return_inverse=True)
        q_ids, g_ids = ids[: len(q_lab)], ids[len(q_lab) :]
    num_ids = int(torch.cat([q_ids, g_ids]).max()) + 1 if len(q_ids) + len(g_ids) else 0
    per_class = torch.bincount(g_ids, minlength=num_ids)
    r_counts = per_class[q_ids] - (1 if all_vs_all else 0)
    active = torch.nonzero(r_counts > 0).squeeze(1)
    return Split(q_emb, g_emb, q_ids, g_ids, r_counts, active, all_vs_all, num_ids)


def _distance_metrics(
    split: Split,
    ks: list[int],
    names: set[str],
    scorer: Scorer | None,
    knn_backend: str,
    chunk_size: int,
    result: dict[str, float],
    per_query: dict[str, np.ndarray],
) -> str | None:
    """Retrieval metrics and LDA in one pass where possible; returns the top-K backend."""
    wants_retrieval = bool(ks) or any(n in names for n in RETRIEVAL_METRICS)
    wants_lda = "lda" in names
    backend = None
    sums = Sums()
    moments = PairMoments() if wants_lda else None
    if wants_retrieval:
        if len(split.active) == 0:
            raise HarnessError(
                f"all {len(split.q_ids)} queries are alone in their class (no other gallery item"
                " has their label), so retrieval metrics are undefined; evaluate on classes with"
                " at least 2 items"
            )
        backend = _top_k_backend(split, ks, names, scorer, knn_backend)
    top_k_names = names - {"map", "lda"}
    if backend == "faiss":
        faiss_pass(split, ks=ks, names=top_k_names, chunk_size=chunk_size, sums=sums)
    # Top-K only: float32 candidates. With map or lda the float64 keys are computed anyway,
    # and one sort of them gives every rank.
    fast = wants_retrieval and backend == "torch" and not names & {"map", "lda"}
    fast = fast and scorer is None and split.exact_dtype == torch.float64
    if fast:
        fast_topk_pass(split, ks=ks, names=top_k_names, chunk_size=chunk_size, sums=sums)
    exact_retrieval = wants_retrieval and not fast and (backend == "torch" or "map" in names)
    if exact_retrieval or wants_lda:
        pass_ks, pass_names = (ks, names) if backend == "torch" else ([], names & {"map"})
        if scorer is None and split.exact_dtype == torch.float64:
            counted_pass(split, ks=pass_ks if exact_retrieval else [], names=pass_names,
                         chunk_size=chunk_size, retrieval=exact_retrieval, lda=moments,
                         sums=sums)  # fmt: skip
        else:
            exact_pass(split, ks=pass_ks if exact_retrieval else [], names=pass_names,
                       scorer=scorer, chunk_size=chunk_size, retrieval=exact_retrieval,
                       lda=moments, sums=sums)  # fmt: skip
    if wants_retrieval:
        result.update(sums.means(len(split.active)))
        per_query.update(sums.per_query())
    if moments is not None:
        result["lda"] = moments.lda()
    return backend


def _top_k_backend(
    split: Split, ks: list[int], names: set[str], scorer: Scorer | None, knn_backend: str
) -> str:
    """ "faiss" when asked for, or on "auto" for large galleries on CUDA where faiss reaches
    the GPU (faiss-gpu), without map, lda or a scorer (they need every float64 key anyway).
    On the CPU "auto" keeps the exact torch path: its top-K pass already takes faiss's
    float32 candidates and was measured as fast as faiss alone (20k-40k items), and exact;
    on CUDA without faiss-gpu torch ranks on the GPU, which beats a copy to faiss on the CPU."""
    depth_needed = bool(ks) or bool(names & {"precision@1", "r_precision", "map@r"})
    on_gpu = split.q_emb.device.type == "cuda"
    use_faiss = depth_needed and (
        knn_backend == "faiss"
        or (
            knn_backend == "auto"
            and topk.faiss is not None
            and on_gpu
            and topk.faiss_gpus() > 0
            and scorer is None
            and not names & {"map", "lda"}
            and len(split.g_ids) > FAISS_AUTO_MIN_GALLERY
        )
    )
    return "faiss" if use_faiss else "torch"


def _clustering_metrics(
    split: Split,
    names: set[str],
    num_clusters: int | None,
    seed: int,
    convention: str,
    result: dict[str, float],
) -> int | None:
    """k-means over the evaluated items, then NMI and F1; returns the k used (None if none)."""
    if not any(n in names for n in CLUSTERING_METRICS):
        return None
    if split.all_vs_all:
        x, y = split.q_emb, split.q_ids
    else:
        x, y = torch.cat([split.q_emb, split.g_emb]), torch.cat([split.q_ids, split.g_ids])
    k_used = int(torch.unique(y).numel()) if num_clusters is None else num_clusters
    check_int("num_clusters", k_used, minimum=1)
    if k_used > len(y):
        raise HarnessError(
            f"num_clusters={k_used} is more than the {len(y)} items to cluster; lower num_clusters"
        )
    assignment = clustering.kmeans(x, k_used, seed, convention=convention, device=x.device)
    y_np = y.cpu().numpy()
    if "nmi" in names:
        result["nmi"] = clustering.nmi(assignment, y_np)
    if "f1" in names:
        result["f1"] = clustering.f1_pairwise(assignment, y_np)
    return k_used
