"""How a test ranking is made when a method has a learned similarity: the scorer that ranks
(exactly, or reranking each query's Euclidean top candidates), counted as it runs, and the
record of what the ranking cost.
"""

from __future__ import annotations

import torch

from harness.core import HarnessError, Method, Protocol, Scorer
from harness.evaluate.reranking import protocol_rerank


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
    a learned scorer (e.g. a PDDM unit) must not apply dropout. A learned scorer under a
    protocol's evaluation.rerank is an error: the re-rankings start from Euclidean distances,
    and combining them with a learned similarity is not what either paper measured."""
    if method.loss is not None:
        method.loss.eval()
    if method.scorer is None:
        return None, None
    check_rerank(method, protocol)
    counted = CountedScorer(method.scorer)
    if protocol.evaluation.scorer_mode == "rerank":
        return rerank(counted, protocol.evaluation.rerank_top + int(all_vs_all)), counted
    return counted, counted


def check_rerank(method: Method, protocol: Protocol) -> None:
    """A learned scorer under a protocol's evaluation.rerank is an error (see ranking_scorer);
    `run` checks it as soon as the model is built, before a step is trained."""
    reranking = protocol_rerank(protocol)
    if method.scorer is not None and reranking is not None:
        raise HarnessError(f"{getattr(protocol, 'path', '') or protocol.name}: evaluation.rerank "
                           f"({reranking}) re-ranks Euclidean distances, but this method ranks "
                           "by its learned scorer; run it under a protocol without "
                           "evaluation.rerank")  # fmt: skip


def retrieval_record(protocol: Protocol, pair_scores: int | None) -> dict[str, object]:
    """How the test ranking was made, and how many learned-score evaluations it cost
    (counted as the scorer ran; None: no learned scorer), and the protocol's re-ranking of
    the Euclidean ranking, when it has one (its canonical text)."""
    if pair_scores is None:
        reranking = protocol_rerank(protocol)
        return {"ranking": "euclidean", **({"rerank": reranking.text} if reranking else {})}
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
