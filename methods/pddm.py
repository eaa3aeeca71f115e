"""PDDM (Huang, Loy, Tang, NIPS 2016): a learned local similarity mines hard quadruplets.

Unit (Eq. 2), on L2-normalised features f: u = |f_i - f_j|, v = (f_i + f_j) / 2,
u' = r(relu(W_u u + b_u)), v' = r(relu(W_v v + b_v)) (W_u, W_v not shared, d x d),
c = relu(W_c [u'; v'] + b_c), S_ij = W_s c + b_s, r the L2-normalisation. Dropout 0.5 on the
outputs of the W_u, W_v and W_c layers (Sec. 3.3, "followed by dropout"), not on the score.
Mining (Sec. 3.1): (i^, j^) = argmin of S over the batch's positive pairs; k^ = argmax of
S_i^k over the negatives k of i^; l^ = argmax of S_j^l over the negatives l of j^.
Loss: E_m + lambda E_e with alpha = 0.5, beta = 1, lambda = 0.5, D Euclidean on the embedding:
  E_m = [alpha + S_i^k^ - S_i^j^]_+ + [alpha + S_j^l^ - S_i^j^]_+    (Eq. 3)
  E_e = [beta + D_i^j^ - D_i^k^]_+ + [beta + D_i^j^ - D_j^l^]_+      (Eq. 4)

Readings and differences:
- "we always scale S into [0, 1] by the similarity graph in the batch": min-max over the graph.
  The unit scores the m(m-1)/2 pairs i < j (S_ij = S_ji) and S~ = (S - min) / (max - min), min
  and max over those pairs, taken as constants (detached). Mining is the same on S or S~
  (monotone); E_m uses S~, so alpha is a margin on the batch's own scale. With the gradient
  through min and max, E_m could also drop by stretching the batch's two extreme scores, which
  squeezes all others together (pddm_score map@r 0.05 against 0.11 detached, default protocol,
  16 quadruplets per batch; a sigmoid instead, which ignores the graph, gave 0.21).
- The miner scores without dropout (the current metric picks the quadruplet) and only what
  Sec. 3.1 needs: the positive pairs, then the rows of i^ and j^. Mining is the same on S or
  S~ (monotone), so `evaluated` = m(K-1)/2 + 2nm, O(m): the paper's claim. The loss rescores
  the whole graph with grad and dropout, because S~ needs the graph's min and max: m(m-1)/2
  scores per step, O(m^2), counted in the loss time, not in `evaluated`.
- D (in E_e, and S = -D in quadruplet_euclidean's graph) is read from the batch's m x m
  distance matrix, made once per step in the loss (methods/_pair_losses.py).
- quadruplets_per_batch (default 1 = the paper): the n lowest-scored positive pairs, each with
  its hardest negatives; the losses average over them (for n = 1, the paper's single term).
- gamma ||W||^2 (5e-4) is weight decay, which the protocol's optimizer owns.

Variants: pddm_quadruplet (retrieval by Euclidean distance); pddm_score (same training,
retrieval by the PDDM score); lmdm_score (the ablation: the score from u alone, W_c d x d);
pddm_triplet (PDDM mining and E_m, with E_e replaced by the triplet loss on (i^, j^, k^) and
(j^, i^, l^): [alpha_t + D_ap^2 - D_an^2]_+, FaceNet's squared form, alpha_t = 0.2 as in
`triplet`; unsquared with margin beta it would be E_e itself); quadruplet_euclidean (Fig. 4's
baseline: S = -D in place of the PDDM score, same scaling, mining and loss; no unit).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from harness.method import (
    Batch,
    Embedded,
    EmbeddingHead,
    Method,
    MethodContext,
    Quadruplets,
    Scorer,
    register_method,
)
from methods._pair_losses import distance_matrix, pair_values

EmbeddingLoss = Callable[[torch.Tensor, Quadruplets], torch.Tensor]  # (D matrix, quadruplets)
PairScore = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


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


def scaled_graph(pair_scores: torch.Tensor, m: int) -> torch.Tensor:
    """The batch's similarity graph [m, m] from the scores of its pairs i < j (triu order),
    min-max scaled into [0, 1] with min and max as constants; the diagonal is 0, never used."""
    lo, hi = pair_scores.detach().min(), pair_scores.detach().max()
    scaled = (pair_scores - lo) / (hi - lo).clamp(min=1e-12)
    first, second = torch.triu_indices(m, m, offset=1, device=pair_scores.device)
    upper = pair_scores.new_zeros(m, m).index_put((first, second), scaled)
    return upper + upper.T


def hardest_quadruplets(score: PairScore, labels: torch.Tensor, n: int = 1) -> Quadruplets:
    """Sec. 3.1: the n lowest-scored positive pairs (i < j) and, for each, the highest-scored
    negative of i and of j. `score(a, b)` scores index tensors pairwise (broadcasting).

    Only what the rule needs is scored: the batch's positive pairs (m(K-1)/2 in a P x K
    batch, O(m)), then the rows of i^ and j^ (2nm scores, the same-class ones masked): O(m)
    in all, the paper's claim, against the m(m-1)/2 of the whole graph. Ties go to the lower
    index."""
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


def metric_loss(graph: torch.Tensor, q: Quadruplets, alpha: float) -> torch.Tensor:
    """E_m (Eq. 3) on the scaled graph, averaged over the quadruplets."""
    s_ij = graph[q.i, q.j]
    hinge = (alpha + graph[q.i, q.k] - s_ij).clamp(min=0)
    return (hinge + (alpha + graph[q.j, q.l] - s_ij).clamp(min=0)).mean()


def double_header_loss(dist: torch.Tensor, q: Quadruplets, beta: float) -> torch.Tensor:
    """E_e (Eq. 4): [beta + D_ij - D_ik]_+ + [beta + D_ij - D_jl]_+, averaged; D read from
    the batch's distance matrix `dist`."""
    d_ij = pair_values(dist, q.i, q.j)
    hinge = (beta + d_ij - pair_values(dist, q.i, q.k)).clamp(min=0)
    return (hinge + (beta + d_ij - pair_values(dist, q.j, q.l)).clamp(min=0)).mean()


