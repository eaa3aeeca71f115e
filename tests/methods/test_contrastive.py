"""Contrastive loss (Hadsell et al. 2006; Eq. 1 of Song et al. 2016): hand-worked batches, the
quadratic pair count, and the distance-matrix form against the gathered-row form."""

from __future__ import annotations

import harness.methods  # noqa: F401
import pytest
import torch
from gathered_forms import (
    SEEDS,
    assert_same,
    random_batch,
    ref_contrastive_pair_loss,
    value_and_grad,
)
from harness.methods.contrastive import ContrastiveLoss

from harness.core import Batch, Embedded, Pairs, all_pairs


def test_contrastive_matches_eq1_by_hand():
    # pairs: (0,1) positive, D = 5 -> 25; (0,2) negative, D = 1 -> [2 - 1]^2 = 1;
    # (1,2) negative, D = sqrt(9 + 9) > 2 -> 0.  J = (25 + 1 + 0) / (2 * 3) = 26 / 6
    emb = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]])
    labels = torch.tensor([0, 0, 1])
    pairs = all_pairs(labels)
    assert pairs.evaluated == 3 and pairs.positive.tolist() == [True, False, False]
    loss = ContrastiveLoss(margin=2.0)(Embedded(emb), Batch(labels), pairs)
    assert loss.item() == pytest.approx(26 / 6)


def test_contrastive_all_pairs_is_quadratic_in_batch_size():
    for m in (8, 16, 32):
        pairs = all_pairs(torch.arange(m) // 4)
        assert pairs.count() == m * (m - 1) // 2
        assert isinstance(pairs, Pairs)


@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_contrastive_matches_the_gathered_form(seed: int, duplicates: bool) -> None:
    emb, labels, _ = random_batch(seed, duplicates)
    pairs = all_pairs(labels)
    loss = ContrastiveLoss(1.0)

    def ref(e):
        per_pair = ref_contrastive_pair_loss(e, pairs.first, pairs.second, pairs.positive, 1.0)
        return per_pair.sum() / (2 * len(per_pair))

    new = value_and_grad(lambda e: loss(Embedded(e), Batch(labels), pairs), emb)
    assert_same(new, value_and_grad(ref, emb))
