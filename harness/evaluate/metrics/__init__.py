"""Retrieval and clustering metrics for embeddings; these definitions are the harness's contract.

The package: ``report`` (the entry points), ``counted`` (the pass over Euclidean distances:
float32 products, exact ranks counted, see there), ``negatives`` (its LDA sums), ``onepass``
(the float64 pass a learned scorer ranks by, see there), ``ranks`` and ``topk`` (retrieval),
``fast_topk`` (exact top-K at float32 speed), ``distances`` (LDA moments), ``clustering``
(k-means, NMI, F1), ``inputs`` (names and checks).

The harness's own runs and ``python -m harness evaluate`` (user-provided embeddings) both report
the numbers computed here, so every choice below is deliberate and tested.

Modes
    * all-vs-all (no gallery given): every query ranks all *other* items. The query itself is
      removed from its own ranking by index, not by distance: an exact duplicate of the query at
      distance 0 is still a neighbour.
    * query/gallery: every query ranks the whole gallery; nothing is excluded (a gallery item
      identical to the query counts like any other).

Ranking
    By squared Euclidean distance ascending, or, when a ``scorer`` is given, by its similarity
    descending. Ties are broken by the lower gallery index first (a stable order), exactly, in
    the torch path. The ranking is that of the float64 keys ||g||^2 - 2 q.g (float32 on MPS),
    so integer-valued embeddings give exact ties. The Euclidean pass finds it from float32
    products and a proven rounding bound, computing float64 keys only for the items the bound
    cannot place (harness.evaluate.metrics.counted): the same ranks, so every retrieval metric
    equals the one a full float64 sort of each row gives, bit for bit.

Retrieval metrics (each a mean over the non-lone queries)
    R = number of gallery items with the query's label (the query itself excluded in all-vs-all).
    rel(i) = 1 when the i-th ranked item has the query's label; P(i) = (sum_{j<=i} rel(j)) / i.

    * ``recall@K``: 1 if any of the K nearest neighbours has the query's label (the deep metric
      learning definition, not the information-retrieval one). K larger than the number of
      ranked items means "all of them".
    * ``precision@1``: 1 if the nearest neighbour has the query's label.
    * ``r_precision``: (number of relevant items among the top R) / R.
    * ``map@r``: (1/R) * sum_{i=1..R} P(i) * rel(i) (Musgrave et al., "A Metric Learning
      Reality Check", 2020).
    * ``map``: mean average precision over the full ranking, AP = (1/R) * sum_i P(i) * rel(i)
      over all ranks i.

    Lone queries (R = 0, e.g. the only item of its class in all-vs-all mode) are excluded from all
    retrieval metrics, as pytorch-metric-learning's AccuracyCalculator does; if every query is
    lone, retrieval metrics are undefined and a HarnessError is raised.

Clustering metrics
    k-means clusters the evaluated items - the queries in all-vs-all mode, the union of queries
    and gallery in query/gallery mode - into k clusters, k = number of distinct labels among them
    unless ``num_clusters`` is given. ``kmeans_convention`` says how (see :func:`kmeans`); both
    are deterministic for a given ``seed``:

    * ``"harness"`` (the default): greedy k-means++ start seeded by ``seed``, then up to 100
      Lloyd iterations (faiss when it imports, else torch). It reaches a lower inertia, and
      usually an NMI a few hundredths (0.02-0.04) higher than "faiss" on the same embeddings.
    * ``"faiss"``: the k-means behind the published tables (pytorch-metric-learning's
      AccuracyCalculator, Roth et al.): faiss.Kmeans with 20 iterations from faiss's random
      start, with ``seed`` as faiss's seed (pytorch-metric-learning keeps faiss's default, 1234)
      and no subsampling. Needs faiss. The paper and fair protocols use it
      (``evaluation.clustering: faiss``).

    * ``nmi``: 2 I(Omega; C) / (H(Omega) + H(C)) with natural logs (the arithmetic normalisation
      of Manning et al., "Introduction to Information Retrieval"); 1.0 when both entropies are 0.
    * ``f1``: the pairwise F-measure (Manning et al.; used by the lifted structure paper). Over
      all unordered item pairs: TP = pairs in the same cluster and the same class, precision =
      TP / pairs in the same cluster, recall = TP / pairs in the same class, F1 = 2PR / (P + R),
      0 when TP = 0. When there are no same-cluster pairs and no same-class pairs (every item
      alone in its cluster and its class), the clustering matches the classes and F1 = 1.0.

Distance distributions
    * ``lda``: the LDA score of Yuan et al. (HDC, ICCV 2017), (m- - m+)^2 / (v+ + v-), with m+, v+
      (m-, v-) the mean and variance of the Euclidean distances of all positive (negative) pairs:
      the unordered pairs i < j in all-vs-all mode, every query x gallery pair otherwise.
      Variances are the population ones (divided by the count). Always on the embeddings'
      Euclidean distances, even when a ``scorer`` ranks. Computed in row chunks of the one pass
      as shifted sums (harness/evaluate/metrics/distances.py): in float64 up to 2^24 query x
      gallery pairs; above, the negative pairs' distances come from the float32 products,
      centred so that rounding neither scales nor shifts them: the score agrees with the
      float64 one to 1e-9 where the classes separate, and to about 1e-13 absolute where they
      do not and it is near 0 (harness/evaluate/metrics/negatives.py); not a fraction: >= 0 and
      unbounded (0 when every distance is equal, inf when both variances are 0 and the means
      differ). Needs at least one positive and one negative pair.

Backends for the top-K neighbours
    * ``torch`` (exact): queries in chunks of ``chunk_size`` against the whole gallery, never the
      full Q x G matrix. Peak memory is roughly 3 * 8 * chunk_size * G bytes. With only top-K
      metrics asked for (no map, no lda, no scorer), float32 keys propose candidates and
      float64 keys decide (see harness.evaluate.metrics.fast_topk): the same neighbours, faster.
    * ``faiss`` (IndexFlatL2, float32): used for the top-K metrics when ``knn_backend="faiss"``,
      or when ``"auto"``, the embeddings are on CUDA, faiss reaches the GPU (faiss-gpu), the
      gallery has more than 20,000 items, no scorer is given and neither ``map`` nor ``lda``
      is requested (they need the full torch pass, which then yields the top-K for free). On
      the CPU ``"auto"`` is the exact torch path, whose top-K pass takes faiss's float32
      candidates when faiss imports: as fast as faiss alone, and exact. Neighbours returned by faiss are re-sorted by (distance, index), but
      which of several items tied at the K-th boundary gets returned is decided by faiss.
    * ``map`` always uses the torch path over the full ranking.
"""

from harness.core import (
    CLUSTERING_METRICS,
    KMEANS_BACKENDS,
    KMEANS_CONVENTIONS,
    KNN_BACKENDS,
    METRIC_NAMES,
    RETRIEVAL_METRICS,
    UNBOUNDED_METRICS,
)
from harness.evaluate.metrics.clustering import f1_pairwise, kmeans, kmeans_faiss, nmi
from harness.evaluate.metrics.report import (
    FAISS_AUTO_MIN_GALLERY,
    MetricOptions,
    MetricReport,
    _lda,
    compute_metrics,
    compute_report,
    lda_score,
)
from harness.evaluate.metrics.topk import faiss

__all__ = [
    "CLUSTERING_METRICS",
    "FAISS_AUTO_MIN_GALLERY",
    "KMEANS_BACKENDS",
    "KMEANS_CONVENTIONS",
    "KNN_BACKENDS",
    "METRIC_NAMES",
    "RETRIEVAL_METRICS",
    "UNBOUNDED_METRICS",
    "MetricOptions",
    "MetricReport",
    "_lda",
    "compute_metrics",
    "compute_report",
    "f1_pairwise",
    "faiss",
    "kmeans",
    "kmeans_faiss",
    "lda_score",
    "nmi",
]
