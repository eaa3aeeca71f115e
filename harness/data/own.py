"""What the two datasets you bring without code share (`folder`: one directory per class;
`csv`: an open-metric-learning table): a listing of image files with labels and an optional
fixed split, the checks a run makes before training, and the problems `data verify` reports.

A listing decodes nothing: it becomes a LabelledImages over a LazyImages (decoded batch by
batch, like the paper datasets). Structural mistakes (one class, an empty class folder, a
missing column, a csv path that is absolute or has a `..` component, a class in both parts)
are HarnessErrors at listing time; `problems` lists what a run must not train on (missing
files, classes with fewer than K training images) one line each, and `data verify` adds files
that do not decode.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.core import HarnessError, program_name
from harness.data import official
from harness.data.base import LabelledImages
from harness.data.lazy import LazyImages, relative_paths
from harness.data.official import NATIVE_SIZE

SHOWN = 20  # problems of one kind listed by name; the rest are counted
TEST_PARTS = ("test", "query", "gallery")


@dataclass(frozen=True)
class OwnListing:
    """Every image of a dataset you brought (nothing decoded).

    files: absolute paths; labels: int64 [N] into class_names (sorted); partition: str [N] of
    train / test / query / gallery when the data fixes its split, else None; where: what the
    items came from (for messages and the result's `source`); root: the data root, which the
    data's `files` are relative to (None: no `files`)."""

    dataset: str
    where: str
    files: list[str]
    labels: np.ndarray
    class_names: list[str]
    partition: np.ndarray | None = None
    coarse_labels: np.ndarray | None = None
    coarse_names: list[str] | None = None
    root: Path | None = None

    def to_images(self) -> LabelledImages:
        """The listing as a dataset whose images are decoded from disk batch by batch."""
        parts = f"{len(self.class_names)} classes, {len(self.files)} images"
        if self.partition is not None:
            parts += ", fixed split " + ", ".join(
                f"{part} {int((self.partition == part).sum())}"
                for part in ("train", *TEST_PARTS)
                if (self.partition == part).any()
            )
        return LabelledImages(
            images=LazyImages(self.files, NATIVE_SIZE, own=True),
            labels=self.labels,
            class_names=self.class_names,
            coarse_labels=self.coarse_labels,
            coarse_names=self.coarse_names,
            source=f"{self.dataset} {self.where} ({parts})",
            partition=self.partition,
            fixed_split=self.partition is not None,
            files=None if self.root is None else relative_paths(self.files, self.root),
        )


def require_root(dataset: str, data_root: Path | None) -> Path:
    """data_root as an existing directory, or a one-line HarnessError."""
    return official.require_root(dataset, Path(data_root).expanduser() if data_root else None,
                                 "your images (docs/own-data.md)")  # fmt: skip


def index_labels(names: list[str], pad_numbers: bool = True) -> tuple[np.ndarray, list[str]]:
    """official.index_labels, where integer names (OML's labels) are first zero-padded to one
    width, so that they sort as numbers (02 before 10) wherever the harness sorts names."""
    if pad_numbers and names and all(n.isdigit() for n in names):
        width = max(len(str(int(n))) for n in names)
        names = [f"{int(n):0{width}d}" for n in names]
    return official.index_labels(names)


def check_disjoint(dataset: str, labels: np.ndarray, names: list[str], partition: np.ndarray,
                   where: str) -> None:  # fmt: skip
    """A fixed split's train and test parts share no class; a shared one is named."""
    train = set(np.unique(labels[partition == "train"]).tolist())
    test = set(np.unique(labels[np.isin(partition, TEST_PARTS)]).tolist())
    shared = sorted(train & test)
    if shared:
        more = f" (and {len(shared) - 1} more)" if len(shared) > 1 else ""
        raise HarnessError(
            f"{dataset}: class {names[shared[0]]!r}{more} is in both the train and the test "
            f"part {where}; the parts must not share a class: move or rename it"
        )
    if not train or not test:
        raise HarnessError(f"{dataset}: the fixed split {where} has no "
                           f"{'train' if not train else 'test'} images")  # fmt: skip


def missing_files(listing: OwnListing) -> list[str]:
    """The listed files that do not exist (one stat per file: cheap enough before a run)."""
    return [f for f in listing.files if not Path(f).is_file()]


def small_classes(listing: OwnListing, k: int, train_labels: np.ndarray | None = None) -> list[str]:
    """`name (n images)` for each training class with fewer than k images; the training
    items are `train_labels` when given (the protocol's split), else the fixed split's train
    part, else every item (the protocol decides which classes train)."""
    if train_labels is None:
        train_labels = listing.labels
        if listing.partition is not None:
            train_labels = listing.labels[listing.partition == "train"]
    classes, counts = np.unique(train_labels, return_counts=True)
    return [f"{listing.class_names[c]} ({n} images)" for c, n in zip(classes, counts, strict=True)
            if n < k]  # fmt: skip


def problems(listing: OwnListing, k: int) -> list[str]:
    """What a run must not train on, one line each (missing files, classes under K images)."""
    out = [f"missing {f}" for f in missing_files(listing)]
    out += [f"class {c}: fewer than K={k} training images" for c in small_classes(listing, k)]
    return out


def refuse_missing(listing: OwnListing) -> None:
    """A run never starts on a listing that names files that are not there."""
    missing = missing_files(listing)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise HarnessError(
            f"{listing.dataset}: image {missing[0]}{more} is missing; check the data with "
            f"`{program_name()} data verify --dataset {listing.dataset} --data-root DIR`"
        )


def shown(lines: list[str], what: str) -> list[str]:
    """The first SHOWN lines, then a count of the rest."""
    more = [f"... and {len(lines) - SHOWN} more {what}"] if len(lines) > SHOWN else []
    return lines[:SHOWN] + more
