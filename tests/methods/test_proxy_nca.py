"""ProxyNCA and ProxyNCA++'s loss side against the NCA formula over proxies, by hand."""

from __future__ import annotations

import math

import pytest
import torch.nn.functional as F
from pml_cases import NUM_CLASSES, batch, build, loss_of


def proxy_nca_by_hand(emb, labels, proxies, scale: float) -> float:
    """mean_i -log(exp(-s d2(x_i, p_y)) / sum_z exp(-s d2(x_i, p_z))), unit vectors."""
    x, p = F.normalize(emb, dim=1), F.normalize(proxies, dim=1)
    total = 0.0
    for i in range(len(labels)):
        d2 = [float(((x[i] - p[z]) ** 2).sum()) for z in range(NUM_CLASSES)]
        denominator = sum(math.exp(-scale * d) for d in d2)
        total += -math.log(math.exp(-scale * d2[int(labels[i])]) / denominator)
    return total / len(labels)


@pytest.mark.parametrize("name, scale", [("proxy_nca", 1.0), ("proxy_nca_pp", 9.0)])
def test_proxy_nca_is_nca_over_proxies(name: str, scale: float):
    method = build(name)
    out, b = batch(1)
    proxies = method.loss.loss.proxies.detach()
    assert loss_of(method, out, b) == pytest.approx(
        proxy_nca_by_hand(out.embedding, b.labels, proxies, scale), rel=1e-9
    )


def test_proxy_nca_pp_moves_its_proxies_fast():
    assert build("proxy_nca_pp").loss_lr_multiplier == 100
    assert build("proxy_nca").loss_lr_multiplier == 1
