"""What a run needs to go on: its statistics, the protocol's optimizer and learning-rate
schedule, and the training state that checkpoints itself atomically at every epoch end and
resumes exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from harness.core import Protocol, RunContext, grad_scaler
from harness.data import PKSampler
from harness.train.model import Model
from harness.train.step import parameter_groups, trainable_modules

log = logging.getLogger(__name__)


@dataclass
class TrainStats:
    steps: int = 0
    epochs: float = 0.0
    images: int = 0
    train_seconds: float = 0.0
    mining_seconds: float = 0.0
    loss_seconds: float = 0.0
    tuple_kind: str = ""
    tuples_mined: int = 0
    pair_scores_evaluated: int = 0
    empty_steps: int = 0
    resumed_from_step: int = 0
    epoch_loss: list[float] = field(default_factory=list)
    epoch_seconds: list[float] = field(default_factory=list)
    validation: list[float] = field(default_factory=list)  # selection metric per epoch
    validation_seconds: float = 0.0  # not part of train_seconds
    best_epoch: int = 0  # 1-based; 0 = no selection, the last weights are kept
    data_wait_seconds: float = 0.0  # the step waiting for its batch (part of train_seconds)
    # the wait for the first batch from worker processes: their start-up (part of the wait)
    data_startup_seconds: float = 0.0
    data_workers: int = 0  # processes that prepared the batches (0: the training process)
    decoder: str | None = None  # who decoded image files: "pil" or "torch"; None: in memory
    compiled: bool = False  # the backbone ran through torch.compile (run --compile)

    def summary(self) -> dict[str, object]:
        if self.steps == 0:  # nothing trained: no throughput to report
            return {"steps": 0, "epochs": 0.0, "train_seconds": 0.0, "images_per_second": None,
                    "seconds_per_epoch": None, "mining_seconds": 0.0, "loss_seconds": 0.0}  # fmt: skip
        seconds = max(self.train_seconds, 1e-9)
        return {
            "steps": self.steps,
            "epochs": round(self.epochs, 3),
            "train_seconds": round(self.train_seconds, 3),
            "images_per_second": round(self.images / seconds, 1),
            "seconds_per_epoch": round(self.train_seconds / max(self.epochs, 1e-9), 3),
            "mining_seconds": round(self.mining_seconds, 4),
            "loss_seconds": round(self.loss_seconds, 4),
            "data_wait_seconds": round(self.data_wait_seconds, 4),
            "data_wait_share": round(self.data_wait_seconds / seconds, 4),
            "data_startup_seconds": round(self.data_startup_seconds, 4),
            "data_workers": self.data_workers,
            "decoder": self.decoder,
            "compiled": self.compiled,
        }


def make_optimizer(
    params: list[nn.Parameter] | list[dict[str, Any]], protocol: Protocol
) -> torch.optim.Optimizer:
    """The protocol's optimizer over parameters or groups (harness.train.step.parameter_groups);
    a group's `lr_scale` multiplies the protocol's learning rate."""
    spec = protocol.optimizer
    groups = params if params and isinstance(params[0], dict) else [{"params": params}]
    groups = [{**g, "lr": spec.lr * g.get("lr_scale", 1.0)} for g in groups]
    if spec.name == "sgd":
        return torch.optim.SGD(
            groups, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay
        )
    cls = torch.optim.AdamW if spec.name == "adamw" else torch.optim.Adam
    return cls(groups, lr=spec.lr, weight_decay=spec.weight_decay)


def lr_factor(protocol: Protocol, epoch: float, total_epochs: float) -> float:
    """The schedule's multiplier of the base learning rate at a (fractional) epoch."""
    spec = protocol.schedule
    if spec.name == "step":
        return spec.gamma ** math.floor(epoch / spec.step_epochs)
    if spec.name == "cosine":
        return 0.5 * (1 + math.cos(math.pi * min(epoch / total_epochs, 1.0)))
    return 1.0


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Atomic: a unique temporary file in the same folder, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: Path | None, identity: str) -> dict[str, Any] | None:
    """The checkpoint at `path` if it belongs to this very run (same identity), else None.
    Another configuration's checkpoint (e.g. of an interrupted run with another --max-steps)
    is moved aside, never overwritten: that run may still be resumed from it."""
    if path is None or not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a checkpoint cut short by a crash: start afresh, say so
        log.warning("ignoring unreadable checkpoint %s (%s)", path, exc)
        return None
    if state.get("identity") != identity:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        aside = path.with_name(f"{path.stem}-other-{stamp}-{os.getpid()}{path.suffix}")
        path.replace(aside)
        log.warning("checkpoint %s belongs to another run configuration: kept aside as %s (to "
                    "resume that run, move it back and rerun with its options)", path, aside)  # fmt: skip
        return None
    return state


