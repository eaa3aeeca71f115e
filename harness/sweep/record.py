"""A run's result record as the sweep builds it: what the run is before it starts (protocol,
method, seed, budget, weights file), where its numbers come from, and its outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch

import harness
from harness.backbones import starting_weights
from harness.core import MethodSpec, Protocol, RunContext
from harness.data import LabelledImages, Split
from harness.deploy import KeptModel, write_model
from harness.evaluate import Evaluation, SavedEmbeddings, retrieval_record, write_embeddings
from harness.records import (
    DatasetInfo,
    Environment,
    MethodInfo,
    ProtocolInfo,
    RunResult,
    Selection,
    TrainingRecord,
    TupleCounts,
    embeddings_dir,
    environment,
    model_path,
    write_result,
)
from harness.sweep.identity import hashed_weights
from harness.sweep.spec import RunSpec
from harness.train import TrainStats


def new_result(spec: RunSpec, method_spec: MethodSpec) -> RunResult:
    """What a run is before it starts: protocol, method, seed, the sweep's seeds, budget, the
    weights file it starts from (with its sha256, so a changed file is another run)."""
    protocol = spec.parsed_protocol
    weights_file = starting_weights(protocol.backbone, spec.weights)
    return RunResult(
        status="running",
        protocol=ProtocolInfo(protocol.name, protocol.version, protocol.hash, protocol.path,
                              protocol.content()),
        method=MethodInfo(spec.method, method_spec.version, method_spec.paper,
                          dict(spec.hyperparameters or {}), method_spec.source),
        seed=spec.seed,
        sweep_seeds=list(spec.sweep_seeds if spec.sweep_seeds is not None else protocol.seeds),
        training=TrainingRecord(max_steps=spec.max_steps),
        tuning=spec.tuning,
        backbone_weights=hashed_weights(weights_file) if weights_file else None,
    )  # fmt: skip


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _describe_run(
    record: RunResult, protocol: Protocol, data: LabelledImages, split: Split, device: torch.device
) -> None:
    """Where the run's numbers come from: dataset, split, start time, code and machine."""
    record.dataset = DatasetInfo(protocol.dataset.name, data.source, data.provenance)
    record.feature_cache = getattr(data.images, "made_by", None) or None
    record.split = split.summary()
    record.started_at = _now()
    record.harness_version = harness.__version__
    record.environment = Environment.from_json(environment(device))


def write_run(
    path: Path, record: RunResult, saved: SavedEmbeddings | None = None,
    kept: KeptModel | None = None,
) -> None:  # fmt: skip
    """A run's result file; with `saved` (`--save-embeddings`, a finished run), its test
    embeddings first, into the folder beside it, and with `kept` (`--save-model`) its model
    file, whose files and sha256s the result records: a result never names files that are not
    written yet."""
    if saved is not None:
        record.embeddings = write_embeddings(embeddings_dir(path), saved)
    if kept is not None:
        record.model = write_model(model_path(path), kept)
    write_result(path, record)


# writes a run's record (and its saved embeddings, if any): the results folder, or a Ray
# worker's hand-back to the driver
Writer = Callable[..., None]


def _stop(
    record: RunResult, path: Path, status: str, failure: str, write: Writer = write_run
) -> tuple[str, Path]:
    """Write a run that ends without metrics (failed, not applicable) and say so, with when
    it ended (its time counts in a sweep's, as a finished run's does)."""
    record.status, record.failure, record.finished_at = status, failure, _now()
    write(path, record)
    return status, path


def _record_outcome(
    record: RunResult, stats: TrainStats, select_by: str, metrics: dict[str, float],
    by_part: dict[str, dict[str, float]], eval_timings: dict[str, float],
) -> None:  # fmt: skip
    """A finished run: its metrics (and each part's, for a composite embedding), timings,
    training counts and losses, mined tuples and model selection."""
    record.status, record.metrics, record.finished_at = "ok", metrics, _now()
    record.metrics_by_part = by_part or None  # left out when the embedding has no parts
    record.timings = {**stats.summary(), **eval_timings}
    record.tuples = TupleCounts(
        kind=stats.tuple_kind, mined=stats.tuples_mined,
        per_step=round(stats.tuples_mined / max(stats.steps, 1), 2),
        pair_scores_evaluated=stats.pair_scores_evaluated, empty_steps=stats.empty_steps,
    )  # fmt: skip
    training = record.training
    training.steps, training.epochs = stats.steps, round(stats.epochs, 3)
    training.epoch_loss = [round(v, 6) for v in stats.epoch_loss]
    training.epoch_seconds = [round(v, 3) for v in stats.epoch_seconds]
    training.resumed_from_step = stats.resumed_from_step
    if stats.validation:
        record.selection = Selection(
            metric=select_by, split="validation", best_epoch=stats.best_epoch,
            per_epoch=[round(v, 6) for v in stats.validation],
            seconds=round(stats.validation_seconds, 3),
        )  # fmt: skip


def record_outcome(
    record: RunResult, ctx: RunContext, stats: TrainStats, result: Evaluation
) -> None:
    """A finished run's evaluation into its record: metrics, timings, training counts,
    selection, the distances' histogram, bootstrap intervals, how it was ranked and, under
    torchrun, the world it trained in."""
    if result.distances:
        record.distances = result.distances
    record.bootstrap = result.bootstrap or None
    record.clustering_convention = result.clustering
    _record_outcome(record, stats, ctx.protocol.evaluation.select_by, result.metrics,
                    result.by_part, result.timings)  # fmt: skip
    if ctx.dist.active:  # the step counts whole batches; each rank embedded 1/world_size of them
        total = (record.timings or {}).get("images_per_second")
        per_rank = None if total is None else round(total / ctx.dist.world_size, 1)
        record.distributed = {"world_size": ctx.dist.world_size, "backend": ctx.dist.backend,
                              "images_per_second_per_rank": per_rank}  # fmt: skip
    record.retrieval = retrieval_record(ctx.protocol, result.pair_scores)
