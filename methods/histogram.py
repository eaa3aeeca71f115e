"""Histogram loss (Ustinova & Lempitsky, NIPS 2016): the probability that a random negative
pair is more similar than a random positive pair, from two soft histograms of the batch.

s_ij = cosine similarity of L2-normalised embeddings, for every pair of the batch; R nodes
t_r = -1 + r Delta on [-1, 1]. Each similarity is split linearly between its two nearest nodes:
  h+_r = 1/|S+| sum_{(i,j) in S+} delta_ijr,  delta_ijr = (s_ij - t_{r-1})/Delta on [t_{r-1}, t_r],
                                                          (t_{r+1} - s_ij)/Delta on [t_r, t_{r+1}]
and h-_r likewise over the negative pairs S-. The loss is
  L = sum_r h-_r phi+_r,  phi+_r = sum_{q <= r} h+_q  (the positives' cumulative histogram).
It has no margin; Delta is its only parameter. Delta = 0.01 (R = 201 nodes) as in the authors'
released training file (github.com/madkn/HistogramLoss, models/cuhk03: grid_delta 0.01).

Each unordered pair of the batch counts once; similarities are clamped into [-1, 1], as the
authors' layer does (rounding can put an identical pair just above 1).
pytorch-metric-learning 2.9's HistogramLoss computes the same value (n_bins = 2 / Delta = 200
intervals; its default 100 is Delta = 0.02), and the tests pin this file to it, but it builds
every triplet of the batch to list the pairs (O(m^3): 47 s at m = 1024 on one shared CPU core,
against about 0.2 s here) and indexes off its grid for s >= 1, so the two histograms are written out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from harness import (
    Batch,
    Choice,
    Embedded,
    EmbeddingHead,
    HarnessError,
    Method,
    MethodContext,
    Pairs,
    all_pairs,
    register_method,
)


def soft_histogram(s: torch.Tensor, delta: float, nodes: int) -> torch.Tensor:
    """h_r = 1/|S| sum delta_r(s): each value split linearly between its two nearest nodes."""
    position = (s.clamp(-1.0, 1.0) + 1) / delta  # in node units, t_r = -1 + r Delta
    r = position.detach().floor().long().clamp(max=nodes - 2)  # s in [t_r, t_(r+1)]
    upper = position - r  # (s - t_r) / Delta goes to node r + 1, the rest to node r
    h = s.new_zeros(nodes).index_add(0, r + 1, upper).index_add(0, r, 1 - upper)
    return h / max(len(s), 1)


def histogram_loss(emb: torch.Tensor, pairs: Pairs, delta: float) -> torch.Tensor:
    """Eq. of Sec. 2 on the given pairs; 0 when the batch has no positive or no negative pair."""
    if not pairs.positive.any() or pairs.positive.all():
        return emb.sum() * 0.0
    unit = F.normalize(emb, dim=1)
    s = (unit @ unit.T)[pairs.first, pairs.second]  # cosine similarity s_ij
    nodes = round(2 / delta) + 1
    h_pos = soft_histogram(s[pairs.positive], delta, nodes)  # h+
    h_neg = soft_histogram(s[~pairs.positive], delta, nodes)  # h-
    return (h_neg * h_pos.cumsum(0)).sum()  # L = sum_r h-_r phi+_r


class HistogramLoss(nn.Module):
    def __init__(self, delta: float) -> None:
        super().__init__()
        n_bins = round(2 / delta) if 0 < delta <= 2 else 0
        if n_bins == 0 or abs(n_bins * delta - 2) > 1e-9:
            raise HarnessError(
                f"histogram: delta {delta} must divide 2 into whole bins; use e.g. 0.01 or 0.02"
            )
        self.delta = delta

    def forward(self, out: Embedded, batch: Batch, pairs: Pairs) -> torch.Tensor:
        return histogram_loss(out.embedding, pairs, self.delta)


def mine_all_pairs(out: Embedded, batch: Batch) -> Pairs:
    """Both histograms need every pair of the batch: m(m-1)/2 similarities."""
    return all_pairs(batch.labels)


@register_method(
    "histogram",
    family="pairs",
    version=1,
    paper="histogram_nips2016",
    # delta must split [-1, 1] into whole bins (2 / delta an integer): a continuous range
    # proposed values the loss refuses, so the search picks among the steps that do
    search={"delta": Choice((0.002, 0.004, 0.005, 0.008, 0.01, 0.02, 0.025, 0.04, 0.05))},
)
def build(ctx: MethodContext, *, delta: float = 0.01) -> Method:
    """Histogram loss (Ustinova & Lempitsky 2016): P(negative pair more similar than positive)
    from soft histograms of the batch's cosine similarities, bin step Delta."""
    return Method(
        head=EmbeddingHead(ctx.feature_dim, ctx.embedding_dim),
        loss=HistogramLoss(delta),
        miner=mine_all_pairs,
    )