@dataclass(frozen=True)
class Checkpoint:
    """Where a run's state is saved at every epoch end, and whose state it is: a checkpoint of
    another identity (another configuration of the run) is kept aside, never resumed."""

    path: Path
    identity: str


def run_sampler(labels: np.ndarray, ctx: RunContext) -> PKSampler:
    """The protocol's P x K sampler over a run's (contiguous) training labels, for its seed:
    the sequence of batches a run trains on."""
    spec = ctx.protocol.sampler
    return PKSampler(labels, spec.classes_per_batch, spec.images_per_class, ctx.seed)


class TrainingState:
    """Everything an interrupted run needs to go on exactly where it stopped: the modules,
    the optimizer, the sampler (its RNG included), the torch RNG, the statistics so far and
    the best epoch's weights. It saves, loads and resumes itself."""

    def __init__(self, model: Model, labels: np.ndarray, ctx: RunContext) -> None:
        protocol = ctx.protocol
        self.sampler = run_sampler(labels, ctx)
        self.modules = trainable_modules(model.backbone, model.method)
        self.optimizer = make_optimizer(parameter_groups(model.backbone, model.method), protocol)
        self.scaler = grad_scaler(ctx.device, protocol.precision)  # fp16 only
        self.device = ctx.device
        self.stats = TrainStats()
        self.best_state: dict[str, Any] | None = None

    def state_dict(self, identity: str) -> dict[str, Any]:
        cuda = self.device.type == "cuda"
        return {
            "identity": identity,
            "modules": self.modules.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": None if self.scaler is None else self.scaler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if cuda else None,
            "stats": dataclasses.asdict(self.stats),
            "best_state": self.best_state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.modules.load_state_dict(state["modules"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.sampler.load_state_dict(state["sampler"])
        torch.set_rng_state(state["torch_rng"])
        if self.device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self.stats = TrainStats(**state["stats"])
        self.best_state = state.get("best_state")

    def save(self, checkpoint: Checkpoint) -> None:
        save_checkpoint(checkpoint.path, self.state_dict(checkpoint.identity))

    def resume(self, checkpoint: Checkpoint) -> bool:
        """Load the checkpoint if it is this run's (same identity); True if so."""
        state = load_checkpoint(checkpoint.path, checkpoint.identity)
        if state is None:
            return False
        self.load_state_dict(state)
        self.stats.resumed_from_step = self.stats.steps
        return True

    def keep_if_best(self) -> None:
        """After a validation: remember this epoch's weights if its score is the best yet."""
        scores = self.stats.validation
        if scores[-1] > max(scores[:-1], default=-math.inf):
            self.stats.best_epoch = len(scores)
            self.best_state = {k: v.detach().to("cpu", copy=True)
                               for k, v in self.modules.state_dict().items()}  # fmt: skip

    def restore_best(self) -> None:
        """Leave the best validation epoch's weights in the modules (if any was selected)."""
        if self.best_state is not None:
            self.modules.load_state_dict(self.best_state)
