"""Embed a split with the trained model and score it with the harness's metric definitions."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from harness.augment import for_test
from harness.backbones import Backbone
from harness.errors import HarnessError, TrainingFailed
from harness.method import Method, Scorer
from harness.metrics import compute_metrics, compute_report
from harness.precision import autocast
from harness.protocol import Protocol
from harness.stats import BOOTSTRAP_RESAMPLES, CONFIDENCE, bootstrap_intervals
from harness.timing import PhaseTimer


def embed(
    backbone: Backbone, method: Method, images: torch.Tensor, device: torch.device,
    batch_size: int, precision: str = "fp32",
) -> torch.Tensor:  # fmt: skip
    """Retrieval embeddings [N, D] (float32, on `device`) in eval mode."""
    return embed_parts(backbone, method, images, device, batch_size, precision)[0]


@torch.no_grad()
def embed_parts(
    backbone: Backbone, method: Method, images: torch.Tensor, device: torch.device,
    batch_size: int, precision: str = "fp32",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
    """The retrieval embeddings and the method's `sub_embeddings` extras (float32), in eval
    mode, the backbone and head computing in `precision` as in training."""
    backbone.eval()
    method.head.eval()
    chunks: list[torch.Tensor] = []
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in method.sub_embeddings}
    for start in range(0, len(images), batch_size):
        x = backbone.prepare(images[start : start + batch_size].to(device, non_blocking=True))
        with autocast(device, precision):
            out = method.head(backbone(x))
        chunks.append(out.embedding.float())
        for name, part in parts.items():
            if name not in out.extras:
                raise HarnessError(f"the method's head returns no extra {name!r} named in its "
                                   f"sub_embeddings; it returns {sorted(out.extras)}")  # fmt: skip
            part.append(out.extras[name].float())
    embeddings = torch.cat(chunks)
    bad = int((~torch.isfinite(embeddings)).any(dim=1).sum())
    if bad:  # the model, not the user's input: the run fails and a sweep goes on
        raise TrainingFailed(f"the model's embeddings contain NaN or inf for {bad} of "
                             f"{len(embeddings)} images (e.g. overflow in low precision)")  # fmt: skip
    return embeddings, {name: torch.cat(part) for name, part in parts.items()}


def evaluate(
    backbone: Backbone,
    method: Method,
    images: torch.Tensor,
    labels: np.ndarray,
    protocol: Protocol,
    device: torch.device,
    seed: int,
    gallery: tuple[torch.Tensor, np.ndarray] | None = None,
) -> Evaluation:
    """Score the model on one split: all-vs-all over (images, labels), or, with ``gallery``
    (images, labels), each query ranking the whole gallery (In-shop's protocol).

    Returns the metrics and timings; all-vs-all also gives the metrics of each sub-embedding
    (e.g. HDC's single heads, ranked by Euclidean distance under the same definitions; the
    method's scorer, if any, applies to the full embedding only) and the histogram of the pair
    distances. Clustering metrics cluster queries and gallery together, with the protocol's
    k-means convention (`evaluation.clustering`; see harness.metrics). Images go through
    the protocol's test augmentation (resize, center crop) when it has one."""
    clock = PhaseTimer(device)  # its now() waits for the device's queued work
    start = clock.now()
    batch, precision = protocol.evaluation.batch_size, protocol.precision
    images = for_test(images, protocol.augmentation, protocol.backbone.input_size)
    if gallery is not None:
        gallery = (for_test(gallery[0], protocol.augmentation, protocol.backbone.input_size),
                   gallery[1])  # fmt: skip
    if gallery is None:  # the parts are scored all-vs-all only
        embeddings, parts = embed_parts(backbone, method, images, device, batch, precision)
    else:
        embeddings, parts = embed(backbone, method, images, device, batch, precision), {}
    gallery_args: tuple[torch.Tensor, torch.Tensor] | tuple[()] = ()
    if gallery is not None:
        gallery_args = (embed(backbone, method, gallery[0], device, batch, precision),
                        torch.as_tensor(gallery[1]))  # fmt: skip
    embed_seconds = clock.now() - start
    ks, names = tuple(protocol.evaluation.recall_ks), _expand(protocol)
    convention = protocol.evaluation.clustering
    scorer, counted = ranking_scorer(method, protocol, all_vs_all=gallery is None)
    report = compute_report(
        embeddings, torch.as_tensor(labels), *gallery_args, recall_ks=ks, metrics=names,
        scorer=scorer, seed=seed, kmeans_convention=convention, device=device,
    )  # fmt: skip
    metrics = report.metrics
    by_part: dict[str, dict[str, float]] = {}
    distances: dict[str, list[float]] = {}
    if gallery is None:
        by_part = {
            name: compute_metrics(
                part,
                torch.as_tensor(labels),
                recall_ks=ks,
                metrics=names,
                seed=seed,
                kmeans_convention=convention,
                device=device,
            )  # fmt: skip
            for name, part in parts.items()
        }
        distances = distance_histogram(embeddings, torch.as_tensor(labels))
    timings = {
        "embed_seconds": round(embed_seconds, 3),
        "eval_seconds": round(clock.now() - start, 3),
    }
    bootstrap = {
        "unit": "test queries", "resamples": BOOTSTRAP_RESAMPLES, "seed": seed,
        "confidence": CONFIDENCE, "intervals": bootstrap_intervals(report.per_query, seed=seed),
    }  # fmt: skip
    return Evaluation(metrics, timings, by_part, distances, bootstrap, report.kmeans_convention,
                      embeddings, None if counted is None else counted.pairs)  # fmt: skip


@dataclass
class Evaluation:
    """What one evaluation gives: by_part and distances are empty in query/gallery mode."""

    metrics: dict[str, float]
    timings: dict[str, float]
    by_part: dict[str, dict[str, float]] = field(default_factory=dict)
    distances: dict[str, list[float]] = field(default_factory=dict)
    # percentile intervals of each retrieval metric over resampled test queries (harness.stats)
    bootstrap: dict[str, object] = field(default_factory=dict)
    clustering: str | None = None  # the k-means convention of nmi and f1; None without them
    embeddings: torch.Tensor | None = field(default=None, repr=False)  # the queries' (or all)
    pair_scores: int | None = None  # the learned scorer's pair evaluations; None: no scorer


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


class CountedScorer:
    """A learned scorer that counts the pairs it scores: what its ranking cost."""

    def __init__(self, scorer: Scorer) -> None:
        self.scorer, self.pairs = scorer, 0

    def __call__(self, query: torch.Tensor, gallery: torch.Tensor) -> torch.Tensor:
        self.pairs += query.shape[0] * gallery.shape[0]
        return self.scorer(query, gallery)


def ranking_scorer(
    method: Method, protocol: Protocol, all_vs_all: bool
) -> tuple[Scorer | None, CountedScorer | None]:
    """The learned similarity that ranks, if the method has one, in the protocol's mode
    (exact, or reranking the Euclidean top candidates; all-vs-all, the query itself is one
    more candidate, dropped after), and its pair counter. Its modules go to eval mode, since
    a learned scorer (e.g. a PDDM unit) must not apply dropout."""
    if method.loss is not None:
        method.loss.eval()
    if method.scorer is None:
        return None, None
    counted = CountedScorer(method.scorer)
    if protocol.evaluation.scorer_mode == "rerank":
        return rerank(counted, protocol.evaluation.rerank_top + int(all_vs_all)), counted
    return counted, counted


def selection_score(
    backbone: Backbone,
    method: Method,
    images: torch.Tensor,
    labels: np.ndarray,
    protocol: Protocol,
    device: torch.device,
    seed: int,
) -> float:
    """The protocol's selection metric (`evaluation.select_by`) all-vs-all on the validation
    split, ranked as the test will be (the method's scorer, if any). Leaves the modules in
    eval mode; the training loop switches them back."""
    images = for_test(images, protocol.augmentation, protocol.backbone.input_size)
    embeddings = embed(backbone, method, images, device, protocol.evaluation.batch_size,
                       protocol.precision)  # fmt: skip
    scorer, _ = ranking_scorer(method, protocol, all_vs_all=True)
    name = protocol.evaluation.select_by
    metrics = compute_metrics(
        embeddings, torch.as_tensor(labels), recall_ks=(1,), metrics=(name,), scorer=scorer,
        seed=seed, kmeans_convention=protocol.evaluation.clustering, device=device,
    )  # fmt: skip
    return metrics[name]


def retrieval_record(protocol: Protocol, pair_scores: int | None) -> dict[str, object]:
    """How the test ranking was made, and how many learned-score evaluations it cost
    (counted as the scorer ran; None: no learned scorer)."""
    if pair_scores is None:
        return {"ranking": "euclidean"}
    mode = protocol.evaluation.scorer_mode
    return {"ranking": "learned_scorer", "mode": mode, "rerank_top": protocol.evaluation.rerank_top
            if mode == "rerank" else None, "pair_scores": pair_scores}  # fmt: skip


def rerank(scorer: Scorer, top: int) -> Scorer:
    """Score only each query's `top` Euclidean nearest candidates with the learned scorer;
    the rest keep their Euclidean order behind them (so full-ranking metrics stay defined).
    Cost: O(n * top) learned scores instead of O(n^2)."""

    def score(query: torch.Tensor, gallery: torch.Tensor) -> torch.Tensor:
        dist = torch.cdist(
            query.double(), gallery.double()
        )  # float64: the offset below keeps order
        n = min(top, gallery.shape[0])
        cand = dist.topk(n, dim=1, largest=False).indices
        # everything behind the candidates: far below any learned score, in Euclidean order
        out = -1e6 - dist
        for row in range(query.shape[0]):
            out[row, cand[row]] = scorer(query[row : row + 1], gallery[cand[row]])[0].double()
        return out

    return score


def _expand(protocol: Protocol) -> list[str]:
    names = []
    for name in protocol.evaluation.metrics:
        if name == "recall@K":
            names += [f"recall@{k}" for k in protocol.evaluation.recall_ks]
        else:
            names.append(name)
    return names
