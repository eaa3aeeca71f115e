"""Re-ranking as an evaluation option: two published re-rankings of the Euclidean ranking,
computed on the test embeddings alone (no training, no labels), and the harness's retrieval
metrics of the re-ranked order.

k_reciprocal: Zhong, Zheng, Cao, Li, "Re-ranking Person Re-identification with k-reciprocal
Encoding", CVPR 2017, as the authors' code computes it (zhunzhong07/person-re-ranking,
python-version/re_ranking_ranklist.py). With d(p, g) the squared Euclidean distance divided
by the largest one in p's row:

    N(p, k)   the k + 1 nearest items of p (p itself first)
    R(p, k)   = {g in N(p, k) : p in N(g, k)}, the k-reciprocal set (Eq. 4)
    R*(p, k1) = R(p, k1) plus R(c, round(k1/2)) of every c in R(p, k1) whose half set shares
                more than 2/3 of its items with R(p, k1) (Eq. 6)
    V_p,g     = exp(-d(p, g)) over g in R*(p, k1), normalised to sum 1 (Eq. 7, normalised as
                the code does)
    V_p      <- mean of V_g over the k2 nearest g of p (local query expansion, Eq. 11)
    d_J(p, g) = 1 - sum_j min(V_p,j, V_g,j) / sum_j max(V_p,j, V_g,j) (Eq. 10; with rows
                summing to 1, the max sum is 2 - the min sum, as the code computes it)
    d*(p, g)  = (1 - lambda) d_J(p, g) + lambda d(p, g) (Eq. 12)

The sets are taken over the whole test set: all-vs-all, the N items; query/gallery, the
queries and the gallery together (the code's probe + gallery). Departures from the code, none
of which changes a value beyond float rounding: float64 throughout (the code: float32, or
float16 in its feature version); neighbours sorted stably (ties to the lower index; the code's
np.argsort is unstable, so its tie order is unspecified); k1 + 1 or k2 larger than the test
set means all of it, as the code's slicing does; distances all zero (one point repeated) are
left unscaled instead of divided by zero; the sparse sums are vectorised.

aqe_dba: alpha-weighted query expansion with database-side augmentation (Radenovic, Tolias,
Chum, "Fine-tuning CNN Image Retrieval with No Human Annotation", TPAMI 2018). Every vector is
L2-normalised first; with s(x, y) = x.y (cosine similarity):

    DBA   each database vector d <- normalise(d + sum_{j in top n(d)} s(d, d_j)^alpha d_j),
          top n(d) its n nearest other database vectors
    aQE   each query q <- normalise(q + sum_{j in top n(q)} s(q, d'_j)^alpha d'_j), over the
          augmented database vectors d'
    rank  by ||q' - d'||, the Euclidean distance of the unit vectors

alpha = 3 and n = 2 by default, for both steps: the paper's text could not be read from here
to confirm its own values (alpha = 3 is the default of the public implementation that could
be read, a qe_dba(..., alpha=3.0)); n = 2 is a fixed choice, small because a deep metric
learning test class may have few items. Neither was tuned on test classes. Similarities
below 0 weigh 0 (s^alpha is undefined for s < 0 and a non-integer alpha); alpha = 0 gives
every neighbour weight 1 (average query expansion), n = 0 no expansion (ranking by cosine
similarity). Ties among neighbours go to the lower index.

Settings: all-vs-all (no gallery), the database is the whole test set, and an item is never
its own neighbour in a top n (DBA and aQE take n *other* items) nor in the final ranking (the
metric pass leaves each query out of its own gallery, by index). Query/gallery, the database
is the gallery (aqe_dba) or queries plus gallery (k_reciprocal, as its code).

Cost: O(N^2) memory and time for the distances (N = the test set; 6,000 items take about
0.3 GB per float64 matrix), plus, for k_reciprocal, the Jaccard sums over the pairs that
share a non-zero entry. See docs/reranking.md for measured seconds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harness.core import (
    METRIC_NAMES,
    RETRIEVAL_METRICS,
    HarnessError,
    PhaseTimer,
    Protocol,
    Scorer,
    resolve_device,
)
from harness.core.rerank_spec import NAMES, RERANKINGS, Rerank, parse_rerank
from harness.evaluate.metrics.inputs import (
    Array,
    check_counts,
    parse_metrics,
    to_embeddings,
    to_labels,
)
from harness.evaluate.metrics.report import (
    DEFAULT_OPTIONS,
    MetricOptions,
    MetricReport,
    compute_report,
)
from harness.evaluate.metrics.topk import stable_topk

__all__ = [
    "NAMES",
    "RERANKINGS",
    "Rerank",
    "Reranked",
    "aqe_dba_distances",
    "k_reciprocal_distances",
    "parse_rerank",
    "protocol_rerank",
    "reranked_distances",
    "reranked_metrics",
    "reranked_report",
]

#: (query entry, gallery entry) pairs the Jaccard sums take at once: bounds their memory
PAIR_BUDGET = 1 << 23


def protocol_rerank(protocol: Protocol) -> Rerank | None:
    """The protocol's evaluation.rerank (None: none). An evaluation section without the key
    (a stand-in namespace, as some callers build) has none."""
    return parse_rerank(getattr(protocol.evaluation, "rerank", "none"))


def reranked_distances(
    query: torch.Tensor, gallery: torch.Tensor | None, rerank: Rerank
) -> torch.Tensor:
    """float64 [Q, G] re-ranked distances (smaller is closer), on the inputs' device. Without a
    gallery (all-vs-all) the queries are the gallery: [N, N], whose diagonal (each item against
    itself) the metrics never read."""
    if rerank.name == "k_reciprocal":
        return k_reciprocal_distances(query, gallery, k1=int(rerank["k1"]),
                                      k2=int(rerank["k2"]), lambda_value=rerank["lambda"])  # fmt: skip
    if rerank.name == "aqe_dba":
        return aqe_dba_distances(query, gallery, alpha=rerank["alpha"], n=int(rerank["n"]))
    raise ValueError(f"no re-ranking named {rerank.name!r}")  # Rerank checked its name


# ---- k-reciprocal encoding (Zhong et al., CVPR 2017) ---------------------------------------


@torch.no_grad()
def k_reciprocal_distances(
    query: torch.Tensor,
    gallery: torch.Tensor | None,
    *,
    k1: int = 20,
    k2: int = 6,
    lambda_value: float = 0.3,
) -> torch.Tensor:
    """d* (Eq. 12) of each query to each gallery item, float64 [Q, G] (all-vs-all: [N, N]);
    see the module docstring for the equations and where the authors' code is followed."""
    items = query if gallery is None else torch.cat([query, gallery.to(query.device)])
    num_query, n = len(query), len(items)
    dist = _scaled_squared_distances(items.to(torch.float64))
    top = stable_topk(dist, min(max(k1 + 1, k2), n))  # the code's initial_rank, as far as read
    weights = _encoded(dist, top, k1)
    if k2 != 1:  # local query expansion (Eq. 11); k2 = 1 is the row itself
        nearest = top[:, : min(k2, n)]
        expanded = weights[nearest[:, 0]].clone()
        for column in range(1, nearest.shape[1]):
            expanded += weights[nearest[:, column]]
        weights = expanded / nearest.shape[1]
    shared = _shared_mass(weights[:num_query], weights)
    jaccard = 1.0 - shared / (2.0 - shared)  # Eq. 10
    final = (1.0 - lambda_value) * jaccard + lambda_value * dist[:num_query]
    return final if gallery is None else final[:, num_query:]


