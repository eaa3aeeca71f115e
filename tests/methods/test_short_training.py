"""The library-style baselines (N-pairs, histogram, binomial deviance, triplet + global) lower
their loss in a short training."""

from __future__ import annotations

import harness.methods  # noqa: F401
import pytest
import torch

from harness.core import METHODS, Batch, MethodContext

BASELINES = ["npairs", "histogram", "binomial_deviance", "triplet_global"]


@pytest.mark.parametrize("name", BASELINES)
def test_short_training_lowers_the_loss(name: str):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(8, 16, generator=g)
    labels = torch.arange(8).repeat_interleave(16)
    x = centres[labels] + 0.8 * torch.randn(len(labels), 16, generator=g)
    method = METHODS.get(name).build(MethodContext((16,), 8, 8))

    def batches(seed: int, count: int):
        gen = torch.Generator().manual_seed(seed)
        for _ in range(count):
            chosen = torch.randperm(8, generator=gen)[:4]
            yield torch.cat([torch.nonzero(labels == c).flatten()[:16][torch.randperm(16, generator=gen)[:4]] for c in chosen])  # fmt: skip

    def mean_loss() -> float:
        with torch.no_grad():
            values = []
            for idx in batches(1, 24):
                out, batch = method.head([x[idx]]), Batch(labels[idx])
                values.append(method.loss(out, batch, method.miner(out, batch)).item())
        return sum(values) / len(values)

    optimizer = torch.optim.Adam(method.head.parameters(), lr=3e-3)
    before = mean_loss()
    for idx in batches(2, 200):
        out, batch = method.head([x[idx]]), Batch(labels[idx])
        with torch.no_grad():
            mined = method.miner(out, batch)
        loss = method.loss(out, batch, mined)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = mean_loss()
    assert after < 0.8 * before, (before, after)
