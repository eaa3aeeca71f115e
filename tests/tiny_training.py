"""What the training tests of augmentation and precision share: the smoke protocol's tiny
conv4 with a contrastive head, built from the same seed, and an epoch callback that
interrupts a run (to check that its resume is bit-identical)."""

from __future__ import annotations

import torch

import methods  # noqa: F401
from harness.backbones import build_backbone
from harness.method import METHODS, MethodContext


def fresh_contrastive(protocol):
    """(backbone, method): seed 0, one input channel, 16-d embedding, 6 classes."""
    torch.manual_seed(0)
    backbone = build_backbone(protocol.backbone, 1)
    method = METHODS.get("contrastive").build(MethodContext(tuple(backbone.stage_dims), 16, 6))
    return backbone, method


def crash_after_epoch_2(epoch: int) -> None:
    """on_epoch_end: interrupt the run as Ctrl-C would, after its second epoch."""
    if epoch == 2:
        raise KeyboardInterrupt
