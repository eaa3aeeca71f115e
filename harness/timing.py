"""Phase timers for the training step; on CUDA they synchronise so a phase is really done."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class PhaseTimer:
    """Accumulates wall seconds per named phase (mining, loss, step)."""

    def __init__(self, device: torch.device) -> None:
        self.synchronize = device.type == "cuda"
        self.seconds: dict[str, float] = defaultdict(float)

    def now(self) -> float:
        if self.synchronize:
            torch.cuda.synchronize()
        return time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = self.now()
        try:
            yield
        finally:
            self.seconds[name] += self.now() - start
