"""Shared pair-loss pieces (methods/_pair_losses.py): the global loss by hand, the m x m distance
matrix against row differences, float32 forms, and finite gradients at zero distance."""

from __future__ import annotations

import harness.methods  # noqa: F401
import pytest
import torch
from gathered_forms import (
    SEEDS,
    TOL,
    random_batch,
    ref_contrastive_pair_loss,
    ref_lifted_loss,
    ref_quadruplet_euclidean,
    ref_triplet_global,
)
from harness.methods._pair_losses import (
    distance_matrix,
    global_loss,
    pair_values,
    squared_distance_matrix,
)
from harness.methods.contrastive import ContrastiveLoss
from harness.methods.lifted_structure import lifted_loss
from harness.methods.triplet_global import TripletGlobalLoss, all_triplets

from harness.core import METHODS, Batch, Embedded, MethodContext, all_pairs


def test_global_loss_by_hand() -> None:
    # d+ = {0.2, 0.4}: mean 0.3, var ((0.1)^2 + (0.1)^2)/2 = 0.01
    # d- = {0.5, 0.9, 1.0}: mean 0.8, var (0.09 + 0.01 + 0.04)/3 = 0.046667
    # gap [0.3 - 0.8 + 0.7]_+ = 0.2, weight 0.5 -> 0.1; total 0.01 + 0.046667 + 0.1
    pos = torch.tensor([0.2, 0.4])
    neg = torch.tensor([0.5, 0.9, 1.0])
    value = global_loss(pos, neg, margin=0.7, mean_weight=0.5)
    assert value.item() == pytest.approx(0.156667, abs=1e-5)
    # a wide enough gap leaves only the variances
    assert global_loss(pos, neg, margin=0.1, mean_weight=0.5).item() == pytest.approx(
        0.056667, abs=1e-5
    )


def test_global_loss_empty_side_is_finite_and_differentiable() -> None:
    pos = torch.tensor([0.2, 0.4], requires_grad=True)
    value = global_loss(pos, torch.empty(0), margin=1.0, mean_weight=1.0)
    value.backward()
    assert value.item() == pytest.approx(0.01)
    assert torch.isfinite(pos.grad).all()


@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_distance_matrices_match_the_differences(seed: int, duplicates: bool) -> None:
    emb, _, _ = random_batch(seed, duplicates, normalize=False)
    diff = emb[:, None] - emb[None]
    squared = diff.pow(2).sum(-1)
    torch.testing.assert_close(squared_distance_matrix(emb), squared, **TOL)
    torch.testing.assert_close(distance_matrix(emb, exact_zero=True), squared.sqrt(), **TOL)
    assert (distance_matrix(emb).diagonal() == 1e-6).all()
    assert (distance_matrix(emb, exact_zero=True).diagonal() == 0).all()
    first, second = torch.triu_indices(len(emb), len(emb), offset=1)
    assert torch.equal(pair_values(squared, first, second), squared[first, second])


@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_float32_losses_match_the_gathered_forms(seed: int, duplicates: bool) -> None:
    """In the training dtype the values agree to 1e-6 as well (gradients may differ where a
    hinge is within float32 rounding of 0, so they are compared in float64 above)."""
    emb, labels, _ = random_batch(seed, duplicates)
    emb, raw = emb.float(), random_batch(seed, duplicates, normalize=False)[0].float()
    pairs = all_pairs(labels)
    triplets = all_triplets(Embedded(emb), Batch(labels))
    q = (
        METHODS.get("quadruplet_euclidean")
        .build(MethodContext((8,), 8, 6))
        .miner(Embedded(emb), Batch(labels))
    )
    per_pair = ref_contrastive_pair_loss(emb, pairs.first, pairs.second, pairs.positive, 1.0)
    cases = [
        (ContrastiveLoss(1.0)(Embedded(emb), Batch(labels), pairs), per_pair.mean() / 2),
        (lifted_loss(raw, labels, 1.0), ref_lifted_loss(raw, labels, 1.0)),
        (TripletGlobalLoss(0.2, 0.4, 1.0)(Embedded(emb), Batch(labels), triplets),
         ref_triplet_global(emb, triplets)),
        (METHODS.get("quadruplet_euclidean").build(MethodContext((8,), 8, 6)).loss(
            Embedded(emb), Batch(labels), q), ref_quadruplet_euclidean(emb, q)),
    ]  # fmt: skip
    for new, ref in cases:
        assert new.dtype == torch.float32
        torch.testing.assert_close(new, ref, **TOL)


@pytest.mark.parametrize("name", ["contrastive", "lifted_structure", "triplet_global",
                                  "hdc_contrastive", "quadruplet_euclidean", "quadruplet_method2"])  # fmt: skip
def test_identical_embeddings_give_finite_gradients(name: str) -> None:
    """Every distance of the batch is 0 (the diagonal's case everywhere): no NaN gradient."""
    method = METHODS.get(name).build(MethodContext((8, 8, 8), 8, 6, 3))
    labels = torch.arange(24) // 4
    emb = torch.full((24, 8), 8**-0.5, requires_grad=True)
    extras = {f"head{k}": emb for k in (1, 2, 3)}
    extras |= {"fine_logits": torch.zeros(24, 6), "coarse_logits": torch.zeros(24, 3)}
    out, batch = Embedded(emb, extras), Batch(labels, labels % 3)
    with torch.no_grad():
        mined = method.miner(out, batch)
    method.loss(out, batch, mined).backward()
    assert torch.isfinite(emb.grad).all()
