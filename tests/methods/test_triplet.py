"""Triplet loss with semi-hard mining (pytorch-metric-learning wrapped) against the formula."""

from __future__ import annotations

import math

import harness.methods  # noqa: F401
import pytest
import torch
from harness.methods.triplet import SemiHardMiner, TripletLoss

from harness.core import Batch, Embedded


def test_triplet_mines_only_semihard_and_matches_formula():
    # unit circle; anchor at 0 deg, positive at 60 deg: D_ap^2 = 2 - 2 cos 60 = 1.
    # negatives: -70 deg (D^2 = 2 - 2 cos 70 = 1.316: semi-hard, within 0.5 of 1),
    # 40 deg (D^2 = 0.468 < 1: hard, not semi-hard), 180 deg (D^2 = 4: easy).
    # From the positive as anchor every negative is hard or easy; the negatives are of three
    # different classes, so none of them is an anchor. So exactly one triplet,
    # loss = D_ap^2 - D_an^2 + 0.5 = 1 - (2 - 2 cos 70) + 0.5 = 2 cos 70 - 0.5.
    angles = torch.tensor([0.0, 60.0, -70.0, 40.0, 180.0]) * math.pi / 180
    emb = torch.stack([angles.cos(), angles.sin()], dim=1)
    labels = torch.tensor([0, 0, 1, 2, 3])
    out, batch = Embedded(emb), Batch(labels)
    mined = SemiHardMiner(margin=0.5)(out, batch)
    assert list(zip(*[t.tolist() for t in mined.indices()], strict=True)) == [(0, 1, 2)]
    loss = TripletLoss(margin=0.5)(out, batch, mined)
    assert loss.item() == pytest.approx(2 * math.cos(math.radians(70)) - 0.5, abs=1e-5)
