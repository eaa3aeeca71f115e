"""Triplet loss plus the global loss (Kumar B G, Carneiro, Reid, CVPR 2016, "TGLoss").

Over the triplets (a, p, n) of the batch, on L2-normalised embeddings:
  L = L_t + L_g
  L_t = mean over triplets of [D_ap^2 - D_an^2 + m]_+                 (triplet term, m = 0.2)
  L_g = var(d+) + var(d-) + lambda [mean(d+) - mean(d-) + t]_+         (global term)
with d+ = D_ap^2 / 4 and d- = D_an^2 / 4 of the same triplets (in [0, 1] on the unit sphere),
t = 0.4, lambda = 1: the global term separates the means of the two distance distributions and
shrinks their variances, over the whole batch rather than triplet by triplet. The global term
is methods/_pair_losses.py's global_loss, shared with the quadruplet methods. Every distance
is read from the batch's m x m matrix of D^2.

Mining: every triplet of the batch, no selection. The paper samples its triplets at random and
the global term is about the distributions of all distances; a semi-hard selection would hand
it a biased, often empty, sample. In a P x K batch every ordered positive pair occurs in m - K
triplets and every ordered negative pair in K - 1, so the moments over the triplets are those of
all pairs of the batch.

Readings to check against the paper: the triplet term here is FaceNet's hinge on squared
distances (the same as `triplet`, so the two methods differ by the mining and the global term;
the paper's local-descriptor experiments may use another triplet form), the / 4 scaling of the
global term's distances, t = 0.4, lambda = 1 and the unit weight between the two terms.
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
    Triplets,
    register_method,
)

from ._pair_losses import (
    counted_moments,
    flat_index,
    global_loss,
    pair_counts,
    squared_distance_matrix,
)


def all_triplets(out: Embedded, batch: Batch) -> Triplets:
    """Every (anchor, positive, negative) of the batch, grouped by anchor-positive pair;
    `evaluated` = the m(m-1)/2 distinct distances they use. Built from the m(K-1) positive
    pairs, not from an m x m x m mask (pytorch-metric-learning's way, 17 s at m = 1024)."""
    labels = batch.labels
    m = len(labels)
    same = labels[:, None] == labels[None]
    eye = torch.eye(m, dtype=torch.bool, device=labels.device)
    anchor, positive = torch.nonzero(same & ~eye, as_tuple=True)
    negatives = ~same[anchor]  # [pairs, m]
    anchor_of, negative = torch.nonzero(negatives, as_tuple=True)
    return Triplets(m * (m - 1) // 2, anchor[anchor_of], positive[anchor_of], negative)


class TripletGlobalLoss(nn.Module):
    def __init__(self, margin: float, global_margin: float, mean_weight: float) -> None:
        super().__init__()
        self.margin, self.global_margin, self.mean_weight = margin, global_margin, mean_weight

    def forward(self, out: Embedded, batch: Batch, triplets: Triplets) -> torch.Tensor:
        emb = out.embedding
        if triplets.count() == 0:
            return emb.sum() * 0.0
        squared = squared_distance_matrix(emb)  # D^2, m x m, once per step
        m = len(emb)
        ap = flat_index(m, triplets.anchor, triplets.positive)  # (a, p) in the flat matrix
        an = flat_index(m, triplets.anchor, triplets.negative)
        flat = squared.flatten()
        d_ap, d_an = flat.index_select(0, ap), flat.index_select(0, an)
        triplet_term = (d_ap - d_an + self.margin).clamp(min=0).mean()  # L_t
        # L_g on D^2 / 4 of the triplets' pairs: moments read off the matrix with each pair's
        # count of triplets (O(m^2)), not reduced over the m(K-1)(m-K) gathered values
        with torch.no_grad():
            pos_counts, neg_counts = pair_counts(m, ap), pair_counts(m, an)
        quarter = squared / 4
        global_term = global_loss(
            counted_moments(quarter, pos_counts, len(ap)),
            counted_moments(quarter, neg_counts, len(an)),
            margin=self.global_margin,
            mean_weight=self.mean_weight,
        )
        return triplet_term + global_term  # L_t + L_g


@register_method(
    "triplet_global",
    family="triplets",
    version=2,
    paper="global_loss_cvpr2016",
    search={
        "margin": Float(0.05, 1.0, log=True),
        "global_margin": Float(0.1, 1.0, log=True),
        "mean_weight": Float(0.1, 10.0, log=True),
    },
)
def build(
    ctx: MethodContext,
    *,
    margin: float = 0.2,
    global_margin: float = 0.4,
    mean_weight: float = 1.0,
) -> Method:
    """Triplet + global loss (Kumar B G et al. 2016): all triplets of the batch, the triplet
    hinge plus the mean/variance separation of their positive and negative distances."""
    return Method(
        head=EmbeddingHead(ctx.feature_dim, ctx.embedding_dim),
        loss=TripletGlobalLoss(margin, global_margin, mean_weight),
        miner=all_triplets,
    )
