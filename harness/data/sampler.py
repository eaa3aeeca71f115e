"""P x K batch sampling: every batch holds exactly P classes with K images each."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from harness.core import HarnessError


class PKSampler:
    """Deterministic per seed: the same seed gives the same sequence of batches.

    An epoch visits the classes in a shuffled order, P at a time; each class hands out K
    images from its own shuffled pool, refilled (reshuffled) when it runs out, so over an
    epoch every image is seen about equally often. Batches are lists of dataset indices.
    """

    def __init__(
        self, labels: np.ndarray, classes_per_batch: int, images_per_class: int, seed: int
    ) -> None:
        self.p, self.k = classes_per_batch, images_per_class
        labels = np.asarray(labels)
        classes, counts = check_fills_batches(labels, self.p, self.k)
        # each class's indices in ascending order, from one stable sort: O(n log n), where a
        # scan per class would be O(n x classes) (seconds for SOP's 11,318 classes)
        order = np.argsort(labels, kind="stable")
        groups = np.split(order, np.cumsum(counts)[:-1])
        self.pools = {int(c): g for c, g in zip(classes, groups, strict=True)}
        self.classes = np.array(sorted(self.pools))
        self.num_images = len(labels)
        self.rng = np.random.default_rng(seed)
        self._queues: dict[int, list[int]] = {c: [] for c in self.pools}
        self._class_queue: list[int] = []

    @property
    def batch_size(self) -> int:
        return self.p * self.k

    @property
    def batches_per_epoch(self) -> int:
        return max(1, self.num_images // self.batch_size)

    def _take(self, c: int) -> list[int]:
        queue = self._queues[c]
        out: list[int] = []
        while len(out) < self.k:
            if not queue:
                queue.extend(self.rng.permutation(self.pools[c]).tolist())
            # never the same image twice in one batch, even when a pool refills mid-take
            item = queue.pop()
            if item in out:
                queue.insert(0, item)
                continue
            out.append(item)
        return out

    def _next_classes(self) -> list[int]:
        chosen: list[int] = []
        while len(chosen) < self.p:
            if not self._class_queue:
                self._class_queue.extend(self.rng.permutation(self.classes).tolist())
            c = self._class_queue.pop()
            if c in chosen:
                self._class_queue.insert(0, c)
                continue
            chosen.append(c)
        return chosen

    def state_dict(self) -> dict[str, object]:
        """Everything needed to continue the exact same batch sequence after a resume."""
        return {
            "rng": self.rng.bit_generator.state,
            "queues": {c: list(q) for c, q in self._queues.items()},
            "class_queue": list(self._class_queue),
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self._queues = {int(c): list(q) for c, q in state["queues"].items()}
        self._class_queue = list(state["class_queue"])

    def next_batch(self) -> np.ndarray:
        return np.array([i for c in self._next_classes() for i in self._take(c)], dtype=np.int64)

    def __iter__(self) -> Iterator[np.ndarray]:
        """One epoch of batches."""
        for _ in range(self.batches_per_epoch):
            yield self.next_batch()


def check_fills_batches(
    labels: np.ndarray, p: int, k: int, class_names: list[str] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The training labels fill P x K batches: at least P classes, each with at least K
    images (a class under K is named with its count when `class_names` is given); returns
    the classes and their counts. The sampler checks it, and a sweep before its first run."""
    classes, counts = np.unique(labels, return_counts=True)
    if len(classes) < p:
        raise HarnessError(f"the training split has {len(classes)} classes but a batch needs "
                           f"classes_per_batch={p}: lower sampler.classes_per_batch")  # fmt: skip
    small = [(c, n) for c, n in zip(classes.tolist(), counts.tolist(), strict=True) if n < k]
    if small:
        if class_names is None:
            which = f"(smallest: {counts.min()})"
        else:
            more = f" and {len(small) - 3} more" if len(small) > 3 else ""
            which = ", ".join(f"{class_names[c]} ({n})" for c, n in small[:3]) + more
        raise HarnessError(f"{len(small)} training classes have fewer than images_per_class={k} "
                           f"images: {which}; add images or lower sampler.images_per_class")  # fmt: skip
    return classes, counts
