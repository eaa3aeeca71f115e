"""The data pipeline's speed: decoded-and-augmented training images per second for each
number of worker processes, and the share of a training step spent waiting for data.

The batches are the protocol's own (its P x K sampler over the training classes, its load
size and train augmentation), prepared by the run's feeder (`harness.train.run_feeder`)
exactly as in a run. The first WARMUP_BATCHES of each count are not timed (worker
start-up); then each count is timed ROUNDS times (`cost --rounds`), in interleaved rounds
with the others (`rounds.py`), on at least `batches` batches rounded up to whole waves of
its workers, and its fastest round is reported (all rounds are recorded): a shared
machine's slow spells then do not decide the comparison. Each row's `speedup` is its
images/s over the first (smallest) count's, both from this one run. The data-wait share
trains the protocol's backbone for `steps` steps fed by the largest worker count, with one
method (--methods NAME, else the first registered method that trains and needs no coarse
labels: the backbone's step dominates, so the method hardly matters);
the backbone is randomly initialised (only timing matters here, and pretrained weights may
not be on the machine), which the record says. `decoder="torch"` measures the torch decoder
(the workers read the files; the measuring process decodes and augments on the device).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from harness.core import METHODS, HarnessError, PhaseTimer, RunContext, protocol_hyperparameters
from harness.cost.rounds import interleaved
from harness.cost.throughput import measure_throughput, random_init, training_set
from harness.data import decoded_by, prepare_data
from harness.records import environment
from harness.train import (
    TrainingSet,
    build_model,
    run_feeder,
    run_sampler,
    train_augmentation,
)

WARMUP_BATCHES = 4
DEFAULT_BATCHES = 24
ROUNDS = 5  # each count is timed this many times, interleaved with the others; the best counts

log = logging.getLogger(__name__)


def default_counts() -> list[int]:
    """1, 2, 4, ... up to this machine's cores."""
    cores, counts = os.cpu_count() or 1, [1]
    while counts[-1] * 2 <= cores:
        counts.append(counts[-1] * 2)
    return counts


def parse_workers(text: str | None) -> list[int]:
    if text is None:
        return default_counts()
    try:
        counts = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise HarnessError(f"--workers: expected comma-separated integers, got {text!r}") from None
    if not counts or counts[0] < 0:
        raise HarnessError("--workers: give worker counts >= 0, e.g. 1,2,4 (0: in-process)")
    return counts


def timing_method(asked: str | None = None) -> str:
    """The method the data-wait share trains (see the module docstring)."""

    if asked:
        METHODS.get(asked)  # unknown: "did you mean"
        return asked
    return next(n for n in METHODS.names() if METHODS.get(n).family != "none"
                and not METHODS.get(n).needs_coarse_labels)  # fmt: skip


