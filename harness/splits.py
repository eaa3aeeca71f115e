"""Class-disjoint splits: the classes a model trains on are never the classes it is tested on."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from harness.data.base import LabelledImages
from harness.errors import HarnessError
from harness.protocol import SplitSpec


@dataclass(frozen=True)
class Split:
    """Item indices of each part, and the class names each part holds."""

    train: np.ndarray
    validation: np.ndarray
    test: np.ndarray
    train_classes: list[str]
    validation_classes: list[str]
    test_classes: list[str]

    @property
    def hash(self) -> str:
        """Hash of the three class lists: two results with the same hash saw the same classes."""
        text = "\n".join(
            "|".join(names)
            for names in (self.train_classes, self.validation_classes, self.test_classes)
        )
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
        }


def split_classes(data: LabelledImages, spec: SplitSpec) -> Split:
    """Sort the classes by name; the first train_fraction train (the last validation_fraction of
    those validate), the rest test, as in the seed papers."""
    present = sorted(np.unique(data.labels).tolist(), key=lambda c: data.class_names[c])
    n = len(present)
    n_train = int(round(n * spec.train_fraction))
    n_val = int(round(n_train * spec.validation_fraction))
    if n_train - n_val < 2 or n - n_train < 2:
        raise HarnessError(
            f"the dataset has {n} classes: too few for a split with train_fraction "
            f"{spec.train_fraction} and validation_fraction {spec.validation_fraction}; "
            "each part needs at least 2 classes"
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
