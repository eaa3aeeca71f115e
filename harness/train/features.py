"""The feature cache of a frozen trunk (protocol `features:`): what makes a pretrained network
fine-tunable on a CPU.

The backbone's first `frozen_stages` stages never train, so their outputs are computed once:
for every training image `train_views` views drawn by the protocol's train augmentation with
the protocol's `view_seed`, and for every image its test view. A run then trains only the
remaining stages and the head on them (harness.backbones.FrozenTrunkTail), drawing one
cached view per image and step (harness.data.cached.ViewPicker).

Like a result, the cache is keyed by everything that made it: the weights' sha256, the hash
of the protocol's parts that decide the trunk's outputs (dataset, split, backbone,
augmentation, features, precision: protocols that differ only in what trains after the trunk
share a cache), the data's labels and training rows, the decoder, the device type and the
machine fingerprint that decides float rounding, and FORMAT. The key is stored inside the file and
checked on load; a file of another key, or one that cannot be read, is rebuilt, never reused.
It is written atomically to `<cache dir>/features/`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from harness.backbones import build_backbone, trunk_outputs, weights_sha256
from harness.backbones.engine import build_engine, onnxruntime_module, resolve_engine
from harness.core import HarnessError, Protocol, RunContext, autocast, default_cache_dir
from harness.core.devices import host_memory_free
from harness.data import LabelledImages, Split, TrainPipeline, for_test
from harness.data.cached import CachedViews
from harness.data.prefetch import prefetched
from harness.records import machine_fingerprint

log = logging.getLogger(__name__)

FORMAT = 1
BATCH = 16  # torch: larger batches of 224 px images only add page faults on a CPU
ENGINE_BATCH = 32  # onnxruntime: its fastest batch here (tests/benchmarks/embed_rate.py)
_LOADED: dict[Path, CachedViews] = {}  # the last cache used: a sweep's runs share it


def trunk_content(protocol: Protocol) -> dict[str, Any]:
    """The protocol's parts that decide the cached outputs (what trains after the trunk, the
    sampler, optimizer, budget and seeds do not)."""
    content = protocol.content()
    keep = ("dataset", "split", "backbone", "augmentation", "features", "precision")
    return {key: content[key] for key in keep if key in content}


def cache_key(ctx: RunContext, data: LabelledImages, split: Split) -> dict[str, Any]:
    """Everything that made the cache (stored in it and compared on load)."""
    protocol = ctx.protocol
    trunk = json.dumps(trunk_content(protocol), sort_keys=True, separators=(",", ":"))
    labels = hashlib.sha256(np.ascontiguousarray(data.labels).tobytes()).hexdigest()[:16]
    train = hashlib.sha256(np.ascontiguousarray(split.train).tobytes()).hexdigest()[:16]
    return {
        "format": FORMAT,
        "trunk_hash": hashlib.sha256(trunk.encode()).hexdigest()[:16],
        "weights_sha256": weights_sha256(protocol.backbone, ctx.weights),
        "images": len(data),
        "labels_sha256": labels,
        "train_rows_sha256": train,
        "frozen_stages": protocol.features.frozen_stages,
        "train_views": protocol.features.train_views,
        "view_seed": protocol.features.view_seed,
        "decoder": ctx.decoder,
        "device": ctx.device.type,
        "machine": machine_fingerprint(ctx.device)["id"],
    } | _engine_key(ctx)


def _engine_key(ctx: RunContext) -> dict[str, str]:
    """The engine, when it is not torch (older caches, all torch's, keep their key)."""
    name = engine_of(ctx)
    if name == "torch":
        return {}
    return {"engine": f"{name} {onnxruntime_module().__version__}"}


def cache_path(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return default_cache_dir() / "features" / f"trunk-{digest}.pt"


def with_cached_features(ctx: RunContext, data: LabelledImages, split: Split) -> LabelledImages:
    """`data` with its images replaced by the frozen trunk's cached outputs (loaded when a
    cache of this very key exists, else computed and saved); `data` itself when the
    protocol freezes nothing."""
    if not ctx.protocol.features.cached:
        return data
    key = cache_key(ctx, data, split)
    path = cache_path(key)
    views = _LOADED.get(path) if path.is_file() else None
    if views is None:
        views = _load(path, key)
        if views is None:
            views = _compute(ctx, data, split, path)
            _save(path, key, views)
        _LOADED.clear()
        _LOADED[path] = views
    return dataclasses.replace(data, images=views)


def _load(path: Path, key: dict[str, Any]) -> CachedViews | None:
    if not path.is_file():
        return None
    try:
        stored = torch.load(path, map_location="cpu", weights_only=True)
        if stored["key"] != key:
            log.warning("feature cache %s was made with %s: rebuilding it", path,
                        _differences(stored["key"], key))  # fmt: skip
            return None
        made_by = {**stored.get("made_by", {"engine": "torch"}), "loaded": str(path)}
        views = CachedViews(stored["test"], stored["train"], stored["train_row"].numpy(), made_by)
    except Exception as exc:  # a truncated or foreign file: rebuilt, never trusted
        log.warning("feature cache %s cannot be read (%s): rebuilding it", path, exc)
        return None
    log.info("feature cache: loaded %s", path)
    return views


def _differences(old: Any, new: dict[str, Any]) -> str:
    if not isinstance(old, dict):
        return "no key"
    return ", ".join(f"{k} {old.get(k)!r} (now {v!r})" for k, v in new.items() if old.get(k) != v)


def _save(path: Path, key: dict[str, Any], views: CachedViews) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".part")
    os.close(fd)
    try:
        torch.save({"key": key, "test": views.test, "train": views.train,
                    "train_row": torch.from_numpy(views.train_row), "made_by": views.made_by},
                   tmp)  # fmt: skip
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    log.info("feature cache: saved %s (%.0f MB)", path, path.stat().st_size / 2**20)


def available_memory() -> int:
    """Bytes of memory this machine can still give (MemAvailable under the cgroup's limit;
    all of it where that cannot be read)."""
    free = host_memory_free()
    return free if free is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_room(rows: int, values: int, path: Path) -> None:
    """Refuse, before the trunk runs, a cache that cannot fit: it is held in memory twice
    while it is assembled, and written once to disk (float16: 2 bytes a value)."""
    import shutil

    size = rows * values * 2
    memory, where = available_memory(), path.parent
    where.mkdir(parents=True, exist_ok=True)
    disk = shutil.disk_usage(where).free
    gb = 2**30
    if 2 * size > memory or size > disk:
        short = "memory" if 2 * size > memory else "disk"
        raise HarnessError(
            f"the feature cache would hold {rows} rows of {values} values ({size / gb:.1f} GB; "
            f"{2 * size / gb:.1f} GB of memory while it is built), but this machine has "
            f"{memory / gb:.1f} GB of memory available and {disk / gb:.1f} GB free in {where}: "
            f"not enough {short}; freeze more stages (features.frozen_stages; all of them caches "
            "only the pooled features), or use fewer features.train_views"
        )


class FrozenTrunk(torch.nn.Module):
    """uint8 images -> the frozen stages' outputs (what the cache holds), normalisation and
    the protocol's precision inside: the network an engine runs."""

    def __init__(self, backbone: torch.nn.Module, frozen_stages: int, precision: str,
                 device: torch.device) -> None:  # fmt: skip
        super().__init__()
        self.backbone, self.frozen_stages = backbone, frozen_stages
        self.precision, self.device = precision, device

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.backbone.prepare(images)
        with autocast(self.device, self.precision):
            return trunk_outputs(self.backbone, x, self.frozen_stages)


def _batches(ctx: RunContext, data: LabelledImages, train_rows: np.ndarray,
             size: int) -> Iterator[torch.Tensor]:  # fmt: skip
    """The uint8 batches the trunk runs on: every image's test view, then each train view of
    the training images (decoded and augmented here, in the prefetch thread)."""
    protocol = ctx.protocol
    test_images = for_test(data.images, protocol.augmentation, protocol.backbone.input_size)
    for s in range(0, len(data), size):
        yield _loaded(test_images[s : s + size])
    pipeline = TrainPipeline(protocol.augmentation.train, protocol.features.view_seed)
    for view in range(protocol.features.train_views):
        for s in range(0, len(train_rows), size):
            rows = train_rows[s : s + size]
            images = _loaded(data.images[torch.from_numpy(rows)])
            if protocol.augmentation.train:
                images = pipeline(images, view, rows.tolist())  # generator (view_seed, view, row)
            yield images


@torch.no_grad()
def _compute(ctx: RunContext, data: LabelledImages, split: Split, path: Path) -> CachedViews:
    """The trunk's outputs, in eval mode (its BatchNorm statistics are ImageNet's), once the
    cache is known to fit this machine, run by the protocol's engine with the next batch
    prepared beside it."""
    protocol, features = ctx.protocol, ctx.protocol.features
    spec = protocol.backbone
    if ctx.weights:
        spec = dataclasses.replace(spec, weights_file=ctx.weights)
    backbone = build_backbone(spec, data.images.shape[1]).to(ctx.device).eval()
    network = FrozenTrunk(backbone, features.frozen_stages, protocol.precision, ctx.device)
    train_rows = np.sort(np.asarray(split.train, dtype=np.int64))
    side, channels = spec.input_size, data.images.shape[1]
    example = torch.randint(0, 256, (2, channels, side, side), dtype=torch.uint8,
                            generator=torch.Generator().manual_seed(0))  # fmt: skip
    values = network(example[:1].to(ctx.device)).shape[1]
    check_room(len(train_rows) * features.train_views + len(data), values, path)
    engine = build_engine(network, example, engine_of(ctx), device=ctx.device, key={
        "weights_sha256": weights_sha256(protocol.backbone, ctx.weights), "backbone": spec.name,
        "frozen_stages": features.frozen_stages, "input": [channels, side, side]})  # fmt: skip
    total = len(train_rows) * features.train_views + len(data)
    bar = tqdm(total=total, desc=f"feature cache ({protocol.name}, {engine.name})", unit="img",
               disable=not ctx.progress)  # fmt: skip
    start, outputs = time.perf_counter(), []
    size = BATCH if engine.name == "torch" else ENGINE_BATCH
    for images in prefetched(_batches(ctx, data, train_rows, size)):
        outputs.append(engine.run(images).to(torch.float16))
        bar.update(len(images))
    bar.close()
    seconds = time.perf_counter() - start
    made_by = {**engine.provenance(), "seconds": round(seconds, 2),
               "images_per_s": round(total / max(seconds, 1e-9), 1)}  # fmt: skip
    log.info("feature cache: %d images in %.0f s (%.0f img/s, %s %s, %d threads)", total,
             seconds, total / max(seconds, 1e-9), engine.name, engine.version, engine.threads)  # fmt: skip
    flat = torch.cat(outputs)
    test, train = flat[: len(data)], flat[len(data) :].view(features.train_views,
                                                             len(train_rows), -1)  # fmt: skip
    train_row = np.full(len(data), -1, dtype=np.int64)
    train_row[train_rows] = np.arange(len(train_rows))
    return CachedViews(test, train.transpose(0, 1).contiguous(), train_row, made_by)


def engine_of(ctx: RunContext) -> str:
    """The engine the cache is computed with: the protocol's, on a CPU; torch on a GPU."""
    return resolve_engine(ctx.protocol.features.engine, ctx.device)


def _loaded(images: Any) -> torch.Tensor:
    return images.load() if hasattr(images, "load") else images
