"""One model builder: seed -> backbone -> MethodContext -> method -> device.

The runner and the cost command build their models here, so a method is timed on exactly
the model it is trained on. The order matters for the numbers: the seed fixes the backbone's
initialisation (the same for every method), and the method's head draws its initial weights
from the RNG right after the backbone, as every committed result was made.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from harness.backbones import Backbone, FrozenTrunkTail, build_backbone
from harness.core import METHODS, Method, MethodContext, RunContext


@dataclass
class Model:
    """A backbone and a method on the device, and the context the method was built for."""

    backbone: Backbone
    method: Method
    context: MethodContext | None = None  # None: a model put together by hand (tests, cost)


def seed_everything(seed: int) -> None:
    """Bit-identical reruns: deterministic kernels (without them, multi-threaded CPU kernels
    and cuDNN may sum in a different order from run to run), then torch's and numpy's
    global RNGs seeded."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(seed)
    np.random.seed(seed)


def build_method(
    method_name: str, context: MethodContext, hyperparameters: dict[str, Any], device: torch.device
) -> Method:
    """The registered method built for `context`, its head and loss moved to the device."""
    method = METHODS.get(method_name).build(context, **hyperparameters)
    method.head.to(device)
    if method.loss is not None:
        method.loss.to(device)
    return method


def build_seeded_backbone(ctx: RunContext, in_channels: int) -> Backbone:
    """Seed (see seed_everything), then the protocol's backbone on the run's device; the
    context's `weights` (a local ImageNet weights file) overrides backbone.weights_file.
    Under a frozen, cached trunk (protocol `features:`) only the stages after it."""
    seed_everything(ctx.seed)  # the same backbone initialisation for every method
    spec = ctx.protocol.backbone
    if ctx.weights:
        spec = dataclasses.replace(spec, weights_file=ctx.weights)
    backbone = build_backbone(spec, in_channels)
    if ctx.protocol.features.cached:
        backbone = FrozenTrunkTail(backbone, ctx.protocol.features.frozen_stages)
    return backbone.to(ctx.device)


def build_model(
    ctx: RunContext,
    method_name: str,
    hyperparameters: dict[str, Any],
    *,
    in_channels: int,
    num_classes: int,
    num_coarse_classes: int | None,
) -> Model:
    """Seed, then the protocol's backbone on the device, then the method for it.

    in_channels: image channels; num_classes: training classes (a classifier head's rows);
    num_coarse_classes: the dataset's coarse classes, None if it has none.
    """
    backbone = build_seeded_backbone(ctx, in_channels)
    context = MethodContext(
        stage_dims=tuple(backbone.stage_dims),
        embedding_dim=ctx.protocol.embedding_dim,
        num_classes=num_classes,
        num_coarse_classes=num_coarse_classes,
    )
    method = build_method(method_name, context, hyperparameters, ctx.device)
    return Model(backbone, method, context)
