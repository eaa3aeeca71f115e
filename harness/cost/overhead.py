"""Harness overhead: `harness.train.train` against a hand-written loop doing the same steps
on the same model and batches, alternated, as a throughput ratio (target >= 0.95).

`_bare_loop` is the reference the harness is measured against: the one training loop of
`cost/` written out by hand (plain PyTorch), it must stay independent of the harness's
training step (`harness.train.step`). What it trains on is the harness's own: the model
`harness.train.build_model` made, the batches the loop's sampler draws and its feeder
prepares (`harness.train.start_training`), grouped in `BareInputs`. torch is imported
inside the functions, so building the CLI parser stays fast.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import os
import statistics
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core import Batch, Embedded, PhaseTimer
from harness.train import (
    Checkpoint,
    Model,
    TrainingSet,
    make_optimizer,
    parameter_groups,
    save_checkpoint,
    start_training,
    train,
)

if TYPE_CHECKING:
    import torch

    from harness.core import Method, Protocol, RunContext

OVERHEAD_ROUNDS = 7
OVERHEAD_MAX_STEPS = 100
OVERHEAD_TARGET = 0.95
# The pieces of the harness's bookkeeping that `_bare_loop` can add one at a time.
OVERHEAD_PIECES = ("item", "check", "timers", "progress", "lr", "checkpoint")


def overhead_method(measured: list[str], asked: str | None = None) -> str | None:
    """The method the overhead is measured on: `asked` (--overhead-method) if given, else the
    first method whose throughput was measured; None when there is none."""
    if asked is not None:
        return asked
    return measured[0] if measured else None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Progress bars to /dev/null and the training log off while the harness loop is timed
    (the bar is still drawn: its cost is measured; one log line per epoch is not)."""
    train_log = logging.getLogger("harness.train.loop")
    level = train_log.level
    train_log.setLevel(logging.WARNING)
    with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):
        try:
            yield
        finally:
            train_log.setLevel(level)


@dataclass(frozen=True)
class BareInputs:
    """What the bare loop trains on, ready before its clock starts: `images` in memory,
    indexed by each batch, or (a list) each batch's images already prepared on the device;
    the labels and coarse labels on the device; the batches' indices; the protocol (its
    precision and optimizer) and the device; and, for the "checkpoint" piece, where to save
    its state at every `per_epoch`-th step."""

    images: Any
    labels: torch.Tensor
    coarse: torch.Tensor | None
    batches: list[torch.Tensor]
    protocol: Protocol
    device: torch.device
    checkpoint: Path | None = None
    per_epoch: int = 0


def _bare_loop(
    backbone: torch.nn.Module, method: Method, inputs: BareInputs,
    extras: frozenset[str] = frozenset(),
) -> None:  # fmt: skip
    """The training step written out by hand in plain PyTorch, nothing else, on every batch
    of `inputs`. The backbone and head run under autocast in the protocol's precision, the
    loss in float32, as the harness's step does. `extras` adds the harness's bookkeeping one
    piece at a time, to find what costs: "item" (the loss read back every step), "check"
    (the miner's index check and counts), "timers" (PhaseTimer around mining and loss),
    "progress" (a tqdm bar updated every step), "lr" (the schedule set every step),
    "checkpoint" (the state saved at each epoch end)."""
    import torch
    from torch import nn
    from tqdm import tqdm

    modules = nn.ModuleList([m for m in (backbone, method.head, method.loss) if m is not None])
    optimizer = make_optimizer(parameter_groups(backbone, method), inputs.protocol)
    modules.train()
    timer = PhaseTimer(inputs.device)
    phase = timer.phase if "timers" in extras else (lambda name: contextlib.nullcontext())
    bar = tqdm(total=len(inputs.batches), disable="progress" not in extras, leave=False)
    fp16 = inputs.protocol.precision == "fp16"
    scaler = torch.amp.GradScaler(inputs.device.type) if fp16 else None
    save = inputs.checkpoint if "checkpoint" in extras else None
    for step, idx in enumerate(inputs.batches):
        if "lr" in extras:
            for group in optimizer.param_groups:
                group["lr"] = inputs.protocol.optimizer.lr * group.get("lr_scale", 1.0)
        out, batch = _bare_forward(backbone, method, inputs, step, idx)
        mined = None
        if method.miner is not None:
            with phase("mining"), torch.no_grad():
                mined = method.miner(out, batch)
            if "check" in extras:
                mined.check(len(idx))
                _ = mined.count(), mined.evaluated
        with phase("loss"):
            loss = method.loss(out, batch, mined)
        value = float(loss.detach()) if "item" in extras else 0.0
        _bare_update(loss, optimizer, scaler)
        if "progress" in extras:
            bar.update(1)
            bar.set_postfix(loss=f"{value:.4f}", refresh=False)
        if save is not None and inputs.per_epoch and (step + 1) % inputs.per_epoch == 0:
            save_checkpoint(save, {"modules": modules.state_dict(),
                                   "optimizer": optimizer.state_dict()})  # fmt: skip
    bar.close()