def _scaled_squared_distances(x: torch.Tensor) -> torch.Tensor:
    """The code's original_dist: squared Euclidean distances, each column divided by its
    largest, transposed (each item's row scaled to a largest value of 1)."""
    norms = (x * x).sum(1)
    squared = torch.addmm(norms[:, None] + norms[None, :], x, x.T, alpha=-2.0).clamp_min_(0)
    squared = (squared + squared.T) / 2  # the same value both ways, as the code's cdist gives
    squared.fill_diagonal_(0.0)
    largest = squared.amax(0, keepdim=True)
    largest[largest == 0] = 1.0  # every item at one point: nothing to scale
    return (squared / largest).T.contiguous()


def _reciprocal(neighbours: torch.Tensor, n: int) -> torch.Tensor:
    """bool [n, n]: g in R(p) when g is among p's neighbours and p among g's (Eq. 4)."""
    near = torch.zeros(n, n, dtype=torch.bool, device=neighbours.device)
    near.scatter_(1, neighbours, True)
    return near & near.T


def _encoded(dist: torch.Tensor, top: torch.Tensor, k1: int) -> torch.Tensor:
    """V (Eq. 7): Gaussian-kernel weights over each item's expanded k-reciprocal set R*
    (Eq. 6, the code's 1/2-k1 sets and its 2/3 overlap rule), rows summing to 1."""
    n = len(dist)
    forward = top[:, : min(k1 + 1, n)]  # N(p, k1): p and its k1 nearest
    half = top[:, : min(round(k1 / 2) + 1, n)]  # N(p, k1/2), rounded as np.around (to even)
    reciprocal, half_reciprocal = _reciprocal(forward, n), _reciprocal(half, n)
    is_candidate = reciprocal.gather(1, forward)  # [n, k1+1]: forward[p, s] is in R(p, k1)
    in_half = half_reciprocal.gather(1, half)  # [n, h]: half[c, t] is in R(c, k1/2)
    members, valid = half[forward], in_half[forward]  # [n, k1+1, h]: each candidate's half set
    rows = torch.arange(n, device=dist.device)[:, None, None]
    overlap = (reciprocal[rows, members] & valid).sum(2)
    size = valid.sum(2)
    # |R(c, k1/2) & R(p, k1)| > 2/3 |R(c, k1/2)|, in integers (the same test as the code's)
    accept = is_candidate & (3 * overlap > 2 * size)
    expanded = reciprocal.clone()
    chosen = accept[:, :, None] & valid
    expanded[rows.expand_as(members)[chosen], members[chosen]] = True
    weights = torch.where(expanded, torch.exp(-dist), torch.zeros((), dtype=dist.dtype,
                                                                  device=dist.device))  # fmt: skip
    return weights / weights.sum(1, keepdim=True)


