"""Evaluation: retrieval by a learned similarity (exact scoring and top-N re-ranking), the
distance histogram, and one evaluate() for all-vs-all and query/gallery."""

from types import SimpleNamespace

import numpy as np
import torch

from harness.backbones import Backbone
from harness.core import AugmentationSpec, Embedded, Method, RunContext
from harness.evaluate import (
    Evaluation,
    MetricOptions,
    compute_metrics,
    distance_histogram,
    evaluate,
    rerank,
)


def neg_sq_dist(q: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return -torch.cdist(q.double(), g.double()).pow(2)


def test_rerank_with_a_euclidean_scorer_changes_nothing():
    torch.manual_seed(0)
    emb = torch.randn(60, 4)
    labels = torch.arange(6).repeat_interleave(10)
    exact = compute_metrics(emb, labels, scorer=neg_sq_dist)
    reranked = compute_metrics(emb, labels, scorer=rerank(neg_sq_dist, top=8))
    assert exact == reranked


def test_rerank_only_reorders_the_top_candidates():
    # 1-D points; the learned scorer prefers FAR items, so exact scoring inverts the ranking,
    # while re-ranking can only reorder each query's 2 nearest candidates.
    gallery = torch.tensor([[0.0], [1.0], [2.0], [10.0]])
    far_first = lambda q, g: torch.cdist(q, g)  # noqa: E731
    scores = rerank(far_first, top=2)(gallery[:1], gallery)
    order = scores[0].argsort(descending=True).tolist()
    assert order == [1, 0, 2, 3]  # candidates {0, 1} swapped by the scorer; 2, 3 stay behind
    exact_order = far_first(gallery[:1], gallery)[0].argsort(descending=True).tolist()
    assert exact_order == [3, 2, 1, 0]


def test_distance_histogram_equals_a_direct_count():
    gen = torch.Generator().manual_seed(2)
    emb, labels = torch.randn(60, 4, generator=gen), torch.randint(0, 5, (60,), generator=gen)
    hist = distance_histogram(emb, labels, bins=10)
    d = torch.cdist(emb, emb)  # one chunk: the same float32 values the function bins
    i, j = torch.triu_indices(60, 60, offset=1)
    same = labels[i] == labels[j]
    top = float(torch.linspace(0.0, float(d.max()) * (1 + 1e-6), 11)[-1])
    for kind, mask in (("positive", same), ("negative", ~same)):
        counts, _ = np.histogram(d[i, j][mask].double().numpy(), bins=10, range=(0.0, top))
        assert hist[kind] == counts.astype(float).tolist()
    assert sum(hist["positive"]) + sum(hist["negative"]) == 60 * 59 / 2
    assert len(hist["edges"]) == 11 and hist["edges"][0] == 0.0


class _Pooled(torch.nn.Module):
    """The pooled pixels as the embedding (and half of them as a sub-embedding)."""

    def forward(self, features: list[torch.Tensor]) -> Embedded:
        return Embedded(embedding=features[-1], extras={"half": features[-1][:, :2]})


def _protocol(evaluation: SimpleNamespace) -> SimpleNamespace:
    """What evaluate reads of a protocol: its evaluation section, no augmentation, fp32."""
    return SimpleNamespace(evaluation=evaluation, augmentation=AugmentationSpec(),
                           backbone=SimpleNamespace(input_size=1), precision="fp32")  # fmt: skip


def _one_nn_protocol() -> SimpleNamespace:
    """The smallest evaluation: recall@1 of exact Euclidean ranking, batches of 8."""
    return _protocol(SimpleNamespace(batch_size=8, recall_ks=(1,), metrics=("recall@K",),
                                     scorer_mode="exact", rerank_top=5, clustering="harness"))  # fmt: skip


def test_one_evaluate_for_all_vs_all_and_query_gallery():
    channels = 4
    backbone = Backbone([torch.nn.Identity()], [channels], channels, (0.0,) * 4, (1.0,) * 4)
    method = Method(head=_Pooled(), sub_embeddings=("half",))
    protocol = _protocol(SimpleNamespace(
        batch_size=7, recall_ks=(1, 2), metrics=("recall@K", "map", "nmi"), scorer_mode="exact",
        rerank_top=5, clustering="harness"))  # fmt: skip
    gen = torch.Generator().manual_seed(3)
    images = torch.randint(0, 256, (40, channels, 1, 1), generator=gen, dtype=torch.uint8)
    labels = np.arange(40) % 5
    emb = images.float().div(255.0).flatten(1)
    names = ["recall@1", "recall@2", "map", "nmi"]
    cpu = torch.device("cpu")
    whole = evaluate(RunContext(protocol, 0, cpu), backbone, method, images, labels)
    assert isinstance(whole, Evaluation) and whole.clustering == "harness"
    assert whole.metrics == compute_metrics(emb, labels, metrics=names)
    assert whole.by_part == {"half": compute_metrics(emb[:, :2], labels, metrics=names)}
    assert set(whole.distances) == {"edges", "positive", "negative"}
    assert set(whole.timings) == {"embed_seconds", "eval_seconds"}
    split = evaluate(
        RunContext(protocol, 0, cpu),
        backbone,
        method,
        images[:15],
        labels[:15],
        (images[15:], labels[15:]),
    )
    assert isinstance(split, Evaluation)
    expected = compute_metrics(emb[:15], labels[:15], emb[15:], labels[15:], metrics=names)
    assert split.metrics == expected
    assert (split.by_part, split.distances) == ({}, {})


def test_evaluate_clusters_with_the_protocols_k_means_convention():
    channels = 4
    backbone = Backbone([torch.nn.Identity()], [channels], channels, (0.0,) * 4, (1.0,) * 4)
    method = Method(head=_Pooled(), sub_embeddings=("half",))
    evaluation = SimpleNamespace(batch_size=16, recall_ks=(1,), metrics=("recall@K", "nmi", "f1"),
                                 scorer_mode="exact", rerank_top=5, clustering="faiss")  # fmt: skip
    protocol = _protocol(evaluation)
    gen = torch.Generator().manual_seed(4)
    images = torch.randint(0, 256, (60, channels, 1, 1), generator=gen, dtype=torch.uint8)
    labels = np.arange(60) % 6
    emb = images.float().div(255.0).flatten(1)
    names = ["recall@1", "nmi", "f1"]
    got = evaluate(RunContext(protocol, 5, torch.device("cpu")), backbone, method, images, labels)
    assert got.clustering == "faiss"
    assert got.metrics == compute_metrics(
        emb, labels, metrics=names, options=MetricOptions(seed=5, kmeans_convention="faiss")
    )
    assert got.by_part["half"] == compute_metrics(
        emb[:, :2], labels, metrics=names, options=MetricOptions(seed=5, kmeans_convention="faiss")
    )
    assert got.metrics != compute_metrics(
        emb, labels, metrics=names, options=MetricOptions(seed=5)
    )  # harness differs
    evaluation.metrics = ("recall@K",)  # nothing clustered: no convention to record
    assert (
        evaluate(
            RunContext(protocol, 5, torch.device("cpu")), backbone, method, images, labels
        ).clustering
        is None
    )


def _scored(scorer_mode: str, rerank_top: int, far_first: bool = True):
    """evaluate() of 1-D points with a learned scorer that prefers FAR items."""
    backbone = Backbone([torch.nn.Identity()], [1], 1, (0.0,), (1.0,))
    scorer = (lambda q, g: torch.cdist(q, g)) if far_first else neg_sq_dist
    method = Method(head=_Pooled(), scorer=scorer)
    protocol = _protocol(SimpleNamespace(
        batch_size=8, recall_ks=(1,), metrics=("recall@K", "map"), scorer_mode=scorer_mode,
        rerank_top=rerank_top, clustering="harness"))  # fmt: skip
    images = torch.tensor([0, 250, 100, 130], dtype=torch.uint8).view(4, 1, 1, 1)
    labels = np.array([0, 0, 1, 1])  # class 0 at both ends: far-first finds it
    return evaluate(RunContext(protocol, 0, torch.device("cpu")), backbone, method, images, labels)


def test_rerank_all_vs_all_reranks_rerank_top_neighbours_besides_the_query_itself():
    """All-vs-all, the query is its own nearest candidate: reranking the top n-1 must rerank
    every other item, as exact scoring does (it once spent a slot on the query itself)."""
    exact = _scored("exact", 0)
    assert exact.metrics["recall@1"] == 0.5  # 0 and 250 find each other; 100 and 130 do not
    assert _scored("rerank", 3).metrics == exact.metrics
    assert _scored("rerank", 1).metrics == _scored("exact", 0, far_first=False).metrics
    assert exact.metrics != _scored("exact", 0, far_first=False).metrics  # the scorer matters


def test_the_learned_scorers_pair_count_is_what_it_scored():
    assert _scored("exact", 0).pair_scores == 4 * 4  # every query x every item, itself too
    assert _scored("rerank", 2).pair_scores == 4 * 3  # its 2 neighbours and itself
    plain = evaluate(
        RunContext(
            _one_nn_protocol(),
            0,
            torch.device("cpu"),
        ),
        Backbone([torch.nn.Identity()], [1], 1, (0.0,), (1.0,)),
        Method(head=_Pooled()),
        torch.zeros(4, 1, 1, 1, dtype=torch.uint8),
        np.array([0, 0, 1, 1]),
    )
    assert plain.pair_scores is None


class _Overflowing(torch.nn.Module):
    def forward(self, features: list[torch.Tensor]) -> Embedded:
        x = features[-1].clone()
        x[1] = float("inf")
        return Embedded(embedding=x)


def test_non_finite_test_embeddings_fail_the_run_not_the_sweep(tmp_path, monkeypatch):
    """NaN/inf embeddings are the model's failure (e.g. low-precision overflow), not bad
    input: evaluate raises TrainingFailed, and the runner records the run as failed and goes
    on to the next run."""
    import json

    import harness.methods  # noqa: F401
    import pytest

    import harness.sweep.runner as runner
    from harness.core import TrainingFailed

    backbone = Backbone([torch.nn.Identity()], [1], 1, (0.0,), (1.0,))
    protocol = _one_nn_protocol()
    with pytest.raises(TrainingFailed, match="NaN or inf for 1 of 4 images"):
        evaluate(
            RunContext(protocol, 0, torch.device("cpu")),
            backbone,
            Method(head=_Overflowing()),
            torch.zeros(4, 1, 1, 1, dtype=torch.uint8),
            np.array([0, 0, 1, 1]),
        )

    def overflowing(*args, **kwargs):
        raise TrainingFailed("the model's embeddings contain NaN or inf for 1 of 96 images")

    monkeypatch.setattr(runner, "evaluate", overflowing)
    specs = [runner.RunSpec("smoke", name, 0, results_dir=str(tmp_path))
             for name in ("contrastive", "triplet")]  # fmt: skip
    assert runner.sweep(specs, progress=False) == {"failed": 2}
    for name in ("contrastive", "triplet"):
        record = json.loads((tmp_path / f"runs/smoke/{name}/seed0.json").read_text())
        assert record["status"] == "failed" and "NaN or inf" in record["failure"]
