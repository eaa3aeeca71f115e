"""PDDM (Huang, Loy, Tang, NIPS 2016): a learned local similarity mines hard quadruplets.

Unit (Eq. 2), on L2-normalised features f: u = |f_i - f_j|, v = (f_i + f_j) / 2,
u' = r(relu(W_u u + b_u)), v' = r(relu(W_v v + b_v)) (W_u, W_v not shared, d x d),
c = relu(W_c [u'; v'] + b_c), S_ij = W_s c + b_s, r the L2-normalisation. Dropout 0.5 on the
outputs of the W_u, W_v and W_c layers (Sec. 3.3, "followed by dropout"), not on the score.
Mining (Sec. 3.1): (i^, j^) = argmin of S over the batch's positive pairs; k^ = argmax of
S_i^k over the negatives k of i^; l^ = argmax of S_j^l over the negatives l of j^.
Loss: E_m + lambda E_e with alpha = 0.5, beta = 1, lambda = 0.5, D on the unit-length embedding:
  E_m = [alpha + S_i^k^ - S_i^j^]_+ + [alpha + S_j^l^ - S_i^j^]_+          (Eq. 3)
  E_e = [beta + D_i^j^^2 - D_i^k^^2]_+ + [beta + D_i^j^^2 - D_j^l^^2]_+    (Eq. 4, on D^2)

Readings and differences:
- Two passes of the unit per step, both of the network as it trains (Fig. 2a): "First, we
  use PDDM to compute similarity scores for the mini-batch samples during a particular forward
  pass. The scores are used to select one hard quadruplet [...] Then each sample in the hard
  quadruplet is separately fed into four identical CNNs [...] Finally, a discriminative
  double-header hinge loss is applied to both the similarity score and feature embeddings";
  the figure draws three PDDM units on the quadruplet's pairs (i, j), (i, k), (j, l). So the
  miner scores the batch's m(m-1)/2 pairs i < j in one pass, with dropout in training (the
  training network's scores: up to version 3 it mined without dropout), mines from them and
  hands the loss the quadruplets and that graph's min and max; the loss scores the 3n pairs of
  the quadruplets with grad, in a pass of its own (its own dropout mask), scales them by the
  graph's min and max and takes E_m. Sec. 3.2's "we reuse the hard quadruplet's features for
  metric optimization (Eq. (3)) in the same forward pass": the embeddings come from one
  backbone pass, shared by mining, E_m and E_e. Measured against the other reading, one pass
  shared by mining and E_m (score the graph with dropout and grad, mine from it, E_m from the
  same scores; `learning` protocol, pddm_score, seeds 0 / 1 / 2): MAP@R 0.009 / 0.015 / 0.051
  and unit AUC 0.42 / 0.41 / 0.63 on the test pairs (untrained MAP@R 0.113), against 0.203 /
  0.174 / 0.155 and 0.83 / 0.79 / 0.80 here. The mined pairs are extreme partly by their
  dropout mask, and the gradient flows through that very mask: the unit fits the mask's noise
  and ranks the test pairs backwards (with dropout 0.1 as well: AUC 0.37; with dropout 0 the
  shared pass learns, 0.176 / 0.209).
- O(m), as it now reads: the paper's claim is for the search, "the searching cost of the hard
  positive pair is very small since the positive pair set P^ is usually much smaller than the
  negative pair set N^ [...] the hard negative mining only incurs an O(m) complexity". Given
  the graph, the search reads m(K-1)/2 positive scores and 2nm row scores: O(m). Scoring the
  graph is O(m^2) (the miner's `evaluated` = m(m-1)/2, under no_grad), which the scaling
  below needs in any case; the loss's pass is O(n), with grad.
- "we always scale S into the range [0, 1] by the similarity graph in the batch": S~ = (S - lo)
  / max(hi - lo, 1), lo and hi the mining graph's min and max as constants. Mining is the same
  on S or S~ (monotone); E_m uses S~ of the loss's scores. The floor 1, the width of [0, 1]:
  the scaling may shrink a graph into [0, 1], never stretch one. Plain min-max stretches a
  narrow graph by 1 / (hi - lo), so E_m's gradient grows as the range shrinks and E_m is met
  by ever smaller raw differences: the range collapsed (an audit: 0.030 -> 0.0005 in 60 steps
  without dropout, E_m's gradient then 60x E_e's; here, `learning`, dropout 0: 0.052 ->
  0.0006 in 100 steps, with the floor 0.052 -> 0.003 -> 0.021). With the floor a graph
  narrower than 1 is only shifted (still in [0, 1]), alpha is a margin on raw scores until the
  range reaches 1, and dS~/dS <= 1. With the gradient through lo and hi (tried before), E_m
  fell by stretching the two extreme scores (pddm_score map@r 0.05 against 0.11 detached).
- E_e on squared distances. Sec. 3.2: "Since all features are l2-normalized (see Figure 2), we
  have beta + D_ij - D_ik = beta - 2 f(x_i) f(x_j) + 2 f(x_i) f(x_k), and can conveniently
  derive the gradients as those in triplet-based methods [27, 33]." On unit vectors
  ||a - b||^2 = 2 - 2 a.b, so the identity holds for D^2 and not for D; both extractions print
  "D_ij = ||f(x_i) - f(x_j)||2", which cannot tell a subscript 2 from a square (the weight
  decay gamma ||W||^2 is printed the same way). beta = 1 is a margin on D^2 in [0, 4]. D^2 is
  read from the batch's m x m matrix, made once per step (methods/_pair_losses.py).
- quadruplets_per_batch (default 1 = the paper): the n lowest-scored positive pairs, each with
  its hardest negatives; the losses average over them (for n = 1, the paper's single term).
- gamma ||W||^2 (5e-4) is weight decay, which the protocol's optimizer owns.
- Each unit variant's result records `unit_auc`, the AUC of the unit's score (no dropout) over
  the test split's positive against negative pairs, and `euclidean_auc`, that of -D on the same
  pairs (harness/core/pair_auc.py: all positive pairs, 200,000 sampled negatives): did the
  learned metric learn anything beyond the distance beside it?

Variants: pddm_quadruplet (retrieval by Euclidean distance); pddm_score (same training,
retrieval by the PDDM score); lmdm_score (the ablation: the score from u alone, W_c d x d);
pddm_triplet (PDDM mining and E_m, with E_e replaced by the triplet loss on (i^, j^, k^) and
(j^, i^, l^) in FaceNet's squared form, alpha_t = 0.2 as in `triplet`: on D^2 these are E_e's
two headers, so pddm_triplet is pddm_quadruplet with margin 0.2 in place of beta = 1);
quadruplet_euclidean (Fig. 4's baseline: S = -D in place of the PDDM score, no unit, no
dropout: its miner mines from -D, m(K-1)/2 + 2nm distances, and the loss takes its quadruplets;
the same scaling and loss).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from harness import (
    Batch,
    Diagnostics,
    Embedded,
    EmbeddingHead,
    Float,
    Int,
    Method,
    MethodContext,
    Quadruplets,
    Scorer,
    euclidean_score,
    register_method,
    sample_pairs,
)

from ._pair_losses import SQUARED_FLOOR, pair_values, squared_distance_matrix

EmbeddingLoss = Callable[[torch.Tensor, Quadruplets], torch.Tensor]  # (D^2 matrix, quadruplets)
PairScore = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

SCALE_FLOOR = 1.0  # the scaling's denominator, max(hi - lo, 1): shrink into [0, 1], never stretch


class PDDMUnit(nn.Module):
    """Eq. 2 on broadcastable [..., d] feature pairs -> [...] scores; position=False is LMDM."""

    def __init__(self, dim: int, dropout: float = 0.5, position: bool = True) -> None:
        super().__init__()
        self.fc_u = nn.Linear(dim, dim)
        self.fc_v = nn.Linear(dim, dim) if position else None
        self.fc_c = nn.Linear(2 * dim if position else dim, dim)
        self.fc_s = nn.Linear(dim, 1)
        self.p = dropout

    def forward(self, fi: torch.Tensor, fj: torch.Tensor, dropout: bool) -> torch.Tensor:
        def fc(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
            return F.dropout(F.relu(layer(x)), self.p, training=dropout)

        fi, fj = F.normalize(fi, dim=-1), F.normalize(fj, dim=-1)
        hidden = [F.normalize(fc(self.fc_u, (fi - fj).abs()), dim=-1)]  # u' (Eq. 2)
        if self.fc_v is not None:
            hidden.append(F.normalize(fc(self.fc_v, (fi + fj) / 2), dim=-1))  # v'
        c = fc(self.fc_c, torch.cat(hidden, dim=-1))  # c = relu(W_c [u'; v'] + b_c)
        return self.fc_s(c).squeeze(-1)  # S_ij = W_s c + b_s


def scale(scores: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Scores into [0, 1] by the batch graph's min `lo` and max `hi` (constants):
    (S - lo) / max(hi - lo, SCALE_FLOOR)."""
    return (scores - lo) / (hi - lo).clamp(min=SCALE_FLOOR)


