"""Sweeps as lists of independent, serialisable run specifications, each -> one result file.

Data flows one way: protocol -> dataset + split -> sampler -> backbone + method -> train ->
evaluate -> result JSON. A finished result with the same protocol hash, method version,
hyperparameters, seed and budget is skipped, so an interrupted sweep resumes by running the
same command again; a result that would be replaced is archived, never lost.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import harness
from harness.backbones import build_backbone, weights_record
from harness.data import DATASETS, LabelledImages, default_cache_dir
from harness.devices import resolve_device
from harness.errors import HarnessError
from harness.evaluate import evaluate, retrieval_record, selection_score
from harness.method import METHODS, MethodContext, MethodSpec
from harness.protocol import Protocol, load_protocol
from harness.registry import closest
from harness.results import (
    RESULT_SCHEMA,
    environment,
    machine_id,
    read_result,
    result_path,
    write_json_atomic,
)
from harness.splits import Split, split_classes
from harness.train import TrainingFailed, train

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSpec:
    """Everything one run needs; plain data, so a sweep can be shipped to other workers."""

    protocol: str
    method: str
    seed: int
    data_root: str | None = None
    device: str = "auto"
    max_steps: int | None = None
    results_dir: str = "results"
    force: bool = False
    weights: str | None = None  # a local ImageNet weights file (overrides backbone.weights_file)


def plan(
    protocol: Protocol,
    methods: list[str],
    seeds: list[int] | None = None,
    **options: Any,
) -> list[RunSpec]:
    """One RunSpec per (method, seed); unknown methods and bad overrides fail before any run."""
    for name in methods:
        METHODS.get(name).hyperparameters(protocol.method_overrides(name))
    for name in protocol.methods:
        if name not in METHODS:
            raise HarnessError(
                f"{protocol.path}: methods: unknown method {name!r}{closest(name, METHODS.names())}"
            )
    return [
        RunSpec(protocol=protocol.path, method=m, seed=s, **options)
        for m in methods
        for s in (seeds if seeds is not None else protocol.seeds)
    ]


@dataclass(frozen=True)
class PreparedData:
    data: LabelledImages
    split: Split


_DATA_CACHE: dict[str, PreparedData] = {}


def prepare_data(protocol: Protocol, data_root: str | None) -> PreparedData:
    """The protocol's dataset at the backbone's input size, and its class-disjoint split."""
    key = json.dumps([protocol.dataset.name, protocol.dataset.params, data_root,
                      protocol.backbone.input_size, dataclasses.asdict(protocol.split)],
                     sort_keys=True)  # fmt: skip
    if key in _DATA_CACHE:
        return _DATA_CACHE[key]
    builder = DATASETS.get(protocol.dataset.name)
    allowed = [
        p for p in inspect.signature(builder).parameters if p not in ("data_root", "cache_dir")
    ]
    for param in protocol.dataset.params:
        if param not in allowed:
            raise HarnessError(
                f"{protocol.path}: dataset.params: {protocol.dataset.name} has no parameter "
                f"{param!r}{closest(param, allowed)}; it takes: {', '.join(allowed)}"
            )
    root = Path(data_root).expanduser() if data_root else None
    if root is not None and not root.is_dir():
        raise HarnessError(f"--data-root {root} is not a directory")
    data = builder(root, default_cache_dir(), **protocol.dataset.params)
    data = resize(data, protocol.backbone.input_size)
    prepared = PreparedData(data, split_classes(data, protocol.split))
    _DATA_CACHE[key] = prepared
    return prepared


def resize(data: LabelledImages, size: int) -> LabelledImages:
    """Resize all images once, up front, so the training step never resizes (images read
    from disk are decoded at `size` batch by batch instead)."""
    if hasattr(data.images, "resized"):  # a LazyImages
        return dataclasses.replace(data, images=data.images.resized(size))
    if data.images.shape[-2:] == (size, size):
        return data
    out = torch.empty((len(data), data.images.shape[1], size, size), dtype=torch.uint8)
    for s in range(0, len(data), 1024):
        chunk = data.images[s : s + 1024].float()
        chunk = F.interpolate(chunk, size=(size, size), mode="bilinear", antialias=True)
        out[s : s + 1024] = chunk.round().clamp(0, 255).to(torch.uint8)
    return dataclasses.replace(data, images=out)


def contiguous(labels: np.ndarray) -> np.ndarray:
    """Map the labels present to 0..C-1 (classifier heads need contiguous training ids)."""
    return np.unique(labels, return_inverse=True)[1].astype(np.int64)


def _same_run(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """A finished result of this very configuration, made on this machine: skip the run.
    (A clone on another machine reruns and archives what it found: its numbers are its own.)"""
    made_on = old.get("environment", {}).get("hardware", {}).get("machine_id")
    return (
        old.get("status") == "ok"
        and made_on == machine_id()
        and old["protocol"]["hash"] == new["protocol"]["hash"]
        and old["method"]["version"] == new["method"]["version"]
        and old["method"]["hyperparameters"] == new["method"]["hyperparameters"]
        and old["training"].get("max_steps") == new["training"]["max_steps"]
    )


def archive(path: Path, results_dir: Path) -> Path:
    """Move a result that is about to be replaced under results/archive/, stamped by time."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    target = results_dir / "archive" / path.relative_to(results_dir / "runs")
    target = target.with_name(f"{target.stem}-{stamp}.json")
    target.parent.mkdir(parents=True, exist_ok=True)
    path.replace(target)
    return target


