"""Binomial deviance (Yi et al. 2014): by hand, each side weighted by its count."""

from __future__ import annotations

import math

import harness.methods  # noqa: F401
import pytest
import torch
from harness.methods.binomial_deviance import binomial_deviance

from harness.core import all_pairs

# Four unit vectors in 2-D, classes [0, 0, 1, 1]. Cosines: (0,1) 0.8 and (2,3) 0.8 positive;
# (0,2) 0, (0,3) -0.6, (1,2) 0.6, (1,3) -0.48 + 0.48 = 0 negative.
UNIT4 = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-0.6, 0.8]], dtype=torch.float64)


LABELS4 = torch.tensor([0, 0, 1, 1])


def test_binomial_deviance_by_hand():
    # alpha = 2, beta = 0.5. Positives (m = 1), s = 0.8 twice: log(1 + e^(-2 * 0.3)) = 0.437488
    # each; mean 0.437488. Negatives (m = -C = -25): log(1 + e^(50 (s - 0.5))):
    #   s = 0: log(1 + e^-25) = 1.3888e-11 (twice); s = -0.6: ~0; s = 0.6: log(1 + e^5) = 5.006715
    #   mean over |N| = 4: 1.251679.  L = 0.437488 + 1.251679 = 1.689167
    pairs = all_pairs(LABELS4)
    value = binomial_deviance(UNIT4, pairs, alpha=2.0, beta=0.5, cost=25.0)
    assert value.item() == pytest.approx(1.689167, abs=1e-6)
    # C = 1: negatives log(1 + e^(2 (s - 0.5))) = 0.313262, 0.105083, 0.798139, 0.313262;
    # mean 0.382436, L = 0.819924
    value = binomial_deviance(UNIT4, pairs, alpha=2.0, beta=0.5, cost=1.0)
    assert value.item() == pytest.approx(0.819924, abs=1e-6)
    # cosine similarity: the scale of the embedding does not matter
    scaled = binomial_deviance(UNIT4 * 7, pairs, alpha=2.0, beta=0.5, cost=1.0)
    assert scaled.item() == pytest.approx(0.819924, abs=1e-6)


def test_binomial_deviance_weights_each_side_by_its_count():
    # doubling the negatives (two more copies of class 1's points as class 2) changes |N| but
    # W = 1/|N| keeps each side a mean: one positive pair (0,1) s = 0.8 plus (2,3), (4,5) at 0.8
    emb = torch.cat([UNIT4, UNIT4[2:]])
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    pairs = all_pairs(labels)
    value = binomial_deviance(emb, pairs, alpha=2.0, beta=0.5, cost=1.0).item()
    unit = torch.nn.functional.normalize(emb, dim=1)
    s = (unit[pairs.first] * unit[pairs.second]).sum(1)
    pos = torch.log1p(torch.exp(-2 * (s[pairs.positive] - 0.5))).mean()
    neg = torch.log1p(torch.exp(2 * (s[~pairs.positive] - 0.5))).mean()
    assert value == pytest.approx((pos + neg).item())
    # a batch of one class has no negatives: only the positive mean, still differentiable
    one = all_pairs(torch.zeros(2, dtype=torch.long))
    x = UNIT4[:2].clone().requires_grad_()
    value = binomial_deviance(x, one, alpha=2.0, beta=0.5, cost=25.0)
    value.backward()
    assert value.item() == pytest.approx(math.log(1 + math.exp(-0.6)))
