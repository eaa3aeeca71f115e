"""A frozen trunk's outputs standing in for the images (protocol `features:`).

`CachedViews` indexes like the image tensor it replaces, so the runner, the training step and
the evaluation take it where they took images: training batches `.load()` every cached train
view of their images and `ViewPicker` (the train augmentation's stand-in) keeps one per image;
evaluation batches `.to(device)` their one test view. Each row is one flat float16 vector
(the last frozen stage's spatial output, then the pooled outputs of the frozen stages before
it: harness.backbones.base.FrozenTrunkTail reads it back).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from harness.core import HarnessError


class CachedViews:
    """Cached features of N images: `test` [N, D], and `train` [M, V, D] for the M images
    with train views (`train_row[i]`: image i's row in `train`, -1 for none)."""

    in_process = True  # nothing to decode: the feeder needs no worker processes
    in_channels = 3  # the images these features stand for (the backbone is built for them)

    def __init__(self, test: torch.Tensor, train: torch.Tensor, train_row: np.ndarray,
                 made_by: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.test, self.train, self.train_row = test, train, np.asarray(train_row, np.int64)
        self.made_by = made_by or {}  # the engine, its version and threads, the build's rate

    def __len__(self) -> int:
        return len(self.train_row)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self), *self.test.shape[1:])

    @property
    def dtype(self) -> torch.dtype:
        return self.test.dtype

    @property
    def views(self) -> int:
        return int(self.train.shape[1]) if self.train.ndim == 3 else 0

    def __getitem__(self, key: Any) -> CachedViews:
        rows = np.arange(len(self))[np.asarray(key) if not isinstance(key, slice) else key]
        rows = np.atleast_1d(rows)
        return CachedViews(self.test[torch.from_numpy(rows)], self.train, self.train_row[rows],
                           self.made_by)  # fmt: skip

    def load(self) -> torch.Tensor:
        """Every train view of these images: [B, V, D]."""
        if (self.train_row < 0).any():
            raise HarnessError("an image outside the training split has no cached train views: "
                               "the feature cache was built for another split; delete it")  # fmt: skip
        return self.train[torch.from_numpy(self.train_row)]

    def to(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The test views, as evaluation embeds them."""
        return self.test.to(*args, **kwargs)


class ViewPicker:
    """The train augmentation of a cached trunk: image `pos` of the batch at `step` gets one of
    its V cached views, drawn from its own generator seeded by (run seed, step, pos), as the
    augmentation draws its crops (a resumed run draws the same)."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def __call__(self, views: torch.Tensor, step: int, positions: Any) -> torch.Tensor:
        from harness.data.augment import generator

        picks = [int(torch.randint(0, views.shape[1], (), generator=generator(self.seed, step,
                                                                                int(pos))))
                 for pos in positions]  # fmt: skip
        return views[torch.arange(len(picks)), torch.tensor(picks, dtype=torch.long)]
