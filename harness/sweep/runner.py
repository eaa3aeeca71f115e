"""Sweeps as lists of independent, serialisable run specifications, each -> one result file.

Data flows one way: protocol -> dataset + split -> sampler -> backbone + method -> train ->
evaluate -> result JSON. A finished result with the same protocol hash, method version,
hyperparameters, seed and budget is skipped, so an interrupted sweep resumes by running the
same command again; a result that would be replaced is archived, never lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from harness.core import METHODS, MethodSpec, Protocol, TrainingFailed, current, resolve_device
from harness.data import decoded_by, prepare_data
from harness.evaluate import evaluate, retrieval_record
from harness.records import RunResult, result_path, write_result
from harness.sweep.identity import checkpoint_identity
from harness.sweep.policy import checkpoint_path, decide
from harness.sweep.record import Writer, _describe_run, _record_outcome, _stop, new_result
from harness.sweep.spec import RunSpec, resolve, resolve_all
from harness.train import train_model

log = logging.getLogger(__name__)


def execute(
    spec: RunSpec, progress: bool = True, on_epoch_end: Callable[[int], None] | None = None
) -> tuple[str, Path]:
    """Run one spec unless an identical finished result exists; returns (status, path).

    Under torchrun, rank 0 decides (skip, lock, archive) and the other ranks follow it: they
    train their shard of every batch, and rank 0 alone evaluates and writes."""
    spec = resolve(spec)
    protocol = spec.parsed_protocol
    method_spec = METHODS.get(spec.method)
    hyper = spec.hyperparameters
    if not current().is_main:
        path = result_path(Path(spec.results_dir), protocol.name, spec.run_name, spec.seed)
        if _agree("") != "run":
            return "skipped", path
        record = new_result(spec, method_spec)
        return _execute(spec, protocol, method_spec, hyper, record, path, False, None)
    with ExitStack() as locks:
        status, path, record = decide(spec, locks)
        if status is not None:
            return _agree(status), path
        _agree("run")
        return _execute(spec, protocol, method_spec, hyper, record, path, progress, on_epoch_end)


def _agree(decision: str) -> str:
    """Rank 0's decision, on every rank (itself when not distributed)."""
    if not current().active:
        return decision
    box = [decision]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def _execute(
    spec: RunSpec,
    protocol: Protocol,
    method_spec: MethodSpec,
    hyper: dict[str, Any],
    record: RunResult,
    path: Path,
    progress: bool,
    on_epoch_end: Callable[[int], None] | None,
    write: Writer = write_result,
) -> tuple[str, Path]:
    """Train and evaluate one run and hand its record to `write` (the result file, or, on a
    Ray worker, the driver, which owns the results folder)."""
    results_dir = Path(spec.results_dir)
    device = resolve_device(spec.device)
    prepared = prepare_data(protocol, spec.data_root)
    data, split = decoded_by(prepared.data, spec.decoder, device, protocol), prepared.split
    _describe_run(record, protocol, data, split, device)
    log.debug("%s seed %d: protocol %s v%d from %s (hash %s), hyperparameters %s, device %s",
              spec.method, spec.seed, protocol.name, protocol.version, protocol.path,
              protocol.hash, hyper, device)  # fmt: skip
    if method_spec.needs_coarse_labels and not data.has_coarse:
        if not current().is_main:
            return "not_applicable", path
        return _stop(record, path, "not_applicable",
                     f"{spec.method} needs coarse labels; {protocol.dataset.name} has none",
                     write)  # fmt: skip

    ckpt = checkpoint_path(results_dir, protocol.name, spec.run_name, spec.seed)
    identity = checkpoint_identity(record, spec.seed, spec.max_steps, spec.decoder)
    try:
        model, stats = train_model(
            protocol, spec.method, hyper, spec.seed, device, data, split.train,
            split.validation, max_steps=spec.max_steps, progress=progress, checkpoint=ckpt,
            identity=identity, on_epoch_end=on_epoch_end, weights=spec.weights,
            workers=spec.workers, compile=spec.compile,
        )  # fmt: skip
    except TrainingFailed as exc:
        if not current().is_main:
            return "failed", path
        stopped = _stop(record, path, "failed", str(exc), write)
        ckpt.unlink(missing_ok=True)
        return stopped
    here = current()
    if not here.is_main:  # rank 0 evaluates and writes
        return "ok", path
    backbone, method = model.backbone, model.method
    query = split.query if len(split.gallery) else split.test  # In-shop: official query/gallery
    gallery = (
        (data.images[split.gallery], data.labels[split.gallery]) if len(split.gallery) else None
    )
    try:
        result = evaluate(backbone, method, data.images[query], data.labels[query], protocol,
                          device, spec.seed, gallery=gallery)  # fmt: skip
    except TrainingFailed as exc:  # e.g. NaN embeddings: this run failed, the sweep goes on
        stopped = _stop(record, path, "failed", str(exc), write)
        ckpt.unlink(missing_ok=True)
        return stopped
    if result.distances:
        record.distances = result.distances
    record.bootstrap = result.bootstrap or None
    record.clustering_convention = result.clustering
    if method.diagnostics is not None:  # the method's own numbers on the test embeddings
        record.diagnostics = method.diagnostics(
            result.embeddings, torch.as_tensor(data.labels[query])
        )
    _record_outcome(record, stats, protocol.evaluation.select_by, result.metrics, result.by_part,
                    result.timings)  # fmt: skip
    if here.active:  # the step counts whole batches; each rank embedded 1/world_size of them
        total = (record.timings or {}).get("images_per_second")
        per_rank = None if total is None else round(total / here.world_size, 1)
        record.distributed = {"world_size": here.world_size, "backend": here.backend,
                              "images_per_second_per_rank": per_rank}  # fmt: skip
    record.retrieval = retrieval_record(protocol, result.pair_scores)
    write(path, record)
    ckpt.unlink(missing_ok=True)
    return "ok", path


def sweep(specs: list[RunSpec], progress: bool = True) -> dict[str, int]:
    """Run specs in order; one failed run does not stop the others. Returns counts by status."""
    specs = resolve_all(specs)
    counts: dict[str, int] = {}
    for n, spec in enumerate(specs, 1):
        start = time.perf_counter()
        log.info("[%d/%d] %s seed %d ...", n, len(specs), spec.method, spec.seed)
        status, path = execute(spec, progress)
        counts[status] = counts.get(status, 0) + 1
        log.info("[%d/%d] %s seed %d: %s in %.1fs -> %s", n, len(specs), spec.method, spec.seed,
                 status, time.perf_counter() - start, path)  # fmt: skip
    return counts
