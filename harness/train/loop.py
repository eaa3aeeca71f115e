"""The training loop: a short loop over `harness.train.step.TrainingStep` under the protocol's budget.

No branch here knows which method it trains; everything method-specific comes through the
Method contract. The state a run needs to go on (modules, optimizer, sampler, RNG, best
weights, counters) is one `TrainingState`, checkpointed atomically at the end of every epoch,
so an interrupted run resumes where it stopped and ends with the same numbers as an
uninterrupted one. Epoch-end work (loss read-back, validation and selection, checkpoint,
log, callback) lives in named functions of `_Session`, this call's unsaved bookkeeping.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from harness.core import HarnessError, Protocol, RunContext, TrainingFailed
from harness.data import Augment, Feeder, TrainPipeline, default_workers, worker_death
from harness.data.cached import ViewPicker
from harness.train.distributed import check_same_step, convert_batchnorm
from harness.train.model import Model
from harness.train.state import Checkpoint, TrainingState, TrainStats, lr_factor
from harness.train.step import StepResult, TrainingSet, TrainingStep

log = logging.getLogger(__name__)

# A miner that finds nothing for this many consecutive steps has stopped training the model.
MAX_EMPTY_STEPS = 50
# Losses stay on the device and are read back (one synchronisation on a GPU) every this many
# steps and at every epoch end; a non-finite loss is still reported with its exact step.
LOSS_READBACK_STEPS = 20


class _Session:
    """This call's bookkeeping, not saved: the timer, losses not yet read back, the running
    epoch's sums, the progress bar, and the clock that train_seconds is measured by."""

    def __init__(
        self, state: TrainingState, step: TrainingStep, feeder: Feeder, protocol: Protocol,
        total: int, progress: bool,
    ) -> None:  # fmt: skip
        self.state, self.step, self.protocol, self.total = state, step, protocol, total
        self.feeder, self.wait_before = feeder, state.stats.data_wait_seconds
        self.startup_before = state.stats.data_startup_seconds
        self.per_epoch = state.sampler.batches_per_epoch
        stats = state.stats
        self.timer = step.timer
        self.timer.seconds["mining"], self.timer.seconds["loss"] = (
            stats.mining_seconds, stats.loss_seconds
        )  # fmt: skip
        self.elapsed = stats.train_seconds  # of the sessions before a resume
        self.validation_seconds = 0.0  # validation seconds since this call started
        self.running, self.in_epoch, self.consecutive_empty = 0.0, 0, 0
        self.pending: list[torch.Tensor] = []  # this window's losses, still on the device
        # disable=None: a bar only on a terminal (a log file gets the per-epoch lines alone)
        self.bar = tqdm(total=total, initial=stats.steps, desc="train", unit="step",
                        disable=None if progress else True, leave=False)  # fmt: skip
        self.start = self.timer.now()
        self.epoch_start = time.perf_counter()
        self.epoch_counts = (stats.images, stats.tuples_mined, stats.data_wait_seconds)

    def set_learning_rate(self, step: int) -> None:
        factor = lr_factor(self.protocol, step / self.per_epoch, self.total / self.per_epoch)
        for group in self.state.optimizer.param_groups:
            group["lr"] = self.protocol.optimizer.lr * factor * group.get("lr_scale", 1.0)

    def train_step(self, step: int, idx: torch.Tensor, images: torch.Tensor) -> None:
        """One step at the schedule's learning rate, counted; the empty-step policy."""
        self.set_learning_rate(step)
        result = self.step(idx, step % LOSS_READBACK_STEPS == 0, images, step)
        self.count(result)
        self.pending.append(result.loss)
        if result.trained:
            self.consecutive_empty = 0
        else:
            self.state.stats.empty_steps += 1
            self.consecutive_empty += 1
            if self.consecutive_empty >= MAX_EMPTY_STEPS:
                raise TrainingFailed(
                    f"the miner found no tuples for {self.consecutive_empty} consecutive steps "
                    f"(until step {step}): nothing left to train on"
                )
        self.state.stats.steps += 1
        self.state.stats.images += result.images
        self.in_epoch += 1
        self.bar.update(1)

    def count(self, result: StepResult) -> None:
        if result.mined is not None:
            stats = self.state.stats
            stats.tuple_kind = type(result.mined).__name__.lower()
            stats.tuples_mined += result.tuples
            stats.pair_scores_evaluated += result.mined.evaluated

    def is_epoch_end(self, step: int) -> bool:
        return (step + 1) % self.per_epoch == 0 or step == self.total - 1

    def read_back(self, step: int) -> None:
        """The window's losses to the host (one synchronisation); a non-finite one fails the
        run with its exact step."""
        values = torch.stack(self.pending).float().cpu().tolist()
        bad = next((n for n, v in enumerate(values) if not math.isfinite(v)), None)
        if bad is not None:
            at = step + 1 - len(values) + bad
            raise TrainingFailed(
                f"loss became {values[bad]} at step {at} (epoch {at / self.per_epoch:.2f})"
            )
        self.running += sum(values)
        self.pending.clear()
        self.bar.set_postfix(epoch=f"{(step + 1) / self.per_epoch:.1f}",
                             loss=f"{sum(values) / len(values):.4f}", refresh=False)  # fmt: skip

    def record_times(self) -> None:
        """Training seconds (validation excluded), phase seconds and epochs into the stats."""
        stats = self.state.stats
        stats.data_wait_seconds = self.wait_before + self.feeder.wait
        stats.data_startup_seconds = self.startup_before + self.feeder.startup
        stats.train_seconds = self.elapsed + self.timer.now() - self.start - self.validation_seconds
        stats.mining_seconds = self.timer.seconds["mining"]
        stats.loss_seconds = self.timer.seconds["loss"]
        stats.epochs = stats.steps / self.per_epoch

    def close_epoch(self) -> float:
        """The epoch's mean loss and seconds into the stats; returns the epoch's seconds."""
        seconds = time.perf_counter() - self.epoch_start
        self.state.stats.epoch_loss.append(self.running / self.in_epoch)
        self.state.stats.epoch_seconds.append(seconds)
        self.record_times()
        return seconds

    def validate(self, validate: Callable[[], float]) -> None:
        """Score the epoch on the validation split; keep its weights if they are the best."""
        begin = time.perf_counter()
        self.state.stats.validation.append(float(validate()))
        self.state.stats.validation_seconds += time.perf_counter() - begin
        self.validation_seconds += time.perf_counter() - begin
        self.state.modules.train()  # validation embedded in eval mode
        self.state.keep_if_best()

    def log_epoch(self, step: int, seconds: float) -> None:
        stats = self.state.stats
        done = (step + 1) / self.total
        eta = stats.train_seconds * (1 - done) / done
        log.info("epoch %d/%d  loss %.4f  %.1fs  eta %.0fs", len(stats.epoch_loss),
                 math.ceil(self.total / self.per_epoch), stats.epoch_loss[-1], seconds, eta)  # fmt: skip

    def next_epoch(self) -> None:
        self.running, self.in_epoch, self.epoch_start = 0.0, 0, time.perf_counter()
        stats = self.state.stats
        self.epoch_counts = (stats.images, stats.tuples_mined, stats.data_wait_seconds)

    def epoch_values(self, seconds: float) -> dict[str, float]:
        """This epoch's numbers for a tracker: mean loss, each parameter group's learning
        rate, tuples mined, the share of its seconds spent waiting for data, images per
        second, and the validation score when there is one."""
        stats = self.state.stats
        images, tuples, wait = self.epoch_counts
        seconds = max(seconds, 1e-9)
        values = {"train/loss": stats.epoch_loss[-1],
                  "train/tuples_mined": float(stats.tuples_mined - tuples),
                  "train/data_wait_share": (stats.data_wait_seconds - wait) / seconds,
                  "train/images_per_second": (stats.images - images) / seconds}  # fmt: skip
        for n, group in enumerate(self.state.optimizer.param_groups):
            values[f"train/lr_group{n}"] = float(group["lr"])
        if len(stats.validation) == len(stats.epoch_loss):  # validated this epoch
            values[f"validation/{self.protocol.evaluation.select_by}"] = stats.validation[-1]
        return values

    def explain(self, exc: Exception) -> None:
        """A non-finite loss not yet read back may be what made a later step fail: say so."""
        values = torch.stack(self.pending).float().cpu() if self.pending else torch.zeros(0)
        if not torch.isfinite(values).all():
            raise TrainingFailed(
                f"the loss became non-finite, then training failed: {exc}"
            ) from exc


