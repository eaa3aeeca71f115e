"""What every dataset returns: images (in memory, or read lazily from disk) with fine and
optional coarse labels, and optionally the dataset's official partition of its items."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from harness.core import HarnessError, Registry
from harness.data.lazy import LazyImages

# The official parts a dataset may assign its items to (protocol `split: {official: true}`).
PARTS = ("train", "test", "query", "gallery")


@dataclass(frozen=True)
class LabelledImages:
    """A whole dataset.

    images: uint8 tensor [N, C, H, W] (C = 1 for grayscale, 3 for colour), or a LazyImages
      that decodes files on demand and indexes like one.
    labels: int64 array [N], fine class index into `class_names`.
    coarse_labels: int64 array [N] into `coarse_names`, or None when the dataset has no superclasses.
    class_names: one stable, sortable name per fine class (the split sorts by it).
    source: a short description of where the pixels came from (paths, archive names, versions).
    partition: str array [N] of PARTS, the dataset's official split (train / test, or train /
      query / gallery), or None when the dataset has none.
    fixed_split: the partition is the data owner's own split (a `folder` dataset's train/ and
      test/, a `csv` table's split column): a protocol must use it (`split: {official: true}`)
      rather than quietly re-split the classes.
    files: each image's file, relative to the dataset's root (POSIX separators; an in-archive
      path for images decoded from a zip), or None when the images are not read from files
      (rendered glyphs); `run --save-embeddings` writes the test rows' files to paths.txt.
    provenance: how the files were built when they are not the published bytes (a real-photo
      dataset rebuilt with another Pillow; harness.data.photo_sets), else None.
    """

    images: torch.Tensor | LazyImages
    labels: np.ndarray
    class_names: list[str]
    coarse_labels: np.ndarray | None = None
    coarse_names: list[str] | None = None
    source: str = ""
    partition: np.ndarray | None = None
    fixed_split: bool = False
    files: tuple[str, ...] | None = None
    provenance: dict | None = None

    def __post_init__(self) -> None:
        n = len(self.labels)
        cached = getattr(self.images, "in_process", False)  # a frozen trunk's CachedViews
        if not cached and (self.images.dtype != torch.uint8 or self.images.ndim != 4):
            raise ValueError("images must be a uint8 tensor [N, C, H, W]")
        if self.images.shape[0] != n:
            raise ValueError(f"{self.images.shape[0]} images but {n} labels")
        if n == 0:
            raise HarnessError("the dataset is empty: check --data-root and the dataset's files")
        if self.coarse_labels is not None and len(self.coarse_labels) != n:
            raise ValueError(f"{len(self.coarse_labels)} coarse labels but {n} labels")
        if self.partition is not None:
            if len(self.partition) != n:
                raise ValueError(f"{len(self.partition)} partition entries but {n} labels")
            unknown = set(np.unique(self.partition).tolist()) - set(PARTS)
            if unknown:
                raise ValueError(f"unknown partition values {sorted(unknown)}; known: {PARTS}")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def has_coarse(self) -> bool:
        return self.coarse_labels is not None

    def subset(self, indices: np.ndarray) -> LabelledImages:
        """The items at `indices`, keeping the full class name lists (labels stay comparable)."""
        idx = np.asarray(indices, dtype=np.int64)
        return LabelledImages(
            images=self.images[torch.from_numpy(idx)],  # a LazyImages returns a view
            labels=self.labels[idx],
            class_names=self.class_names,
            coarse_labels=None if self.coarse_labels is None else self.coarse_labels[idx],
            coarse_names=self.coarse_names,
            source=self.source,
            partition=None if self.partition is None else self.partition[idx],
            fixed_split=self.fixed_split,
            files=None if self.files is None else tuple(self.files[i] for i in idx),
            provenance=self.provenance,
        )


# A dataset builder: build(data_root, cache_dir, **params) -> LabelledImages.
# data_root is None when the user gave no --data-root; params come from the protocol.
DatasetBuilder = Callable[..., LabelledImages]

DATASETS: Registry[DatasetBuilder] = Registry("dataset")

# Whether a dataset needs --data-root, given its params (read before any run, so that a missing
# --data-root is one line at planning time, not an error inside the first run)
_NEEDS_ROOT: dict[str, Callable[[dict], bool]] = {}


def register_dataset(
    name: str, needs_data_root: bool | Callable[[dict], bool] | None = None
) -> Callable[[DatasetBuilder], DatasetBuilder]:
    """Register a dataset builder under `name` (one line per dataset in harness/data/__init__.py).
    needs_data_root: True when it reads --data-root, or a function of dataset.params saying so
    (Omniglot's download); None leaves the check to the builder."""
    if needs_data_root is not None:
        _NEEDS_ROOT[name] = needs_data_root if callable(needs_data_root) else lambda _: True
    return DATASETS.register(name)


def needs_data_root(name: str, params: dict) -> bool:
    """Whether dataset `name` with these params reads --data-root (False when undeclared)."""
    check = _NEEDS_ROOT.get(name)
    return bool(check and check(params))