def measure_pipeline(
    ctx: RunContext,
    counts: Sequence[int],
    *,
    batches: int = DEFAULT_BATCHES,
    steps: int = DEFAULT_BATCHES,
    method: str | None = None,
    rounds: int = ROUNDS,
) -> dict[str, Any]:
    """The `cost --pipeline` record (see the module docstring) for the context's protocol,
    data root, device and decoder; each worker count timed in `rounds` interleaved rounds."""

    started = time.perf_counter()
    protocol = ctx.protocol
    prepared = prepare_data(protocol, ctx.data_root)
    if ctx.decoder != "pil":
        data = decoded_by(prepared.data, ctx.decoder, ctx.device, protocol)
        prepared = dataclasses.replace(prepared, data=data)
    data = training_set(prepared)
    record: dict[str, Any] = {
        "kind": "cost_pipeline",
        "protocol": {"name": protocol.name, "version": protocol.version, "hash": protocol.hash},
        "load_size": protocol.load_size,
        "input_size": protocol.backbone.input_size,
        "augmentation": [op.op for op in protocol.augmentation.train],
        "decoder": ctx.decoder,
        "batch_size": protocol.sampler.batch_size,
        "pipeline": _rates(ctx, data, counts, batches, started, rounds),
        **_data_wait(ctx.replace(workers=max(counts)), data, steps, timing_method(method)),
    }
    record["seconds"] = round(time.perf_counter() - started, 1)
    record["created_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    record["environment"] = environment(ctx.device)
    return record


def _rates(
    ctx: RunContext, data: TrainingSet, counts: Sequence[int], batches: int, started: float,
    rounds: int = ROUNDS,
) -> list[dict[str, Any]]:  # fmt: skip
    """Each worker count's row: the run's feeder (its sampler's batches, its augmentation)
    with that many workers, timed `rounds` times in interleaved rounds (`rounds.interleaved`)
    with the other counts."""
    sampler = run_sampler(data.labels, ctx)
    sizes = {w: whole_waves(batches, w) for w in counts}
    keys = [(n, sampler.next_batch()) for n in range(WARMUP_BATCHES + max(sizes.values()))]
    augment = train_augmentation(ctx)
    feeders = {w: run_feeder(ctx.replace(workers=w), data.images, augment) for w in counts}
    clock = PhaseTimer(ctx.device)  # its now() waits for the torch decoder's queued kernels
    try:
        for w, feeder in feeders.items():  # worker start-up, first decodes: not timed
            log.info("pipeline: %d worker(s): warming up (%d batches)", w, WARMUP_BATCHES)
            sum(1 for _ in feeder.batches(keys[:WARMUP_BATCHES]))

        def timed(w: int) -> float:
            begin = clock.now()
            chosen = keys[WARMUP_BATCHES : WARMUP_BATCHES + sizes[w]]
            n = sum(len(x) for _, _, x in feeders[w].batches(chosen))
            return round(n / (clock.now() - begin), 1)

        def report(r: int, w: int, rate: float) -> None:
            log.info("pipeline: round %d/%d, %d worker(s): %.0f images/s (%d batches); %.0f s",
                     r + 1, rounds, w, rate, sizes[w], time.perf_counter() - started)  # fmt: skip

        # interleaved, so a slow spell of the machine hits one round of every count
        rates = interleaved({w: functools.partial(timed, w) for w in counts}, rounds, report)
    finally:
        for feeder in feeders.values():
            feeder.close()
    first = max(rates[counts[0]])
    return [{"workers": w, "batches": sizes[w], "images_per_second": max(r),
             "speedup": round(max(r) / first, 2), "rounds": r} for w, r in rates.items()]  # fmt: skip


def whole_waves(batches: int, workers: int) -> int:
    """At least `batches`, rounded up to a multiple of the worker count: each timed round
    starts with every worker idle, and W workers take ceil(n / W) batch-times for n batches,
    so a partial last wave would understate a large count's images per second."""
    w = max(1, workers)
    return -(-batches // w) * w


def _data_wait(ctx: RunContext, data: TrainingSet, steps: int, method: str) -> dict[str, Any]:
    """Training steps of `method` fed by the context's workers, timed as a run takes them
    (the harness's own step and feeder, see measure_throughput): the share of their time
    spent waiting for data."""
    import numpy as np

    protocol = ctx.protocol
    timed = ctx.replace(protocol=random_init(protocol))
    model = build_model(timed, method, protocol_hyperparameters(timed.protocol, method),
                        in_channels=data.images.shape[1],
                        num_classes=len(np.unique(data.labels)), num_coarse_classes=None)  # fmt: skip
    log.info("pipeline: data-wait share: %d training steps of %s, %d worker(s)", steps, method,
             ctx.workers)  # fmt: skip
    measured = measure_throughput(timed, model, data, steps=steps, warmup=WARMUP_BATCHES,
                                  fed=True, split_backward=False)  # fmt: skip
    return {
        "data_wait_share": measured["data_wait_share"],
        "training": {"workers": ctx.workers, "steps": steps, "backbone": protocol.backbone.name,
                     "method": method, "step_ms": measured["step_ms"],
                     "backbone_weights": "random (timing only)"},
    }  # fmt: skip