def check_compile(device: torch.device) -> None:
    """Stop with a one-line HarnessError, before any step, when torch.compile's inductor
    cannot work on `device`: on the CPU it compiles C++ (a compiler, $CXX or g++), on CUDA it
    writes Triton kernels. Without the check the first step dies deep in inductor. The
    processor stand-in (ATEN_CPU_CAPABILITY) is refused too: inductor's CPU code then computes
    garbage (a plain torch.compile of a small conv net under ATEN_CPU_CAPABILITY=avx2 on an
    AVX-512 CPU indexes out of bounds; the harness's runs got NaN losses)."""
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            raise HarnessError("--compile on CUDA needs Triton (pip install triton): install it "
                               "or drop --compile")  # fmt: skip
    elif not shutil.which(os.environ.get("CXX", "g++")) and not shutil.which("c++"):
        raise HarnessError("--compile needs a C++ compiler (g++) on the CPU: install one or "
                           "drop --compile")  # fmt: skip
    elif os.environ.get("ATEN_CPU_CAPABILITY"):  # torch 2.14.1 on an AVX-512 CPU: NaN losses
        raise HarnessError("--compile on the CPU does not work with ATEN_CPU_CAPABILITY set (the "
                           "compiled code then reads wrong indices): unset it or drop --compile")  # fmt: skip