def scaled_graph(pair_scores: torch.Tensor, m: int) -> torch.Tensor:
    """The batch's similarity graph [m, m] from the scores of its pairs i < j (triu order),
    scaled by its own min and max as constants (`scale`); the diagonal is 0, never used."""
    scaled = scale(pair_scores, pair_scores.detach().min(), pair_scores.detach().max())
    first, second = torch.triu_indices(m, m, offset=1, device=pair_scores.device)
    upper = pair_scores.new_zeros(m, m).index_put((first, second), scaled)
    return upper + upper.T


def hardest_quadruplets(score: PairScore, labels: torch.Tensor, n: int = 1) -> Quadruplets:
    """Sec. 3.1: the n lowest-scored positive pairs (i < j) and, for each, the highest-scored
    negative of i and of j. `score(a, b)` scores index tensors pairwise (broadcasting).

    The search reads the batch's positive pairs (m(K-1)/2 in a P x K batch, O(m)), then the
    rows of i^ and j^ (2nm scores, the same-class ones masked): O(m) in all, against the
    m(m-1)/2 of the whole graph; `evaluated` counts what it read. Ties go to the lower index."""
    m = len(labels)
    same = labels[:, None] == labels[None]
    first, second = torch.triu_indices(m, m, offset=1, device=labels.device)
    pos = same[first, second]
    empty = torch.zeros(0, dtype=torch.long, device=labels.device)
    if not pos.any() or same.all():  # no positive pair, or no negative: nothing to mine
        return Quadruplets(0, empty, empty, empty, empty)
    first, second = first[pos], second[pos]
    order = torch.sort(score(first, second), stable=True).indices[:n]
    i, j = first[order], second[order]  # (i^, j^) = argmin_{P} S_ij
    everyone = torch.arange(m, device=labels.device)[None]
    rows = score(torch.cat([i, j])[:, None], everyone).masked_fill(
        same[torch.cat([i, j])], float("-inf")
    )
    k, l = rows.argmax(dim=1).split(len(i))  # noqa: E741 (k^, l^): argmax_{N} S_i^k, S_j^l
    return Quadruplets(len(first) + rows.numel(), i, j, k, l)


