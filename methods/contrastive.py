"""Contrastive loss (Hadsell et al. 2006) over all pairs of the batch, as Eq. 1 of Song et al.

J = 1/(2|pairs|) * sum_pairs  y_ij D_ij^2 + (1 - y_ij) [alpha - D_ij]_+^2, on L2-normalised
embeddings (HDC's form, margin M = 1), D read from the batch's m x m distance matrix.
pytorch-metric-learning's ContrastiveLoss does not square the hinge and averages over non-zero
pairs only, so this is written out.
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

from ._pair_losses import contrastive_pair_loss, distance_matrix


class ContrastiveLoss(nn.Module):
    def __init__(self, margin: float) -> None:
        super().__init__()
        self.margin = margin

    def forward(self, out: Embedded, batch: Batch, pairs: Pairs) -> torch.Tensor:
        dist = distance_matrix(out.embedding, exact_zero=True)  # D, once per step
        per_pair = contrastive_pair_loss(  # Eq. 1
            dist, pairs.first, pairs.second, pairs.positive, margin=self.margin
        )
        return per_pair.sum() / (2 * len(per_pair))


def mine_all_pairs(out: Embedded, batch: Batch) -> Pairs:
    return all_pairs(batch.labels)


@register_method(
    "contrastive",
    family="pairs",
    version=2,
    paper="lifted_structure_cvpr2016",
    search={"margin": Float(0.25, 2.0, log=True)},
)
def build(ctx: MethodContext, *, margin: float = 1.0) -> Method:
    return Method(
        head=EmbeddingHead(ctx.feature_dim, ctx.embedding_dim),
        loss=ContrastiveLoss(margin),
        miner=mine_all_pairs,
    )