def _bare_forward(
    backbone: torch.nn.Module, method: Method, inputs: BareInputs, step: int, idx: torch.Tensor
) -> tuple[Embedded, Batch]:
    """The batch's embeddings (backbone and head under autocast, then float32) and labels."""
    import torch

    staged = inputs.images[step] if isinstance(inputs.images, list) else inputs.images[idx]
    x = backbone.prepare(staged.to(inputs.device, non_blocking=True))
    idx_dev = idx.to(inputs.device, non_blocking=True)
    coarse = None if inputs.coarse is None else inputs.coarse[idx_dev]
    batch = Batch(inputs.labels[idx_dev], coarse)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(inputs.protocol.precision)
    device_type = inputs.device.type
    with torch.autocast(device_type, dtype=dtype or torch.float32, enabled=dtype is not None):
        out = method.head(backbone(x))
    if dtype is not None:
        out = Embedded(out.embedding.float(),
                       {k: v.float() if v.is_floating_point() else v
                        for k, v in out.extras.items()})  # fmt: skip
    return out, batch


def _bare_update(
    loss: torch.Tensor, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None
) -> None:
    """Gradients and the optimizer's step (fp16: through the loss scaler)."""
    optimizer.zero_grad(set_to_none=True)
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()


def _needs_preparing(images: Any, protocol: Protocol) -> bool:
    """Whether a run's feeder does work on each batch: images read from disk or augmented."""
    return bool(protocol.augmentation.train) or hasattr(images, "load")


class _Loops:
    """The two loops compared, each timed on a fresh copy of the same initial model, the
    same batches and the same method. The batches are the harness loop's own: drawn from
    its sampler and prepared by its feeder (`harness.train.start_training`). The harness
    saves its epoch-end checkpoint into a temporary folder, deleted after each run (else the
    next round would resume from it)."""

    def __init__(self, ctx: RunContext, model: Model, data: TrainingSet, ckpt: Path) -> None:
        self.ctx, self.model, self.data, self.ckpt = ctx, model, data, ckpt
        self.timer = PhaseTimer(ctx.device)
        self.startups: list[float] = []  # the harness rounds' worker start-up seconds
        parts = start_training(ctx.replace(workers=0), copy.deepcopy(model), data)
        try:
            self.per_epoch = parts.state.sampler.batches_per_epoch
            self.steps = min(self.per_epoch + 1, OVERHEAD_MAX_STEPS, parts.total)
            fed = list(parts.batches(until=self.steps))
        finally:
            parts.close()
        self.images_per_run = self.steps * ctx.protocol.sampler.batch_size
        self.inputs = self._inputs(fed)

    def _inputs(self, fed: list[tuple[int, torch.Tensor, torch.Tensor]]) -> BareInputs:
        """Images read from disk or augmented: each batch as the harness's feeder prepares
        it, once, up front, kept on the device, so the bare loop measures the model alone
        (the issue's "data already on the GPU"), while the harness loop prepares them as a
        run does. Images in memory without augmentation are indexed by both loops alike."""
        import torch

        device, data = self.ctx.device, self.data
        staged = _needs_preparing(data.images, self.ctx.protocol)
        images = [x.to(device) for _, _, x in fed] if staged else data.images
        coarse = data.coarse_labels
        return BareInputs(
            images, torch.as_tensor(data.labels, device=device),
            None if coarse is None else torch.as_tensor(coarse, device=device),
            [idx for _, idx, _ in fed], self.ctx.protocol, device, self.ckpt, self.per_epoch,
        )  # fmt: skip

    def bare(self, extras: frozenset[str] = frozenset(), steps: int | None = None) -> float:
        model = copy.deepcopy(self.model)
        inputs = dataclasses.replace(self.inputs, batches=self.inputs.batches[:steps])
        start = self.timer.now()
        _bare_loop(model.backbone, model.method, inputs, extras)
        seconds = self.timer.now() - start
        self.ckpt.unlink(missing_ok=True)
        return seconds

    def harness(self) -> float:
        """`harness.train.train` itself, as a run calls it (progress bar, epoch-end
        checkpoint, the context's workers)."""
        ctx = self.ctx.replace(max_steps=self.steps, progress=True)
        with _quiet():
            stats = train(ctx, copy.deepcopy(self.model), self.data,
                          checkpoint=Checkpoint(self.ckpt, "cost-overhead"))  # fmt: skip
        self.ckpt.unlink(missing_ok=True)  # else the next round would resume from it
        # the training seconds every result records (the steps with their data waits, loss
        # read-backs and epoch-end checkpoints; synchronised on CUDA), less the worker
        # processes' start-up: they start and stop once per run, not once per window
        self.startups.append(stats.data_startup_seconds)
        return stats.train_seconds - stats.data_startup_seconds

    def alternate(self, a: Callable[[], float], b: Callable[[], float], rounds: int) -> dict:
        """Rounds alternate which loop goes first. The fastest round of each loop is the one
        least disturbed by the rest of the machine (timeit's rule); the median of the
        per-round ratios is kept to show the spread that other processes cause."""
        ta, tb = [], []
        for r in range(rounds):
            if r % 2 == 0:
                ta.append(a())
                tb.append(b())
            else:
                tb.append(b())
                ta.append(a())
        ratios = [x / y for x, y in zip(ta, tb, strict=True)]
        return {
            "ratio": round(min(ta) / min(tb), 4),
            "median_round_ratio": round(statistics.median(ratios), 4),
            "images_per_second": round(self.images_per_run / min(tb), 2),
            "reference_images_per_second": round(self.images_per_run / min(ta), 2),
        }


