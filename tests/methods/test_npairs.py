"""N-pairs (Sohn 2016): the miner's pairs and the loss by hand and against pytorch-metric-learning."""

from __future__ import annotations

import math

import harness.methods  # noqa: F401
import pytest
import torch
from harness.methods.npairs import npair_tuples, npairs_loss
from pytorch_metric_learning import distances, losses

from harness.core import METHODS, Batch, Embedded, MethodContext

# P = 2 classes x K = 4, interleaved: class 0 at 0, 2, 4, 6 and class 1 at 1, 3, 5, 7.
NPAIR_EMB = torch.tensor(
    [[1, 0], [0, 1], [1, 1], [-1, 1], [2, 0], [0, 1], [1, 0], [0, 2]], dtype=torch.float64
)


NPAIR_LABELS = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])


def test_npair_miner_cuts_each_class_into_consecutive_pairs():
    # class 0: (0, 2), (4, 6); class 1: (1, 3), (5, 7). Tuple 0 = the first pair of each
    # class, tuple 1 = the second: N = 2 per tuple, 2 x 2^2 = 8 inner products.
    pairs = npair_tuples(Embedded(NPAIR_EMB), Batch(NPAIR_LABELS))
    assert list(zip(pairs.first.tolist(), pairs.second.tolist(), strict=True)) == [
        (0, 2), (1, 3), (4, 6), (5, 7)
    ]  # fmt: skip
    assert pairs.evaluated == 8 and bool(pairs.positive.all())
    # an odd class size leaves its last image out; a singleton class gives no pair
    odd = npair_tuples(Embedded(NPAIR_EMB[:7]), Batch(torch.tensor([0, 0, 0, 1, 1, 2, 2])))
    assert list(zip(odd.first.tolist(), odd.second.tolist(), strict=True)) == [
        (0, 1), (3, 4), (5, 6)
    ]  # fmt: skip
    assert npair_tuples(Embedded(NPAIR_EMB[:2]), Batch(torch.tensor([0, 1]))).count() == 0


def test_npairs_loss_matches_sohn_by_hand():
    # Tuple 0: anchors f0 = (1,0), f1 = (0,1); positives f2 = (1,1), f3 = (-1,1).
    #   f0: f0.f2 = 1, f0.f3 = -1 -> log(1 + e^(-1-1)) = log(1 + e^-2)
    #   f1: f1.f3 = 1, f1.f2 = 1  -> log(1 + e^0) = log 2
    # Tuple 1: anchors f4 = (2,0), f5 = (0,1); positives f6 = (1,0), f7 = (0,2).
    #   f4: f4.f6 = 2, f4.f7 = 0 -> log(1 + e^-2);  f5: f5.f7 = 2, f5.f6 = 0 -> log(1 + e^-2)
    # (f4 against tuple 0's positive f2 would give f4.f2 = 2: tuples must not mix.)
    # L = (3 log(1 + e^-2) + log 2) / 4 = 0.2717...
    # Regulariser: anchors' squared norms 1, 1, 4, 1 (mean 7/4), positives' 2, 2, 1, 4
    # (mean 9/4): 0.002 / 4 * (7/4 + 9/4) = 0.002.
    n_pair = (3 * math.log(1 + math.exp(-2)) + math.log(2)) / 4
    pairs = npair_tuples(Embedded(NPAIR_EMB), Batch(NPAIR_LABELS))
    a, p = NPAIR_EMB[pairs.first], NPAIR_EMB[pairs.second]
    anchor_labels = NPAIR_LABELS[pairs.first]
    assert npairs_loss(a, p, anchor_labels, 0.0).item() == pytest.approx(n_pair, rel=1e-12)
    assert npairs_loss(a, p, anchor_labels, 0.002).item() == pytest.approx(n_pair + 0.002)
    method = METHODS.get("npairs").build(MethodContext((2,), 2, 2))
    assert method.loss(Embedded(NPAIR_EMB), Batch(NPAIR_LABELS), pairs).item() == pytest.approx(
        n_pair + 0.002
    )


def test_npairs_equals_pytorch_metric_learning_on_one_pair_per_class():
    """With K = 2 there is one tuple, which is what NPairsLoss computes, once told not to
    normalise the embeddings (its default DotProductSimilarity does, unlike the paper)."""
    torch.manual_seed(0)
    emb = torch.randn(12, 5, dtype=torch.float64)
    labels = torch.arange(6).repeat_interleave(2)
    pairs = npair_tuples(Embedded(emb), Batch(labels))
    ours = npairs_loss(emb[pairs.first], emb[pairs.second], labels[pairs.first], 0.0)
    raw = losses.NPairsLoss(distance=distances.DotProductSimilarity(normalize_embeddings=False))
    assert ours.item() == pytest.approx(raw(emb, labels).item(), rel=1e-9)


def test_npairs_head_is_not_normalised():
    method = METHODS.get("npairs").build(MethodContext((4,), 3, 2))
    out = method.head([torch.full((2, 4), 10.0)])
    assert out.embedding.norm(dim=1).max() > 1.5  # a plain fc layer, as in the paper
