"""Circle loss (Sun et al. 2020, Eq. 6 with the self-paced weights of Eq. 5), by hand per
anchor over every pair of the batch, averaged over anchors with a non-zero loss."""

from __future__ import annotations

import math

import pytest
from pml_cases import batch, build, cosine, loss_of


def circle_by_hand(emb, labels, m=0.4, gamma=80.0) -> float:
    s = cosine(emb, emb)
    losses = []
    for i in range(len(labels)):
        pos = [float(s[i, k]) for k in range(len(labels)) if k != i and labels[k] == labels[i]]
        neg = [float(s[i, k]) for k in range(len(labels)) if labels[k] != labels[i]]
        lp = [-gamma * max(1 + m - v, 0) * (v - (1 - m)) for v in pos]
        ln = [gamma * max(v + m, 0) * (v - m) for v in neg]
        lse = math.log(sum(math.exp(v) for v in lp)) + math.log(sum(math.exp(v) for v in ln))
        losses.append(math.log1p(math.exp(lse)))
    nonzero = [v for v in losses if v > 0]
    return sum(nonzero) / len(nonzero)


@pytest.mark.parametrize("seed", [0, 6])
def test_circle_is_eq_6(seed: int):
    method = build("circle")
    out, b = batch(seed)
    assert method.miner(out, b).count() == 12 * 11  # every ordered pair, as PML takes them
    assert loss_of(method, out, b) == pytest.approx(
        circle_by_hand(out.embedding, b.labels), rel=1e-9
    )
