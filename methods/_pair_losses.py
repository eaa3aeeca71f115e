"""Loss pieces shared by several methods: the batch's distance matrix, the per-pair contrastive
loss and the global loss. Not a method (methods/__init__.py registers only its MODULES).

Every loss over pairs or tuples of one batch reads its distances from one m x m matrix made
here once per step, never from gathered embedding rows: gathering builds a [pairs, d] tensor
(O(m^2 d) memory and time for all pairs), the matrix is one Gram product and O(m^2) after it.
"""

from __future__ import annotations

import torch

# D^2 under this is rounding noise of the Gram form (about 1e-16 x |x|^2 in float64), so it
# reads as a distance of 1e-6 or 0 with no gradient: sqrt has an infinite slope at 0.
SQUARED_FLOOR = 1e-12


def squared_distance_matrix(emb: torch.Tensor) -> torch.Tensor:
    """[m, m] squared Euclidean distances ||x_i - x_j||^2, in `emb`'s dtype, from one product.

    [x, |x|^2, 1] @ [-2x, 1, |x|^2]^T = |x_i|^2 + |x_j|^2 - 2 x_i.x_j, in float64: in float32
    the cancellation leaves two identical rows about 1e-4 apart (sqrt of 1e-7), in float64
    about 1e-8, below float32's resolution, so the values and gradients match the gathered
    differences to float32 rounding. Clamped at 0: never negative, as a sum of squares.
    """
    x = emb.double()
    sq_norm = x.pow(2).sum(1, keepdim=True)
    ones = torch.ones_like(sq_norm)
    left = torch.cat([x, sq_norm, ones], dim=1)
    right = torch.cat([-2 * x, ones, sq_norm], dim=1)
    return (left @ right.T).to(emb.dtype).clamp(min=0)


def distance_matrix(emb: torch.Tensor, *, exact_zero: bool = False) -> torch.Tensor:
    """[m, m] Euclidean distances. D = sqrt(max(D^2, 1e-12)): a distance under 1e-6 (the
    diagonal, duplicated rows) reads 1e-6 with zero gradient, the clamped gathered form that
    lifted structure and PDDM used. `exact_zero`: it reads 0 instead, as torch.norm of a zero
    difference does (contrastive, quadruplet selection). No NaN gradient either way."""
    squared = squared_distance_matrix(emb)
    dist = squared.clamp(min=SQUARED_FLOOR).sqrt()
    return dist.masked_fill(squared < SQUARED_FLOOR, 0.0) if exact_zero else dist


def flat_index(m: int, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """first * m + second, in one pass (it is a long tensor as long as the pair list)."""
    return second.add(first, alpha=m)


def pair_values(matrix: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """matrix[first, second] as a flat index_select: its backward is one index_add into the
    matrix, several times faster on a CPU than advanced indexing's accumulating index_put."""
    return matrix.flatten().index_select(0, flat_index(matrix.shape[1], first, second))


Moments = tuple[torch.Tensor, torch.Tensor, int]  # mean, biased variance, number of values


def moments(values: torch.Tensor) -> Moments:
    """Mean and biased variance of a set of values; an empty set gives zeros (differentiable)."""
    if values.numel() == 0:
        zero = values.sum()
        return zero, zero, 0
    return values.mean(), values.var(unbiased=False), values.numel()


def counted_moments(matrix: torch.Tensor, counts: torch.Tensor, n: int) -> Moments:
    """moments() of the n values matrix[i, j], each taken counts[i, j] times (n = the sum of
    the counts), read off the m x m matrix: for a set of tuples far larger than m^2 (every
    triplet of the batch), one O(m^2) reduction instead of one value per tuple."""
    if n == 0:
        zero = matrix.sum() * 0.0
        return zero, zero, 0
    mean = (counts * matrix).sum() / n
    return mean, (counts * (matrix - mean).pow(2)).sum() / n, n


def pair_counts(m: int, flat: torch.Tensor) -> torch.Tensor:
    """[m, m] float: how many times each pair occurs in a list of flat indices (flat_index)."""
    return torch.bincount(flat, minlength=m * m).view(m, m).to(torch.get_default_dtype())


def global_loss(
    positive: torch.Tensor | Moments,
    negative: torch.Tensor | Moments,
    *,
    margin: float,
    mean_weight: float,
) -> torch.Tensor:
    """The global loss of Kumar B G et al. (CVPR 2016) on two sets of distances, given as
    values or as their moments (counted_moments).

    L_g = (var(d+) + var(d-)) + mean_weight * [mean(d+) - mean(d-) + margin]_+ : it pulls the
    two distance distributions apart in mean and tightens both in variance, over the whole
    batch instead of tuple by tuple. Variances are the biased (population) ones; an empty set
    contributes nothing (the call stays differentiable).
    """
    mean_pos, var_pos, n_pos = positive if isinstance(positive, tuple) else moments(positive)
    mean_neg, var_neg, n_neg = negative if isinstance(negative, tuple) else moments(negative)
    gap = torch.relu(mean_pos - mean_neg + margin)
    if n_pos == 0 or n_neg == 0:
        gap = gap * 0
    return var_pos + var_neg + mean_weight * gap


def contrastive_pair_loss(
    dist: torch.Tensor,
    first: torch.Tensor,
    second: torch.Tensor,
    positive: torch.Tensor,
    *,
    margin: float,
) -> torch.Tensor:
    """Per-pair contrastive loss (Hadsell et al. 2006; Eq. 1 of Song et al. 2016), [n_pairs].

    y D^2 for a positive pair, [margin - D]_+^2 for a negative one, D read from the batch's
    distance matrix `dist` (distance_matrix(emb, exact_zero=True)). Shared by `contrastive`
    (which averages it over all pairs) and HDC's cascade (which ranks pairs by it and averages
    it over each head's hard pairs).
    """
    d = pair_values(dist, first, second)
    y = positive.to(d.dtype)
    return y * d.pow(2) + (1 - y) * (margin - d).clamp(min=0).pow(2)
