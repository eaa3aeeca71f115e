"""Sweeps as lists of independent, serialisable run specifications, each -> one result file.

Data flows one way: protocol -> dataset + split -> sampler -> backbone + method -> train ->
evaluate -> result JSON. A finished result with the same protocol hash, method version,
hyperparameters, seed and budget is skipped, so an interrupted sweep resumes by running the
same command again; a result that would be replaced is archived, never lost.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import harness
from harness import distributed
from harness.data import LabelledImages, default_cache_dir
from harness.devices import resolve_device
from harness.errors import HarnessError
from harness.evaluate import evaluate, retrieval_record, selection_score
from harness.locks import run_lock
from harness.method import METHODS, MethodSpec, protocol_hyperparameters
from harness.model import Model, build_model
from harness.preflight import check_dataset, check_protocol
from harness.protocol import Protocol, load_protocol
from harness.results import (
    DatasetInfo,
    Environment,
    MethodInfo,
    ProtocolInfo,
    RunResult,
    Selection,
    TrainingRecord,
    TupleCounts,
    archive,
    environment,
    machine_id,
    read_result,
    result_path,
    write_result,
)
from harness.run_identity import checkpoint_identity, hashed_weights, refuse_to_replace, weights_sha
from harness.splits import Split, split_classes
from harness.train import TrainingFailed, TrainStats, train

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSpec:
    """Everything one run needs; plain, picklable data, so a sweep can be shipped to other
    workers. `plan` fills in the parsed protocol, the method's resolved hyperparameters and
    the sweep's seeds once; a spec made by hand may give a protocol name or path instead, and
    `resolve` completes it."""

    protocol: Protocol | str = field(hash=False)  # parsed by plan; a name or path is parsed once
    method: str
    seed: int
    data_root: str | None = None
    device: str = "auto"
    max_steps: int | None = None
    results_dir: str = "results"
    force: bool = False
    weights: str | None = None  # a local ImageNet weights file (overrides backbone.weights_file)
    workers: int | None = None  # processes preparing batches (None: pipeline.default_workers)
    decoder: str = "pil"  # who decodes image files: "pil" (the workers) or "torch" (the device)
    compile: bool = False  # the training step's backbone through torch.compile
    hyperparameters: dict[str, Any] | None = field(default=None, hash=False)  # None: resolve
    sweep_seeds: tuple[int, ...] | None = None  # what the sweep asked for (None: the protocol's)
    # a tuned configuration (`run --tuned`): the tuning study's record; None: paper defaults
    tuning: dict[str, Any] | None = field(default=None, hash=False)

    @property
    def run_name(self) -> str:
        """The method's folder under runs/<protocol>/: tuned runs apart from paper-default ones."""
        return f"{self.method}{TUNED_SUFFIX}" if self.tuning else self.method

    @property
    def parsed_protocol(self) -> Protocol:
        if isinstance(self.protocol, str):
            raise HarnessError(f"run spec for {self.method} is not resolved; call resolve() first")
        return self.protocol


def resolve(spec: RunSpec) -> RunSpec:
    """The spec with its protocol parsed and the method's hyperparameters resolved (defaults
    with the protocol's overrides; an unknown override is an error); a resolved spec as is."""
    protocol = load_protocol(spec.protocol) if isinstance(spec.protocol, str) else spec.protocol
    hyper = spec.hyperparameters
    if hyper is None:
        hyper = protocol_hyperparameters(protocol, spec.method)
    if protocol is spec.protocol and hyper is spec.hyperparameters:
        return spec
    return dataclasses.replace(spec, protocol=protocol, hyperparameters=hyper)


def resolve_all(specs: list[RunSpec]) -> list[RunSpec]:
    """Resolve a sweep, parsing each protocol named by path once (not once per spec)."""
    parsed: dict[str, Protocol] = {}
    for spec in specs:
        if isinstance(spec.protocol, str) and spec.protocol not in parsed:
            parsed[spec.protocol] = load_protocol(spec.protocol)
    return [
        resolve(dataclasses.replace(s, protocol=parsed[s.protocol]))
        if isinstance(s.protocol, str)
        else resolve(s)
        for s in specs
    ]


def _check_weights(protocol: Protocol, weights: str | None) -> None:
    """`--weights FILE` before any run: a file that exists, for a pretrained backbone."""
    if not weights:
        return
    if protocol.backbone.pretrained == "none":
        raise HarnessError(f"--weights loads pretrained weights, but protocol {protocol.name} "
                           f"trains its {protocol.backbone.name} from random weights "
                           "(backbone.pretrained: none): drop --weights")  # fmt: skip
    if not Path(weights).is_file():
        raise HarnessError(f"weights file {weights} does not exist (from --weights)")


