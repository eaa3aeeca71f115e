"""Proxy-Anchor against Eq. 4 of Kim et al. 2020, written out per proxy; proxies train 100x."""

from __future__ import annotations

import math

import pytest
import torch
from pml_cases import NUM_CLASSES, batch, build, cosine, loss_of

from harness.core import load_protocol
from harness.train import make_optimizer, parameter_groups


def proxy_anchor_by_hand(emb, labels, proxies, alpha: float, delta: float) -> float:
    s = cosine(emb, proxies)
    present = sorted(set(labels.tolist()))
    pos = sum(math.log(1 + sum(math.exp(-alpha * (s[i, p] - delta)) for i in range(len(labels))
                                if labels[i] == p)) for p in present)  # fmt: skip
    neg = sum(math.log(1 + sum(math.exp(alpha * (s[i, p] + delta)) for i in range(len(labels))
                                if labels[i] != p)) for p in range(NUM_CLASSES))  # fmt: skip
    return pos / len(present) + neg / NUM_CLASSES


@pytest.mark.parametrize("seed", [0, 1])
def test_proxy_anchor_is_eq_4(seed: int):
    method = build("proxy_anchor")
    out, b = batch(seed)
    proxies = method.loss.loss.proxies.detach()
    expected = proxy_anchor_by_hand(out.embedding, b.labels, proxies, alpha=32, delta=0.1)
    assert loss_of(method, out, b) == pytest.approx(expected, rel=1e-9)
    assert method.miner is None  # nothing mined: the proxies are the anchors


def test_proxies_train_at_100x_the_learning_rate():
    torch.manual_seed(0)
    method = build("proxy_anchor")
    backbone = torch.nn.Linear(8, 8)
    protocol = load_protocol("smoke")
    optimizer = make_optimizer(parameter_groups(backbone, method), protocol)
    lrs = [g["lr"] for g in optimizer.param_groups]
    assert lrs == [protocol.optimizer.lr, 100 * protocol.optimizer.lr]
    assert optimizer.param_groups[1]["params"] == [method.loss.loss.proxies]
