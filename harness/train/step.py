"""ONE training step: batch -> backbone -> head -> miner -> loss -> backward -> optimizer.

The training loop (`harness.train`), the cost command's throughput measurement and, through
`train`, its overhead measurement all call `TrainingStep`, so what is timed is what trains.
Mining and the loss are timed as phases of a `PhaseTimer` (CUDA events on a GPU, so timing
does not stall it). Nothing here knows which method it trains: everything method-specific
comes through the Method contract. The learning-rate schedule, the loss read-back and the
empty-step policy belong to the loop that calls the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from harness.core import (
    Batch,
    Embedded,
    Method,
    Mined,
    PhaseTimer,
    RunContext,
    autocast,
    to_float32,
)
from harness.data import Augment, load_batch
from harness.train.distributed import average_gradients, gather_embedded
from harness.train.model import Model


@dataclass
class StepResult:
    """What one step did. `loss` is detached and still on the device (reading it back is a
    synchronisation on a GPU: the loop does it in windows)."""

    loss: torch.Tensor
    mined: Mined | None
    trained: bool  # False: an empty step (no gradient, or the miner found no tuples)
    images: int  # the whole batch (under torchrun: all ranks' shards together)
    tuples: int = 0  # mined.count(), counted once per step


@dataclass(frozen=True)
class TrainingSet:
    """What a run trains on: uint8 images [N, C, S, S] (a tensor, or a LazyImages that decodes
    files batch by batch) at the protocol's load size, their contiguous training-class ids
    (0 .. classes - 1) and the dataset's coarse ids (None when it has none)."""

    images: Any
    labels: np.ndarray
    coarse_labels: np.ndarray | None = None


def trainable_modules(backbone: nn.Module, method: Method) -> nn.ModuleList:
    """The modules one optimizer updates, in a fixed order (their state_dict keys depend on
    it): backbone, head, then the loss's own parameters if it has any."""
    return nn.ModuleList([m for m in (backbone, method.head, method.loss) if m is not None])


def parameter_groups(backbone: nn.Module, method: Method) -> list[dict[str, Any]]:
    """The trainable parameters as optimizer groups: all at the protocol's learning rate, or,
    when the method asks (Method.loss_lr_multiplier), the loss's own parameters (proxies,
    class weights) in a second group at that multiple; `lr_scale` carries the multiple."""
    params = [p for p in trainable_modules(backbone, method).parameters() if p.requires_grad]
    scale = float(method.loss_lr_multiplier)
    own = [p for p in method.loss.parameters() if p.requires_grad] if method.loss else []
    if scale == 1.0 or not own:
        return [{"params": params, "lr_scale": 1.0}]
    mine = {id(p) for p in own}
    rest = [p for p in params if id(p) not in mine]
    return [{"params": rest, "lr_scale": 1.0}, {"params": own, "lr_scale": scale}]


