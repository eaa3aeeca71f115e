"""The types that flow between a method's head, miner, loss and scorer: the embedded batch, the
batch's labels, and the typed tuples a miner returns (pairs, triplets, quadruplets).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch

if TYPE_CHECKING:
    pass


@dataclass
class Batch:
    """Labels of one training batch, on the training device: fine labels are contiguous
    training-class ids (0 .. num_classes - 1); coarse labels are the dataset's own ids."""

    labels: torch.Tensor
    coarse_labels: torch.Tensor | None = None


@dataclass
class Embedded:
    embedding: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class Mined:
    """Base of the typed tuples a miner returns; `evaluated` counts the pair scores or
    distances the miner computed, the work that the cost measurements compare."""

    evaluated: int
    family: ClassVar[str] = ""  # the method family whose miners return this type

    def count(self) -> int:
        return len(self.indices()[0])

    def indices(self) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def check(self, batch_size: int, indices: bool = True) -> None:
        """The runner's shape check: equal-length 1-D index tensors inside the batch. The
        range check (`indices`) reads the tensors back, a synchronisation on a GPU, so the
        training loop asks for it only every few steps."""
        idx = self.indices()
        n = len(idx[0])
        for t in idx:
            if t.ndim != 1 or len(t) != n:
                raise RuntimeError(f"{type(self).__name__}: malformed indices from the miner")
            if indices and n and (t.min() < 0 or t.max() >= batch_size):
                raise RuntimeError(f"{type(self).__name__}: miner indices outside the batch")


@dataclass
class Pairs(Mined):
    family: ClassVar[str] = "pairs"
    first: torch.Tensor
    second: torch.Tensor
    positive: torch.Tensor  # bool: same class

    def indices(self) -> tuple[torch.Tensor, ...]:
        return self.first, self.second


@dataclass
class Triplets(Mined):
    family: ClassVar[str] = "triplets"
    anchor: torch.Tensor
    positive: torch.Tensor
    negative: torch.Tensor

    def indices(self) -> tuple[torch.Tensor, ...]:
        return self.anchor, self.positive, self.negative


@dataclass
class Quadruplets(Mined):
    """(i, j) a positive pair, k a negative of i, l a negative of j (PDDM's hard quadruplet);
    hierarchical methods read them as (reference, same fine, same coarse, other coarse)."""

    family: ClassVar[str] = "quadruplets"

    i: torch.Tensor
    j: torch.Tensor
    k: torch.Tensor
    l: torch.Tensor  # noqa: E741 (the paper's name)

    def indices(self) -> tuple[torch.Tensor, ...]:
        return self.i, self.j, self.k, self.l


Miner = Callable[[Embedded, Batch], Mined]
Scorer = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Diagnostics = Callable[[torch.Tensor, torch.Tensor], dict[str, float]]


def all_pairs(labels: torch.Tensor) -> Pairs:
    """Every unordered pair of the batch (i < j), with its same-class flag: m(m-1)/2 pairs."""
    m = len(labels)
    first, second = torch.triu_indices(m, m, offset=1, device=labels.device)
    return Pairs(m * (m - 1) // 2, first, second, labels[first] == labels[second])
