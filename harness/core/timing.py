"""Phase timers for the training step, exact on a GPU without stalling it.

On CUDA a phase is timed by a pair of CUDA events recorded on the stream, so the GPU keeps
running ahead of the Python code; the events are read (one synchronisation) only when the
totals are asked for, e.g. once per epoch. On the CPU a phase is wall-clock time.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class PhaseTimer:
    """Accumulates seconds per named phase (mining, loss, step)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._seconds: dict[str, float] = defaultdict(float)
        self._events: dict[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = defaultdict(list)

    def now(self) -> float:
        """Wall time after everything queued so far has finished."""
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    @property
    def seconds(self) -> dict[str, float]:
        """Totals per phase (reads the recorded CUDA events: synchronises once)."""
        if self.cuda and any(self._events.values()):
            torch.cuda.synchronize()
            for name, pairs in self._events.items():
                self._seconds[name] += sum(s.elapsed_time(e) for s, e in pairs) / 1000.0
                pairs.clear()
        return self._seconds

    def reset(self) -> None:
        """Forget every phase's total (e.g. after warm-up steps that must not count)."""
        self._seconds.clear()
        self._events.clear()

    def total(self, *names: str) -> float:
        """The summed seconds of the named phases (synchronises once on CUDA)."""
        seconds = self.seconds
        return sum(seconds.get(name, 0.0) for name in names)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the enclosed block into the phase `name` (added to its total)."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._events[name].append((start, end))
            return
        begin = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[name] += time.perf_counter() - begin