def _shared_mass(rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[m, n]: sum_j min(rows[i, j], weights[g, j]) for each row i and item g (Eq. 10's
    numerator), over the pairs that share a non-zero j only (the code's inverted index),
    vectorised in blocks of at most PAIR_BUDGET pairs."""
    m, n = rows.shape
    device = weights.device
    column, holder = torch.nonzero(weights.T, as_tuple=True)  # item `holder` weighs `column`
    held = weights[holder, column]
    per_column = torch.bincount(column, minlength=n)
    first_in_column = per_column.cumsum(0) - per_column
    row, row_column = torch.nonzero(rows, as_tuple=True)
    row_value = rows[row, row_column]
    pairs = per_column[row_column]  # each row entry meets the items holding its column
    ends = pairs.cumsum(0)
    shared = torch.zeros(m * n, dtype=weights.dtype, device=device)
    begin, total = 0, len(row)
    while begin < total:
        base = int(ends[begin - 1]) if begin else 0
        stop = int(torch.searchsorted(ends, torch.tensor(base + PAIR_BUDGET, device=device),
                                      right=True))  # fmt: skip
        stop = max(stop, begin + 1)
        entry = torch.repeat_interleave(torch.arange(begin, stop, device=device),
                                        pairs[begin:stop])  # fmt: skip
        within = torch.arange(len(entry), device=device) + base - (ends[entry] - pairs[entry])
        other = first_in_column[row_column[entry]] + within
        least = torch.minimum(row_value[entry], held[other])
        shared.index_add_(0, row[entry] * n + holder[other], least)
        begin = stop
    return shared.view(m, n)


# ---- alpha-weighted query expansion with database-side augmentation (Radenovic et al.) ----


@torch.no_grad()
def aqe_dba_distances(
    query: torch.Tensor, gallery: torch.Tensor | None, *, alpha: float = 3.0, n: int = 2
) -> torch.Tensor:
    """||q' - d'|| of each expanded query to each augmented gallery vector, float64 [Q, G]
    (all-vs-all: [N, N]); see the module docstring."""
    queries = F.normalize(query.to(torch.float64), dim=1)
    all_vs_all = gallery is None
    database = queries if all_vs_all else F.normalize(gallery.to(queries), dim=1)
    augmented = _expanded(database, database, alpha, n, skip_own=True)  # DBA
    expanded = _expanded(queries, augmented, alpha, n, skip_own=all_vs_all)  # alpha-QE
    return (2.0 - 2.0 * expanded @ augmented.T).clamp_min_(0).sqrt_()


def _expanded(
    vectors: torch.Tensor, database: torch.Tensor, alpha: float, n: int, *, skip_own: bool
) -> torch.Tensor:
    """Each vector plus its n most similar database vectors weighted by similarity^alpha,
    L2-normalised; `skip_own`: vector i is database row i, never its own neighbour."""
    count = min(n, len(database) - int(skip_own))
    if count <= 0:
        return vectors
    similarity = vectors @ database.T
    if skip_own:
        similarity.fill_diagonal_(float("-inf"))
    nearest = stable_topk(-similarity, count)  # most similar first, ties to the lower index
    weight = similarity.gather(1, nearest).clamp_min(0).pow(alpha)  # s^alpha; 0^0 = 1
    mix = torch.zeros_like(similarity).scatter_(1, nearest, weight)
    return F.normalize(vectors + mix @ database, dim=1)


# ---- metrics of the re-ranked order ---------------------------------------------------------


@dataclass(frozen=True)
class Reranked:
    """The metrics of a re-ranked evaluation (retrieval metrics from the re-ranked
    distances, the others as without re-ranking), the re-ranking's seconds, and the distances
    themselves (float64 [Q, G]; all-vs-all [N, N], diagonal unused)."""

    report: MetricReport
    seconds: float
    distances: torch.Tensor
    rerank: Rerank
    all_vs_all: bool

    def ranking(self) -> tuple[torch.Tensor, torch.Tensor | None, Scorer]:
        """(query rows, gallery rows or None all-vs-all, scorer) that rank as the re-ranking
        did wherever the metrics take embeddings and a scorer (top_neighbours,
        compute_report): each row is its own index, and the scorer reads the distances."""
        return _index_scorer(self.distances, all_vs_all=self.all_vs_all)


def reranked_report(
    query_embeddings: Array,
    query_labels: Array,
    gallery_embeddings: Array | None = None,
    gallery_labels: Array | None = None,
    *,
    rerank: Rerank | str,
    recall_ks: Iterable[int] = (1, 2, 4, 8),
    metrics: Iterable[str] | str | None = None,
    options: MetricOptions = DEFAULT_OPTIONS,
) -> Reranked:
    """compute_report's metrics with the retrieval ones (recall@K, precision@1, r_precision,
    map@r, map) ranked by the re-ranked distances, under the same definitions (all-vs-all,
    each query left out of its own gallery by index); nmi, f1 and lda do not depend on the
    ranking and are computed as without re-ranking. The re-ranking runs on options.device
    (None: the embeddings' device)."""
    checked = parse_rerank(rerank) if isinstance(rerank, str) else rerank
    if checked is None:
        raise ValueError("reranked_report needs a re-ranking, not none; use compute_report")
    ks, names = parse_metrics(metrics, recall_ks)
    device = resolve_device(options.device, query_embeddings)
    query, gallery = _checked_inputs(query_embeddings, query_labels, gallery_embeddings,
                                     gallery_labels, device)  # fmt: skip
    ranked = [f"recall@{k}" for k in ks] + [m for m in RETRIEVAL_METRICS if m in names]
    others = [m for m in METRIC_NAMES if m in names and m not in RETRIEVAL_METRICS]
    plain = None
    if others:
        plain = compute_report(query_embeddings, query_labels, gallery_embeddings,
                               gallery_labels, recall_ks=(), metrics=others, options=options)  # fmt: skip
        if not ranked:  # nothing the ranking changes
            return Reranked(plain, 0.0, torch.empty(0, 0, dtype=torch.float64), checked,
                            gallery is None)  # fmt: skip
    clock = PhaseTimer(device)
    start = clock.now()
    distances = reranked_distances(query, gallery, checked)
    seconds = clock.now() - start
    all_vs_all = gallery is None
    rows, columns, scorer = _index_scorer(distances, all_vs_all=all_vs_all)
    report = compute_report(rows, query_labels, columns, None if all_vs_all else gallery_labels,
                            recall_ks=ks, metrics=ranked, scorer=scorer,
                            options=dataclasses.replace(options, knn_backend="torch"))  # fmt: skip
    if plain is not None:
        report = _merged(report, plain)
    return Reranked(report, seconds, distances, checked, all_vs_all)


def reranked_metrics(
    query_embeddings: Array,
    query_labels: Array,
    gallery_embeddings: Array | None = None,
    gallery_labels: Array | None = None,
    *,
    rerank: Rerank | str,
    recall_ks: Iterable[int] = (1, 2, 4, 8),
    metrics: Iterable[str] | str | None = None,
    options: MetricOptions = DEFAULT_OPTIONS,
) -> tuple[dict[str, float], float]:
    """(the metrics, the re-ranking's seconds): reranked_report's metrics as
    compute_metrics gives them, python floats in the harness's order."""
    reranked = reranked_report(query_embeddings, query_labels, gallery_embeddings,
                               gallery_labels, rerank=rerank, recall_ks=recall_ks,
                               metrics=metrics, options=options)  # fmt: skip
    return reranked.report.metrics, reranked.seconds


def _checked_inputs(
    query_embeddings: Array, query_labels: Array, gallery_embeddings: Array | None,
    gallery_labels: Array | None, device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """The embeddings as tensors on `device`, checked as compute_report checks them (before
    the re-ranking spends its seconds on them)."""
    if (gallery_embeddings is None) != (gallery_labels is None):
        given, missing = ("gallery_embeddings", "gallery_labels") if gallery_labels is None \
            else ("gallery_labels", "gallery_embeddings")  # fmt: skip
        raise HarnessError(f"{given} given without {missing}; pass both or neither")
    what = "the" if gallery_embeddings is None else "query"
    query = to_embeddings(query_embeddings, f"{what} embeddings", device)
    check_counts(query, to_labels(query_labels, f"{what} labels", device), what)
    if gallery_embeddings is None:
        return query, None
    gallery = to_embeddings(gallery_embeddings, "gallery embeddings", device)
    check_counts(gallery, to_labels(gallery_labels, "gallery labels", device), "gallery")
    if query.shape[1] != gallery.shape[1]:
        raise HarnessError(
            f"query embeddings have dimension {query.shape[1]} but gallery embeddings have"
            f" {gallery.shape[1]}; embed both with the same model"
        )
    return query, gallery


def _merged(ranked: MetricReport, plain: MetricReport) -> MetricReport:
    """The re-ranked retrieval metrics and the plain report's others, in the harness's order
    (recall@K ascending, then METRIC_NAMES), with the clustering counts of the plain one."""
    metrics = {**ranked.metrics, **plain.metrics}
    order = [k for k in ranked.metrics if k.startswith("recall@")] + list(METRIC_NAMES)
    return dataclasses.replace(
        ranked, metrics={k: metrics[k] for k in order if k in metrics},
        num_clusters=plain.num_clusters, kmeans_convention=plain.kmeans_convention,
    )  # fmt: skip


def _index_scorer(
    distances: torch.Tensor, *, all_vs_all: bool
) -> tuple[torch.Tensor, torch.Tensor | None, Scorer]:
    """Row indices as 1-d embeddings and a scorer returning -distance for them: how a
    precomputed [Q, G] matrix goes through the metric pass unchanged."""
    q, g = distances.shape
    queries = torch.arange(q, dtype=torch.float64, device=distances.device)[:, None]
    gallery = None if all_vs_all else torch.arange(g, dtype=torch.float64,
                                                   device=distances.device)[:, None]  # fmt: skip

    def scorer(rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        picked = distances[rows[:, 0].to(distances.device).long()]
        return -picked[:, columns[:, 0].to(distances.device).long()]

    return queries, gallery, scorer
