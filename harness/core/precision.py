"""Mixed precision: the protocol's `precision` (fp32, bf16 or fp16) for the backbone and the
head, under torch.autocast; mining and losses always see float32 embeddings.

bf16 keeps float32's range, so it needs no loss scaling; fp16 does, through a GradScaler
whose state is part of the training checkpoint (a resumed fp16 run scales as the
uninterrupted one would). Both work on CUDA and on the CPU (where they are slower than
float32 on most processors: they are there so that the CPU path runs the same code).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from harness.core.tuples import Embedded

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@contextlib.contextmanager
def autocast(device: torch.device, precision: str) -> Iterator[None]:
    """Autocast to the precision's dtype on `device`; nothing for fp32."""
    if precision == "fp32":
        yield
        return
    with torch.autocast(device.type, dtype=_DTYPES[precision]):
        yield


def to_float32(out: Embedded) -> Embedded:
    """The head's outputs in float32 (what miners and losses are written and tested for)."""

    def up(t: torch.Tensor) -> torch.Tensor:
        return t.float() if t.is_floating_point() and t.dtype != torch.float64 else t

    return Embedded(up(out.embedding), {k: up(v) for k, v in out.extras.items()})


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler | None:
    """fp16's loss scaler (None for fp32 and bf16)."""
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None
