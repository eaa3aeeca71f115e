"""The pair AUC (Mann-Whitney) by hand and against scikit-learn, and the pairs it is taken on."""

from __future__ import annotations

import math

import pytest
import torch
from sklearn.metrics import roc_auc_score

from harness.core import euclidean_score, sample_pairs
from harness.core.pair_auc import rank_auc


def test_rank_auc_by_hand():
    # positives 0.9, 0.4, 0.6 against negatives 0.6, 0.1: of the 6 couples the positive wins
    # (0.9, 0.6), (0.9, 0.1), (0.4, 0.1), (0.6, 0.1), loses (0.4, 0.6) and ties (0.6, 0.6):
    # (4 + 0.5) / 6 = 0.75
    scores = torch.tensor([0.9, 0.4, 0.6, 0.1, 0.6])
    positive = torch.tensor([True, True, False, False, True])
    assert rank_auc(scores, positive) == pytest.approx(0.75)
    assert rank_auc(-scores, positive) == pytest.approx(0.25)  # reversed: 1.5 / 6
    assert rank_auc(torch.ones(5), positive) == pytest.approx(0.5)  # all tied
    assert math.isnan(rank_auc(scores, torch.ones(5, dtype=torch.bool)))  # no negative


def test_rank_auc_matches_scikit_learn():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 20, (500,), generator=gen).double()  # many ties
    positive = torch.rand(500, generator=gen) < 0.2
    assert rank_auc(scores, positive) == pytest.approx(roc_auc_score(positive, scores))


def test_small_split_lists_every_pair():
    labels = torch.tensor([0, 0, 0, 1, 1, 2])
    pairs = sample_pairs(labels)
    assert (pairs.positives_in_split, pairs.negatives_in_split) == (4, 11)
    found = sorted(zip(pairs.first.tolist(), pairs.second.tolist(), strict=True))
    assert found == [(a, b) for a in range(6) for b in range(a + 1, 6)]
    assert torch.equal(pairs.positive, labels[pairs.first] == labels[pairs.second])
    assert int(pairs.positive.sum()) == 4
    # -D on points of three well-separated classes: every positive pair is closer
    emb = torch.tensor([[0, 0.0], [0, 0.1], [0.1, 0], [5, 5], [5, 5.1], [-5, 5]])
    assert pairs.auc(euclidean_score, emb) == 1.0


def test_large_split_keeps_every_positive_and_samples_negatives_by_a_fixed_seed():
    labels = torch.arange(2400) // 16  # the default protocol's test split: 150 x 16
    pairs = sample_pairs(labels)
    assert pairs.positives_in_split == 150 * 120 and int(pairs.positive.sum()) == 18_000
    assert pairs.negatives_in_split == 2400 * 2399 // 2 - 18_000
    assert len(pairs.first) == 18_000 + 200_000 and (pairs.first < pairs.second).all()
    assert torch.equal(pairs.positive, labels[pairs.first] == labels[pairs.second])
    again = sample_pairs(labels)
    assert torch.equal(pairs.first, again.first) and torch.equal(pairs.second, again.second)
    few = sample_pairs(torch.arange(40) // 20, limit=10)  # 380 positive pairs, 10 kept
    assert int(few.positive.sum()) == 10 and len(few.positive) == 20
    kept = set(zip(few.first[few.positive].tolist(), few.second[few.positive].tolist(),
                   strict=True))  # fmt: skip
    assert len(kept) == 10  # without replacement
