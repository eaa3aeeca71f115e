"""HDC (Yuan, Yang, Zhang, ICCV 2017): contrastive heads at three depths, hard pairs cascaded.

Model k = backbone blocks G_1..G_k plus its own transform F_k (here a linear layer on the pooled
stage, L2-normalised). Loss ("Model Formulation"): sum_k lambda_k L_k, L_k the contrastive loss
(M = 1, L2-normalised features) over P_k, N_k only: "all positive pairs that are considered as
hard examples by previous models". Hard ("Definition of Hard Example"): rank the losses of the
batch's positive pairs in descending order, keep the top h_k percent; negatives apart.

Our reading of the cascade (cascade=True), from that text and its toy example ("Model-1 will
forward all pairs in P0 and N0 [...] and form P1, N1 by selecting hard samples according its
loss. Similarly, P2 and N2 are formed by Cascade Model-2"):
- head 1 trains on the top h_1 of all pairs (h_1 = 100 %: all; ranked by its own loss if < 1);
- head k >= 2 trains on the top h_k of head k-1's pairs ranked by head k-1's loss: the previous
  model judges what is hard, the deeper one trains on it (a pair reaches model k only if
  models 1..k-1 found it hard; model 1 pushes and pulls all of P0);
- h_k is a fraction of the ranking list the judging head holds (the previous head's pairs),
  rounded up: h = (100, 50, 20) % trains the heads on 100 %, 50 % and 10 % of the pairs.
cascade=False is the authors' Caffe code: each head ranks all pairs by its own loss and trains
on its top h_k (100 %, 50 %, 20 %). pytorch-metric-learning's HDCMiner (each head ranks, by
its own distances, the pairs the previous head kept) is a third reading, not implemented.

L_k = sum over its pairs / (2 x their number), as `contrastive` (Eq. 1 of Song et al.), D read
from head k's m x m distance matrix (once per head and step, in the miner and in the loss). The
retrieval embedding concatenates the heads: 3 x head_dim, larger than the other methods'
embedding_dim (the paper: 3 x 128 = 384). Evaluation also scores each head alone (HDC-1/2/3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from harness import (
    Batch,
    Embedded,
    Float,
    HarnessError,
    Method,
    MethodContext,
    Mined,
    Pairs,
    all_pairs,
    register_method,
)

from ._pair_losses import contrastive_pair_loss, distance_matrix


@dataclass
class CascadePairs(Mined):
    """One set of pairs per cascade head: `heads[k]` are the pairs head k+1 trains on.
    count() and indices() cover every head's pairs together (a pair trained by two heads
    counts twice); `evaluated` counts the pair losses the miner computed to rank them."""

    family: ClassVar[str] = "pairs"
    heads: tuple[Pairs, ...]

    def count(self) -> int:  # without concatenating every head's pairs
        return sum(p.count() for p in self.heads)

    def indices(self) -> tuple[torch.Tensor, ...]:
        empty = torch.zeros(0, dtype=torch.long)
        first = [p.first for p in self.heads] or [empty]
        second = [p.second for p in self.heads] or [empty]
        return torch.cat(first), torch.cat(second)


class CascadeHead(nn.Module):
    """F_k: one linear map per chosen stage, L2-normalised; the embedding concatenates them."""

    def __init__(self, stage_dims: tuple[int, ...], stages: list[int], dim: int) -> None:
        super().__init__()
        self.stages = stages
        self.fcs = nn.ModuleList(nn.Linear(stage_dims[s], dim) for s in stages)

    def forward(self, features: list[torch.Tensor]) -> Embedded:
        heads = [
            F.normalize(fc(features[s]), dim=1) for fc, s in zip(self.fcs, self.stages, strict=True)
        ]
        return Embedded(torch.cat(heads, dim=1), {f"head{k}": h for k, h in enumerate(heads, 1)})


def hardest(pairs: Pairs, losses: torch.Tensor, ratio: float) -> Pairs:
    """The top `ratio` of the positive pairs by loss and, apart, of the negative pairs
    (ceil(ratio x n) of each; ties go to the earlier pair), kept in their original order."""
    keep = []
    for sign in (pairs.positive, ~pairs.positive):
        idx = torch.nonzero(sign).squeeze(1)
        n = math.ceil(ratio * len(idx) - 1e-9)  # 0.14 x 50 is 7.000000000000001 in floats
        order = torch.sort(losses[idx], descending=True, stable=True).indices
        keep.append(idx[order[:n]])
    kept = torch.sort(torch.cat(keep)).values
    return Pairs(len(losses), pairs.first[kept], pairs.second[kept], pairs.positive[kept])


class CascadeMiner:
    def __init__(self, margin: float, ratios: list[float], cascade: bool) -> None:
        self.margin, self.ratios, self.cascade = margin, ratios, cascade

    @torch.no_grad()
    def __call__(self, out: Embedded, batch: Batch) -> CascadePairs:
        every = all_pairs(batch.labels)
        heads: list[Pairs] = []
        evaluated = 0
        for k, ratio in enumerate(self.ratios, 1):
            judge, pool = k, every  # cascade=False (Caffe): own loss, all pairs
            if self.cascade and k > 1:
                judge, pool = k - 1, heads[-1]  # P_k: hard for the previous model
            if ratio >= 1:
                heads.append(pool)
                continue
            dist = distance_matrix(out.extras[f"head{judge}"], exact_zero=True)
            losses = contrastive_pair_loss(
                dist, pool.first, pool.second, pool.positive, margin=self.margin
            )
            evaluated += len(losses)
            heads.append(
                hardest(pool, losses, ratio)
            )  # top h_k percent, positives and negatives apart
        return CascadePairs(evaluated, tuple(heads))


class CascadeLoss(nn.Module):
    def __init__(self, margin: float, weights: list[float]) -> None:
        super().__init__()
        self.margin, self.weights = margin, weights

    def forward(self, out: Embedded, batch: Batch, mined: CascadePairs) -> torch.Tensor:
        total = out.embedding.sum() * 0.0
        for k, (pairs, weight) in enumerate(zip(mined.heads, self.weights, strict=True), 1):
            if pairs.count() == 0:
                continue
            dist = distance_matrix(out.extras[f"head{k}"], exact_zero=True)  # head k's D
            per_pair = contrastive_pair_loss(
                dist, pairs.first, pairs.second, pairs.positive, margin=self.margin
            )
            total = total + weight * per_pair.sum() / (2 * len(per_pair))  # lambda_k L_k
        return total


def _stages(ctx: MethodContext, stages: list[int]) -> list[int]:
    """Negative indices count from the deepest stage; a backbone with fewer stages than
    heads gives the shallow heads its first stage. Depths must not decrease."""
    n = len(ctx.stage_dims)
    if any(s >= n for s in stages):
        raise HarnessError(f"hdc: stages {stages} out of range; the backbone has {n} stages")
    resolved = [max(s + n, 0) if s < 0 else s for s in stages]
    if resolved != sorted(resolved):
        raise HarnessError(f"hdc: stages {stages} must go from shallow to deep")
    return resolved


@register_method(
    "hdc_contrastive",
    family="pairs",
    version=2,
    paper="hdc_iccv2017",
    search={"margin": Float(0.25, 2.0, log=True)},
)
def build(
    ctx: MethodContext,
    *,
    margin: float = 1.0,
    hard_ratios: tuple[float, ...] = (1.0, 0.5, 0.2),
    loss_weights: tuple[float, ...] = (1.0, 1.0, 1.0),
    stages: tuple[int, ...] = (-3, -2, -1),
    head_dim: int | None = None,
    cascade: bool = True,
) -> Method:
    """HDC + contrastive: 3 heads at increasing depths, hard pairs passed down the cascade."""
    if not len(hard_ratios) == len(loss_weights) == len(stages) >= 1:
        raise HarnessError("hdc: hard_ratios, loss_weights and stages need one entry per head")
    if not all(0 < r <= 1 for r in hard_ratios):
        raise HarnessError(f"hdc: hard_ratios {list(hard_ratios)} must be in (0, 1]")
    dim = head_dim or ctx.embedding_dim
    head = CascadeHead(ctx.stage_dims, _stages(ctx, list(stages)), dim)
    return Method(
        head=head,
        loss=CascadeLoss(margin, list(loss_weights)),
        miner=CascadeMiner(margin, list(hard_ratios), cascade),
        sub_embeddings=tuple(f"head{k}" for k in range(1, len(stages) + 1)),
    )


@register_method(
    "hdc_contrastive_independent",
    family="pairs",
    version=2,
    paper="hdc_iccv2017",
    search={"margin": Float(0.25, 2.0, log=True)},
)
def build_independent(
    ctx: MethodContext,
    *,
    margin: float = 1.0,
    hard_ratios: tuple[float, ...] = (1.0, 0.5, 0.2),
    loss_weights: tuple[float, ...] = (1.0, 1.0, 1.0),
    stages: tuple[int, ...] = (-3, -2, -1),
    head_dim: int | None = None,
) -> Method:
    """HDC as the authors' Caffe code: every head ranks all pairs by its own loss."""
    return build(ctx, margin=margin, hard_ratios=hard_ratios, loss_weights=loss_weights,
                 stages=stages, head_dim=head_dim, cascade=False)  # fmt: skip