def checkpoint_path(results_dir: Path, protocol: str, method: str, seed: int) -> Path:
    return results_dir / "checkpoints" / protocol / method / f"seed{seed}.pt"


@contextmanager
def run_lock(path: Path) -> Iterator[bool]:
    """An exclusive lock file next to the result: yields False if a live process holds it,
    so two sweeps sharing a results folder never run (or write) the same run at once."""
    lock = path.with_name(path.stem + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(lock.read_text().split()[0])
                os.kill(pid, 0)  # raises if that process is gone
                yield False
                return
            except (ValueError, IndexError, ProcessLookupError, FileNotFoundError):
                lock.unlink(missing_ok=True)  # stale: its owner died (kill -9)
                continue
            except PermissionError:
                yield False
                return
        with os.fdopen(fd, "w") as handle:
            handle.write(f"{os.getpid()} {socket.gethostname()}\n")
        try:
            yield True
        finally:
            lock.unlink(missing_ok=True)
        return
    yield False


def execute(
    spec: RunSpec, progress: bool = True, on_epoch_end: Callable[[int], None] | None = None
) -> tuple[str, Path]:
    """Run one spec unless an identical finished result exists; returns (status, path)."""
    protocol = load_protocol(spec.protocol)
    method_spec = METHODS.get(spec.method)
    hyper = method_spec.hyperparameters(protocol.method_overrides(spec.method))
    results_dir = Path(spec.results_dir)
    path = result_path(results_dir, protocol.name, spec.method, spec.seed)
    record: dict[str, Any] = {
        "schema": RESULT_SCHEMA,
        "status": "running",
        "failure": None,
        "protocol": {"name": protocol.name, "version": protocol.version, "hash": protocol.hash,
                     "path": protocol.path, "content": protocol.content()},
        "method": {"name": spec.method, "version": method_spec.version,
                   "paper": method_spec.paper, "hyperparameters": hyper},
        "seed": spec.seed,
        "training": {"max_steps": spec.max_steps},
    }  # fmt: skip
    if path.exists() and not spec.force and _same_run(read_result(path), record):
        return "skipped", path
    with run_lock(path) as locked:
        if not locked:
            log.warning("%s is being run by another process; skipping it here", path)
            return "running_elsewhere", path
        if path.exists():
            old = read_result(path)
            if _same_run(old, record) and not spec.force:
                return "skipped", path  # finished by another process meanwhile
            log.info("archived the previous result to %s", archive(path, results_dir))
        return _execute(spec, protocol, method_spec, hyper, record, path, progress, on_epoch_end)


def _execute(
    spec: RunSpec,
    protocol: Protocol,
    method_spec: MethodSpec,
    hyper: dict[str, Any],
    record: dict[str, Any],
    path: Path,
    progress: bool,
    on_epoch_end: Callable[[int], None] | None,
) -> tuple[str, Path]:
    results_dir = Path(spec.results_dir)
    device = resolve_device(spec.device)
    prepared = prepare_data(protocol, spec.data_root)
    data, split = prepared.data, prepared.split
    record["dataset"] = {"name": protocol.dataset.name, "source": data.source}
    record["split"] = split.summary()
    record["started_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    record["harness_version"] = harness.__version__
    record["environment"] = environment(device)
    if method_spec.needs_coarse_labels and not data.has_coarse:
        record.update(status="not_applicable",
                      failure=f"{spec.method} needs coarse labels; {protocol.dataset.name} has none")  # fmt: skip
        write_json_atomic(path, record)
        return "not_applicable", path

    # Bit-identical reruns: without this, multi-threaded CPU kernels (and cuDNN) may sum in
    # a different order from run to run.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(spec.seed)  # the same backbone initialisation for every method
    np.random.seed(spec.seed)
    backbone_spec = protocol.backbone
    if spec.weights:
        backbone_spec = dataclasses.replace(backbone_spec, weights_file=spec.weights)
    if backbone_spec.weights_file:
        record["backbone_weights"] = weights_record(backbone_spec.weights_file)
    backbone = build_backbone(backbone_spec, data.images.shape[1]).to(device)
    train_labels = data.labels[split.train]
    ctx = MethodContext(
        stage_dims=tuple(backbone.stage_dims),
        embedding_dim=protocol.embedding_dim,
        num_classes=len(np.unique(train_labels)),
        num_coarse_classes=len(data.coarse_names) if data.coarse_names else None,
    )
    method = method_spec.build(ctx, **hyper)
    method.head.to(device)
    if method.loss is not None:
        method.loss.to(device)
    train_coarse = None if data.coarse_labels is None else data.coarse_labels[split.train]
    ckpt = checkpoint_path(results_dir, protocol.name, spec.method, spec.seed)
    identity = json.dumps([record["protocol"]["hash"], record["method"], spec.seed,
                           spec.max_steps], sort_keys=True)  # fmt: skip
    validate = None
    if len(split.validation):  # model selection on the validation classes, never on the test
        val_images, val_labels = data.images[split.validation], data.labels[split.validation]

        def validate() -> float:
            return selection_score(backbone, method, val_images, val_labels, protocol, device,
                                   spec.seed)  # fmt: skip

    try:
        stats = train(backbone, method, data.images[split.train], contiguous(train_labels),
                      train_coarse, protocol, spec.seed, device, spec.max_steps, progress,
                      checkpoint=ckpt, identity=identity, on_epoch_end=on_epoch_end,
                      validate=validate)  # fmt: skip
    except TrainingFailed as exc:
        record.update(status="failed", failure=str(exc))
        write_json_atomic(path, record)
        ckpt.unlink(missing_ok=True)
        return "failed", path
    query = split.query if len(split.gallery) else split.test  # In-shop: official query/gallery
    gallery = (
        (data.images[split.gallery], data.labels[split.gallery]) if len(split.gallery) else None
    )
    result = evaluate(backbone, method, data.images[query], data.labels[query], protocol, device,
                      spec.seed, gallery=gallery)  # fmt: skip
    metrics, eval_timings, by_part = result.metrics, result.timings, result.by_part
    if result.distances:
        record["distances"] = result.distances
    record["status"] = "ok"
    record["metrics"] = metrics
    if by_part:  # a composite embedding's parts, each scored alone (HDC's single heads)
        record["metrics_by_part"] = by_part
    record["timings"] = {**stats.summary(), **eval_timings}
    record["tuples"] = {"kind": stats.tuple_kind, "mined": stats.tuples_mined,
                        "per_step": round(stats.tuples_mined / max(stats.steps, 1), 2),
                        "pair_scores_evaluated": stats.pair_scores_evaluated,
                        "empty_steps": stats.empty_steps}  # fmt: skip
    record["training"].update(steps=stats.steps, epochs=round(stats.epochs, 3),
                              epoch_loss=[round(v, 6) for v in stats.epoch_loss],
                              epoch_seconds=[round(v, 3) for v in stats.epoch_seconds])  # fmt: skip
    record["training"]["resumed_from_step"] = stats.resumed_from_step
    if stats.validation:
        record["selection"] = {"metric": protocol.evaluation.select_by,
                               "split": "validation", "best_epoch": stats.best_epoch,
                               "per_epoch": [round(v, 6) for v in stats.validation],
                               "seconds": round(stats.validation_seconds, 3)}  # fmt: skip
    record["retrieval"] = retrieval_record(method, protocol, len(split.test))
    record["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_json_atomic(path, record)
    ckpt.unlink(missing_ok=True)
    return "ok", path


def sweep(specs: list[RunSpec], progress: bool = True) -> dict[str, int]:
    """Run specs in order; one failed run does not stop the others. Returns counts by status."""
    counts: dict[str, int] = {}
    for n, spec in enumerate(specs, 1):
        start = time.perf_counter()
        log.info("[%d/%d] %s seed %d ...", n, len(specs), spec.method, spec.seed)
        status, path = execute(spec, progress)
        counts[status] = counts.get(status, 0) + 1
        log.info("[%d/%d] %s seed %d: %s in %.1fs -> %s", n, len(specs), spec.method, spec.seed,
                 status, time.perf_counter() - start, path)  # fmt: skip
    return counts


def _pin_worker(threads: int, log_level: int) -> None:
    """Process-pool initializer: a fixed torch thread count and the registered methods."""
    import methods  # noqa: F401  (a spawned worker starts with an empty registry)

    torch.set_num_threads(threads)
    logging.basicConfig(level=log_level, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")


def sweep_pinned(specs: list[RunSpec], workers: int, threads: int = 1) -> dict[str, int]:
    """Run specs in `workers` processes of `threads` torch threads each.

    Float rounding depends on the thread count, so a sweep whose numbers are compared bit for
    bit across machines (the regression check) pins it: then a 2-core and a 16-core machine
    of one processor type agree, and the spare cores run other specs in parallel instead.
    Returns counts by status; one failed run does not stop the others."""
    for spec in specs:  # build each dataset cache once, here, before the workers read it
        prepare_data(load_protocol(spec.protocol), spec.data_root)
    counts: dict[str, int] = {}
    start = time.perf_counter()
    if workers <= 1:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            for n, spec in enumerate(specs, 1):
                status, _ = execute(spec, progress=False)
                counts[status] = counts.get(status, 0) + 1
                log.info("[%d/%d] %s seed %d: %s (%.0f s)", n, len(specs), spec.method,
                         spec.seed, status, time.perf_counter() - start)  # fmt: skip
        finally:
            torch.set_num_threads(previous)
        return counts
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    level = logging.getLogger("harness").getEffectiveLevel()
    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),  # fork after OpenMP init can hang
        initializer=_pin_worker,
        initargs=(threads, max(level, logging.WARNING)),
    ) as pool:
        futures = {pool.submit(execute, spec, False): spec for spec in specs}
        try:
            for n, future in enumerate(as_completed(futures), 1):
                spec = futures[future]
                status, _ = future.result()
                counts[status] = counts.get(status, 0) + 1
                log.info("[%d/%d] %s seed %d: %s (%.0f s)", n, len(specs), spec.method,
                         spec.seed, status, time.perf_counter() - start)  # fmt: skip
        except BaseException:  # an error or Ctrl-C: finished results stay, queued runs do not start
            for future in futures:
                future.cancel()
            raise
    return counts
