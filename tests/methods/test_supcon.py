"""Supervised contrastive loss (Khosla et al. 2020, L^sup_out, Eq. 2), by hand."""

from __future__ import annotations

import math

import pytest
from pml_cases import batch, build, cosine, loss_of


def supcon_by_hand(emb, labels, tau=0.1) -> float:
    s = cosine(emb, emb)
    m, total = len(labels), 0.0
    for i in range(m):
        others = [a for a in range(m) if a != i]
        log_denominator = math.log(sum(math.exp(float(s[i, a]) / tau) for a in others))
        pos = [p for p in others if labels[p] == labels[i]]
        total += -sum(float(s[i, p]) / tau - log_denominator for p in pos) / len(pos)
    return total / m


def test_supcon_is_l_sup_out():
    method = build("supcon")
    out, b = batch(7)
    assert loss_of(method, out, b) == pytest.approx(
        supcon_by_hand(out.embedding, b.labels), rel=1e-9
    )