def measure_overhead(
    ctx: RunContext,
    model: Model,
    data: TrainingSet,
    *,
    rounds: int = OVERHEAD_ROUNDS,
    breakdown: bool = False,
) -> dict[str, Any]:
    """Throughput of `harness.train.train` against `_bare_loop` on the same model (a fresh
    copy of the same initial state each time), the same batches (the harness loop's own for
    the context's seed) and the same method. The window is one epoch plus a step (so the
    harness saves its epoch-end checkpoint, as in a real run), at most OVERHEAD_MAX_STEPS.
    Rounds alternate which loop goes first; the ratio is the fastest round of each (see
    `_Loops.alternate`). The harness's data workers start once per run, so their start-up
    (the first batch's wait) is taken out of its rounds and reported alone
    (`worker_startup_seconds`; 0 without workers). With `breakdown`, each piece of
    bookkeeping (OVERHEAD_PIECES) is added alone to the bare loop and timed against it the
    same way."""
    with tempfile.TemporaryDirectory(prefix="dml-cost-") as tmp:
        loops = _Loops(ctx, model, data, Path(tmp) / "overhead.pt")
        with _quiet():  # warm-up
            loops.bare(steps=3)
        main = loops.alternate(loops.bare, loops.harness, rounds)
        result: dict[str, Any] = {
            "method": "",
            "steps": loops.steps,
            "rounds": rounds,
            "steps_per_epoch": loops.per_epoch,
            "checkpoint_in_window": loops.steps > loops.per_epoch,
            "harness_images_per_second": main["images_per_second"],
            "bare_images_per_second": main["reference_images_per_second"],
            "ratio": main["ratio"],
            "median_round_ratio": main["median_round_ratio"],
            "target": OVERHEAD_TARGET,
            "worker_startup_seconds": round(statistics.median(loops.startups), 3),
        }
        if breakdown:
            result["breakdown"] = _breakdown(loops, rounds)
    return result


def _breakdown(loops: _Loops, rounds: int) -> dict[str, float]:
    """The bare loop plus one piece of bookkeeping, then all of them, against the bare loop."""
    pieces = {}
    with _quiet():
        for piece in OVERHEAD_PIECES:
            extra = frozenset({piece})
            pieces[piece] = loops.alternate(loops.bare, lambda e=extra: loops.bare(e), rounds)[
                "ratio"
            ]
        every = frozenset(OVERHEAD_PIECES)
        pieces["all"] = loops.alternate(loops.bare, lambda: loops.bare(every), rounds)["ratio"]
    return pieces
