"""Triplet loss with semi-hard negative mining (Schroff et al., FaceNet, CVPR 2015).

Every anchor-positive pair of the batch with every semi-hard negative:
D_ap^2 < D_an^2 <= D_ap^2 + alpha; loss = mean over those triplets of
[D_ap^2 - D_an^2 + alpha]_+ (Eq. 2 of Song et al. up to its constant), squared Euclidean
distances on L2-normalised embeddings, alpha = 0.2. Wraps pytorch-metric-learning.
"""

from __future__ import annotations

import torch
from pytorch_metric_learning import distances, losses, miners, reducers
from torch import nn

from harness import (
    Batch,
    Embedded,
    EmbeddingHead,
    Float,
    Method,
    MethodContext,
    Triplets,
    register_method,
)


class SemiHardMiner:
    def __init__(self, margin: float) -> None:
        self.miner = miners.TripletMarginMiner(
            margin=margin, type_of_triplets="semihard", distance=distances.LpDistance(power=2)
        )

    def __call__(self, out: Embedded, batch: Batch) -> Triplets:
        anchor, positive, negative = self.miner(out.embedding, batch.labels)
        m = len(batch.labels)
        return Triplets(m * m, anchor, positive, negative)


class TripletLoss(nn.Module):
    def __init__(self, margin: float) -> None:
        super().__init__()
        self.loss = losses.TripletMarginLoss(
            margin=margin, distance=distances.LpDistance(power=2), reducer=reducers.MeanReducer()
        )

    def forward(self, out: Embedded, batch: Batch, mined: Triplets) -> torch.Tensor:
        return self.loss(out.embedding, batch.labels, mined.indices())


@register_method(
    "triplet",
    family="triplets",
    version=1,
    paper="facenet_cvpr2015",
    search={"margin": Float(0.05, 1.0, log=True)},
)
def build(ctx: MethodContext, *, margin: float = 0.2) -> Method:
    return Method(
        head=EmbeddingHead(ctx.feature_dim, ctx.embedding_dim),
        loss=TripletLoss(margin),
        miner=SemiHardMiner(margin),
    )
