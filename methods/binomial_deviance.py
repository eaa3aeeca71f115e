"""Binomial deviance (Yi, Lei, Liao, Li, ICPR 2014), in the form Ustinova & Lempitsky compare with.

For every pair (i, j) of the batch, with cosine similarity s_ij of the embeddings:
  L = sum_ij W_ij log(1 + exp(-alpha (s_ij - beta) m_ij))
m_ij = +1 for a positive pair and -C for a negative one (C weighs the negatives' cost);
W_ij = 1/|P| on positive pairs and 1/|N| on negative pairs, so L = the mean over positive
pairs + the mean over negative pairs. alpha = 2, beta = 0.5 (Yi et al.); C = 25 (the value
the histogram-loss paper reports for its binomial deviance baseline). Each unordered pair once.
pytorch-metric-learning has no such loss; it is written out and tested by hand.
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
    all_pairs,
    register_method,
)


def binomial_deviance(
    emb: torch.Tensor, pairs: Pairs, *, alpha: float, beta: float, cost: float
) -> torch.Tensor:
    """The weighted deviance over the given pairs; an empty side (no positive or no negative
    pair in the batch) contributes 0."""
    unit = F.normalize(emb, dim=1)
    s = (unit @ unit.T)[pairs.first, pairs.second]  # cosine similarity s_ij
    m = torch.where(pairs.positive, 1.0, -cost).to(s.dtype)  # m_ij = 1 or -C
    deviance = F.softplus(-alpha * (s - beta) * m)  # log(1 + exp(-alpha (s_ij - beta) m_ij))
    pos, neg = deviance[pairs.positive], deviance[~pairs.positive]
    zero = emb.sum() * 0.0
    return (pos.mean() if len(pos) else zero) + (neg.mean() if len(neg) else zero)  # W_ij


class BinomialDevianceLoss(nn.Module):
    def __init__(self, alpha: float, beta: float, cost: float) -> None:
        super().__init__()
        self.alpha, self.beta, self.cost = alpha, beta, cost

    def forward(self, out: Embedded, batch: Batch, pairs: Pairs) -> torch.Tensor:
        return binomial_deviance(
            out.embedding, pairs, alpha=self.alpha, beta=self.beta, cost=self.cost
        )


def mine_all_pairs(out: Embedded, batch: Batch) -> Pairs:
    return all_pairs(batch.labels)


@register_method(
    "binomial_deviance",
    family="pairs",
    version=1,
    paper="binomial_deviance_icpr2014",
    search={
        "alpha": Float(0.5, 8.0, log=True),
        "beta": Float(0.0, 0.9),
        "cost": Float(1.0, 50.0, log=True),
    },
)
def build(
    ctx: MethodContext, *, alpha: float = 2.0, beta: float = 0.5, cost: float = 25.0
) -> Method:
    """Binomial deviance (Yi et al. 2014): softplus of the cosine similarity of every pair,
    negatives weighted by the cost C, positive and negative pairs averaged separately."""
    return Method(
        head=EmbeddingHead(ctx.feature_dim, ctx.embedding_dim),
        loss=BinomialDevianceLoss(alpha, beta, cost),
        miner=mine_all_pairs,
    )
