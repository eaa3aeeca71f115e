"""Class-disjoint splits: the classes a model trains on are never the classes it is tested on."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from harness.core import HarnessError, SplitSpec
from harness.data.base import LabelledImages


@dataclass(frozen=True)
class Split:
    """Item indices of each part, and the class names each part holds.

    query and gallery are empty, except under an official split whose test part is a query
    set searched against a gallery (In-shop); test is then their union.
    """

    train: np.ndarray
    validation: np.ndarray
    test: np.ndarray
    train_classes: list[str]
    validation_classes: list[str]
    test_classes: list[str]
    query: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gallery: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def hash(self) -> str:
        """Hash of the three class lists: two results with the same hash saw the same classes."""
        text = "\n".join(
            "|".join(names)
            for names in (self.train_classes, self.validation_classes, self.test_classes)
        )
        if len(self.gallery):
            text += f"\nquery {len(self.query)} gallery {len(self.gallery)}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def summary(self) -> dict[str, object]:
        return {
            "hash": self.hash,
            "train_classes": len(self.train_classes),
            "validation_classes": len(self.validation_classes),
            "test_classes": len(self.test_classes),
            "train_images": len(self.train),
            "validation_images": len(self.validation),
            "test_images": len(self.test),
            **({"query_images": len(self.query), "gallery_images": len(self.gallery)}
               if len(self.gallery) else {}),
        }  # fmt: skip


def split_classes(data: LabelledImages, spec: SplitSpec) -> Split:
    """Sort the classes by name; the first train_fraction train (the last validation_fraction of
    those validate), the rest test, as in the seed papers. With spec.official, the dataset's
    official lists decide train and test (see split_official)."""
    if spec.official:
        return split_official(data, spec)
    if data.fixed_split:
        raise HarnessError(
            f"{data.source.split(' (')[0]} comes with its own train/test split: write split: "
            "{official: true} in the protocol (validation_fraction may stay)"
        )
    present = sorted(np.unique(data.labels).tolist(), key=lambda c: data.class_names[c])
    n = len(present)
    n_train = int(round(n * spec.train_fraction))
    n_val = int(round(n_train * spec.validation_fraction))
    if n_train - n_val < 2 or n - n_train < 2 or (spec.validation_fraction and n_val < 2):
        raise HarnessError(
            f"the dataset has {n} classes: too few for a split with train_fraction "
            f"{spec.train_fraction} and validation_fraction {spec.validation_fraction}; "
            "each part needs at least 2 classes (retrieval on one class scores 1.0 whatever "
            "the model)"
        )
    parts = {
        "train": present[: n_train - n_val],
        "validation": present[n_train - n_val : n_train],
        "test": present[n_train:],
    }
    indices = {k: np.flatnonzero(np.isin(data.labels, v)) for k, v in parts.items()}
    split = Split(
        train=indices["train"],
        validation=indices["validation"],
        test=indices["test"],
        train_classes=[data.class_names[c] for c in parts["train"]],
        validation_classes=[data.class_names[c] for c in parts["validation"]],
        test_classes=[data.class_names[c] for c in parts["test"]],
    )
    assert_disjoint(split, data)
    return split


def assert_disjoint(split: Split, data: LabelledImages) -> None:
    """Fail loudly if any class or item appears in two parts."""
    parts = {"train": split.train, "validation": split.validation, "test": split.test}
    seen: dict[int, str] = {}
    for name, idx in parts.items():
        for label in np.unique(data.labels[idx]).tolist():
            if label in seen:
                raise AssertionError(
                    f"class {data.class_names[label]} is in {seen[label]} and {name}"
                )
            seen[label] = name
    all_idx = np.concatenate(list(parts.values()))
    if len(np.unique(all_idx)) != len(all_idx):
        raise AssertionError("an item appears in two parts of the split")


def split_official(data: LabelledImages, spec: SplitSpec) -> Split:
    """The dataset's official parts: its train items train (the last validation_fraction of
    their sorted classes validate); test, or query + gallery, items test."""
    if data.partition is None:
        raise HarnessError(
            "this dataset has no official split; use split: {train_fraction: ...} instead of "
            "official: true"
        )
    part = data.partition
    train_items = np.flatnonzero(part == "train")
    test_items = np.flatnonzero(np.isin(part, ["test", "query", "gallery"]))
    train_classes = sorted(np.unique(data.labels[train_items]).tolist(),
                           key=lambda c: data.class_names[c])  # fmt: skip
    test_classes = sorted(np.unique(data.labels[test_items]).tolist(),
                          key=lambda c: data.class_names[c])  # fmt: skip
    shared = set(train_classes) & set(test_classes)
    if shared:
        name = data.class_names[min(shared)]
        raise HarnessError(
            f"the official lists put class {name} (and {len(shared) - 1} more) in both train "
            "and test; the lists are damaged or mixed from two releases"
        )
    n_val = int(round(len(train_classes) * spec.validation_fraction))
    too_few_val = spec.validation_fraction and n_val < 2
    if len(train_classes) - n_val < 2 or len(test_classes) < 2 or too_few_val:
        raise HarnessError(
            f"the official split has {len(train_classes)} train and {len(test_classes)} test "
            f"classes: too few with validation_fraction {spec.validation_fraction}; each part "
            "needs at least 2 classes"
        )
    fit = train_classes[: len(train_classes) - n_val]
    val = train_classes[len(train_classes) - n_val :]
    query = np.flatnonzero(part == "query")
    gallery = np.flatnonzero(part == "gallery")
    if len(query) != 0 and len(gallery) == 0 or len(gallery) != 0 and len(query) == 0:
        raise HarnessError("the official lists name query images but no gallery, or the reverse")
    split = Split(
        train=train_items[np.isin(data.labels[train_items], fit)],
        validation=train_items[np.isin(data.labels[train_items], val)],
        test=test_items,
        train_classes=[data.class_names[c] for c in fit],
        validation_classes=[data.class_names[c] for c in val],
        test_classes=[data.class_names[c] for c in test_classes],
        query=query,
        gallery=gallery,
    )
    assert_disjoint(split, data)
    return split
