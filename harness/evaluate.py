"""Embed a split with the trained model and score it with the harness's metric definitions."""

from __future__ import annotations

import time

import numpy as np
import torch

from harness.backbones import Backbone
from harness.method import Method
from harness.metrics import compute_metrics
from harness.protocol import Protocol


@torch.no_grad()
def embed(
    backbone: Backbone, method: Method, images: torch.Tensor, device: torch.device, batch_size: int
) -> torch.Tensor:
    """Retrieval embeddings [N, D] (float32, on `device`) in eval mode."""
    backbone.eval()
    method.head.eval()
    chunks = []
    for start in range(0, len(images), batch_size):
        x = backbone.prepare(images[start : start + batch_size].to(device, non_blocking=True))
        chunks.append(method.head(backbone(x)).embedding.float())
    return torch.cat(chunks)


def evaluate(
    backbone: Backbone,
    method: Method,
    images: torch.Tensor,
    labels: np.ndarray,
    protocol: Protocol,
    device: torch.device,
    seed: int,
) -> tuple[dict[str, float], dict[str, float]]:
    """All-vs-all retrieval on one split: (metrics, timings)."""
    start = time.perf_counter()
    embeddings = embed(backbone, method, images, device, protocol.evaluation.batch_size)
    embed_seconds = time.perf_counter() - start
    if method.loss is not None:
        method.loss.eval()  # a learned scorer (e.g. a PDDM unit) must not apply dropout
    metrics = compute_metrics(
        embeddings,
        torch.as_tensor(labels),
        recall_ks=tuple(protocol.evaluation.recall_ks),
        metrics=_expand(protocol),
        scorer=method.scorer,
        seed=seed,
        device=device,
    )
    timings = {
        "embed_seconds": round(embed_seconds, 3),
        "eval_seconds": round(time.perf_counter() - start, 3),
    }
    return metrics, timings


def _expand(protocol: Protocol) -> list[str]:
    names = []
    for name in protocol.evaluation.metrics:
        if name == "recall@K":
            names += [f"recall@{k}" for k in protocol.evaluation.recall_ks]
        else:
            names.append(name)
    return names
