"""The LDA score's pair-distance moments, accumulated chunk by chunk from the ranking pass.

Distances are Euclidean, from the float64 keys ||g||^2 - 2 q.g of the pass (plus ||q||^2).
Sums are kept shifted by one actual pair distance of each kind (a negative pair's for the
negative sums, a positive pair's for the positive ones): the shifted sums stay small, so the
variance M2 = S2 - S1^2 / N loses no precision, and a constant set of distances gives exactly 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from harness.core import HarnessError


@dataclass
class _Sums:
    shift: float | None = None
    count: int = 0
    s1: float = 0.0
    s2: float = 0.0

    def add(self, values: torch.Tensor, shift: float) -> None:
        """Add the values' shifted sums; ``values`` is overwritten (it is scratch)."""
        if values.numel() == 0:
            return
        shifted = values.sub_(shift)
        self.count += values.numel()
        self.s1 += float(shifted.sum())
        self.s2 += float(shifted.square_().sum())

    def moments(self, base: float) -> tuple[int, float, float]:
        """(count, mean, M2) of the values whose sums were shifted by ``base``."""
        if self.count == 0:
            return 0, 0.0, 0.0
        return self.count, base + self.s1 / self.count, max(0.0, self.s2 - self.s1**2 / self.count)


@dataclass
class PairMoments:
    """Count, mean and M2 of the positive and of the negative pair distances, in chunks.

    Each chunk gives the distances of all its pairs (``block``) and of its positive pairs
    (``positive``); negative sums are all-pair sums minus positive ones, both shifted alike.
    """

    every: _Sums = field(default_factory=_Sums)  # all pairs, shifted by a negative distance
    positive_as_every: _Sums = field(default_factory=_Sums)  # positives, same shift
    positive: _Sums = field(default_factory=_Sums)  # positives, shifted by a positive distance

    def choose_shifts(self, negative: torch.Tensor, positive: torch.Tensor) -> None:
        """Fix the shifts from the first pair distances seen (a negative and a positive one)."""
        if self.every.shift is None and negative.numel():
            self.every.shift = float(negative.reshape(-1)[0])
        if self.positive.shift is None and positive.numel():
            self.positive.shift = float(positive[0])

    def add_every(self, block: torch.Tensor) -> None:
        """Distances of some of the chunk's pairs, positive or negative (overwritten)."""
        if self.every.shift is None and block.numel():
            self.every.shift = float(block.flatten()[0])
        self.every.add(block, self.every.shift or 0.0)

    def add_positive(self, positive: torch.Tensor) -> None:
        """Distances of the chunk's positive pairs (already counted by ``add_every``)."""
        if positive.numel():
            self.choose_shifts(torch.empty(0), positive)
            self.positive_as_every.add(positive.clone(), self.every.shift or 0.0)
            self.positive.add(positive, self.positive.shift)

    def lda(self) -> float:
        """(m- - m+)^2 / (v+ + v-), population variances; see harness.evaluate.metrics."""
        n_pos, m_pos, m2_pos = self.positive.moments(self.positive.shift or 0.0)
        n_neg = self.every.count - self.positive_as_every.count
        if n_pos == 0 or n_neg == 0:
            raise HarnessError(
                f"lda needs positive and negative pairs, got {n_pos} and {n_neg}; evaluate on at"
                " least 2 classes with 2 items in one of them"
            )
        s1 = self.every.s1 - self.positive_as_every.s1
        s2 = self.every.s2 - self.positive_as_every.s2
        m_neg = (self.every.shift or 0.0) + s1 / n_neg
        m2_neg = max(0.0, s2 - s1 * s1 / n_neg)
        spread = m2_pos / n_pos + m2_neg / n_neg
        gap = (m_neg - m_pos) ** 2
        if spread == 0:
            return 0.0 if gap == 0 else math.inf
        return gap / spread


def euclidean(keys: torch.Tensor, q_sq: torch.Tensor) -> torch.Tensor:
    """Distances from keys ||g||^2 - 2 q.g [rows, cols] and ||q||^2 [rows] (a new tensor)."""
    return (keys + q_sq.unsqueeze(1)).clamp_(min=0).sqrt_()


def add_chunk_pairs(
    moments: PairMoments,
    keys: torch.Tensor,
    rows: torch.Tensor,
    q_sq: torch.Tensor,
    q_ids: torch.Tensor,
    g_ids: torch.Tensor,
    members: torch.Tensor,
    *,
    all_vs_all: bool,
) -> None:
    """Add a chunk's pairs: every (query row, gallery item) pair in query/gallery mode, the
    unordered pairs i < j in all-vs-all mode (each once, never an item with itself).
    ``keys`` is overwritten (by distances, then by shifted sums' scratch)."""
    first, last = int(rows[0]), int(rows[-1]) + 1
    sq = q_sq[rows]
    partners = members[q_ids[rows]]  # same-class gallery items, -1 padded
    keep = partners >= 0
    if all_vs_all:
        keep &= partners > rows.unsqueeze(1)
    positive = euclidean(keys.gather(1, partners.clamp(min=0)), sq)[keep]
    if moments.every.shift is None:  # once: one negative pair's distance, if the chunk has any
        moments.choose_shifts(_one_negative(keys, rows, sq, q_ids, g_ids, all_vs_all), positive)
    # every pair's distance, in place in the keys (each unordered pair once in all-vs-all)
    block = keys[:, last:] if all_vs_all else keys
    moments.add_every(block.add_(sq.unsqueeze(1)).clamp_(min=0).sqrt_())
    if all_vs_all:
        tri = keys[:, first:last].add_(sq.unsqueeze(1)).clamp_(min=0).sqrt_()
        moments.add_every(tri[torch.ones_like(tri, dtype=torch.bool).triu_(1)])
    moments.add_positive(positive)


def _one_negative(
    keys: torch.Tensor,
    rows: torch.Tensor,
    sq: torch.Tensor,
    q_ids: torch.Tensor,
    g_ids: torch.Tensor,
    all_vs_all: bool,
) -> torch.Tensor:
    """The distance of the chunk's first negative pair (empty when it has none)."""
    valid = g_ids.unsqueeze(0) != q_ids[rows].unsqueeze(1)
    if all_vs_all:
        columns = torch.arange(keys.shape[1], device=keys.device)
        valid &= columns.unsqueeze(0) > rows.unsqueeze(1)
    flat = valid.reshape(-1)  # the first True without listing all (nonzero: 16 bytes a pair)
    if not bool(flat.any()):
        return torch.empty(0, dtype=keys.dtype)
    i, j = divmod(int(flat.to(torch.uint8).argmax()), valid.shape[1])
    return euclidean(keys[i : i + 1, j : j + 1], sq[i : i + 1]).reshape(-1)