def plan(
    protocol: Protocol,
    methods: list[str],
    seeds: list[int] | None = None,
    tuned: bool = False,
    **options: Any,
) -> list[RunSpec]:
    """One resolved RunSpec per (method, seed): the protocol parsed once, each method's
    hyperparameters resolved once (with `tuned`, the configuration `harness tune` found on
    validation classes); unknown methods, bad overrides and missing tunings fail before any run."""
    hyper = check_protocol(protocol, methods)  # what `validate` checks too
    tuning: dict[str, dict[str, Any] | None] = dict.fromkeys(methods)
    if tuned:
        from harness.tune import load_overlay

        for name in methods:
            overlay = load_overlay(options.get("results_dir", "results"), protocol, name,
                                   options.get("max_steps"))  # fmt: skip
            hyper[name] = METHODS.get(name).hyperparameters(
                overlay.get("hyperparameters"), f"{overlay['path']}: hyperparameters"
            )
            tuning[name] = {**overlay["study"], "overlay": overlay["path"]}
    _check_weights(protocol, options.get("weights"))
    asked = tuple(seeds if seeds is not None else protocol.seeds)
    specs = [
        RunSpec(
            protocol=protocol,
            method=m,
            seed=s,
            hyperparameters=hyper[m],
            sweep_seeds=asked,
            tuning=tuning[m],
            **options,
        )
        for m in methods
        for s in asked
    ]
    for spec in specs:  # before any run, not half-way through the sweep
        path = result_path(Path(spec.results_dir), protocol.name, spec.run_name, spec.seed)
        if path.exists() and not spec.force:
            refuse_to_replace(read_result(path), spec.max_steps, protocol.hash, path)
    return specs


@dataclass(frozen=True)
class PreparedData:
    data: LabelledImages
    split: Split


_DATA_CACHE: dict[str, PreparedData] = {}


def prepare_data(protocol: Protocol, data_root: str | None) -> PreparedData:
    """The protocol's dataset at its load size (the backbone's input size unless the
    augmentation says otherwise), and its class-disjoint split."""
    key = json.dumps([protocol.dataset.name, protocol.dataset.params, data_root,
                      protocol.load_size, dataclasses.asdict(protocol.split)],
                     sort_keys=True)  # fmt: skip
    if key in _DATA_CACHE:
        return _DATA_CACHE[key]
    builder = check_dataset(protocol)
    root = Path(data_root).expanduser() if data_root else None
    if root is not None and not root.is_dir():
        raise HarnessError(f"--data-root {root} is not a directory")
    data = builder(root, default_cache_dir(), **protocol.dataset.params)
    data = resize(data, protocol.load_size)
    prepared = PreparedData(data, split_classes(data, protocol.split))
    _DATA_CACHE[key] = prepared
    return prepared


def resize(data: LabelledImages, size: int) -> LabelledImages:
    """Resize all images once, up front, so the training step never resizes (images read
    from disk are decoded at `size` batch by batch instead; size 0 keeps them as they are)."""
    if hasattr(data.images, "resized"):  # a LazyImages
        return dataclasses.replace(data, images=data.images.resized(size))
    if not size or data.images.shape[-2:] == (size, size):  # 0: as they are (load: original)
        return data
    out = torch.empty((len(data), data.images.shape[1], size, size), dtype=torch.uint8)
    for s in range(0, len(data), 1024):
        chunk = data.images[s : s + 1024].float()
        chunk = F.interpolate(chunk, size=(size, size), mode="bilinear", antialias=True)
        out[s : s + 1024] = chunk.round().clamp(0, 255).to(torch.uint8)
    return dataclasses.replace(data, images=out)


def decoded_by(
    data: LabelledImages, decoder: str, device: torch.device, protocol: Protocol
) -> LabelledImages:
    """The data with its image files decoded by `decoder` ("pil" or "torch" on `device`)."""
    if decoder == "pil":
        return data
    if not hasattr(data.images, "decoded_by"):
        raise HarnessError(f"--decoder {decoder} decodes image files, but {protocol.dataset.name} "
                           "is held in memory: drop --decoder")  # fmt: skip
    return dataclasses.replace(data, images=data.images.decoded_by(decoder, device))


def contiguous(labels: np.ndarray) -> np.ndarray:
    """Map the labels present to 0..C-1 (classifier heads need contiguous training ids)."""
    return np.unique(labels, return_inverse=True)[1].astype(np.int64)


def _same_run(old: RunResult, new: RunResult, any_machine: bool = False) -> bool:
    """A finished result of this very configuration, made on this machine (or, for a sweep on
    a cluster, on any of its machines): skip the run. (A clone on another machine reruns and
    archives what it found: its numbers are its own.)"""
    return not _differences(old, new, any_machine)


def _differences(old: RunResult, new: RunResult, any_machine: bool = False) -> list[str]:
    """Why `old` is not a finished result of the run `new` (empty: it is)."""
    if not old.ok:  # a failed or interrupted run may lack what the checks below read
        return [f"a {old.status} run"]
    checks = [
        (not any_machine and old.hardware.machine_id != machine_id(), "made on another machine"),
        (old.protocol.hash != new.protocol.hash, "another protocol hash"),
        (old.method.version != new.method.version, "another method version"),
        (old.method.hyperparameters != new.method.hyperparameters, "other hyperparameters"),
        (old.training.max_steps != new.training.max_steps, "another step cap"),
        (weights_sha(old) != weights_sha(new), "another weights file"),
    ]
    return [why for differs, why in checks if differs]


