"""Device resolution, in one place for the runner, the cost command and the metrics."""

from __future__ import annotations

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
