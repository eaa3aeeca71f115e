"""What the five papers' datasets share: an index of image files read from the official lists.

Each dataset module (cub200, cars196, sop, inshop, vehicleid) parses its official annotation
files into a Listing - file paths, labels, the official partition, optional crop boxes and
coarse labels - without decoding any image. A Listing becomes a LabelledImages whose images
are a LazyImages (decoded batch by batch), and `harness data verify` counts a Listing against
the published numbers and decodes every file it names.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.core import HarnessError
from harness.data.base import LabelledImages
from harness.data.lazy import LazyImages, relative_paths

# Decode size before the runner resizes to the backbone's input size (a LazyImages view only
# records the size: nothing is decoded at this size unless asked).
NATIVE_SIZE = 256


@dataclass(frozen=True)
class Listing:
    """Every image of a dataset as its official lists describe it (nothing decoded).

    root: the dataset's folder (--data-root, or the dataset's own folder under it, such as
    CUB_200_2011/); the data's `files` are the paths relative to it.
    files: absolute paths; labels: int64 [N] into class_names (sorted so that the official
    class order is the sorted order); partition: str [N], "train"/"test"/"query"/"gallery";
    boxes: float [N, 4] (left, top, right, bottom in pixels) or None.
    """

    dataset: str
    root: Path
    files: list[str]
    labels: np.ndarray
    class_names: list[str]
    partition: np.ndarray
    boxes: np.ndarray | None = None
    coarse_labels: np.ndarray | None = None
    coarse_names: list[str] | None = None
    note: str = ""

    def counts(self) -> dict[str, int]:
        """Classes and images of each part, named as in protocols/reference/paper_results.yaml."""
        out = {"classes": len(np.unique(self.labels)), "images": len(self.labels)}
        for part in ("train", "test", "query", "gallery"):
            mask = self.partition == part
            if part in ("query", "gallery"):
                if mask.any():
                    out[f"{part}_images"] = int(mask.sum())
                continue
            if part == "test":
                mask = np.isin(self.partition, ["test", "query", "gallery"])
            out[f"{part}_classes"] = len(np.unique(self.labels[mask]))
            out[f"{part}_images"] = int(mask.sum())
        return out

    def to_images(self, bounding_boxes: bool = False) -> LabelledImages:
        if bounding_boxes and self.boxes is None:
            raise HarnessError(f"{self.dataset} has no bounding boxes: set bounding_boxes: false")
        lazy = LazyImages(self.files, NATIVE_SIZE, self.boxes if bounding_boxes else None)
        parts = ", ".join(f"{k} {v}" for k, v in self.counts().items())
        crop = "bounding-box crops" if bounding_boxes else "whole images"
        return LabelledImages(
            images=lazy,
            labels=self.labels,
            class_names=self.class_names,
            coarse_labels=self.coarse_labels,
            coarse_names=self.coarse_names,
            partition=self.partition,
            files=relative_paths(self.files, self.root),
            source=f"{self.dataset} from {self.root} ({parts}; {crop}){self.note}",
        )


def require_root(dataset: str, data_root: Path | None, what: str) -> Path:
    """data_root as a directory, or a HarnessError saying what to put there."""
    if data_root is None:
        raise HarnessError(f"{dataset} needs --data-root DIR holding {what} (see docs/datasets.md)")
    root = Path(data_root)
    if not root.is_dir():
        raise HarnessError(f"{dataset}: --data-root {root} is not a directory")
    return root


def find_dir(dataset: str, root: Path, name: str, marker: str, fix: str) -> Path:
    """`root/name` or `root` itself, whichever holds `marker` (a file the dataset must have);
    neither is a one-line error ending with `fix`."""
    for candidate in (root / name, root):
        if (candidate / marker).is_file():
            return candidate
    raise HarnessError(f"{dataset}: no {name}/{marker} under {root}; {fix}")


def read_rows(path: Path, columns: int, skip: int = 0) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) for every non-empty line after `skip` lines of a
    whitespace-separated list; a line with fewer than `columns` fields is an error naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HarnessError(f"{path} is missing; it is part of the official dataset") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise HarnessError(f"cannot read {path} ({exc}); get it again from the archive") from None
    for number, line in enumerate(text.splitlines()[skip:], start=skip + 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < columns:
            raise HarnessError(
                f"{path}:{number}: expected {columns} fields, got {line.strip()!r}; "
                "the file is damaged: get it again from the official archive"
            )
        yield number, fields


def as_int(value: str, path: Path, number: int) -> int:
    try:
        return int(value)
    except ValueError:
        raise HarnessError(f"{path}:{number}: {value!r} is not an integer") from None


def index_labels(names: list[str]) -> tuple[np.ndarray, list[str]]:
    """Labels into the sorted list of distinct names."""
    classes = sorted(set(names))
    index = {c: i for i, c in enumerate(classes)}
    return np.asarray([index[n] for n in names], dtype=np.int64), classes
