"""Training throughput on the protocol's real data, through the harness's own training step.

Images per second of the whole step (backbone forward/backward, mining, loss, optimizer step)
as a run takes it: the step, its optimizer, scaler and sampler and the feeder of its batches
are the ones `harness.train.train` runs (`harness.train.start_training`), on the model
`harness.train.build_model` makes (the identical initial backbone for every method); and the
share of the step spent in mining + loss. Several methods are timed in interleaved rounds
(`throughput_rounds`): every method once per round, its fastest round reported. torch is imported inside the functions, so building
the CLI parser stays fast.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from harness.core import HarnessError, Protocol, RunContext
from harness.cost.rounds import fastest, interleaved
from harness.data import contiguous
from harness.train import Model, Training, TrainingSet, start_training

if TYPE_CHECKING:
    import torch

    from harness.data import PreparedData

DEFAULT_STEPS = 24  # measured training steps per method and round, after WARMUP_STEPS
WARMUP_STEPS = 4
DEFAULT_ROUNDS = 5  # interleaved throughput rounds per method; the fastest is reported

log = logging.getLogger(__name__)


def random_init(protocol: Protocol) -> Protocol:
    """The protocol with a randomly initialised backbone: what the cost commands time
    (weights change no cost, and pretrained ones may not be on the machine)."""
    backbone = dataclasses.replace(protocol.backbone, pretrained="none", weights_file="")
    return dataclasses.replace(protocol, backbone=backbone)


def cost_context(
    protocol: Protocol, device: torch.device, data_root: str | None = None, decoder: str = "pil"
) -> RunContext:
    """The run context the cost commands measure under: the protocol's first seed (the one
    every method's initial backbone is drawn from), this process's place among torchrun's
    ranks, and the folder of the dataset's files."""
    return RunContext(protocol, protocol.seeds[0], device, data_root=data_root, decoder=decoder)


def training_set(prepared: PreparedData) -> TrainingSet:
    """The prepared data's training split as a run trains on it (contiguous class ids)."""
    data, split = prepared.data, prepared.split
    coarse = None if data.coarse_labels is None else data.coarse_labels[split.train]
    return TrainingSet(data.images[split.train], contiguous(data.labels[split.train]), coarse)


def measure_throughput(
    ctx: RunContext,
    model: Model,
    data: TrainingSet,
    *,
    steps: int = DEFAULT_STEPS,
    warmup: int = WARMUP_STEPS,
    fed: bool = False,
    split_backward: bool = True,
) -> dict[str, Any]:
    """Whole training steps of `model` on `data` (the P x K batches of the run's sampler):
    images per second over `steps` steps after `warmup`, and the share of those steps spent
    in mining + loss (with `split_backward`, the loss's forward and its backward down to the
    embedding; the split computes the same gradients; without it the step is timed exactly
    as a run takes it). On CUDA the phases are timed with events. Under torchrun (the
    context's dist) this rank embeds its shard of every batch, as in a run, and the images
    counted are the whole batches. `fed`: the loop's feeder (the context's workers) prepares
    the batches while the steps run, as in a run, so the window holds every step's data wait
    and the record adds the data-wait share; else the same feeder prepares them in this
    process before the clock starts, as a run's workers prepare them beside the step."""
    if not fed:
        ctx = ctx.replace(workers=0)
    training = start_training(ctx, model, data, split_backward=split_backward)
    try:
        source = training.batches(until=warmup + steps)
        if not fed:
            source = iter(list(source))
        return _timed(training, source, steps, warmup, fed)
    finally:
        training.close()


def _timed(
    training: Training, source: Iterator[Any], steps: int, warmup: int, fed: bool
) -> dict[str, Any]:
    """The throughput record of `steps` calls of the training's step after `warmup`."""
    step, feeder = training.step, training.feeder
    images, empty, waited, begin = 0, 0, 0.0, 0.0
    for k in range(warmup + steps):
        if k == warmup:  # before the batch is fetched: the window holds `steps` data waits
            step.timer.reset()
            begin = step.timer.now()
            waited = feeder.wait
        n, idx, x = next(source)
        result = step(idx, images=x, step=n)
        if k >= warmup:
            images += result.images
            empty += not result.trained
    seconds = step.timer.now() - begin
    mining_loss = step.timer.total("mining", "loss")
    record = {
        "steps": steps,
        "batch_size": training.state.sampler.p * training.state.sampler.k,
        "images_per_second": round(images / seconds, 2),
        "step_ms": round(seconds / steps * 1e3, 3),
        "mining_loss_ms": round(mining_loss / steps * 1e3, 3),
        "mining_loss_share": round(mining_loss / seconds, 4),
        "empty_steps": empty,
    }
    if fed:
        record["data_wait_share"] = round((feeder.wait - waited) / seconds, 4)
    return record


def throughput_rounds(
    ctx: RunContext,
    models: Mapping[str, Callable[[], Model]],
    data: TrainingSet,
    *,
    steps: int = DEFAULT_STEPS,
    rounds: int = DEFAULT_ROUNDS,
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Each method's throughput (measure_throughput, `steps` steps after WARMUP_STEPS, on a
    fresh model from `models[name]()`, so every round times the same steps from the same
    initial state) in interleaved rounds (`rounds.interleaved`): every method once per
    round, `rounds` rounds, so a change in the machine's load hits one round of every method
    instead of all rounds of one. Returns (each method's fastest round with every round in
    `rounds` and its index in `fastest_round`, the failures' reasons): a method that fails is
    left out of the later rounds; the others go on."""
    failures: dict[str, str] = {}

    def one(name: str) -> dict[str, Any] | None:
        try:
            return measure_throughput(ctx, models[name](), data, steps=steps)
        except (KeyboardInterrupt, HarnessError):
            raise
        except Exception as exc:  # one broken method does not stop the others
            failures[name] = f"{type(exc).__name__}: {exc}"
            log.warning("cost %s: throughput failed: %s", name, failures[name])
            return None

    def report(r: int, name: str, record: dict[str, Any]) -> None:
        log.info("cost: throughput round %d/%d, %s: %.0f img/s, %.1f ms per step", r + 1,
                 rounds, name, record["images_per_second"], record["step_ms"])  # fmt: skip

    measured = interleaved({n: functools.partial(one, n) for n in models}, rounds, report)
    return {n: best_round(r) for n, r in measured.items() if r and n not in failures}, failures


def best_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The throughput record of the fastest round (most images per second), with every
    round's images/s, step time and mining + loss share in `rounds` (in round order) and
    the fastest one's index in `fastest_round`."""
    best = fastest(rounds, key=lambda r: r["images_per_second"])
    kept = ("images_per_second", "step_ms", "mining_loss_share")
    return {**rounds[best], "rounds": [{k: r[k] for k in kept} for r in rounds],
            "fastest_round": best}  # fmt: skip