TUNED_SUFFIX = "+tuned"


def checkpoint_path(results_dir: Path, protocol: str, method: str, seed: int) -> Path:
    return results_dir / "checkpoints" / protocol / method / f"seed{seed}.pt"


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
    if not distributed.current().is_main:
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


def decide(
    spec: RunSpec, locks: ExitStack, any_machine: bool = False
) -> tuple[str | None, Path, RunResult]:
    """Whether to run a resolved spec now, by the skip-if-finished rule: (None, path, record)
    with the run's lock held in `locks` and a different earlier result archived, or
    ("skipped" | "running_elsewhere", path, record). `any_machine`: a result made on another
    machine counts as finished (a cluster's driver)."""
    path = result_path(Path(spec.results_dir), spec.parsed_protocol.name, spec.run_name,
                       spec.seed)  # fmt: skip
    record = new_result(spec, METHODS.get(spec.method))
    if path.exists() and not spec.force and _same_run(read_result(path), record, any_machine):
        return "skipped", path, record
    if not locks.enter_context(run_lock(path)):
        log.warning("%s is being run by another process; skipping it here", path)
        return "running_elsewhere", path, record
    if path.exists():
        old = read_result(path)
        if not spec.force and _same_run(old, record, any_machine):
            return "skipped", path, record  # finished by another process meanwhile
        if not spec.force:  # plan checked before the sweep; another process may have written
            refuse_to_replace(old, spec.max_steps, spec.parsed_protocol.hash, path)
        why = "--force" if spec.force else ", ".join(_differences(old, record, any_machine))
        log.info("archived the previous result (%s) to %s", why,
                 archive(path, Path(spec.results_dir)))  # fmt: skip
    return None, path, record


def _agree(decision: str) -> str:
    """Rank 0's decision, on every rank (itself when not distributed)."""
    if not distributed.current().active:
        return decision
    box = [decision]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def new_result(spec: RunSpec, method_spec: MethodSpec) -> RunResult:
    """What a run is before it starts: protocol, method, seed, the sweep's seeds, budget, the
    weights file it starts from (with its sha256, so a changed file is another run)."""
    protocol = spec.parsed_protocol
    weights_file = spec.weights or protocol.backbone.weights_file
    return RunResult(
        status="running",
        protocol=ProtocolInfo(protocol.name, protocol.version, protocol.hash, protocol.path,
                              protocol.content()),
        method=MethodInfo(spec.method, method_spec.version, method_spec.paper,
                          dict(spec.hyperparameters or {})),
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
    record.dataset = DatasetInfo(protocol.dataset.name, data.source)
    record.split = split.summary()
    record.started_at = _now()
    record.harness_version = harness.__version__
    record.environment = Environment.from_json(environment(device))


Writer = Callable[[Path, RunResult], None]


def _stop(
    record: RunResult, path: Path, status: str, failure: str, write: Writer = write_result
) -> tuple[str, Path]:
    """Write a run that ends without metrics (failed, not applicable) and say so."""
    record.status, record.failure = status, failure
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


def train_model(
    protocol: Protocol,
    method_name: str,
    hyper: dict[str, Any],
    seed: int,
    device: torch.device,
    data: LabelledImages,
    train_idx: np.ndarray,
    validation_idx: np.ndarray | None = None,
    *,
    on_validation: Callable[[float], None] | None = None,
    weights: str | None = None,
    **train_options: Any,
) -> tuple[Model, TrainStats]:
    """Build the model for `data[train_idx]` and train it: the one path that `run` and `tune`
    share. With validation indices (never test ones), the protocol's selection metric on them
    is computed after every epoch (and passed to `on_validation`) and the best epoch kept.
    `train_options` go to `train` (max_steps, progress, checkpoint, identity, on_epoch_end);
    raises TrainingFailed."""
    labels = data.labels[train_idx]
    model = build_model(
        protocol, method_name, hyper, seed, device, in_channels=data.images.shape[1],
        num_classes=len(np.unique(labels)),
        num_coarse_classes=len(data.coarse_names) if data.coarse_names else None,
        weights=weights,
    )  # fmt: skip
    validate = None
    if validation_idx is not None and len(validation_idx):
        val_images, val_labels = data.images[validation_idx], data.labels[validation_idx]

        def validate() -> float:
            value = selection_score(model.backbone, model.method, val_images, val_labels,
                                    protocol, device, seed)  # fmt: skip
            if on_validation is not None:
                on_validation(value)
            return value

    coarse = None if data.coarse_labels is None else data.coarse_labels[train_idx]
    train_options.setdefault("progress", False)
    stats = train(model.backbone, model.method, data.images[train_idx], contiguous(labels),
                  coarse, protocol, seed, device, validate=validate, **train_options)  # fmt: skip
    return model, stats


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
        if not distributed.current().is_main:
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
        if not distributed.current().is_main:
            return "failed", path
        stopped = _stop(record, path, "failed", str(exc), write)
        ckpt.unlink(missing_ok=True)
        return stopped
    here = distributed.current()
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
