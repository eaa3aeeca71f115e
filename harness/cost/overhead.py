"""Harness overhead: `harness.train.train` against a hand-written loop doing the same steps
on the same model and batches, alternated, as a throughput ratio (target >= 0.95).

`_bare_loop` is the reference the harness is measured against: it is written out by hand
and must stay independent of the harness's training step (`harness.train.step`). torch is imported
inside the functions, so building the CLI parser stays fast.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import statistics
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core import Batch, Embedded, PhaseTimer
from harness.cost.throughput import stage_batches
from harness.data import PKSampler, contiguous
from harness.train import make_optimizer, parameter_groups, save_checkpoint, total_steps, train

if TYPE_CHECKING:
    import torch

    from harness.core import Method, Protocol
    from harness.data import PreparedData

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


def _bare_loop(
    backbone: torch.nn.Module,
    method: Method,
    images: torch.Tensor | list[torch.Tensor],
    labels_t: torch.Tensor,
    coarse_t: torch.Tensor | None,
    batches: list[torch.Tensor],
    protocol: Protocol,
    device: torch.device,
    extras: frozenset[str] = frozenset(),
    checkpoint: Path | None = None,
    per_epoch: int = 0,
) -> None:
    """The training step written out by hand, nothing else. `images`: the images in memory,
    indexed by each batch, or (a list) each batch's images already prepared on the device.
    The backbone and head run under autocast in the protocol's precision, the loss in
    float32, as the harness's step does. `extras` adds the harness's bookkeeping one piece
    at a time, to find what costs: "item" (the loss read back every step), "check" (the
    miner's index check and counts), "timers" (PhaseTimer around mining and loss),
    "progress" (a tqdm bar updated every step), "lr" (the schedule set every step),
    "checkpoint" (the state saved at each epoch end)."""
    import torch
    from torch import nn
    from tqdm import tqdm

    modules = nn.ModuleList([m for m in (backbone, method.head, method.loss) if m is not None])
    optimizer = make_optimizer(parameter_groups(backbone, method), protocol)
    modules.train()
    timer = PhaseTimer(device)
    phase = timer.phase if "timers" in extras else (lambda name: contextlib.nullcontext())
    bar = tqdm(total=len(batches), disable="progress" not in extras, leave=False)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(protocol.precision)
    scaler = torch.amp.GradScaler(device.type) if protocol.precision == "fp16" else None
    for step, idx in enumerate(batches):
        if "lr" in extras:
            for group in optimizer.param_groups:
                group["lr"] = protocol.optimizer.lr * group.get("lr_scale", 1.0)
        staged = images[step] if isinstance(images, list) else images[idx]
        x = backbone.prepare(staged.to(device, non_blocking=True))
        idx_dev = idx.to(device, non_blocking=True)
        batch = Batch(labels_t[idx_dev], None if coarse_t is None else coarse_t[idx_dev])
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            out = method.head(backbone(x))
        if dtype is not None:
            out = Embedded(out.embedding.float(),
                           {k: v.float() if v.is_floating_point() else v
                            for k, v in out.extras.items()})  # fmt: skip
        mined = None
        if method.miner is not None:
            with phase("mining"), torch.no_grad():
                mined = method.miner(out, batch)
            if "check" in extras:
                mined.check(len(idx))
                _ = mined.count(), mined.evaluated
        with phase("loss"):
            loss = method.loss(out, batch, mined)
        if "item" in extras:
            value = float(loss.detach())
        optimizer.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        if "progress" in extras:
            bar.update(1)
            bar.set_postfix(loss=f"{value if 'item' in extras else 0.0:.4f}", refresh=False)
        if checkpoint is not None and per_epoch and (step + 1) % per_epoch == 0:
            save_checkpoint(checkpoint, {"modules": modules.state_dict(),
                                         "optimizer": optimizer.state_dict()})  # fmt: skip
    bar.close()


class _Loops:
    """The two loops compared, each timed on a fresh copy of the same initial model, the
    same batches and the same method. The harness saves its epoch-end checkpoint into a
    temporary folder, deleted after each run (else the next round would resume from it)."""

    def __init__(
        self, backbone: torch.nn.Module, method: Method, prepared: PreparedData,
        protocol: Protocol, device: torch.device, seed: int, ckpt: Path,
    ) -> None:  # fmt: skip
        import torch

        data, split = prepared.data, prepared.split
        self.backbone, self.method, self.protocol, self.device = backbone, method, protocol, device
        self.seed, self.ckpt, self.timer = seed, ckpt, PhaseTimer(device)
        self.startups: list[float] = []  # the harness rounds' worker start-up seconds
        self.images = data.images[split.train]
        self.labels = contiguous(data.labels[split.train])
        self.coarse = None if data.coarse_labels is None else data.coarse_labels[split.train]
        p, k = protocol.sampler.classes_per_batch, protocol.sampler.images_per_class
        sampler = PKSampler(self.labels, p, k, seed)
        self.per_epoch = sampler.batches_per_epoch
        budget = total_steps(protocol, self.per_epoch, None)
        self.steps = min(self.per_epoch + 1, OVERHEAD_MAX_STEPS, budget)
        self.images_per_run = self.steps * p * k
        self.batches = [torch.from_numpy(sampler.next_batch()) for _ in range(self.steps)]
        self.staged = self._stage(protocol, seed, device)
        self.labels_t = torch.as_tensor(self.labels, device=device)
        self.coarse_t = None if self.coarse is None else torch.as_tensor(self.coarse, device=device)

    def _stage(self, protocol: Protocol, seed: int, device: torch.device) -> list | None:
        """Images read from disk or augmented: each batch prepared once, up front, and kept on
        the device, so the bare loop measures the model alone (the issue's "data already on
        the GPU"), while the harness loop prepares them as a run does. None: images in
        memory without augmentation, indexed by both loops alike."""

        staged = stage_batches(self.images, protocol, seed, list(enumerate(self.batches)))
        return None if staged is None else [x.to(device) for x in staged]

    def bare(self, extras: frozenset[str] = frozenset(), steps: int | None = None) -> float:
        bb, mt = copy.deepcopy(self.backbone), copy.deepcopy(self.method)
        start = self.timer.now()
        images = self.images if self.staged is None else self.staged
        _bare_loop(bb, mt, images, self.labels_t, self.coarse_t, self.batches[:steps],
                   self.protocol, self.device, extras,
                   self.ckpt if "checkpoint" in extras else None, self.per_epoch)  # fmt: skip
        seconds = self.timer.now() - start
        self.ckpt.unlink(missing_ok=True)
        return seconds

    def harness(self) -> float:

        bb, mt = copy.deepcopy(self.backbone), copy.deepcopy(self.method)
        with _quiet():
            stats = train(bb, mt, self.images, self.labels, self.coarse, self.protocol,
                          self.seed, self.device, max_steps=self.steps, progress=True,
                          checkpoint=self.ckpt, identity="cost-overhead")  # fmt: skip
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
    backbone: torch.nn.Module,
    method: Method,
    prepared: PreparedData,
    protocol: Protocol,
    device: torch.device,
    *,
    rounds: int = OVERHEAD_ROUNDS,
    seed: int = 0,
    breakdown: bool = False,
) -> dict[str, Any]:
    """Throughput of `harness.train.train` against `_bare_loop` on the same model (a fresh
    copy of the same initial state each time), the same batches (the sampler's sequence for
    this seed, images already in memory) and the same method. The window is one epoch plus
    a step (so the harness saves its epoch-end checkpoint, as in a real run), at most
    OVERHEAD_MAX_STEPS. Rounds alternate which loop goes first; the ratio is the fastest
    round of each (see `_Loops.alternate`). The harness's data workers start once per run, so
    their start-up (the first batch's wait) is taken out of its rounds and reported alone
    (`worker_startup_seconds`; 0 without workers). With `breakdown`, each piece of
    bookkeeping (OVERHEAD_PIECES) is added alone to the bare loop and timed against it the
    same way."""
    with tempfile.TemporaryDirectory(prefix="dml-cost-") as tmp:
        loops = _Loops(backbone, method, prepared, protocol, device, seed,
                       Path(tmp) / "overhead.pt")  # fmt: skip
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
