"""Build a model and train it on a set of training indices, choosing the best epoch on
validation classes when given: the one path that `run` and `tune` share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from harness.core import Protocol
from harness.data import LabelledImages, contiguous
from harness.evaluate import selection_score
from harness.train.loop import train
from harness.train.model import Model, build_model
from harness.train.state import TrainStats


def train_model(
    protocol: Protocol,
    method_name: str,
    hyper: dict[str, Any],
    seed: int,
    device: torch.device,
    data: LabelledImages,
    train_idx: np.ndarray,
    validation_idx: np.ndarray | None = None,
    *,
    on_validation: Callable[[float], None] | None = None,
    weights: str | None = None,
    **train_options: Any,
) -> tuple[Model, TrainStats]:
    """Build the model for `data[train_idx]` and train it: the one path that `run` and `tune`
    share. With validation indices (never test ones), the protocol's selection metric on them
    is computed after every epoch (and passed to `on_validation`) and the best epoch kept.
    `train_options` go to `train` (max_steps, progress, checkpoint, identity, on_epoch_end);
    raises TrainingFailed."""
    labels = data.labels[train_idx]
    model = build_model(
        protocol, method_name, hyper, seed, device, in_channels=data.images.shape[1],
        num_classes=len(np.unique(labels)),
        num_coarse_classes=len(data.coarse_names) if data.coarse_names else None,
        weights=weights,
    )  # fmt: skip
    validate = None
    if validation_idx is not None and len(validation_idx):
        val_images, val_labels = data.images[validation_idx], data.labels[validation_idx]

        def validate() -> float:
            value = selection_score(model.backbone, model.method, val_images, val_labels,
                                    protocol, device, seed)  # fmt: skip
            if on_validation is not None:
                on_validation(value)
            return value

    coarse = None if data.coarse_labels is None else data.coarse_labels[train_idx]
    train_options.setdefault("progress", False)
    stats = train(model.backbone, model.method, data.images[train_idx], contiguous(labels),
                  coarse, protocol, seed, device, validate=validate, **train_options)  # fmt: skip
    return model, stats
