"""ArcFace and CosFace: softmax cross-entropy over s cos(theta), the target class's angle
widened by m (ArcFace) or its cosine lowered by m (CosFace), by hand."""

from __future__ import annotations

import math

import pytest
import torch
from pml_cases import batch, build, cosine, loss_of


def margin_softmax_by_hand(emb, labels, weights, target) -> float:
    """mean_i -log softmax(s cos theta_i with the target logit replaced)_{y_i}."""
    cos = cosine(emb, weights)
    total = 0.0
    for i, y in enumerate(labels.tolist()):
        logits = [64 * float(c) for c in cos[i]]
        logits[y] = 64 * target(float(cos[i, y]))
        total += -(logits[y] - math.log(sum(math.exp(v) for v in logits)))
    return total / len(labels)


@pytest.mark.parametrize(
    "name, target",
    [("arcface", lambda c: math.cos(math.acos(c) + math.radians(28.6))),
     ("cosface", lambda c: c - 0.35)],
)  # fmt: skip
def test_margin_softmax_is_the_papers(name, target):
    method = build(name)
    out, b = batch(2)
    weights = method.loss.loss.W.detach().T  # [classes, dim]
    expected = margin_softmax_by_hand(out.embedding, b.labels, weights, target)
    assert loss_of(method, out, b) == pytest.approx(expected, rel=1e-7)
    assert torch.is_tensor(method.loss.loss.W) and method.loss.loss.W.requires_grad
