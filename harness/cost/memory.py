"""How much memory one call takes, and how much the device has free: what the scaling
measurement needs to skip a batch size that would not fit instead of crashing.

On Linux an allocation larger than the machine's memory can succeed (overcommit) and the
process is killed only when it writes to it, so catching "out of memory" is not enough:
pytorch-metric-learning's semi-hard triplet miner builds an m x m x m mask, 64 GB at
m = 4096. The scaling measurement therefore extrapolates each call's peak memory from the
smaller sizes and skips a size whose estimate exceeds a share of what is free.

CPU: the process's peak resident set (VmHWM, reset through /proc/self/clear_refs) above its
resident set before the call, and MemAvailable capped by the cgroup's limit. CUDA: torch's
peak allocated bytes and `torch.cuda.mem_get_info`. Where neither can be read (not Linux),
nothing is estimated (None) and only a failed allocation skips the larger sizes.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from harness.core.devices import host_memory_free

if TYPE_CHECKING:
    import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kb(field: str) -> int | None:
    try:
        found = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), flags=re.M)
    except OSError:
        return None
    return int(found.group(1)) if found else None


def available_bytes(device: torch.device) -> int | None:
    """Memory free for one call on `device` (see the module docstring); None if unknown."""
    import torch

    if device.type == "cuda":  # the driver's free memory, and what torch's cache holds unused
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(torch.cuda.mem_get_info(device)[0]) + cached
    return host_memory_free()


class PeakMemory:
    """`with PeakMemory(device) as peak: call()`, then `peak.bytes`: the most memory the
    call held above what was held before it (None where it cannot be read)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bytes: int | None = None
        self._before: int | None = None

    def __enter__(self) -> PeakMemory:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._before = torch.cuda.memory_allocated(self.device)
            return self
        try:
            _CLEAR_REFS.write_text("5")  # resets VmHWM to the current resident set
        except OSError:
            return self
        rss = _status_kb("VmRSS")
        self._before = None if rss is None else rss * 1024
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        import torch

        if self._before is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak: int | None = torch.cuda.max_memory_allocated(self.device)
        else:
            hwm = _status_kb("VmHWM")
            peak = None if hwm is None else hwm * 1024
        if peak is not None:
            self.bytes = max(0, peak - self._before)
