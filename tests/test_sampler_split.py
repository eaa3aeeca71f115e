import numpy as np
import pytest
import torch

from harness.data.base import LabelledImages
from harness.errors import HarnessError
from harness.protocol import SplitSpec
from harness.sampler import PKSampler
from harness.splits import assert_disjoint, split_classes


def dataset(counts: list[int]) -> LabelledImages:
    labels = np.repeat(np.arange(len(counts)), counts)
    names = [f"c{i:03d}" for i in range(len(counts))]
    return LabelledImages(torch.zeros((len(labels), 1, 4, 4), dtype=torch.uint8), labels, names)


def test_every_batch_has_p_classes_with_k_distinct_images():
    labels = np.repeat(np.arange(10), [4, 5, 6, 7, 8, 9, 10, 11, 12, 13])
    sampler = PKSampler(labels, classes_per_batch=3, images_per_class=4, seed=0)
    for _ in range(200):
        batch = sampler.next_batch()
        assert len(batch) == 12 and len(set(batch.tolist())) == 12
        classes, counts = np.unique(labels[batch], return_counts=True)
        assert len(classes) == 3 and (counts == 4).all()
        # each class's K images are contiguous: the miners rely on no ordering, but this is
        # what the sampler promises
        assert all(len(set(labels[batch[i : i + 4]])) == 1 for i in range(0, 12, 4))


def test_sampler_is_deterministic_per_seed_and_covers_the_data():
    labels = np.repeat(np.arange(8), 8)
    a = [PKSampler(labels, 4, 2, seed=1).next_batch() for _ in range(1)]
    b = [PKSampler(labels, 4, 2, seed=1).next_batch() for _ in range(1)]
    c = [PKSampler(labels, 4, 2, seed=2).next_batch() for _ in range(1)]
    assert np.array_equal(a[0], b[0]) and not np.array_equal(a[0], c[0])
    s = PKSampler(labels, 4, 2, seed=0)
    seen = np.concatenate([s.next_batch() for _ in range(s.batches_per_epoch)])
    assert len(np.unique(seen)) == len(labels)  # one epoch visits every image exactly once


def test_sampler_rejects_impossible_batches():
    labels = np.repeat(np.arange(3), [5, 5, 2])
    with pytest.raises(HarnessError, match="fewer than images_per_class=4"):
        PKSampler(labels, 2, 4, seed=0)
    with pytest.raises(HarnessError, match="needs classes_per_batch=4"):
        PKSampler(labels, 4, 2, seed=0)


def test_split_is_class_disjoint_and_sorted():
    data = dataset([5] * 10)
    split = split_classes(data, SplitSpec(train_fraction=0.5, validation_fraction=0.2))
    assert split.train_classes == ["c000", "c001", "c002", "c003"]
    assert split.validation_classes == ["c004"]
    assert split.test_classes == ["c005", "c006", "c007", "c008", "c009"]
    parts = [set(data.labels[i]) for i in (split.train, split.validation, split.test)]
    assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
    assert len(split.train) + len(split.validation) + len(split.test) == 50
    other = split_classes(data, SplitSpec(train_fraction=0.6))
    assert other.hash != split.hash


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
