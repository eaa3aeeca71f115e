"""Device resolution and the host's free memory, in one place for the runner, the cost
command and the metrics."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from harness.core.errors import HarnessError


def resolve_device(device: str | torch.device | None = "auto", like: object = None) -> torch.device:
    """The torch device for a name: "auto" is CUDA when a GPU is visible, else the CPU; None
    is the device of ``like`` (a tensor) or the CPU; anything else is parsed by torch.device.
    Asking for CUDA without a visible GPU, or for an unknown name, is a HarnessError."""
    if device is None:
        return like.device if isinstance(like, torch.Tensor) else torch.device("cpu")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise HarnessError(
            f"unknown device {device!r}; use auto, cpu or cuda (or e.g. 'cuda:0')"
        ) from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise HarnessError(
            f"--device {device} was asked for but no CUDA GPU is visible; use --device cpu"
        )
    return resolved


def _cgroup_free() -> int | None:
    """Bytes left under this container's cgroup (v2) memory limit; None without one."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - used)


def host_memory_free() -> int | None:
    """Bytes of host memory a process can still take: MemAvailable, capped by the container's
    cgroup limit; None where neither can be read (not Linux)."""
    try:
        found = re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(),
                          flags=re.M)  # fmt: skip
    except OSError:
        found = None
    free = [int(found.group(1)) * 1024] if found else []
    free += [b for b in [_cgroup_free()] if b is not None]
    return min(free) if free else None
