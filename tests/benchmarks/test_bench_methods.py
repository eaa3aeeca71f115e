"""Micro-benchmarks of every registered method's miner and loss (forward + backward) at a few
batch sizes, on random L2-normalised embeddings of P x 4 batches.

Skipped by the default test command (`--benchmark-skip` in pyproject.toml); run them with
`pytest tests/benchmarks --benchmark-only` (add `--benchmark-compare` to compare runs).
"""

from __future__ import annotations

import harness.methods  # noqa: F401  (registers the methods)
import pytest
import torch

from harness.core import METHODS, Batch, Embedded, Method, MethodContext

K = 4
SIZES = (64, 256)
DIM = 64
CTX = MethodContext(stage_dims=(DIM,), embedding_dim=DIM, num_classes=max(SIZES) // K,
                    num_coarse_classes=8)  # fmt: skip


def _build(name: str) -> Method:
    torch.manual_seed(0)
    method = METHODS.get(name).build(CTX)
    if not method.trains:
        pytest.skip(f"{name} has no loss")
    return method


def _inputs(method: Method, m: int) -> tuple[Embedded, Batch]:
    gen = torch.Generator().manual_seed(m)
    labels = torch.arange(m // K).repeat_interleave(K)
    coarse = (torch.arange(m // K) % max(2, m // K // 4)).repeat_interleave(K)
    with torch.no_grad():
        out = method.head([torch.rand(m, DIM, generator=gen)])
    return out, Batch(labels, coarse)


def _leaf(out: Embedded) -> Embedded:
    def leaf(t: torch.Tensor) -> torch.Tensor:
        return t.detach().requires_grad_(True) if t.is_floating_point() else t

    return Embedded(leaf(out.embedding), {k: leaf(v) for k, v in out.extras.items()})


@pytest.mark.parametrize("m", SIZES)
@pytest.mark.parametrize("name", METHODS.names())
def test_bench_miner(benchmark, name: str, m: int):
    method = _build(name)
    if method.miner is None:
        pytest.skip(f"{name} has no miner")
    out, batch = _inputs(method, m)

    def mine():
        with torch.no_grad():
            return method.miner(out, batch)

    mined = benchmark.pedantic(mine, rounds=5, warmup_rounds=1)
    benchmark.extra_info.update(evaluated=int(mined.evaluated), tuples=int(mined.count()))


@pytest.mark.parametrize("m", SIZES)
@pytest.mark.parametrize("name", METHODS.names())
def test_bench_loss_forward_backward(benchmark, name: str, m: int):
    method = _build(name)
    out, batch = _inputs(method, m)
    with torch.no_grad():
        mined = method.miner(out, batch) if method.miner is not None else None

    def setup():
        return (_leaf(out),), {}

    def step(leaf: Embedded) -> float:
        loss = method.loss(leaf, batch, mined)
        if loss.requires_grad:
            loss.backward()
        return loss

    loss = benchmark.pedantic(step, setup=setup, rounds=5, warmup_rounds=1)
    assert torch.isfinite(loss.detach())
