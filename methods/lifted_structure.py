"""Lifted structured feature embedding (Song, Xiang, Jegelka, Savarese, CVPR 2016), Eq. 4.

Every positive pair (i, j) of the batch against every negative of i and every negative of j,
through the smooth upper bound that the paper trains (Eq. 4), margin alpha = 1.0:
  J~_ij = log( sum_{(i,k) in N} exp(alpha - D_ik) + sum_{(j,l) in N} exp(alpha - D_jl) ) + D_ij
  J~    = 1/(2|P|) * sum_{(i,j) in P} [J~_ij]_+^2
D is the Euclidean (not squared) distance on the embedding, which is not L2-normalised, as in
the paper (a plain fc layer): on the unit sphere D <= 2, so every J~_ij >= log(2(m - K)/e) > 0
and the loss could never reach 0 (`normalize=True` gives that variant). The log of the sum
adds the logsumexp of row i and of row j (non-negatives masked to -inf), each taken once per
row: O(m^2) for the batch instead of 2m entries per positive pair.

P holds the unordered positive pairs {i, j}, i < j, as in the authors' Caffe layer (which
loops j > i and ends with loss / num_constraints / 2). J~_ij = J~_ji, so ordered pairs would
double both the sum and |P|: either way J~ is half the mean of [J~_ij]_+^2 over positive pairs.
pytorch-metric-learning 2.9's LiftedStructureLoss (defaults: normalised embeddings, ordered
pairs, J~_ij^2 / 2 each, plain mean) gives the same value; the tests pin this file to it and
to a hand-worked batch. It is written out here so that Eq. 4 reads in one place.

Where we differ: the paper builds its batch from random positive pairs plus their hard
negatives; here the protocol's P x K batch is used as it comes. D is the paper's
x^ 1^T + 1 x^^T - 2 X X^T, in float64 so that its cancellation near 0 stays below float32's
resolution (methods/_pair_losses.py); D < 1e-6 reads 1e-6, with no gradient.
"""

from __future__ import annotations

import torch
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

from ._pair_losses import distance_matrix, pair_values


def lifted_loss(emb: torch.Tensor, labels: torch.Tensor, margin: float) -> torch.Tensor:
    """Eq. 4 on one batch: 1/(2|P|) sum over unordered positive pairs of [J~_ij]_+^2."""
    same = labels[:, None] == labels[None]
    first, second = torch.triu_indices(len(labels), len(labels), offset=1, device=emb.device)
    positive = same[first, second]
    i, j = first[positive], second[positive]
    if len(i) == 0 or bool(same.all()):  # no positive pair, or no negative at all
        return emb.sum() * 0.0
    dist = distance_matrix(emb)  # D, m x m, once per step
    neg_terms = (margin - dist).masked_fill(same, float("-inf"))  # alpha - D_ik for (i,k) in N
    row_lse = neg_terms.logsumexp(dim=1)  # log sum_{(i,k) in N} exp(alpha - D_ik), per row
    soft_max = torch.logaddexp(row_lse[i], row_lse[j])  # the log of the sum over rows i and j
    j_ij = soft_max + pair_values(dist, i, j)  # Eq. 4, J~_ij
    return j_ij.clamp(min=0).pow(2).sum() / (2 * len(j_ij))  # Eq. 4, J~


class LiftedStructureLoss(nn.Module):
    def __init__(self, margin: float) -> None:
        super().__init__()
        self.margin = margin

    def forward(self, out: Embedded, batch: Batch, pairs: Pairs) -> torch.Tensor:
        return lifted_loss(out.embedding, batch.labels, self.margin)


def mine_dense_matrix(out: Embedded, batch: Batch) -> Pairs:
    """The "mining" is the dense distance matrix: m(m-1)/2 distinct distances."""
    return all_pairs(batch.labels)


@register_method(
    "lifted_structure",
    family="pairs",
    version=2,
    paper="lifted_structure_cvpr2016",
    search={"margin": Float(0.25, 2.0, log=True)},
)
def build(ctx: MethodContext, *, margin: float = 1.0, normalize: bool = False) -> Method:
    return Method(
        head=EmbeddingHead(ctx.feature_dim, ctx.embedding_dim, normalize=normalize),
        loss=LiftedStructureLoss(margin),
        miner=mine_dense_matrix,
    )
