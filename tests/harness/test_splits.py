"""Class-disjoint splits: sorted, disjoint, and a clear error when there are too few classes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.core import HarnessError, SplitSpec
from harness.data import LabelledImages, split_classes
from harness.data.splits import assert_disjoint


def dataset(counts: list[int]) -> LabelledImages:
    labels = np.repeat(np.arange(len(counts)), counts)
    names = [f"c{i:03d}" for i in range(len(counts))]
    return LabelledImages(torch.zeros((len(labels), 1, 4, 4), dtype=torch.uint8), labels, names)


def test_split_is_class_disjoint_and_sorted():
    data = dataset([5] * 20)
    split = split_classes(data, SplitSpec(train_fraction=0.5, validation_fraction=0.2))
    assert split.train_classes == [f"c{c:03d}" for c in range(8)]
    assert split.validation_classes == ["c008", "c009"]
    assert split.test_classes == [f"c{c:03d}" for c in range(10, 20)]
    parts = [set(data.labels[i]) for i in (split.train, split.validation, split.test)]
    assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
    assert len(split.train) + len(split.validation) + len(split.test) == 100
    other = split_classes(data, SplitSpec(train_fraction=0.6))
    assert other.hash != split.hash
    # one validation class would score map@r 1.0 whatever the model: selection by nothing
    with pytest.raises(HarnessError, match="each part needs at least 2 classes"):
        split_classes(dataset([5] * 10), SplitSpec(train_fraction=0.5, validation_fraction=0.2))


def test_disjointness_check_catches_a_leak():
    data = dataset([5] * 6)
    split = split_classes(data, SplitSpec())
    leaked = type(split)(
        split.train, split.validation, np.concatenate([split.test, split.train[:1]]),
        split.train_classes, split.validation_classes, split.test_classes,
    )  # fmt: skip
    with pytest.raises(AssertionError, match="is in train and test"):
        assert_disjoint(leaked, data)


def test_too_few_classes_is_a_clear_error():
    with pytest.raises(HarnessError, match="too few for a split"):
        split_classes(dataset([5, 5, 5]), SplitSpec())
