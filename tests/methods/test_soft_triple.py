"""SoftTriple (Qian et al. 2019): the relaxed similarity to each class (Eq. 7), the margin
and scale in the cross-entropy (Eq. 8) and the center regulariser (Eq. 13), by hand."""

from __future__ import annotations

import math

import pytest
import torch
from pml_cases import NUM_CLASSES, batch, build, loss_of

K, LA, GAMMA, DELTA, TAU = 10, 20.0, 0.1, 0.01, 0.2


def soft_triple_by_hand(emb, labels, centers) -> float:
    w = torch.nn.functional.normalize(centers, dim=0)  # [dim, C*K], column c*K+k
    x = torch.nn.functional.normalize(emb, dim=1)
    total = 0.0
    for i, y in enumerate(labels.tolist()):
        logits = []
        for c in range(NUM_CLASSES):
            sims = [float(x[i] @ w[:, c * K + k]) for k in range(K)]
            weights = [math.exp(v / GAMMA) for v in sims]
            s_ic = sum(a * v for a, v in zip(weights, sims, strict=True)) / sum(weights)  # Eq. 7
            logits.append(LA * (s_ic - (DELTA if c == y else 0.0)))
        total += -(logits[y] - math.log(sum(math.exp(v) for v in logits)))
    reg = 0.0
    for c in range(NUM_CLASSES):
        for t in range(K):
            for u in range(t + 1, K):
                dot = float(w[:, c * K + t] @ w[:, c * K + u])
                reg += math.sqrt(2.0 + 1e-5 - 2 * dot)  # PML's 1e-5 keeps the root finite
    return total / len(labels) + TAU * reg / (NUM_CLASSES * K * (K - 1))


def test_soft_triple_is_eq_8_with_the_center_regulariser():
    method = build("soft_triple")
    out, b = batch(5)
    expected = soft_triple_by_hand(out.embedding, b.labels, method.loss.inner.loss.fc.detach())
    assert loss_of(method, out, b) == pytest.approx(expected, rel=1e-9)
    assert method.loss_lr_multiplier == 100
    assert [p.shape for p in method.loss.parameters()] == [(6, NUM_CLASSES * K)]  # one copy