def double_hinge(s_ij: torch.Tensor, s_ik: torch.Tensor, s_jl: torch.Tensor, alpha: float):
    """E_m (Eq. 3) on scaled scores: [alpha + S_ik - S_ij]_+ + [alpha + S_jl - S_ij]_+, averaged."""
    return ((alpha + s_ik - s_ij).clamp(min=0) + (alpha + s_jl - s_ij).clamp(min=0)).mean()


def metric_loss(graph: torch.Tensor, q: Quadruplets, alpha: float) -> torch.Tensor:
    """E_m (Eq. 3) read from a scaled graph, averaged over the quadruplets."""
    return double_hinge(graph[q.i, q.j], graph[q.i, q.k], graph[q.j, q.l], alpha)


def double_header_loss(squared: torch.Tensor, q: Quadruplets, beta: float) -> torch.Tensor:
    """E_e (Eq. 4) on squared distances: [beta + D_ij^2 - D_ik^2]_+ + [beta + D_ij^2 - D_jl^2]_+,
    averaged; D^2 read from the batch's squared distance matrix."""
    d_ij = pair_values(squared, q.i, q.j)
    hinge = (beta + d_ij - pair_values(squared, q.i, q.k)).clamp(min=0)
    return (hinge + (beta + d_ij - pair_values(squared, q.j, q.l)).clamp(min=0)).mean()


