"""Build a model and train it on a set of training indices, choosing the best epoch on
validation classes when given: the one path that `run` and `tune` share.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.core import RunContext
from harness.data import LabelledImages, contiguous
from harness.evaluate import check_rerank, selection_score
from harness.train.loop import NO_HOOKS, EpochHooks, train
from harness.train.model import Model, build_model
from harness.train.state import Checkpoint, TrainStats
from harness.train.step import TrainingSet


def train_model(
    ctx: RunContext,
    method_name: str,
    hyperparameters: dict[str, Any],
    data: LabelledImages,
    train_idx: np.ndarray,
    validation_idx: np.ndarray | None = None,
    *,
    checkpoint: Checkpoint | None = None,
    hooks: EpochHooks = NO_HOOKS,
) -> tuple[Model, TrainStats]:
    """Build the model for `data[train_idx]` and train it: the one path that `run` and `tune`
    share. With validation indices (never test ones), the protocol's selection metric on them
    is computed after every epoch (and passed to `hooks.on_validation`) and the best epoch
    kept. Raises TrainingFailed."""
    labels = data.labels[train_idx]
    model = build_model(
        ctx, method_name, hyperparameters, in_channels=getattr(data.images, "in_channels", data.images.shape[1]),
        num_classes=len(np.unique(labels)),
        num_coarse_classes=len(data.coarse_names) if data.coarse_names else None,
    )  # fmt: skip
    check_rerank(model.method, ctx.protocol)  # before a step is trained
    validate = None
    if validation_idx is not None and len(validation_idx):
        val_images, val_labels = data.images[validation_idx], data.labels[validation_idx]

        def validate() -> float:
            return selection_score(ctx, model.backbone, model.method, val_images, val_labels)

    coarse = None if data.coarse_labels is None else data.coarse_labels[train_idx]
    training = TrainingSet(data.images[train_idx], contiguous(labels), coarse)
    stats = train(ctx, model, training, checkpoint=checkpoint, validate=validate, hooks=hooks)
    return model, stats