def compiled(backbone: nn.Module, device: torch.device) -> nn.Module:
    """The backbone through torch.compile (inductor), for the training step only: a wrapper
    that shares the module's parameters, so the optimizer, the checkpoints (no `_orig_mod.`
    keys), validation and the final evaluation keep using the eager module itself. Rounding
    differs from eager by float-rounding amounts; the first steps include the compilation."""
    check_compile(device)
    return torch.compile(backbone)


def total_steps(protocol: Protocol, per_epoch: int, max_steps: int | None) -> int:
    """The protocol's budget in steps, capped by max_steps."""
    total = protocol.budget.steps or protocol.budget.epochs * per_epoch
    return total if max_steps is None else min(total, max_steps)


@dataclass(frozen=True)
class EpochHooks:
    """What a caller hears at each epoch end: the validation score (tuning's pruner reads
    it, and may stop the trial by raising), the number of the epoch just finished (a Ray
    worker reports it to the driver) and, for a tracker, the global step with the epoch's
    numbers (`_Session.epoch_values`)."""

    on_validation: Callable[[float], None] | None = None
    on_epoch_end: Callable[[int], None] | None = None
    on_epoch_stats: Callable[[int, dict[str, float]], None] | None = None


NO_HOOKS = EpochHooks()


def _end_epoch(
    session: _Session,
    step: int,
    checkpoint: Checkpoint | None,
    validate: Callable[[], float] | None,
    hooks: EpochHooks,
) -> None:
    """Epoch end: statistics, validation and selection, log, checkpoint, callbacks."""
    seconds = session.close_epoch()
    if validate is not None:
        session.validate(validate)
        if hooks.on_validation is not None:
            hooks.on_validation(session.state.stats.validation[-1])
    session.log_epoch(step, seconds)
    if hooks.on_epoch_stats is not None:  # before the checkpoint: a resume redoes, not skips
        hooks.on_epoch_stats(step + 1, session.epoch_values(seconds))
    last = step >= session.total - 1  # the last one is never resumed; rank 0 writes for all
    if checkpoint is not None and not last and session.step.dist.is_main:
        session.state.save(checkpoint)
    if hooks.on_epoch_end is not None:
        hooks.on_epoch_end(len(session.state.stats.epoch_loss))
    session.next_epoch()


