"""What the training tests of augmentation and precision share: the smoke protocol's tiny
conv4 with a contrastive head, built from the same seed, and an epoch callback that
interrupts a run (to check that its resume is bit-identical)."""

from __future__ import annotations

import os
import signal

import harness.methods  # noqa: F401
import numpy as np
import torch

from harness.backbones import build_backbone
from harness.core import METHODS, MethodContext


def fresh_contrastive(protocol):
    """(backbone, method): seed 0, one input channel, 16-d embedding, 6 classes."""
    torch.manual_seed(0)
    backbone = build_backbone(protocol.backbone, 1)
    method = METHODS.get("contrastive").build(MethodContext(tuple(backbone.stage_dims), 16, 6))
    return backbone, method


def tiny_images(size: int = 16) -> tuple[torch.Tensor, np.ndarray]:
    """(images, labels): 48 random one-channel uint8 images of size x size (seed 0), 6
    classes of 8, for those models."""
    images = torch.randint(0, 255, (48, 1, size, size), generator=torch.Generator().manual_seed(0),
                           dtype=torch.uint8)  # fmt: skip
    return images, np.repeat(np.arange(6), 8)


def crash_after_epoch_2(epoch: int) -> None:
    """on_epoch_end: interrupt the run as Ctrl-C would, after its second epoch."""
    if epoch == 2:
        raise KeyboardInterrupt


class DiesInAWorker:
    """Images whose loading kills the data worker process that loads them, as the system's
    out-of-memory killer would (a class here, so that spawned workers can unpickle it)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, idx):
        return self

    def load(self) -> torch.Tensor:
        if torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.zeros((8, 1, 4, 4), dtype=torch.uint8)
