"""Lifted structured embedding (Song et al. 2016, Eq. 4): by hand, against pytorch-metric-learning,
numerically stable, and the distance-matrix form against gathered rows."""

from __future__ import annotations

import math

import harness.methods  # noqa: F401
import pytest
import torch
from gathered_forms import SEEDS, assert_same, random_batch, ref_lifted_loss, value_and_grad
from harness.methods.lifted_structure import lifted_loss, mine_dense_matrix
from pytorch_metric_learning import distances, losses

from harness.core import Batch, Embedded


@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_lifted_structure_matches_the_gathered_form(seed: int, duplicates: bool) -> None:
    emb, labels, _ = random_batch(seed, duplicates, normalize=False)  # not normalised, as trained
    new = value_and_grad(lambda e: lifted_loss(e, labels, 1.0), emb)
    assert_same(new, value_and_grad(lambda e: ref_lifted_loss(e, labels, 1.0), emb))


# Classes 0 and 1 on a 3 x 4 rectangle, class 2 a pair far away (x = 100).
LIFTED_EMB = torch.tensor(
    [[0.0, 0.0], [0.0, 3.0], [4.0, 0.0], [4.0, 3.0], [100.0, 0.0], [100.0, 0.1]],
    dtype=torch.float64,
)


LIFTED_LABELS = torch.tensor([0, 0, 1, 1, 2, 2])


def test_lifted_matches_eq4_by_hand():
    # P = {(0,1), (2,3), (4,5)}, |P| = 3. Pair (0,1): D_01 = 3; negatives of 0 at D = 4, 5,
    # ~100, ~100; of 1 at D = 5, 4, ~100, ~100 (exp(1 - 100) ~ 1e-43, nothing in float64 here).
    # J~_01 = log(2 e^(1-4) + 2 e^(1-5)) + 3 = log(2 e^-3 (1 + e^-1)) + 3 = log(2 (1 + 1/e)).
    # (2,3) is its mirror image: the same value L. Pair (4,5): D_45 = 0.1, its nearest negatives
    # at D ~ 96: J~_45 ~ 1 - 96 + log 4 + 0.1 < 0, so [J~_45]_+ = 0 and it still counts in |P|.
    # J~ = (L^2 + L^2 + 0) / (2 * 3) = L^2 / 3.
    L = math.log(2 * (1 + 1 / math.e))
    loss = lifted_loss(LIFTED_EMB, LIFTED_LABELS, margin=1.0)
    assert loss.item() == pytest.approx(L**2 / 3, rel=1e-9)


def test_lifted_equals_pytorch_metric_learning_with_its_defaults():
    """pytorch-metric-learning 2.9's LiftedStructureLoss (ordered pairs, J^2 / 2 each, plain
    mean) is the same value: 1/(2|P|) sum, whether P is read as ordered or unordered."""
    L = math.log(2 * (1 + 1 / math.e))
    raw = losses.LiftedStructureLoss(distance=distances.LpDistance(normalize_embeddings=False))
    assert raw(LIFTED_EMB, LIFTED_LABELS).item() == pytest.approx(L**2 / 3, rel=1e-9)
    torch.manual_seed(0)  # its defaults normalise the embeddings, as our head does
    emb = torch.nn.functional.normalize(torch.randn(64, 16, dtype=torch.float64), dim=1)
    labels = torch.arange(16).repeat_interleave(4)
    expected = losses.LiftedStructureLoss()(emb, labels).item()
    assert lifted_loss(emb, labels, margin=1.0).item() == pytest.approx(expected, rel=1e-9)


def test_lifted_is_stable_and_counts_the_dense_matrix():
    emb = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.3, 0.4], [50.0, 0.0]], requires_grad=True)
    labels = torch.tensor([0, 0, 1, 1])  # a duplicated point (D = 0) and far negatives
    loss = lifted_loss(emb, labels, margin=1.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(emb.grad).all()
    assert mine_dense_matrix(Embedded(emb), Batch(labels)).evaluated == 4 * 3 // 2
    far = torch.tensor([[0.0, 0.0], [0.0, 0.0], [50.0, 0.0], [50.0, 0.1]])
    assert lifted_loss(far, labels, margin=1.0).item() == 0.0  # J~ ~ 1 - 50 + log 4 < 0
