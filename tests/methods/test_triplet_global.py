"""Triplet + global loss (Kumar B G et al. 2016): by hand, the global moments of a P x K batch,
and the distance-matrix form against gathered rows."""

from __future__ import annotations

import harness.methods  # noqa: F401
import pytest
import torch
from gathered_forms import SEEDS, assert_same, random_batch, ref_triplet_global, value_and_grad
from harness.methods._pair_losses import (
    global_loss,
)
from harness.methods.triplet import TripletLoss
from harness.methods.triplet_global import TripletGlobalLoss, all_triplets
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from harness.core import Batch, Embedded, Triplets


@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_triplet_global_matches_the_gathered_form(seed: int, duplicates: bool) -> None:
    emb, labels, _ = random_batch(seed, duplicates)
    triplets = all_triplets(Embedded(emb), Batch(labels))
    loss = TripletGlobalLoss(0.2, 0.4, 1.0)
    new = value_and_grad(lambda e: loss(Embedded(e), Batch(labels), triplets), emb)
    assert_same(new, value_and_grad(lambda e: ref_triplet_global(e, triplets), emb))


LABELS4 = torch.tensor([0, 0, 1, 1])


def test_triplet_global_by_hand():
    # f0 = (1,0), f1 = (0.6,0.8) [class 0]; f2 = (0,1), f3 = (-1,0) [class 1]. Squared distances
    # 2 - 2 cos: D01 = 0.8, D23 = 2; D02 = 2, D03 = 4, D12 = 0.4, D13 = 3.2.
    emb = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    out, batch = Embedded(emb), Batch(LABELS4)
    triplets = all_triplets(out, batch)
    assert triplets.count() == 8 and triplets.evaluated == 6  # 4 anchors x 1 positive x 2 negatives
    library = lmu.get_all_triplets_indices(LABELS4)
    assert sorted(zip(*[t.tolist() for t in triplets.indices()], strict=True)) == sorted(
        zip(*[t.tolist() for t in library], strict=True)
    )
    # (a,p,n): D_ap, D_an, [D_ap - D_an + 0.2]_+
    # (0,1,2) .8, 2 -> 0 | (0,1,3) .8, 4 -> 0 | (1,0,2) .8, .4 -> 0.6 | (1,0,3) .8, 3.2 -> 0
    # (2,3,0) 2, 2 -> 0.2 | (2,3,1) 2, .4 -> 1.8 | (3,2,0) 2, 4 -> 0 | (3,2,1) 2, 3.2 -> 0
    # L_t = 2.6 / 8 = 0.325
    # d+ = D_ap / 4 = 0.2 (x4), 0.5 (x4): mean 0.35, var 0.15^2 = 0.0225
    # d- = D_an / 4 = 0.5, 1, 0.1, 0.8 (x2): mean 0.6, var (0.25 + 1 + 0.01 + 0.64)/4 - 0.36 = 0.115
    # L_g = 0.0225 + 0.115 + 1 * [0.35 - 0.6 + 0.4]_+ = 0.1375 + 0.15 = 0.2875
    loss = TripletGlobalLoss(margin=0.2, global_margin=0.4, mean_weight=1.0)
    assert loss(out, batch, triplets).item() == pytest.approx(0.325 + 0.2875, rel=1e-6)
    # its triplet term is `triplet`'s loss (pytorch-metric-learning) on the same triplets
    assert TripletLoss(0.2)(out, batch, triplets).item() == pytest.approx(0.325, rel=1e-6)
    # a wide enough gap (t = 0.1) leaves only the variances in L_g
    loss = TripletGlobalLoss(margin=0.2, global_margin=0.1, mean_weight=1.0)
    assert loss(out, batch, triplets).item() == pytest.approx(0.325 + 0.1375, rel=1e-6)
    # no triplet (one class): zero, differentiable
    empty = all_triplets(out, Batch(torch.zeros(4, dtype=torch.long)))
    assert isinstance(empty, Triplets) and empty.count() == 0
    assert TripletGlobalLoss(0.2, 0.4, 1.0)(out, Batch(torch.zeros(4)), empty).item() == 0


def test_triplet_global_moments_are_those_of_all_pairs_in_a_pk_batch():
    # P x K = 3 x 3: every ordered positive pair is in m - K = 6 triplets, every ordered
    # negative pair in K - 1 = 2, so the global term equals global_loss over the pairs themselves

    torch.manual_seed(2)
    emb = torch.nn.functional.normalize(torch.randn(9, 4, dtype=torch.float64), dim=1)
    labels = torch.arange(3).repeat_interleave(3)
    out, batch = Embedded(emb), Batch(labels)
    triplets = all_triplets(out, batch)
    loss = TripletGlobalLoss(margin=-10.0, global_margin=0.4, mean_weight=1.0)  # L_t = 0
    d = (emb[:, None] - emb[None]).pow(2).sum(-1) / 4
    same = labels[:, None] == labels[None]
    off_diagonal = ~torch.eye(9, dtype=torch.bool)
    expected = global_loss(d[same & off_diagonal], d[~same], margin=0.4, mean_weight=1.0)
    assert loss(out, batch, triplets).item() == pytest.approx(expected.item(), rel=1e-9)
