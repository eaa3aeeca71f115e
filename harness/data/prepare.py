"""A protocol's data, ready for runs: its dataset built (or read from the cache), its images
at the protocol's load size, and its class-disjoint split, made once per process."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from harness.core import (
    HarnessError,
    Protocol,
    closest,
    default_cache_dir,
    keyword_names,
    registered,
)
from harness.data import photo_sets, rebuild
from harness.data.base import DATASETS, LabelledImages, needs_data_root
from harness.data.sampler import check_fills_batches
from harness.data.splits import Split, split_classes


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


_ON_DEVICE: dict[
    tuple[int, str], torch.Tensor
] = {}  # the last dataset moved: a sweep's runs share it


def on_device(data: LabelledImages, device: torch.device) -> LabelledImages:
    """Decoded images held in memory moved to a CUDA device once, where they fit in half of
    its free memory: every batch is then cut and augmented on the device, which never waits
    on decoding. Images read from files, and any run on a CPU, stay as they are."""
    images = data.images
    if device.type != "cuda" or not isinstance(images, torch.Tensor) or images.is_cuda:
        return data
    key = (id(images), str(device))
    if key not in _ON_DEVICE:
        free, _ = torch.cuda.mem_get_info(device)
        if images.numel() * images.element_size() > free // 2:
            return data
        _ON_DEVICE.clear()
        _ON_DEVICE[key] = images.to(device)
    return dataclasses.replace(data, images=_ON_DEVICE[key])


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


def check_dataset(protocol: Protocol) -> Callable[..., Any]:
    """The protocol's dataset builder, once its name and dataset.params are known to it."""
    builder = registered(DATASETS.get, protocol.dataset.name, f"{protocol.path}: dataset.name")
    allowed = keyword_names(builder, ("data_root", "cache_dir")) or []
    for param in protocol.dataset.params:
        if param not in allowed:
            raise HarnessError(
                f"{protocol.path}: dataset.params: {protocol.dataset.name} has no parameter "
                f"{param!r}{closest(param, allowed)}; it takes: {', '.join(allowed)}"
            )
    return builder


def check_data_root(protocol: Protocol, data_root: str | None) -> None:
    """Before any run: a dataset read from disk has a --data-root, and it is a directory; a
    real-photo set is there and matches its manifest (harness.data.photo_sets)."""
    name = protocol.dataset.name
    if data_root is None and needs_data_root(name, protocol.dataset.params):
        raise HarnessError(f"protocol {protocol.name} reads dataset {name} from disk: pass "
                           "--data-root DIR, the folder holding it (see docs/datasets.md)")  # fmt: skip
    if data_root is not None and not Path(data_root).expanduser().is_dir():
        raise HarnessError(f"--data-root {data_root} is not a directory")
    if name in photo_sets.SETS:  # found, verified (or fetched, when asked) before any run
        rebuild.open_data(name, None if data_root is None else Path(data_root)).__exit__()


def check_trainable(prepared: PreparedData, protocol: Protocol) -> None:
    """Before any run: the training classes fill a P x K batch (each class with fewer than K
    training images named with its count; the sampler would refuse it mid-sweep)."""
    data, sampler = prepared.data, protocol.sampler
    check_fills_batches(data.labels[prepared.split.train], sampler.classes_per_batch,
                        sampler.images_per_class, data.class_names)  # fmt: skip
