"""Multi-Similarity: the miner's two rules (Eq. 8-9 of Wang et al. 2019) and the loss (Eq. 10)
per anchor, by hand on cosine similarities."""

from __future__ import annotations

import math

import pytest
from pml_cases import batch, build, cosine, loss_of


def ms_by_hand(emb, labels, alpha=2.0, beta=50.0, lam=0.5, eps=0.1) -> tuple[float, int]:
    s = cosine(emb, emb)
    m, total, kept = len(labels), 0.0, 0
    for i in range(m):
        pos = [k for k in range(m) if k != i and labels[k] == labels[i]]
        neg = [k for k in range(m) if labels[k] != labels[i]]
        hardest_pos, hardest_neg = min(s[i, k] for k in pos), max(s[i, k] for k in neg)
        neg_kept = [k for k in neg if s[i, k] + eps > hardest_pos]  # Eq. 8
        pos_kept = [k for k in pos if s[i, k] - eps < hardest_neg]  # Eq. 9
        kept += len(pos_kept) + len(neg_kept)
        total += 1 / alpha * math.log(1 + sum(math.exp(-alpha * (s[i, k] - lam)) for k in pos_kept))
        total += 1 / beta * math.log(1 + sum(math.exp(beta * (s[i, k] - lam)) for k in neg_kept))
    return total / m, kept


@pytest.mark.parametrize("seed", [0, 3])
def test_multi_similarity_mines_and_weighs_as_the_paper(seed: int):
    method = build("multi_similarity")
    out, b = batch(seed, per_class=4)
    expected, kept = ms_by_hand(out.embedding, b.labels)
    assert method.miner(out, b).count() == kept
    assert loss_of(method, out, b) == pytest.approx(expected, rel=1e-9)