def scaled_distance_graph(dist: torch.Tensor) -> torch.Tensor:
    """scaled_graph of S = -D from the distance matrix itself: (max D - D) / max(max D - min
    D, SCALE_FLOOR), min and max over i != j as constants; the diagonal is 0, never used."""
    eye = torch.eye(len(dist), dtype=torch.bool, device=dist.device)
    off_diagonal = dist.detach().masked_fill(eye, float("inf"))
    lo, hi = -dist.detach().max(), -off_diagonal.min()  # the diagonal is the smallest D
    return scale(-dist, lo, hi).masked_fill(eye, 0.0)


@dataclass
class GraphQuadruplets(Quadruplets):
    """Quadruplets mined from the unit's scores of the batch's graph, with that graph's min
    `lo` and max `hi`: the constants by which E_m scales the loss's own scores into [0, 1]."""

    lo: torch.Tensor
    hi: torch.Tensor


class UnitMiner:
    """Sec. 3.1 on the unit's graph: every pair i < j scored in one pass of the network as it
    trains (dropout in training, Fig. 2a's mining pass); `evaluated` = m(m-1)/2."""

    def __init__(self, unit: PDDMUnit, per_batch: int) -> None:
        self.unit, self.per_batch = unit, per_batch

    @torch.no_grad()
    def __call__(self, out: Embedded, batch: Batch) -> GraphQuadruplets:
        emb = F.normalize(out.embedding, dim=1)
        m = len(emb)
        first, second = torch.triu_indices(m, m, offset=1, device=emb.device)
        scores = self.unit(emb[first], emb[second], dropout=self.unit.training)
        graph = emb.new_zeros(m, m).index_put((first, second), scores)
        graph = graph + graph.T  # mining is the same on S or its scaled S~ (monotone)
        q = hardest_quadruplets(lambda a, b: graph[a, b], batch.labels, self.per_batch)
        bounds = scores if len(scores) else emb.new_zeros(1)  # a batch of one: no pair
        return GraphQuadruplets(m * (m - 1) // 2, *q.indices(), bounds.min(), bounds.max())


class QuadrupletLoss(nn.Module):
    """E_m + lam * an embedding term on D^2. With a unit, E_m reads the loss's own scores of
    each quadruplet's pairs (i, j), (i, k), (j, l) (Fig. 2a's three PDDM units), scaled by the
    mining graph's constants; without one (S = -D), the scaled graph of -D."""

    def __init__(
        self, unit: PDDMUnit | None, alpha: float, lam: float, embedding_loss: EmbeddingLoss
    ) -> None:
        super().__init__()
        self.unit, self.alpha, self.lam, self.embedding_loss = unit, alpha, lam, embedding_loss

    def unit_metric_loss(self, emb: torch.Tensor, q: GraphQuadruplets) -> torch.Tensor:
        """E_m on one scoring of the quadruplets' 3n pairs (own dropout mask in training)."""
        first, second = torch.cat([q.i, q.i, q.j]), torch.cat([q.j, q.k, q.l])
        scores = scale(self.unit(emb[first], emb[second], dropout=self.training), q.lo, q.hi)
        return double_hinge(*scores.split(len(q.i)), self.alpha)

    def forward(self, out: Embedded, batch: Batch, q: Quadruplets) -> torch.Tensor:
        emb = F.normalize(out.embedding, dim=1)
        if q.count() == 0:
            return emb.sum() * 0.0
        squared = squared_distance_matrix(emb)  # D^2, m x m, once per step
        if self.unit is None:
            graph = scaled_distance_graph(squared.clamp(min=SQUARED_FLOOR).sqrt())
            e_m = metric_loss(graph, q, self.alpha)  # Eq. 3 on S = -D
        else:
            assert isinstance(q, GraphQuadruplets), "the unit's loss needs its miner's graph"
            e_m = self.unit_metric_loss(emb, q)  # Eq. 3
        return e_m + self.lam * self.embedding_loss(squared, q)  # Eq. 4: E_m + lambda E_e


class DistanceMiner:
    """quadruplet_euclidean's miner: Sec. 3.1's search on S = -D, no unit, no dropout."""

    def __init__(self, per_batch: int) -> None:
        self.per_batch = per_batch

    @torch.no_grad()
    def __call__(self, out: Embedded, batch: Batch) -> Quadruplets:
        emb = F.normalize(out.embedding, dim=1)

        def score(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return -(emb[a] - emb[b]).pow(2).sum(-1).clamp(min=SQUARED_FLOOR).sqrt()

        return hardest_quadruplets(score, batch.labels, self.per_batch)


def pddm_scorer(unit: PDDMUnit, block: int | None = None) -> Scorer:
    """Retrieval by the PDDM score, [q, G], no dropout, no grad; `block` queries at a time
    (default: about 2^22 elements per [block, G, d] intermediate)."""

    @torch.no_grad()
    def scorer(query: torch.Tensor, gallery: torch.Tensor) -> torch.Tensor:
        dtype = unit.fc_s.weight.dtype
        q, g = query.to(dtype), gallery.to(dtype)[None]
        step = block or max(1, 2**22 // max(1, g.shape[1] * g.shape[2]))
        rows = [unit(q[s : s + step, None], g, dropout=False) for s in range(0, len(q), step)]
        return torch.cat(rows).float() if rows else q.new_zeros(0, len(gallery))

    return scorer


def unit_auc(unit: PDDMUnit) -> Diagnostics:
    """unit_auc and euclidean_auc on the same test pairs (the module docstring); nothing
    without a positive or a negative pair."""

    def diagnostics(embeddings: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        pairs = sample_pairs(labels)
        if pairs.positive.all() or not pairs.positive.any():
            return {}
        emb = embeddings.to(unit.fc_s.weight.dtype)
        by_unit = pairs.auc(lambda a, b: unit(a, b, dropout=False), emb)
        by_distance = pairs.auc(euclidean_score, emb)
        return {"unit_auc": round(by_unit, 6), "euclidean_auc": round(by_distance, 6)}

    return diagnostics


def _pddm(
    ctx: MethodContext,
    alpha: float,
    lam: float,
    dropout: float,
    per_batch: int,
    embedding_loss: EmbeddingLoss,
    position: bool = True,
    by_score: bool = False,
) -> Method:
    unit = PDDMUnit(ctx.embedding_dim, dropout, position)
    return Method(
        head=EmbeddingHead(ctx.feature_dim, ctx.embedding_dim),
        loss=QuadrupletLoss(unit, alpha, lam, embedding_loss),
        miner=UnitMiner(unit, per_batch),
        scorer=pddm_scorer(unit) if by_score else None,
        diagnostics=unit_auc(unit),
    )


def _e_e(beta: float) -> EmbeddingLoss:
    return lambda squared, q: double_header_loss(squared, q, beta)


# What `harness tune` may try, around the paper's values (alpha is a margin on [0, 1] scores,
# beta on D^2 in [0, 4]); the protocol's quadruplets_per_batch overrides the paper's 1.
MARGINS = {"alpha": Float(0.1, 1.0), "lam": Float(0.1, 2.0, log=True),
           "quadruplets_per_batch": Int(1, 32, log=True)}  # fmt: skip
UNIT_SPACE = {**MARGINS, "beta": Float(0.25, 2.0), "dropout": Float(0.0, 0.7)}


@register_method(
    "pddm_quadruplet", family="quadruplets", version=4, paper="pddm_nips2016", search=UNIT_SPACE
)
def build_quadruplet(
    ctx: MethodContext,
    *,
    alpha: float = 0.5,
    beta: float = 1.0,
    lam: float = 0.5,
    dropout: float = 0.5,
    quadruplets_per_batch: int = 1,
) -> Method:
    """PDDM+Quadruplet: PDDM-mined hard quadruplets, E_m + lambda E_e; Euclidean retrieval."""
    return _pddm(ctx, alpha, lam, dropout, quadruplets_per_batch, _e_e(beta))


@register_method(
    "pddm_score", family="quadruplets", version=4, paper="pddm_nips2016", search=UNIT_SPACE
)
def build_score(
    ctx: MethodContext,
    *,
    alpha: float = 0.5,
    beta: float = 1.0,
    lam: float = 0.5,
    dropout: float = 0.5,
    quadruplets_per_batch: int = 1,
) -> Method:
    """PDDM score: the pddm_quadruplet training, retrieval ranked by the learned PDDM score."""
    return _pddm(ctx, alpha, lam, dropout, quadruplets_per_batch, _e_e(beta), by_score=True)


@register_method(
    "lmdm_score", family="quadruplets", version=4, paper="pddm_nips2016", search=UNIT_SPACE
)
def build_lmdm(
    ctx: MethodContext,
    *,
    alpha: float = 0.5,
    beta: float = 1.0,
    lam: float = 0.5,
    dropout: float = 0.5,
    quadruplets_per_batch: int = 1,
) -> Method:
    """LMDM score (ablation): the score from the difference u alone, retrieval by that score."""
    return _pddm(
        ctx, alpha, lam, dropout, quadruplets_per_batch, _e_e(beta), position=False, by_score=True
    )


@register_method(
    "pddm_triplet", family="quadruplets", version=4, paper="pddm_nips2016",
    search={**MARGINS, "triplet_margin": Float(0.05, 0.5), "dropout": Float(0.0, 0.7)},
)  # fmt: skip
def build_triplet(
    ctx: MethodContext,
    *,
    alpha: float = 0.5,
    triplet_margin: float = 0.2,
    lam: float = 0.5,
    dropout: float = 0.5,
    quadruplets_per_batch: int = 1,
) -> Method:
    """PDDM+Triplet: PDDM-mined quadruplets, E_m + lambda x triplet loss on (i, j, k), (j, i, l)."""
    # [margin + D_ij^2 - D_ik^2]_+ + [margin + D_ji^2 - D_jl^2]_+: E_e's form, FaceNet's margin
    return _pddm(ctx, alpha, lam, dropout, quadruplets_per_batch, _e_e(triplet_margin))


@register_method(
    "quadruplet_euclidean", family="quadruplets", version=4, paper="pddm_nips2016",
    search={**MARGINS, "beta": Float(0.25, 2.0)},
)  # fmt: skip
def build_euclidean(
    ctx: MethodContext,
    *,
    alpha: float = 0.5,
    beta: float = 1.0,
    lam: float = 0.5,
    quadruplets_per_batch: int = 1,
) -> Method:
    """Quadruplet (Euclidean): the same mining and double-header loss with S = -D (Fig. 4)."""
    return Method(
        head=EmbeddingHead(ctx.feature_dim, ctx.embedding_dim),
        loss=QuadrupletLoss(None, alpha, lam, _e_e(beta)),
        miner=DistanceMiner(quadruplets_per_batch),
    )
