"""Margin loss (Wu et al. 2017, Eq. 3) on given triplets, by hand, with a learned beta per
class; the distance-weighted sampler never draws a negative beyond the non-zero-loss cutoff."""

from __future__ import annotations

import pytest
import torch
from pml_cases import batch, build

from harness.core import Triplets


def test_margin_loss_is_eq_3_over_the_nonzero_terms():
    method = build("margin")
    out, b = batch(8)
    beta = method.loss.loss.beta.detach()
    assert beta.shape == (5,) and torch.allclose(beta, torch.full((5,), 1.2, dtype=beta.dtype))
    assert method.loss.loss.beta.requires_grad
    a, p, n = torch.tensor([0, 3, 6, 9]), torch.tensor([1, 4, 7, 10]), torch.tensor([3, 0, 0, 6])
    x = out.embedding
    d_ap, d_an = (x[a] - x[p]).norm(dim=1), (x[a] - x[n]).norm(dim=1)
    by = beta[b.labels[a]]  # the anchor's class's beta
    terms = torch.cat([(0.2 + d_ap - by).clamp(min=0), (0.2 - (d_an - by)).clamp(min=0)])
    expected = float(terms.sum() / (terms > 0).sum())
    got = float(method.loss(out, b, Triplets(0, a, p, n)).detach())
    assert got == pytest.approx(expected, rel=1e-9)


def test_distance_weighted_sampling_skips_zero_loss_negatives():
    method = build("margin")
    out, b = batch(9, per_class=4)
    torch.manual_seed(0)
    with torch.no_grad():
        mined = method.miner(out, b)
    assert mined.count() > 0 and type(mined) is Triplets
    x = out.embedding
    assert torch.all((x[mined.anchor] - x[mined.negative]).norm(dim=1) < 1.4)
    assert torch.all(b.labels[mined.anchor] == b.labels[mined.positive])
    assert torch.all(b.labels[mined.anchor] != b.labels[mined.negative])
