"""Embed a split with the trained model and score it with the harness's metric definitions."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from harness.backbones import Backbone
from harness.core import Method, PhaseTimer, Protocol, RunContext
from harness.data import for_test
from harness.evaluate.embedding import embed, embed_parts
from harness.evaluate.metrics.report import (
    MetricOptions,
    MetricReport,
    compute_metrics,
    compute_report,
)
from harness.evaluate.neighbours import AVERAGE_PRECISION, per_query_values, top_neighbours
from harness.evaluate.reranking import Reranked, protocol_rerank, reranked_report
from harness.evaluate.scoring import CountedScorer, ranking_scorer
from harness.stats import BOOTSTRAP_RESAMPLES, CONFIDENCE, bootstrap_intervals


def evaluate(
    ctx: RunContext,
    backbone: Backbone,
    method: Method,
    images: torch.Tensor,
    labels: np.ndarray,
    gallery: tuple[torch.Tensor, np.ndarray] | None = None,
    *,
    neighbours: int = 0,
) -> Evaluation:
    """Score the model on one split: all-vs-all over (images, labels), or, with ``gallery``
    (images, labels), each query ranking the whole gallery (In-shop's protocol).

    Returns the metrics and timings; all-vs-all also gives the metrics of each sub-embedding
    (e.g. HDC's single heads, ranked by Euclidean distance under the same definitions; the
    method's scorer, if any, applies to the full embedding only) and the histogram of the pair
    distances. Clustering metrics cluster queries and gallery together, with the protocol's
    k-means convention (`evaluation.clustering`; see harness.evaluate.metrics). Images go
    through the protocol's test augmentation (resize, center crop) when it has one.

    `neighbours` > 0 (`run --save-embeddings`) also keeps what each query retrieves: its top
    `neighbours` gallery rows as the run ranked them and its MAP@R (harness.evaluate.neighbours),
    after the timings, so they time and score what a run without them does."""
    clock = PhaseTimer(ctx.device)  # its now() waits for the device's queued work
    start = clock.now()
    embedded = _embed_split(ctx, backbone, method, images, gallery)
    embed_seconds = clock.now() - start
    labels_t = torch.as_tensor(labels)
    ks, names, options = (
        tuple(ctx.protocol.evaluation.recall_ks),
        metric_names(ctx.protocol),
        _options(ctx),
    )
    report, reranked, counted = _ranked(ctx, method, embedded, labels_t, ks, names, options)
    by_part: dict[str, dict[str, float]] = {}
    distances: dict[str, list[float]] = {}
    if gallery is None:
        by_part = {
            name: compute_metrics(part, labels_t, recall_ks=ks, metrics=names, options=options)
            for name, part in embedded.parts.items()
        }
        distances = distance_histogram(embedded.embeddings, labels_t)
    timings = {
        "embed_seconds": round(embed_seconds, 3),
        "eval_seconds": round(clock.now() - start, 3),
        **({"rerank_seconds": round(reranked.seconds, 3)} if reranked is not None else {}),
    }
    bootstrap = {
        "unit": "test queries", "resamples": BOOTSTRAP_RESAMPLES, "seed": ctx.seed,
        "confidence": CONFIDENCE,
        "intervals": bootstrap_intervals(report.per_query, seed=ctx.seed),
    }  # fmt: skip
    result = Evaluation(report.metrics, timings, by_part, distances, bootstrap,
                        report.kmeans_convention, embedded.embeddings,
                        None if counted is None else counted.pairs,
                        embedded.gallery[0] if embedded.gallery else None)  # fmt: skip
    if neighbours > 0:
        _retrieved(ctx, method, embedded, labels, report.per_query, neighbours, result, reranked)
    return result


def _ranked(
    ctx: RunContext, method: Method, embedded: _Embedded, labels: torch.Tensor,
    ks: tuple[int, ...], names: list[str], options: MetricOptions,
) -> tuple[MetricReport, Reranked | None, CountedScorer | None]:  # fmt: skip
    """The test metrics as the run ranks: by the method's scorer (counted) or Euclidean
    distance, or by the protocol's re-ranking of the Euclidean distances (evaluation.rerank;
    a learned scorer with a re-ranking is refused by ranking_scorer)."""
    scorer, counted = ranking_scorer(method, ctx.protocol, all_vs_all=not embedded.gallery)
    reranking = protocol_rerank(ctx.protocol)  # evaluation.rerank; None: no re-ranking
    if reranking is None:
        return compute_report(embedded.embeddings, labels, *embedded.gallery, recall_ks=ks,
                              metrics=names, scorer=scorer, options=options), None, counted  # fmt: skip
    reranked = reranked_report(embedded.embeddings, labels, *embedded.gallery, rerank=reranking,
                               recall_ks=ks, metrics=names, options=options)  # fmt: skip
    return reranked.report, reranked, counted


def _retrieved(
    ctx: RunContext, method: Method, embedded: _Embedded, labels: np.ndarray,
    per_query: dict[str, np.ndarray], k: int, result: Evaluation, reranked: Reranked | None,
) -> None:  # fmt: skip
    """Each query's top-k gallery rows, ranked by the run's own scorer (a fresh, uncounted
    one: the result's pair_scores stays the metrics' cost) or by its re-ranked distances,
    and its MAP@R: the metrics' own per-query values when the protocol reports map@r, else
    one more pass for them alone."""
    all_vs_all = not embedded.gallery
    scorer, _ = ranking_scorer(method, ctx.protocol, all_vs_all=all_vs_all)
    queries, gallery = embedded.embeddings, None if all_vs_all else embedded.gallery[0]
    if reranked is not None:  # row indices, and a scorer reading the re-ranked distances
        queries, gallery, scorer = reranked.ranking()
    gallery_labels = None if all_vs_all else embedded.gallery[1].cpu().numpy()
    size = len(labels) - 1 if all_vs_all else len(gallery_labels)
    result.neighbours = top_neighbours(queries, gallery, min(k, size), scorer)
    values = per_query.get(AVERAGE_PRECISION)
    if values is None:
        given = () if all_vs_all else (gallery, embedded.gallery[1])
        report = compute_report(queries, torch.as_tensor(labels), *given, recall_ks=(),
                                metrics=(AVERAGE_PRECISION,), scorer=scorer,
                                options=_options(ctx))  # fmt: skip
        values = report.per_query[AVERAGE_PRECISION]
    result.average_precision = per_query_values(values, labels, gallery_labels)


@dataclass
class _Embedded:
    """A split's embeddings: the queries' (or all), their sub-embeddings (all-vs-all only),
    and the gallery's (embeddings, labels), empty when all-vs-all."""

    embeddings: torch.Tensor
    parts: dict[str, torch.Tensor]
    gallery: tuple[torch.Tensor, torch.Tensor] | tuple[()]


def _embed_split(
    ctx: RunContext,
    backbone: Backbone,
    method: Method,
    images: torch.Tensor,
    gallery: tuple[torch.Tensor, np.ndarray] | None,
) -> _Embedded:
    """Embed the queries (with their sub-embeddings when all-vs-all), then the gallery,
    after the protocol's test augmentation."""
    protocol, device = ctx.protocol, ctx.device
    batch, precision = protocol.evaluation.batch_size, ctx.precision
    images = for_test(images, protocol.augmentation, protocol.backbone.input_size)
    if gallery is None:  # the parts are scored all-vs-all only
        embeddings, parts = embed_parts(backbone, method, images, device, batch, precision)
        return _Embedded(embeddings, parts, ())
    gallery_images = for_test(gallery[0], protocol.augmentation, protocol.backbone.input_size)
    embeddings = embed(backbone, method, images, device, batch, precision)
    gallery_embeddings = embed(backbone, method, gallery_images, device, batch, precision)
    return _Embedded(embeddings, {}, (gallery_embeddings, torch.as_tensor(gallery[1])))


def _options(ctx: RunContext) -> MetricOptions:
    """How a run's metrics are computed: k-means seeded by the run's seed, with the
    protocol's convention, on the run's device."""
    return MetricOptions(seed=ctx.seed, kmeans_convention=ctx.protocol.evaluation.clustering,
                         device=ctx.device)  # fmt: skip


@dataclass
class Evaluation:
    """What one evaluation gives: by_part and distances are empty in query/gallery mode."""

    metrics: dict[str, float]
    timings: dict[str, float]
    by_part: dict[str, dict[str, float]] = field(default_factory=dict)
    distances: dict[str, list[float]] = field(default_factory=dict)
    # percentile intervals of each retrieval metric over resampled test queries (harness.stats.frequentist)
    bootstrap: dict[str, object] = field(default_factory=dict)
    clustering: str | None = None  # the k-means convention of nmi and f1; None without them
    embeddings: torch.Tensor | None = field(default=None, repr=False)  # the queries' (or all)
    pair_scores: int | None = None  # the learned scorer's pair evaluations; None: no scorer
    gallery_embeddings: torch.Tensor | None = field(default=None, repr=False)  # None: all-vs-all
    # with evaluate(neighbours=k) only: each query's top-k gallery rows, ranked as the run
    # ranked, int64 [Q, k], and its MAP@R (NaN: alone in its class), float64 [Q]
    neighbours: np.ndarray | None = field(default=None, repr=False)
    average_precision: np.ndarray | None = field(default=None, repr=False)


HISTOGRAM_BINS = 50


@torch.no_grad()
def distance_histogram(
    embeddings: torch.Tensor, labels: torch.Tensor, bins: int = HISTOGRAM_BINS, chunk: int = 1024
) -> dict[str, list[float]]:
    """Counts of the Euclidean distances of every positive and every negative pair (i < j),
    on `bins` equal bins from 0 to the largest distance: HDC's figure of how far the two
    distributions overlap, kept in the result so the figure is drawn from results. Exact,
    row block by row block (O(n^2) distances, O(chunk * n) memory)."""
    emb, lab = embeddings.float(), labels.to(embeddings.device)
    n = len(emb)
    top = 0.0
    for s in range(0, n, chunk):
        top = max(top, float(torch.cdist(emb[s : s + chunk], emb).max()) if n > 1 else 0.0)
    edges = torch.linspace(0.0, max(top, 1e-12) * (1 + 1e-6), bins + 1)
    positive = torch.zeros(bins, dtype=torch.float64)
    negative = torch.zeros(bins, dtype=torch.float64)
    columns = torch.arange(n, device=emb.device)[None]
    for s in range(0, n, chunk):  # on the embeddings' device (SOP: 60k x 60k on a GPU)
        d = torch.cdist(emb[s : s + chunk], emb)
        upper = columns[:, s : s + chunk].T < columns  # each unordered pair once
        same = lab[s : s + chunk, None] == lab[None]
        for mask, out in ((upper & same, positive), (upper & ~same, negative)):
            out += torch.histc(d[mask].double(), bins=bins, min=0.0, max=float(edges[-1])).cpu()
    return {"edges": [round(float(e), 6) for e in edges], "positive": positive.tolist(),
            "negative": negative.tolist()}  # fmt: skip


def selection_score(
    ctx: RunContext, backbone: Backbone, method: Method, images: torch.Tensor, labels: np.ndarray
) -> float:
    """The protocol's selection metric (`evaluation.select_by`) all-vs-all on the validation
    split, ranked as the test will be (the method's scorer, if any). Leaves the modules in
    eval mode; the training loop switches them back."""
    protocol = ctx.protocol
    images = for_test(images, protocol.augmentation, protocol.backbone.input_size)
    embeddings = embed(backbone, method, images, ctx.device, protocol.evaluation.batch_size,
                       ctx.precision)  # fmt: skip
    scorer, _ = ranking_scorer(method, protocol, all_vs_all=True)
    name, reranking = protocol.evaluation.select_by, protocol_rerank(protocol)
    if reranking is not None:  # ranked as the test will be: re-ranked
        return reranked_report(embeddings, torch.as_tensor(labels), rerank=reranking,
                               recall_ks=(1,), metrics=(name,),
                               options=_options(ctx)).report.metrics[name]  # fmt: skip
    metrics = compute_metrics(embeddings, torch.as_tensor(labels), recall_ks=(1,),
                              metrics=(name,), scorer=scorer, options=_options(ctx))  # fmt: skip
    return metrics[name]


def metric_names(protocol: Protocol) -> list[str]:
    """The metrics a run of `protocol` reports, recall@K expanded to one name per K."""
    names = []
    for name in protocol.evaluation.metrics:
        if name == "recall@K":
            names += [f"recall@{k}" for k in protocol.evaluation.recall_ks]
        else:
            names.append(name)
    return names
