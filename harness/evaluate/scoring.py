"""How a test ranking is made when a method has a learned similarity: the scorer that ranks
(exactly, or reranking each query's Euclidean top candidates), counted as it runs, and the
record of what the ranking cost.
"""

from __future__ import annotations

import torch

from harness.core import Method, Protocol, Scorer


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