def _batches(
    state: TrainingState, feeder: Feeder, total: int
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """(step, indices, images) from the current step to `total`: each epoch's indices drawn
    from the sampler at the epoch's start (the sampler state a checkpoint saves is the
    epoch end's), their images prepared by the feeder."""
    n, per_epoch = state.stats.steps, state.sampler.batches_per_epoch
    while n < total:
        end = min(total, (n // per_epoch + 1) * per_epoch)
        keys = [(m, state.sampler.next_batch()) for m in range(n, end)]
        yield from feeder.batches(keys)
        n = end


def train(
    ctx: RunContext,
    model: Model,
    data: TrainingSet,
    *,
    checkpoint: Checkpoint | None = None,
    validate: Callable[[], float] | None = None,
    hooks: EpochHooks = NO_HOOKS,
) -> TrainStats:
    """Train the model in place on `data` under the protocol's budget (capped by the context's
    max_steps).

    With `checkpoint`, the state is saved there after every epoch and, if a checkpoint of the
    same identity exists, training resumes from it. With `validate` (the selection metric on
    the validation split, higher is better), it is called after every epoch and the best
    epoch's weights are the ones left in the modules at the end. The protocol's train
    augmentation is applied to every batch; the context's `workers` processes prepare the
    batches (None: harness.data.pipeline.default_workers). With the context's `compile`, the
    training step runs the backbone through torch.compile (checkpoints and weights stay the
    module's own).
    """
    if not model.method.trains:
        return TrainStats()
    session = _start(ctx, model, data, checkpoint)
    try:
        for n, idx, batch in _batches(session.state, session.feeder, session.total):
            session.train_step(n, idx, batch)
            epoch_end = session.is_epoch_end(n)
            if epoch_end or len(session.pending) >= LOSS_READBACK_STEPS:
                session.read_back(n)
            if epoch_end:
                _end_epoch(session, n, checkpoint, validate, hooks)
        session.record_times()  # before the workers stop: their shutdown is not training
    except TrainingFailed:
        raise
    except Exception as exc:
        session.explain(exc)
        death = worker_death(exc)  # a data worker killed while the step computed
        if death is not None:
            raise death from None
        raise
    finally:
        session.bar.close()
        session.feeder.close()
    session.state.restore_best()
    return session.state.stats


def train_augmentation(ctx: RunContext) -> Augment | None:
    """The protocol's train augmentation for this run's seed (None when it has none); under a
    frozen, cached trunk, the choice of one cached view per image."""
    if ctx.protocol.features.cached:
        return ViewPicker(ctx.seed)
    ops = ctx.protocol.augmentation.train
    return TrainPipeline(ops, ctx.seed) if ops else None


@dataclass
class Training:
    """The parts one call of `train` runs: the run's state (sampler, optimizer, scaler,
    statistics), the ONE training step, the feeder of its batches and the budget's total
    steps. `train` loops over them; the cost command times these very parts (no second
    setup of its own), so what it measures is what trains."""

    state: TrainingState
    step: TrainingStep
    feeder: Feeder
    total: int

    def batches(self, until: int | None = None) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """(step, indices, images) from the state's step to `until` (default: the budget's
        total), drawn and prepared as the loop takes them."""
        return _batches(self.state, self.feeder, self.total if until is None else until)

    def close(self) -> None:
        """Stop the feeder's worker processes."""
        self.feeder.close()


def start_training(
    ctx: RunContext,
    model: Model,
    data: TrainingSet,
    checkpoint: Checkpoint | None = None,
    *,
    split_backward: bool = False,
) -> Training:
    """The run's state (resumed from its checkpoint when there is one of this very run), its
    training step and the feeder of its batches, the modules in training mode. Under
    torchrun each rank trains its shard of every batch, with batch statistics over the whole
    batch. `split_backward`: the step times the loss's own backward as part of its "loss"
    phase (see TrainingStep; the same gradients)."""
    if ctx.dist.world_size > 1:  # before the optimizer is made
        convert_batchnorm(model.backbone)
        convert_batchnorm(model.method.head)
    state = TrainingState(model, data.labels, ctx)
    total = total_steps(ctx.protocol, state.sampler.batches_per_epoch, ctx.max_steps)
    if checkpoint is not None and state.resume(checkpoint):
        log.info("resuming from %s at step %d/%d", checkpoint.path, state.stats.steps, total)
    if ctx.dist.world_size > 1:
        check_same_step(state.stats.steps, ctx.device)
    augment = train_augmentation(ctx)
    state.stats.compiled = ctx.compile
    if ctx.compile:
        model = dataclasses.replace(model, backbone=compiled(model.backbone, ctx.device))
    step = TrainingStep(model, state.optimizer, data, ctx, augment=augment, scaler=state.scaler,
                        split_backward=split_backward)  # fmt: skip
    feeder = run_feeder(ctx, data.images, augment)
    state.stats.data_workers = feeder.workers
    state.stats.decoder = getattr(data.images, "decoder", None)
    state.modules.train()
    return Training(state, step, feeder, total)


def run_feeder(ctx: RunContext, images: Any, augment: Augment | None) -> Feeder:
    """The feeder of a run's batches: the context's `workers` processes (None:
    harness.data.default_workers), pinned memory on CUDA, this rank's shard of each batch."""
    workers = default_workers(images, augment) if ctx.workers is None else ctx.workers
    return Feeder(images, augment, workers, ctx.device.type == "cuda", ctx.dist)


def _start(
    ctx: RunContext, model: Model, data: TrainingSet, checkpoint: Checkpoint | None
) -> _Session:
    """The loop's parts (start_training) and this call's bookkeeping around them."""
    parts = start_training(ctx, model, data, checkpoint)
    return _Session(parts.state, parts.step, parts.feeder, ctx.protocol, parts.total,
                    ctx.progress)  # fmt: skip
