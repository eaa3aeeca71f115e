"""The LDA score's negative pairs from the counted pass's float32 keys.

The LDA score weighs the negative distances' mean against the positives' and divides by their
spread; when distances crowd around their mean (spread / mean^2 of 0.004 is common), a shift of
a few parts in 10^10 in the float32 distances, or one that leans with the distance (rounding
steps double at each power of two), moves the score by more than 1e-9. So the float32 numbers
are kept small and centred:

    * the pass's keys are k = ||q - g||^2 - level, the level c^2 near the mean squared
      distance, taken off inside the one product (harness.evaluate.metrics.counted), with c
      and c^2 exact in float32: a rounded constant would scale or shift every distance alike;
    * each pair contributes its distance less c, computed without cancellation as
      u = k / (sqrt(k + c^2) + c), and the sums of u and u^2 are the moments' shifted sums
      (shift c), accumulated in float64;
    * positive pairs are left out (their distances are exact, from their dot products), and
      pairs closer than ``close`` (where a square root turns an error e into one of sqrt(e))
      are taken out of the float32 sums and added with their exact distance.

Used from 2^24 pairs on, the score agrees with the float64 sums' to 1e-9 where the classes
separate; where they do not it is near 0, a difference of two nearly equal means, and agrees
to about 1e-13 absolute (docs/metrics.md gives the measurements).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from harness.evaluate.metrics.distances import PairMoments

#: CPU tensors take numpy's passes (several times faster than torch's there); False sends them
#: through the torch steps that CUDA tensors take, which the tests compare with numpy's.
NUMPY_ON_CPU = True


def use_numpy(t: torch.Tensor) -> bool:
    """Whether the passes over ``t`` run in numpy (see NUMPY_ON_CPU)."""
    return NUMPY_ON_CPU and t.device.type == "cpu"


@dataclass
class Negatives:
    """The negative pairs' count and shifted sums over the pass."""

    level: float
    count: int = 0
    s1: float = 0.0  # sum of d - sqrt(level)
    s2: float = 0.0  # sum of (d - sqrt(level))^2

    def add(
        self, moments: PairMoments, count: int, s1: float, s2: float, positive: torch.Tensor
    ) -> None:
        """Add some rows' pairs (float32_pairs' result); the positives go to ``moments``."""
        self.count, self.s1, self.s2 = self.count + count, self.s1 + s1, self.s2 + s2
        moments.choose_shifts(torch.empty(0), positive)
        moments.positive.add(positive, moments.positive.shift)

    def finish(self, moments: PairMoments) -> None:
        """Put the negative pairs' moments into ``moments``."""
        moments.every.shift = math.sqrt(self.level)
        moments.every.count, moments.every.s1, moments.every.s2 = self.count, self.s1, self.s2


@dataclass(frozen=True)
class Exact:
    """What float32_pairs reads besides the keys: the level taken off them, the squared
    distance below which a pair gets its exact one, and ``squares(rows, cols)``, which gives
    it."""

    level: float
    close: float
    squares: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def float32_pairs(
    k32: torch.Tensor,
    rows: torch.Tensor,
    partners: torch.Tensor,
    exact_sq: torch.Tensor,
    all_vs_all: bool,
    exact: Exact,
    scratch: np.ndarray | None = None,
) -> tuple[int, float, float, torch.Tensor]:
    """(count, sum of d - sqrt(level), sum of its square over the negative pairs of some
    consecutive rows; the positive pairs' distances), each unordered pair once in all-vs-all.
    ``exact_sq`` [n, W] are the positive pairs' exact squared distances (like ``partners``, -1
    padded); ``k32`` [n, G] every pair's float32 key ||q - g||^2 - level (overwritten);
    pairs closer than ``exact.close`` take their exact squared distance; ``scratch``, float32
    of k32's size at least, saves fresh memory on the CPU."""
    first, last = int(rows[0]), int(rows[-1]) + 1
    keep = partners >= 0
    if all_vs_all:
        keep &= partners > rows.unsqueeze(1)
    positive = exact_sq.clamp(min=0)[keep].sqrt()
    at = torch.nonzero(keep)
    k32[at[:, 0], partners[at[:, 0], at[:, 1]]] = 0.0  # u = 0: adds nothing to the sums
    count, s1, s2 = -len(at), 0.0, 0.0
    level = exact.level
    c = math.sqrt(level)
    below = exact.close - level
    for row, col in _close_pairs(k32, first if all_vs_all else 0, below, all_vs_all):
        d = exact.squares(rows[row], col).clamp(min=0).sqrt() - c
        k32[row, col] = 0.0  # taken out of the float32 sums, added exactly
        s1, s2 = s1 + float(d.sum()), s2 + float((d * d).sum())
    upper = None
    if all_vs_all:
        upper = torch.ones(len(rows), last - first, dtype=torch.bool, device=k32.device).triu_(1)
    for block in [k32[:, last:], k32[:, first:last][upper]] if all_vs_all else [k32]:
        n, a, b = _shifted_sums(block, level, scratch)
        count, s1, s2 = count + n, s1 + a, s2 + b
    return count, s1, s2, positive


def _close_pairs(
    k32: torch.Tensor, start: int, below: float, all_vs_all: bool
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[(rows, columns)] of the counted pairs whose key is under ``below`` (none or one
    entry): columns from ``start`` on, and in all-vs-all only those after the row's own."""
    view = k32[:, start:]
    if view.numel() == 0 or float(view.min()) >= below:  # one reduction, most of the time
        return []
    if use_numpy(view):
        flat = torch.from_numpy(np.flatnonzero(view.numpy() < np.float32(below)))
    else:
        flat = torch.nonzero((view < below).reshape(-1)).squeeze(1)
    row, col = flat // view.shape[1], flat % view.shape[1] + start
    if all_vs_all:  # the row's own query sits at column start + row
        kept = col > start + row
        row, col = row[kept], col[kept]
    return [(row, col)] if len(row) else []


def _shifted_sums(
    block: torch.Tensor, level: float, scratch: np.ndarray | None = None
) -> tuple[int, float, float]:
    """(count, sum of u, sum of u^2) with u = d - c = k / (sqrt(k + c^2) + c), from keys
    k = d^2 - c^2 (overwritten), c^2 = level; float32 terms, float64 sums."""
    if block.numel() == 0:
        return 0, 0.0, 0.0
    c = math.sqrt(level)  # exact: level is c^2 for a float32 c (see counted._level)
    if use_numpy(block):
        k = block.numpy()
        d = None
        if scratch is not None and scratch.size >= k.size:
            d = scratch.reshape(-1)[: k.size].reshape(k.shape)
        d = np.add(k, np.float32(level), out=d)  # >= 0: closer pairs were made exact
        np.sqrt(d, out=d)
        d += np.float32(c)
        np.divide(k, d, out=k)  # u = (d^2 - c^2) / (d + c)
        s1 = float(k.sum(dtype=np.float64))
        np.square(k, out=k)
        return k.size, s1, float(k.sum(dtype=np.float64))
    u = block / ((block + level).sqrt_() + c)
    return u.numel(), float(u.sum(dtype=torch.float64)), float(u.square().sum(dtype=torch.float64))
