"""Multi-class N-pair loss (Sohn, NIPS 2016) with its L2 regulariser on the embedding norms.

An N-pair tuple holds one (anchor f_i, positive f_i^+) pair from each of N classes; every
other class's positive is a negative of f_i:
  L = 1/N sum_i log(1 + sum_{j != i} exp(f_i^T f_j^+ - f_i^T f_i^+))        (N-pair-mc loss)
i.e. softmax cross-entropy over the logits f_i^T f_j^+ with target j = i. The embeddings are
not L2-normalised (a plain fc layer); their squared norms are penalised instead, in the form of
TensorFlow's npairs_loss (the implementation behind the N-pairs numbers that later papers
quote): lambda/4 * (mean_i ||f_i||^2 + mean_i ||f_i^+||^2), lambda = 0.002.

Where we differ: Sohn samples N classes x 2 images; the protocol gives P classes x K images.
The miner cuts each class's K images into K/2 consecutive (anchor, positive) pairs; pair r of
every class forms N-pair tuple r (N = P, K/2 tuples per batch, each image used once; an odd
K leaves one image out). pytorch-metric-learning's NPairsLoss keeps only the first positive
pair of each label, so with K = 4 half of the batch would not train; it is written out here
(the tests check that it equals NPairsLoss on a K = 2 batch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from harness import (
    Batch,
    Embedded,
    EmbeddingHead,
    Float,
    Method,
    MethodContext,
    Pairs,
    register_method,
)


def npair_tuples(out: Embedded, batch: Batch) -> Pairs:
    """(anchor, positive) = images (2r, 2r + 1) of each class in batch order, listed tuple by
    tuple; `evaluated` counts the anchor-positive inner products of the tuples (N^2 each)."""
    labels = batch.labels
    order = torch.sort(labels, stable=True).indices
    _, counts = torch.unique_consecutive(labels[order], return_counts=True)
    starts = (counts.cumsum(0) - counts).repeat_interleave(counts)
    rank = torch.arange(len(labels), device=labels.device) - starts  # position within its class
    is_anchor = (rank % 2 == 0) & (rank + 1 < counts.repeat_interleave(counts))
    slots = torch.nonzero(is_anchor).flatten()
    by_tuple = torch.sort(rank[slots] // 2, stable=True).indices  # tuple r = the r-th pairs
    slots = slots[by_tuple]
    evaluated = int(torch.bincount(rank[slots] // 2).pow(2).sum()) if len(slots) else 0
    positive = torch.ones(len(slots), dtype=torch.bool, device=labels.device)
    return Pairs(evaluated, order[slots], order[slots + 1], positive)


def tuple_index(anchor_labels: torch.Tensor) -> torch.Tensor:
    """Which N-pair tuple each pair belongs to: its rank among the pairs of its class, so a
    tuple never holds two pairs of one class, whatever order the pairs come in."""
    same = anchor_labels[:, None] == anchor_labels[None]
    return same.tril(diagonal=-1).sum(dim=1)


def npairs_loss(
    anchor: torch.Tensor, positive: torch.Tensor, anchor_labels: torch.Tensor, reg_lambda: float
) -> torch.Tensor:
    """The N-pair-mc loss averaged over the anchors of all tuples, plus the L2 regulariser."""
    if len(anchor) == 0:
        return anchor.sum() * 0.0
    logits = anchor @ positive.T  # f_i^T f_j^+
    group = tuple_index(anchor_labels)
    logits = logits.masked_fill(group[:, None] != group[None], float("-inf"))  # other tuples
    target = torch.arange(len(anchor), device=anchor.device)
    n_pair = F.cross_entropy(logits, target)  # log(1 + sum_{j!=i} exp(f_i^T f_j^+ - f_i^T f_i^+))
    norms = anchor.pow(2).sum(1).mean() + positive.pow(2).sum(1).mean()
    return n_pair + 0.25 * reg_lambda * norms  # + lambda/4 (mean ||f||^2 + mean ||f^+||^2)


class NPairsLoss(nn.Module):
    def __init__(self, reg_lambda: float) -> None:
        super().__init__()
        self.reg_lambda = reg_lambda

    def forward(self, out: Embedded, batch: Batch, pairs: Pairs) -> torch.Tensor:
        emb = out.embedding
        anchor_labels = batch.labels[pairs.first]
        return npairs_loss(emb[pairs.first], emb[pairs.second], anchor_labels, self.reg_lambda)


@register_method(
    "npairs",
    family="pairs",
    version=1,
    paper="npairs_nips2016",
    search={"reg_lambda": Float(0.0002, 0.02, log=True)},
)
def build(ctx: MethodContext, *, reg_lambda: float = 0.002) -> Method:
    """Multi-class N-pair loss (Sohn 2016): one pair per class, other classes' positives as
    negatives, L2 penalty on the unnormalised embeddings."""
    return Method(
        head=EmbeddingHead(ctx.feature_dim, ctx.embedding_dim, normalize=False),
        loss=NPairsLoss(reg_lambda),
        miner=npair_tuples,
    )
