"""AUC of a pair score for telling a split's positive pairs (same class) from its negatives.

AUC = P(a positive pair scores above a negative one) + P(tie) / 2: the Mann-Whitney U
statistic of the positive pairs' scores against the negatives', divided by the number of
(positive, negative) couples, computed from average ranks (ties share their rank). It does
not depend on how many negatives there are per positive, so the pairs can be sampled for each
kind apart without bias:

- positive pairs i < j: all of them, or a fixed seeded sample of `limit` when there are more;
- negative pairs i < j: all of them when there are at most `limit` (and the split is small
  enough to list its pairs), else `limit` drawn uniformly with replacement, seeded.

A split of 2,400 images in 150 classes of 16 has 18,000 positive pairs and 2.86M negative
ones: all 18,000 and a sample of 200,000 are scored, not the 2.9M (a learned score costs a
small network's forward pass per pair). The seed is fixed, not the run's, so every method
evaluated on one split is scored on the same pairs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

PairScore = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # [n, d], [n, d] -> [n]

PAIR_LIMIT = 200_000  # pairs of each kind scored at most
PAIR_SEED = 0
LISTED_ITEMS = 4096  # a split up to this size may list all of its pairs (16.8M mask entries)
CHUNK = 65_536  # pairs scored at a time


def rank_auc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """Mann-Whitney AUC of `scores` (higher = more similar) for the `positive` flags; NaN when
    either kind is missing."""
    values = scores.detach().double().cpu().numpy()
    flags = positive.cpu().numpy().astype(bool)
    n_pos, n_neg = int(flags.sum()), int((~flags).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    from scipy.stats import rankdata  # on first use: scipy.stats is slow to import

    ranks = rankdata(values)  # 1-based, ties get their average rank
    u = ranks[flags].sum() - n_pos * (n_pos + 1) / 2  # couples won by a positive, ties 1/2
    return float(u / (n_pos * n_neg))


@dataclass(frozen=True)
class PairSample:
    """Pairs (first[i] < second[i]) and their same-class flags; how many the split has."""

    first: torch.Tensor
    second: torch.Tensor
    positive: torch.Tensor
    positives_in_split: int
    negatives_in_split: int

    def auc(self, score: PairScore, embeddings: torch.Tensor) -> float:
        """AUC of `score` on these pairs of `embeddings` (rows of the split), in chunks."""
        first, second = self.first.to(embeddings.device), self.second.to(embeddings.device)
        with torch.no_grad():
            values = [
                score(embeddings[first[s : s + CHUNK]], embeddings[second[s : s + CHUNK]])
                for s in range(0, len(first), CHUNK)
            ]
        if not values:
            return float("nan")
        return rank_auc(torch.cat(values), self.positive)


def _positive_pairs(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every same-class pair i < j, class by class."""
    order = torch.argsort(labels, stable=True)
    sizes = torch.unique_consecutive(labels[order], return_counts=True)[1].tolist()
    first, second, start = [], [], 0
    for size in sizes:
        a, b = torch.triu_indices(size, size, offset=1)
        members = order[start : start + size]
        first.append(members[a])
        second.append(members[b])
        start += size
    first_all, second_all = torch.cat(first), torch.cat(second)
    return torch.minimum(first_all, second_all), torch.maximum(first_all, second_all)


def _sampled_negatives(
    labels: torch.Tensor, count: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` negative pairs drawn uniformly with replacement (rejection of the rest)."""
    n, kept, total = len(labels), [], 0
    for _ in range(1000):  # enough unless nearly every pair is positive
        a = torch.randint(n, (2 * count,), generator=gen)
        b = torch.randint(n, (2 * count,), generator=gen)
        keep = labels[a] != labels[b]
        kept.append((a[keep], b[keep]))
        total += int(keep.sum())
        if total >= count:
            break
    a, b = (torch.cat([k[x] for k in kept])[:count] for x in (0, 1))
    return torch.minimum(a, b), torch.maximum(a, b)


def sample_pairs(
    labels: torch.Tensor, limit: int = PAIR_LIMIT, seed: int = PAIR_SEED
) -> PairSample:
    """The pairs the AUC is computed on (see the module docstring)."""
    labels = torch.as_tensor(labels).cpu()
    n = len(labels)
    gen = torch.Generator().manual_seed(seed)
    pos_first, pos_second = _positive_pairs(labels)
    positives = len(pos_first)
    negatives = n * (n - 1) // 2 - positives
    if positives > limit:
        keep = torch.randperm(positives, generator=gen)[:limit].sort().values
        pos_first, pos_second = pos_first[keep], pos_second[keep]
    if negatives <= limit and n <= LISTED_ITEMS:
        a, b = torch.triu_indices(n, n, offset=1)
        other = labels[a] != labels[b]
        neg_first, neg_second = a[other], b[other]
    else:
        neg_first, neg_second = _sampled_negatives(labels, min(limit, negatives), gen)
    flags = torch.cat([torch.ones(len(pos_first)), torch.zeros(len(neg_first))]).bool()
    return PairSample(torch.cat([pos_first, neg_first]), torch.cat([pos_second, neg_second]),
                      flags, positives, negatives)  # fmt: skip


def euclidean_score(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """-D: the Euclidean distance as a similarity (retrieval's ranking)."""
    return -(a.double() - b.double()).norm(dim=-1)