def triplet_pair_loss(dist: torch.Tensor, q: Quadruplets, margin: float) -> torch.Tensor:
    """Triplets (i, j, k) and (j, i, l): [margin + D_ap^2 - D_an^2]_+ summed, averaged."""
    d_ij = pair_values(dist, q.i, q.j).pow(2)
    hinge = (margin + d_ij - pair_values(dist, q.i, q.k).pow(2)).clamp(min=0)
    return (hinge + (margin + d_ij - pair_values(dist, q.j, q.l).pow(2)).clamp(min=0)).mean()


def scaled_distance_graph(dist: torch.Tensor) -> torch.Tensor:
    """scaled_graph of S = -D from the distance matrix itself: (max D - D) / (max D - min D),
    min and max over i != j as constants; the diagonal is 0, never used."""
    eye = torch.eye(len(dist), dtype=torch.bool, device=dist.device)
    off_diagonal = dist.detach().masked_fill(eye, float("inf"))
    lo, hi = -dist.detach().max(), -off_diagonal.min()  # the diagonal is the smallest D
    return ((-dist - lo) / (hi - lo).clamp(min=1e-12)).masked_fill(eye, 0.0)


class QuadrupletLoss(nn.Module):
    """E_m on the scaled graph + lam * an embedding term; unit=None scores by -D."""

    def __init__(
        self,
        unit: PDDMUnit | None,
        alpha: float,
        lam: float,
        embedding_loss: EmbeddingLoss,
    ) -> None:
        super().__init__()
        self.unit, self.alpha, self.lam, self.embedding_loss = unit, alpha, lam, embedding_loss

    def pair_score(self, emb: torch.Tensor, dropout: bool) -> PairScore:
        """S(a, b) for index tensors a, b of the batch: the PDDM unit, or -D without one."""
        if self.unit is None:
            unit_emb = F.normalize(emb, dim=1)
            return lambda a, b: -(unit_emb[a] - unit_emb[b]).pow(2).sum(-1).clamp(min=1e-12).sqrt()
        return lambda a, b: self.unit(emb[a], emb[b], dropout=dropout)

    def graph(self, emb: torch.Tensor, dist: torch.Tensor, dropout: bool) -> torch.Tensor:
        """The scaled similarity graph: S = -D read from `dist` without a unit, else the
        unit's score of every pair i < j."""
        if self.unit is None:
            return scaled_distance_graph(dist)
        m = len(emb)
        first, second = torch.triu_indices(m, m, offset=1, device=emb.device)
        return scaled_graph(self.pair_score(emb, dropout)(first, second), m)

    def forward(self, out: Embedded, batch: Batch, q: Quadruplets) -> torch.Tensor:
        emb = F.normalize(out.embedding, dim=1)
        if q.count() == 0:
            return emb.sum() * 0.0
        dist = distance_matrix(emb)  # D, m x m, once per step
        e_m = metric_loss(self.graph(emb, dist, dropout=self.training), q, self.alpha)  # Eq. 3
        return e_m + self.lam * self.embedding_loss(dist, q)  # Eq. 4: E_m + lambda E_e


class QuadrupletMiner:
    def __init__(self, loss: QuadrupletLoss, per_batch: int) -> None:
        self.loss, self.per_batch = loss, per_batch

    @torch.no_grad()
    def __call__(self, out: Embedded, batch: Batch) -> Quadruplets:
        score = self.loss.pair_score(F.normalize(out.embedding, dim=1), dropout=False)
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
    loss = QuadrupletLoss(unit, alpha, lam, embedding_loss)
    return Method(
        head=EmbeddingHead(ctx.feature_dim, ctx.embedding_dim),
        loss=loss,
        miner=QuadrupletMiner(loss, per_batch),
        scorer=pddm_scorer(unit) if by_score else None,
    )


def _e_e(beta: float) -> EmbeddingLoss:
    return lambda dist, q: double_header_loss(dist, q, beta)


@register_method("pddm_quadruplet", family="quadruplets", version=3, paper="pddm_nips2016")
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


@register_method("pddm_score", family="quadruplets", version=3, paper="pddm_nips2016")
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


@register_method("lmdm_score", family="quadruplets", version=3, paper="pddm_nips2016")
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


@register_method("pddm_triplet", family="quadruplets", version=3, paper="pddm_nips2016")
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

    def e_t(dist: torch.Tensor, q: Quadruplets) -> torch.Tensor:
        return triplet_pair_loss(dist, q, triplet_margin)

    return _pddm(ctx, alpha, lam, dropout, quadruplets_per_batch, e_t)


@register_method("quadruplet_euclidean", family="quadruplets", version=3, paper="pddm_nips2016")
def build_euclidean(
    ctx: MethodContext,
    *,
    alpha: float = 0.5,
    beta: float = 1.0,
    lam: float = 0.5,
    quadruplets_per_batch: int = 1,
) -> Method:
    """Quadruplet (Euclidean): the same mining and double-header loss with S = -D (Fig. 4)."""
    loss = QuadrupletLoss(None, alpha, lam, _e_e(beta))
    return Method(
        head=EmbeddingHead(ctx.feature_dim, ctx.embedding_dim),
        loss=loss,
        miner=QuadrupletMiner(loss, quadruplets_per_batch),
    )
