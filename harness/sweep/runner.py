"""Sweeps as lists of independent, serialisable run specifications, each -> one result file.

Data flows one way: protocol -> dataset + split -> sampler -> backbone + method -> train ->
evaluate -> result JSON. A finished result with the same protocol hash, method version,
hyperparameters, seed and budget is skipped, so an interrupted sweep resumes by running the
same command again; a result that would be replaced is archived, never lost.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import torch

from harness.backbones import build_backbone, starting_weights
from harness.core import METHODS, RunContext, TrainingFailed, current
from harness.data import (
    LabelledImages,
    Split,
    check_trainable,
    decoded_by,
    on_device,
    prepare_data,
)
from harness.deploy import KeptModel, keep_model
from harness.evaluate import (
    Evaluation,
    SavedEmbeddings,
    evaluate,
    from_evaluation,
    neighbour_count,
)
from harness.records import RunResult, result_path
from harness.sweep.applicable import why_not_applicable
from harness.sweep.identity import checkpoint_identity
from harness.sweep.policy import checkpoint_path, decide
from harness.sweep.record import (
    Writer,
    _describe_run,
    _stop,
    new_result,
    record_outcome,
    write_run,
)
from harness.sweep.spec import RunSpec, resolve, resolve_all, run_context
from harness.sweep.tracked import log_result, tracked
from harness.train import Checkpoint, EpochHooks, Model, train_model, with_cached_features

log = logging.getLogger(__name__)


def execute(
    spec: RunSpec, progress: bool = True, on_epoch_end: Callable[[int], None] | None = None
) -> tuple[str, Path]:
    """Run one spec unless an identical finished result exists; returns (status, path).

    Under torchrun, rank 0 decides (skip, lock, archive) and the other ranks follow it: they
    train their shard of every batch, and rank 0 alone evaluates and writes."""
    spec = resolve(spec)
    if not current().is_main:
        path = result_path(Path(spec.results_dir), spec.parsed_protocol.name, spec.run_name,
                           spec.seed)  # fmt: skip
        if _agree("") != "run":
            return "skipped", path
        return execute_run(spec, new_result(spec, METHODS.get(spec.method)), path)
    with ExitStack() as locks:
        status, path, record = decide(spec, locks)
        if status is not None:
            return _agree(status), path
        _agree("run")
        return execute_run(spec, record, path, progress=progress, on_epoch_end=on_epoch_end)


def _agree(decision: str) -> str:
    """Rank 0's decision, on every rank (itself when not distributed)."""
    if not current().active:
        return decision
    box = [decision]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def execute_run(
    spec: RunSpec,
    record: RunResult,
    path: Path,
    *,
    progress: bool = False,
    on_epoch_end: Callable[[int], None] | None = None,
    write: Writer = write_run,
) -> tuple[str, Path]:
    """Train and evaluate one resolved run and hand its record to `write` (the result file,
    or, on a Ray worker, the driver, which owns the results folder), with its test embeddings
    when the spec saves them (a finished run only); returns (status, path)."""
    ctx = run_context(spec, progress)
    data, split = _data(ctx)
    _describe_run(record, ctx.protocol, data, split, ctx.device)
    log.debug("%s seed %d: protocol %s v%d from %s (hash %s), hyperparameters %s, device %s",
              spec.method, spec.seed, ctx.protocol.name, ctx.protocol.version,
              ctx.protocol.path, ctx.protocol.hash, spec.hyperparameters, ctx.device)  # fmt: skip
    if why := why_not_applicable(spec.method, data, ctx.protocol.dataset.name):
        if not ctx.dist.is_main:
            return "not_applicable", path
        return _stop(record, path, "not_applicable", why, write)
    with tracked(spec, ctx, record) as tracker:
        hooks = EpochHooks(on_epoch_end=on_epoch_end, on_epoch_stats=tracker.log_epoch)
        status = _train_and_write(spec, ctx, (data, split), record, path, hooks, write)
        if status == "ok":
            log_result(tracker, record, path)
    return status, path


def _train_and_write(
    spec: RunSpec, ctx: RunContext, prepared: tuple[LabelledImages, Split], record: RunResult,
    path: Path, hooks: EpochHooks, write: Writer,
) -> str:  # fmt: skip
    """Train (resuming from the run's checkpoint), evaluate and write; returns the status."""
    data, split = prepared
    checkpoint = Checkpoint(
        checkpoint_path(ctx.results_dir, ctx.protocol.name, spec.run_name, spec.seed),
        checkpoint_identity(record, spec.seed, spec.max_steps, spec.decoder),
    )
    try:
        model, stats = train_model(ctx, spec.method, spec.hyperparameters, data, split.train,
                                   split.validation, checkpoint=checkpoint, hooks=hooks)  # fmt: skip
        if not ctx.dist.is_main:  # rank 0 evaluates and writes
            return "ok"
        result, query = _evaluate(ctx, model, data, split, spec.save_embeddings)
    except TrainingFailed as exc:  # also NaN test embeddings: this run failed, the sweep goes on
        if not ctx.dist.is_main:
            return "failed"
        stopped, _ = _stop(record, path, "failed", str(exc), write)
        checkpoint.path.unlink(missing_ok=True)
        return stopped
    if model.method.diagnostics is not None:  # the method's own numbers on the test embeddings
        record.diagnostics = model.method.diagnostics(
            result.embeddings, torch.as_tensor(data.labels[query])
        )
    record_outcome(record, ctx, stats, result)
    saved = _saved(spec, ctx, result, data, split) if spec.save_embeddings else None
    kept = kept_model(spec, ctx, model, record) if spec.save_model else None
    write(path, record, saved, kept)
    checkpoint.path.unlink(missing_ok=True)
    return "ok"