def detach_outputs(
    out: Embedded, every_float: bool
) -> tuple[Embedded, list[torch.Tensor], list[torch.Tensor]]:
    """The head's outputs detached into leaves that require grad, so a loss's backward stops
    there and can be timed alone. `every_float`: every float tensor (outputs made under
    no_grad), else only those that carry a gradient. Returns (leaf Embedded, the originals,
    their leaves)."""
    originals: list[torch.Tensor] = []
    leaves: list[torch.Tensor] = []

    def leaf(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point() or not (every_float or t.requires_grad):
            return t
        new = t.detach().requires_grad_(True)
        originals.append(t)
        leaves.append(new)
        return new

    embedded = Embedded(leaf(out.embedding), {k: leaf(v) for k, v in out.extras.items()})
    return embedded, originals, leaves


class TrainingStep:
    """One optimisation step on a batch of training-set indices.

    The model trains on `data` (its images on any device: each batch is moved) at the run
    context's device, precision and place among torchrun's ranks; `augment` is the protocol's
    train augmentation (None: none), `scaler` fp16's loss scaler.
    With `split_backward`, the backward is split at the head's outputs, so the "loss" phase
    holds the loss's forward and its own backward (the same gradients reach the parameters);
    the cost command uses it to report what mining + loss cost within a whole step.
    The model's backbone may be torch.compile's wrapper of the module (`run --compile`, see
    harness.train.compiled): the step only calls it and its `prepare`, and the wrapper's
    parameters are the module's own.
    """

    def __init__(
        self,
        model: Model,
        optimizer: torch.optim.Optimizer,
        data: TrainingSet,
        ctx: RunContext,
        *,
        augment: Augment | None = None,
        scaler: torch.amp.GradScaler | None = None,
        timer: PhaseTimer | None = None,
        split_backward: bool = False,
    ) -> None:
        self.backbone, self.method, self.optimizer = model.backbone, model.method, optimizer
        self.images, self.device = data.images, ctx.device
        self.labels = torch.as_tensor(data.labels, device=ctx.device)
        self.coarse = (
            None
            if data.coarse_labels is None
            else torch.as_tensor(data.coarse_labels, device=ctx.device)
        )
        self.timer = timer if timer is not None else PhaseTimer(ctx.device)
        self.split_backward = split_backward
        self.dist = ctx.dist
        self.augment = augment
        self.precision, self.scaler = ctx.precision, scaler
        self.params = [p for p in trainable_modules(self.backbone, self.method).parameters()]

    def batch(
        self, idx: torch.Tensor, images: torch.Tensor | None = None, step: int = 0
    ) -> tuple[torch.Tensor, Batch]:
        """The prepared images of the batch `idx` (CPU indices; distributed: this rank's shard
        of it) and the labels of the whole batch, on the device. `images`: the shard already
        loaded and augmented (by the training loop's Feeder), else it is loaded here."""
        if images is None:
            images = load_batch(self.images, self.augment, step, idx, self.dist)
        x = self.backbone.prepare(images.to(self.device, non_blocking=True))
        idx_dev = idx.to(self.device, non_blocking=True)
        coarse = None if self.coarse is None else self.coarse[idx_dev]
        return x, Batch(self.labels[idx_dev], coarse)

    def __call__(
        self,
        idx: torch.Tensor,
        check_indices: bool = False,
        images: torch.Tensor | None = None,
        step: int = 0,
    ) -> StepResult:
        """Train on the batch `idx` (at training step `step`: the augmentation's draws).
        `check_indices`: also range-check the miner's indices (a read-back, so a
        synchronisation on a GPU: the loop asks for it every few steps)."""
        assert self.method.loss is not None, "a method without a loss does not train"
        x, batch = self.batch(idx, images, step)
        with autocast(self.device, self.precision):
            out = self.method.head(self.backbone(x))
        if self.precision != "fp32":  # mining and losses in float32
            out = to_float32(out)
        if self.dist.active:  # the whole batch's embeddings, as one process would have them
            out = gather_embedded(out)
        originals: list[torch.Tensor] = []
        leaves: list[torch.Tensor] = []
        if self.split_backward:
            out, originals, leaves = detach_outputs(out, every_float=False)
        mined: Mined | None = None
        if self.method.miner is not None:
            with self.timer.phase("mining"), torch.no_grad():
                mined = self.method.miner(out, batch)
            mined.check(len(idx), indices=check_indices)
        with self.timer.phase("loss"):
            loss = self.method.loss(out, batch, mined)
        self.optimizer.zero_grad(set_to_none=True)
        tuples = 0 if mined is None else mined.count()
        trained = bool(loss.requires_grad and (mined is None or tuples > 0))
        if trained:
            self._backward(loss if self.scaler is None else self.scaler.scale(loss), originals,
                           leaves)  # fmt: skip
            if self.dist.active:
                average_gradients(self.params)
            if self.scaler is None:
                self.optimizer.step()
            else:  # fp16: unscale, skip the step on inf/NaN gradients, adapt the scale
                self.scaler.step(self.optimizer)
                self.scaler.update()
        return StepResult(loss.detach(), mined, trained, len(idx), tuples)

    def _backward(
        self, loss: torch.Tensor, originals: list[torch.Tensor], leaves: list[torch.Tensor]
    ) -> None:
        if not self.split_backward:
            loss.backward()
            return
        with self.timer.phase("loss"):  # the loss's own backward, down to the head's outputs
            loss.backward()
        grads = [(o, g.grad) for o, g in zip(originals, leaves, strict=True) if g.grad is not None]
        if grads:
            torch.autograd.backward([o for o, _ in grads], [g for _, g in grads])
