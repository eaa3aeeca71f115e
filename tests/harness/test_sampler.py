"""The K-per-class batch sampler: P classes x K distinct images per batch, deterministic per seed."""

from __future__ import annotations

import numpy as np
import pytest

from harness.core import HarnessError
from harness.data import PKSampler


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
