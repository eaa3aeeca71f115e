"""Photos from a folder as a kept model's input: found, decoded and preprocessed exactly as the
run's evaluation preprocessed its test photos (harness.deploy.model.preprocessing), then
embedded in batches with a progress bar. A file that cannot be decoded is skipped and
reported, never the end of a long job.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from harness.backbones.engine import Engine, build_engine
from harness.core import HarnessError, OpSpec
from harness.data.augment import apply_op
from harness.data.lazy import pixels
from harness.data.photo_decode import TOO_LARGE, open_photo
from harness.data.prefetch import prefetched
from harness.deploy.model import LoadedModel

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")
BATCH = 32


def image_files(folder: Path) -> list[str]:
    """The image files under `folder` (by suffix, any case; hidden files and folders left
    out), as sorted POSIX paths relative to it: the catalogue's rows, in a fixed order."""
    if not folder.is_dir():
        raise HarnessError(f"--images {folder} is not a folder; give the folder of photos")
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            if not name.startswith(".") and name.lower().endswith(IMAGE_SUFFIXES):
                found.append(Path(root, name).relative_to(folder).as_posix())
    return sorted(found)


def preprocess(path: Path | str, preprocessing: dict[str, Any]) -> torch.Tensor:
    """One photo as the network's input, uint8 [C, S, S]: decoded upright to RGB as a viewer
    shows it (harness.data.photo_decode), resized to the load size, then the test ops. A
    one-line HarnessError naming the file if it cannot be decoded or is too large."""
    try:
        photo = open_photo(path, str(path))
    except FileNotFoundError:
        raise HarnessError(f"cannot decode {path}: the file does not exist") from None
    image = torch.from_numpy(np.ascontiguousarray(pixels(photo, int(preprocessing["load_size"]))))
    for op in preprocessing["test_ops"]:
        image = apply_op(image, OpSpec(**op))
    size = int(preprocessing["input"]["size"])
    if tuple(image.shape[-2:]) != (size, size):
        raise HarnessError(f"{path}: preprocessed to {tuple(image.shape[-2:])}, not the "
                           f"model's {size} x {size}; the model's test ops do not end at its "
                           "input size")  # fmt: skip
    return image


@dataclass
class Embedded:
    """A folder's photos embedded: the files that were (in order) with their vectors, and
    those that could not be decoded, with why."""

    files: list[str]
    vectors: np.ndarray
    failed: list[tuple[str, str]] = field(default_factory=list)
    engine: dict[str, Any] | None = None  # what embedded them: name, version, threads


def model_engine(model: LoadedModel, device: torch.device | None = None,
                 name: str = "auto", threads: int | None = None) -> Engine:  # fmt: skip
    """The engine that embeds photos with the kept model: `auto` is onnxruntime on a CPU
    where it is installed (about 4x torch's rate here), torch otherwise and on a GPU; an
    engine asked for by name that is not installed is one line."""
    from harness.deploy.export import sample_batch

    device = device or torch.device("cpu")
    if name == "auto":
        name = "onnxruntime" if device.type == "cpu" and _installed("onnxruntime") else "torch"
    spec = model.preprocessing["input"]
    key = {"weights_sha256": model.weights_sha256, "part": "embedder",
           "input": [int(spec["channels"]), int(spec["size"]), int(spec["size"])]}  # fmt: skip
    embedder = model.embedder.to(device).eval()
    return build_engine(embedder, sample_batch(model), name, key, device, threads)


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _decoded(folder: Path, files: list[str], preprocessing: dict[str, Any],
             failed: list[tuple[str, str]],
             ) -> Iterator[tuple[list[str], torch.Tensor | None, list[str]]]:  # fmt: skip
    """BATCH files at a time: (the files tried, their input batch or None when none decoded,
    the files in it); an undecodable file is added to `failed` and left out."""
    for start in range(0, len(files), BATCH):
        batch, names = [], []
        for name in files[start : start + BATCH]:
            try:
                batch.append(preprocess(folder / name, preprocessing))
                names.append(name)
            except HarnessError as exc:
                failed.append((name, str(exc)))
        yield files[start : start + BATCH], (torch.stack(batch) if batch else None), names


def embed_files(
    model: LoadedModel, folder: Path, files: list[str], *, progress: bool = True,
    device: torch.device | None = None, engine: str = "auto", threads: int | None = None,
) -> Embedded:  # fmt: skip
    """Embed `files` (relative to `folder`) with the model, BATCH at a time, by the engine
    model_engine gives for `engine` on `device`, the next batch decoded in a thread while
    the engine runs; undecodable files are skipped and listed in `failed`."""
    if not files:  # nothing to embed: no engine to build
        dim = int(model.meta["embedding_dim"])
        return Embedded([], np.zeros((0, dim), np.float32), [])
    runner = model_engine(model, device, engine, threads)
    kept: list[str] = []
    chunks: list[np.ndarray] = []
    failed: list[tuple[str, str]] = []
    bar = tqdm(total=len(files), desc=f"embedding ({runner.name})", unit="img",
               disable=not progress)  # fmt: skip
    for tried, batch, names in prefetched(_decoded(folder, files, model.preprocessing, failed)):
        if batch is not None:
            chunks.append(runner.run(batch).numpy())
            kept += names
        bar.update(len(tried))
    bar.close()
    dim = int(model.meta["embedding_dim"])
    vectors = np.concatenate(chunks) if chunks else np.zeros((0, dim), np.float32)
    return Embedded(kept, np.ascontiguousarray(vectors, dtype=np.float32), failed,
                    runner.provenance())  # fmt: skip


def report_failed(failed: list[tuple[str, str]], shown: int = 3) -> None:
    """One warning for the files that could not be decoded and one for those too large to be
    (over PIL's decompression-bomb limit), each naming the first few."""
    from PIL import Image

    large = [name for name, why in failed if TOO_LARGE in why]
    broken = [name for name, why in failed if TOO_LARGE not in why]
    limit = f"{Image.MAX_IMAGE_PIXELS:,}" if Image.MAX_IMAGE_PIXELS else "no"
    for names, what in [(broken, "that could not be decoded"),
                        (large, f"too large to decode (over PIL's decompression-bomb limit "
                                f"of {limit} pixels)")]:  # fmt: skip
        if names:
            more = f" and {len(names) - shown} more" if len(names) > shown else ""
            log.warning("skipped %d file(s) %s: %s%s", len(names), what,
                        ", ".join(names[:shown]), more)  # fmt: skip
