"""Shared set-up of the pytorch-metric-learning methods' tests: a small batch and the method."""

from __future__ import annotations

import harness.methods  # noqa: F401
import torch
import torch.nn.functional as F

from harness.core import METHODS, Batch, Embedded, Method, MethodContext

NUM_CLASSES, DIM = 5, 6


def batch(seed: int = 0, per_class: int = 3, classes: int = 4) -> tuple[Embedded, Batch]:
    """L2-normalised embeddings of `classes` of the NUM_CLASSES classes, `per_class` each."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(classes).repeat_interleave(per_class)
    emb = F.normalize(torch.randn(len(labels), DIM, generator=gen, dtype=torch.float64), dim=1)
    return Embedded(emb), Batch(labels)


def build(name: str, **overrides: float) -> Method:
    torch.manual_seed(0)
    spec = METHODS.get(name)
    method = spec.build(MethodContext((8,), DIM, NUM_CLASSES), **spec.hyperparameters(overrides))
    method.loss.double()  # the hand-worked values below are float64
    return method


def loss_of(method: Method, out: Embedded, b: Batch) -> float:
    with torch.no_grad():
        mined = method.miner(out, b) if method.miner else None
    return float(method.loss(out, b, mined).detach())


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.normalize(a, dim=1) @ F.normalize(b, dim=1).T
