"""The metric names the harness knows, and the backends and k-means conventions behind them:
shared by the protocol's checks, the metrics, the leaderboard and `compare`.
"""

from __future__ import annotations

import re

#: Every metric name ``compute_metrics`` knows. ``"recall@K"`` is parametrised: ask for
#: ``"recall@4"`` (any K >= 1), or for the literal ``"recall@K"`` meaning every K in ``recall_ks``.
#: Returned keys, in this order: ``recall@K`` for each K ascending, ``precision@1``,
#: ``r_precision``, ``map@r``, ``map``, ``nmi``, ``f1``, ``lda``.
METRIC_NAMES: tuple[str, ...] = (
    "recall@K",
    "precision@1",
    "r_precision",
    "map@r",
    "map",
    "nmi",
    "f1",
    "lda",
)
RETRIEVAL_METRICS: tuple[str, ...] = METRIC_NAMES[:5]
CLUSTERING_METRICS: tuple[str, ...] = ("nmi", "f1")
#: Metrics that are not fractions in [0, 1] (not clamped, not shown in percent).
UNBOUNDED_METRICS: tuple[str, ...] = ("lda",)

#: With ``knn_backend="auto"`` on CUDA with faiss-gpu, faiss serves the top-K when the gallery
#: has more items than this (see harness.evaluate.metrics.report._top_k_backend).
FAISS_AUTO_MIN_GALLERY = 20_000

KNN_BACKENDS: tuple[str, ...] = ("auto", "faiss", "torch")
KMEANS_BACKENDS: tuple[str, ...] = ("auto", "faiss", "torch")
#: How k-means runs for nmi and f1 (see harness.evaluate.metrics.clustering.kmeans): "harness" (greedy
#: k-means++ start, up to 100 Lloyd iterations) or "faiss" (pytorch-metric-learning's and the
#: published tables' faiss k-means: random start, 20 iterations).
KMEANS_CONVENTIONS: tuple[str, ...] = ("harness", "faiss")

RECALL_PATTERN = re.compile(r"recall@(-?\d+)")
#: The metrics that are one number each (what a protocol selects by or compare reads): recall@<k>
#: for one k, and every other name.
SINGLE_METRICS: tuple[str, ...] = METRIC_NAMES[1:]


def is_single_metric(name: str) -> bool:
    """Whether `name` is one number: recall@<k> (k >= 1) or a non-parametrised metric."""
    return name in SINGLE_METRICS or bool(re.fullmatch(r"recall@[1-9][0-9]*", name))
