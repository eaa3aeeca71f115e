"""Retrieval by a learned similarity: exact scoring and top-N re-ranking."""

import torch

from harness.evaluate import rerank
from harness.metrics import compute_metrics


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