def kept_model(spec: RunSpec, ctx: RunContext, model: Model, record: RunResult) -> KeptModel:
    """The network `--save-model` keeps (harness.deploy.model): the whole backbone and the
    head, with the method, its context and the run's provenance."""
    protocol = ctx.protocol
    select_by = protocol.evaluation.select_by
    meta = {
        "method": {"name": spec.method, "version": record.method.version,
                   "hyperparameters": dict(spec.hyperparameters or {}),
                   "source": record.method.source},  # a plugin's file and sha256; None: built in
        "context": dataclasses.asdict(model.context) if model.context else {},
        "learned_scorer": model.method.scorer is not None,
        "provenance": {
            "protocol": {"name": protocol.name, "version": protocol.version,
                         "hash": protocol.hash},
            "run_name": spec.run_name, "seed": spec.seed, "harness_version": record.harness_version,
            "git_commit": record.environment.git_commit if record.environment else None,
            "backbone_weights": record.backbone_weights,
            "test_metric": {select_by: (record.metrics or {}).get(select_by)},
        },
    }  # fmt: skip
    return keep_model(protocol, model.backbone, model.method.head,
                      in_channels=model.backbone.in_channels, weights=ctx.weights, meta=meta)  # fmt: skip


def _saved(
    spec: RunSpec, ctx: RunContext, result: Evaluation, data: LabelledImages, split: Split
) -> SavedEmbeddings:
    """The test embeddings `--save-embeddings` keeps, with the labels of the rows evaluated
    (the queries, then the gallery when the split has one), each row's index into the data
    and, for data read from files, each row's file (paths.txt)."""
    has_gallery = len(split.gallery) > 0
    query = split.query if has_gallery else split.test
    protocol = ctx.protocol
    run = {"protocol": {"name": protocol.name, "version": protocol.version, "hash": protocol.hash},
           "method": spec.method, "run_name": spec.run_name}  # fmt: skip
    gallery_labels = data.labels[split.gallery] if has_gallery else None
    indices = np.concatenate([query, split.gallery]) if has_gallery else query
    paths = _row_files(data, indices)
    return from_evaluation(ctx, result, data.labels[query], gallery_labels, run, indices, paths)


def _row_files(data: LabelledImages, indices: np.ndarray) -> list[str] | None:
    """The files of the items at `indices` (None when the data names none, or names a
    number of files other than its items: then no row can be trusted to name its image)."""
    files = data.files
    if files is None:
        return None
    if len(files) != len(data.labels):
        log.warning("the dataset names %d files for %d images: not saving paths.txt",
                    len(files), len(data.labels))  # fmt: skip
        return None
    return [files[int(i)] for i in indices]


def _data(ctx: RunContext) -> tuple[LabelledImages, Split]:
    """The protocol's data (its image files decoded by the run's decoder; a frozen trunk's
    cached outputs in their place under protocol `features:`) and split."""
    prepared = prepare_data(ctx.protocol, ctx.data_root)
    data = on_device(decoded_by(prepared.data, ctx.decoder, ctx.device, ctx.protocol), ctx.device)
    return with_cached_features(ctx, data, prepared.split), prepared.split


def _evaluate(
    ctx: RunContext, model: Model, data: LabelledImages, split: Split, keep_neighbours: bool
) -> tuple[Evaluation, np.ndarray]:
    """The test split's evaluation (In-shop: its official queries against its gallery), and
    the indices of the items evaluated as queries; `keep_neighbours` (--save-embeddings):
    with what each query retrieves."""
    query = split.query if len(split.gallery) else split.test
    gallery = (
        (data.images[split.gallery], data.labels[split.gallery]) if len(split.gallery) else None
    )
    size = len(split.gallery) if len(split.gallery) else len(query) - 1
    k = neighbour_count(ctx.protocol.evaluation.recall_ks, size) if keep_neighbours else 0
    result = evaluate(ctx, model.backbone, model.method, data.images[query], data.labels[query],
                      gallery, neighbours=k)  # fmt: skip
    return result, query


def sweep(specs: list[RunSpec], progress: bool = True) -> dict[str, int]:
    """Run specs in order; one failed run does not stop the others. Returns counts by status."""
    specs = resolve_all(specs)
    prepare_all(specs, progress)
    counts: dict[str, int] = {}
    for n, spec in enumerate(specs, 1):
        start = time.perf_counter()
        log.info("[%d/%d] %s seed %d ...", n, len(specs), spec.method, spec.seed)
        status, path = execute(spec, progress)
        counts[status] = counts.get(status, 0) + 1
        log.info("[%d/%d] %s seed %d: %s in %.1fs -> %s", n, len(specs), spec.method, spec.seed,
                 status, time.perf_counter() - start, path)  # fmt: skip
    return counts


def prepare_all(specs: list[RunSpec], progress: bool = False) -> None:
    """Each protocol's data built and checked once, before the first run takes a lock or makes
    a folder: nothing is trained on data with missing files, a class in both parts of a fixed
    split or a class with fewer than K training images (prepare_data caches what it built),
    no run starts from a local weights file that does not load (a missing package, another
    file), and a frozen trunk's feature cache is built (or checked and loaded)."""
    distinct = {(s.parsed_protocol.hash, s.data_root, s.weights): s for s in specs}
    for spec in distinct.values():  # once per protocol
        protocol = spec.parsed_protocol
        check_trainable(prepare_data(protocol, spec.data_root), protocol)
        weights = starting_weights(protocol.backbone, spec.weights)
        if weights:
            build_backbone(dataclasses.replace(protocol.backbone, weights_file=weights), 3)
        if protocol.features.cached:
            _data(run_context(spec, progress))
