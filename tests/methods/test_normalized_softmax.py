"""Normalized softmax (Zhai & Wu 2019): cross-entropy over cos(x, w_c) / T, by hand."""

from __future__ import annotations

import math

import pytest
from pml_cases import batch, build, cosine, loss_of


def test_normalized_softmax_is_cross_entropy_over_cosines_at_temperature():
    method = build("normalized_softmax")
    out, b = batch(4)
    cos = cosine(out.embedding, method.loss.loss.W.detach().T)
    expected = 0.0
    for i, y in enumerate(b.labels.tolist()):
        logits = [float(c) / 0.05 for c in cos[i]]
        expected += -(logits[y] - math.log(sum(math.exp(v) for v in logits)))
    assert loss_of(method, out, b) == pytest.approx(expected / len(b.labels), rel=1e-9)
