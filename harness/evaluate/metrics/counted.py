"""Exact ranks at float32 speed: the relevant items' ranks counted, not sorted.

A query's metrics need only where its R relevant items land in its ranking (float64 keys
||g||^2 - 2 q.g ascending, ties to the lower gallery index), not the whole row in order. So
each chunk of query rows gets one float32 matrix product of the centred embeddings, the mean
squared distance taken off inside it (keys k32 = ||q - g||^2 - level, within a proven ``err``
of the float64 keys plus a row constant), and for the t-th relevant item, with the window
[r32_t - 2 err, r32_t + 2 err] around its float32 key:

    rank_t = 1 + #{items whose k32 lies below the window}
               + #{other items inside the window whose exact (key, index) comes first}

Items below the window come first for certain, items above it come after. Only the items
below the row's last window matter at all: they are picked out with one comparison and placed
among the row's windows through a grid of 8 R cells (a binary search where a window shares the
cell), O(N + M) per row against the O(N log N) of sorting it. The few items inside a window
get their float64 key, and the same vector twice ties exactly: the counts, and every metric
read from them, are those of a full float64 sort. Rows are placed in groups of bounded size,
so an untrained embedding, whose rows lie almost wholly below their last window, costs time
(about a sort's) but not memory.

On a CPU the elementwise passes and searches run in numpy (several times faster than torch's
here), each chunk cut into parts that threads take in turn; on CUDA the same steps run in
torch (a binary search where numpy reads the grid: the same counts).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from harness.evaluate.metrics.distances import PairMoments
from harness.evaluate.metrics.negatives import Exact, Negatives, float32_pairs, use_numpy
from harness.evaluate.metrics.onepass import Split, Sums, exact_pass, retrieval_depth
from harness.evaluate.metrics.ranks import class_members, rank_metrics

#: Items located at once, at most (a row with more is located alone): about 40 bytes each.
GROUP_ITEMS = 1 << 22

#: Below this many query x gallery pairs the LDA score's distances are all float64 (as the
#: exact pass computes them); above it the negative pairs' come from the float32 keys, which
#: agree to 1e-9 and cost a fifth as much.
FLOAT32_LDA_MIN_PAIRS = 1 << 24

#: float64 values gathered at once to compare the items of the windows exactly ([pairs, D]):
#: 64 MB a thread.
PAIR_ELEMENTS = 1 << 23

#: At most this many threads share a chunk (each holds its part's keys).
MAX_THREADS = 8

#: Parts per thread in each chunk: a thread that finishes early takes another part.
PARTS = 4


@dataclass(frozen=True)
class Centred:
    """The embeddings as the float32 product and the exact pair keys need them."""

    q64: torch.Tensor
    g64: torch.Tensor
    level: float  # c^2 near the mean squared distance, c and c^2 exact in float32
    g_sq64: torch.Tensor
    q_sq64: torch.Tensor
    q_aug: torch.Tensor  # [Q, D + 4] float32: centred query, 1, 1, its squared norm (hi, lo)
    g_aug: torch.Tensor  # [G, D + 4] float32: -2 x centred item, its squared norm (hi, lo), 1, 1
    err: torch.Tensor  # [Q] float64: |k32 - (k64 + row constant)| <= err
    g_aug_t: np.ndarray | None  # on the CPU: g_aug transposed, contiguous (numpy's BLAS)

    @classmethod
    def of(cls, q: torch.Tensor, g: torch.Tensor) -> Centred:
        """Centre on the gallery's mean and take the mean squared distance off every key (small
        keys, a tight bound, and float32 sums that round alike on both sides of the mean)."""
        g64 = g.to(torch.float64)
        q64 = g64 if q is g else q.to(torch.float64)  # all-vs-all: one copy
        mu = g64.mean(0)
        gc = (g64 - mu).to(torch.float32)
        qc = gc if q is g else (q64 - mu).to(torch.float32)
        gc_sq = ((g64 - mu) ** 2).sum(1)
        qc_sq = gc_sq if q is g else ((q64 - mu) ** 2).sum(1)
        level = _level(float(qc_sq.mean() + gc_sq.mean()))  # the mean of ||q - g||^2
        one_q = torch.ones(len(qc), 2, dtype=torch.float32, device=q.device)
        one_g = torch.ones(len(gc), 2, dtype=torch.float32, device=q.device)
        # the squared norms less half the level, as float32 pairs hi + lo: rounding them would
        # shift every distance of a row (or a column) alike, and the LDA score's sums with it
        g_aug = torch.cat([-2 * gc, _hi_lo(gc_sq - level / 2), one_g], 1).contiguous()
        on_cpu = g_aug.device.type == "cpu"
        return cls(
            q64=q64,
            g64=g64,
            level=level,
            g_sq64=(g64 * g64).sum(1),
            q_sq64=(q64 * q64).sum(1),
            q_aug=torch.cat([qc, one_q, _hi_lo(qc_sq - level / 2)], 1).contiguous(),
            g_aug=g_aug,
            err=_rounding_bound(q64, g64, qc, gc, level),
            g_aug_t=np.ascontiguousarray(g_aug.numpy().T) if on_cpu else None,
        )

    def keys32(self, rows: torch.Tensor, out: np.ndarray | None = None) -> torch.Tensor:
        """[n, G] float32 keys ||q - g||^2 - level of the rows, from one product of the
        centred embeddings (the float64 keys plus ||q||^2 - level, within ``err``); on the CPU
        into ``out`` when given (fresh memory costs page faults each time)."""
        a = self.q_aug[rows]
        if use_numpy(a):  # numpy's BLAS runs this product faster than torch's here
            return torch.from_numpy(np.matmul(a.numpy(), self.g_aug_t, out=out))
        # the bound holds for float32 products only: never TF32, whatever the caller set
        precision = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")
        try:
            return a @ self.g_aug.T
        finally:
            torch.set_float32_matmul_precision(precision)

    def pair_keys(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """[M] float64 keys ||g||^2 - 2 q.g of the pairs (rows[i], cols[i])."""
        if use_numpy(rows):  # numpy gathers rows several times faster than torch
            q, g = (
                np.take(self.q64.numpy(), rows.numpy(), 0),
                np.take(self.g64.numpy(), cols.numpy(), 0),
            )
            dots = torch.from_numpy(np.einsum("md,md->m", q, g))
        else:
            dots = (self.q64[rows] * self.g64[cols]).sum(1)
        return self.g_sq64[cols] - 2 * dots

    def pair_squares(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """[M] float64 squared distances of the pairs (rows[i], cols[i])."""
        return self.pair_keys(rows, cols) + self.q_sq64[rows]

    def relevant_keys(self, rows: torch.Tensor, partners: torch.Tensor) -> torch.Tensor:
        """[n, W] float64 keys of each row's partners (-1 padding: any finite value)."""
        cols = partners.clamp(min=0)
        if use_numpy(rows):
            g = np.take(self.g64.numpy(), cols.numpy(), 0)
            q = np.take(self.q64.numpy(), rows.numpy(), 0)
            dots = torch.from_numpy(np.einsum("nwd,nd->nw", g, q))
        else:
            dots = torch.bmm(self.g64[cols], self.q64[rows].unsqueeze(2)).squeeze(2)
        return self.g_sq64[cols] - 2 * dots


def counted_ranks(
    cent: Centred,
    k32: torch.Tensor,
    rows: torch.Tensor,
    partners: torch.Tensor,
    exact: torch.Tensor,
    all_vs_all: bool,
) -> torch.Tensor:
    """[n, W] float64 ranks of each row's relevant items, ascending, +inf padded. ``partners``
    [n, W] are the rows' same-class gallery indices (-1 padded), ``exact`` their pair keys;
    ``k32`` is overwritten at the queries' own columns in all-vs-all mode."""
    n = len(rows)
    valid = partners >= 0
    if all_vs_all:
        valid &= partners != rows.unsqueeze(1)
        k32[torch.arange(n, device=k32.device), rows] = float("inf")  # the query is not ranked
    cols = partners.clamp(min=0)
    r32 = k32.gather(1, cols).to(torch.float64)
    margin = 2 * cent.err[rows].unsqueeze(1)
    lo = _float32_toward(torch.where(valid, r32 - margin, float("inf")), down=True)
    hi = _float32_toward(torch.where(valid, r32 + margin, float("inf")), down=False)
    # the windows in key order: lo and hi both ascend (one margin per row, monotone rounding)
    order = torch.sort(torch.where(valid, r32, float("inf")), dim=1, stable=True).indices
    lo, hi, cols, exact, valid = (x.gather(1, order) for x in (lo, hi, cols, exact, valid))
    last = torch.where(valid, hi, float("-inf")).max(1).values
    counts, item_row, item_col, started = _locate_in_groups(k32, last, lo, hi)
    ranks = 1 + counts.cumsum(1)[:, :-1].to(torch.float64)
    if len(item_row):  # items inside windows t in [ended, started): compared exactly
        width = lo.shape[1]
        hi_code = _encode(_row_of(n, width, lo.device), hi.reshape(-1))
        value = k32[item_row, item_col]
        code = _encode(item_row, value)
        ended = torch.searchsorted(hi_code, code, side="left") - item_row * width
        spans = started - ended
        item = torch.repeat_interleave(torch.arange(len(spans), device=spans.device), spans)
        step = torch.arange(len(item), device=item.device) - (spans.cumsum(0) - spans)[item]
        window, row, col = ended[item] + step, item_row[item], item_col[item]
        own = cols[row, window]
        other = torch.nonzero(col != own).squeeze(1)  # an item never comes before itself
        row, window, col, own = row[other], window[other], col[other], own[other]
        ahead = _ahead(cent, rows[row], col, own, exact[row, window])
        ranks.view(-1).index_add_(0, row * width + window, ahead.to(torch.float64))
    ranks = torch.where(valid, ranks, float("inf"))
    return torch.sort(ranks, dim=1).values


def _ahead(
    cent: Centred, rows: torch.Tensor, col: torch.Tensor, own: torch.Tensor, ref: torch.Tensor
) -> torch.Tensor:
    """Whether gallery item col[i] ranks ahead of the relevant item own[i] for query rows[i]
    (ref[i]: own's exact key): a lower exact key, or the same vector (then the lower index).
    In slices of at most PAIR_ELEMENTS gathered float64 values ([pairs, D]): a wide embedding
    with many near-ties (HDC's 3 x 4096 dimensions) gathered them all at once, some 20 GB.
    Each pair's answer is its own, so the slicing changes no number."""
    step = max(1, PAIR_ELEMENTS // max(1, cent.g64.shape[1]))
    out = []
    for a in range(0, len(col), step):
        r, c, o, e = rows[a : a + step], col[a : a + step], own[a : a + step], ref[a : a + step]
        key = cent.pair_keys(r, c)
        # the same vector twice has the same key, however each was rounded
        same = (key == e) | (cent.g64[c] == cent.g64[o]).all(1)
        out.append((key < e) & ~same | same & (c < o))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.bool, device=col.device)


def _locate_in_groups(
    k32: torch.Tensor, last: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """_locate_numpy (or _locate_torch) over groups of rows that hold at most GROUP_ITEMS items
    not above their last window (a row alone when it holds more): memory stays bounded even
    when most of every row is (an untrained embedding ranks its last relevant item late)."""
    cpu = use_numpy(k32)
    if cpu:
        below = torch.from_numpy(k32.numpy() <= last.numpy()[:, None])
        if np.count_nonzero(below.numpy()) <= GROUP_ITEMS:  # one group (a cheaper count)
            return _locate_numpy(k32, below, lo, hi)
        per_row = torch.from_numpy(np.count_nonzero(below.numpy(), axis=1))
    else:
        below = k32 <= last.unsqueeze(1)
        per_row = below.sum(1)
    group = (torch.cumsum(per_row, 0) - per_row) // GROUP_ITEMS  # each row's group, ascending
    cuts = torch.nonzero(torch.diff(group, prepend=group[:1] - 1)).squeeze(1).tolist()
    parts = []
    for a, b in itertools.pairwise([*cuts, len(k32)]):
        located = (_locate_numpy if cpu else _locate_torch)(k32[a:b], below[a:b], lo[a:b], hi[a:b])
        parts.append((located[0], located[1] + a, *located[2:]))
    return tuple(torch.cat(column) for column in zip(*parts, strict=True))


def _locate_numpy(
    k32: torch.Tensor, below: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """Every item of a row that is not above its last window (``below``), located among the
    row's windows [lo, hi] (ascending, +inf padded).

    Returns (counts [n, W + 1]: the row's items by how many of its windows start at or below
    them; then for the items inside a window: their row, column, and how many windows start at
    or below them). numpy on the CPU; _locate_torch takes the same steps in torch."""
    k = k32.numpy()
    n, size = k.shape
    width = lo.shape[1]
    flat = np.flatnonzero(below.numpy())
    per_row = np.diff(np.searchsorted(flat, np.arange(n + 1) * size))
    row = np.repeat(np.arange(n), per_row)
    values = k.reshape(-1)[flat]
    started = _started_numpy(row, per_row, values, lo.numpy())
    counts = np.bincount(row * (width + 1) + started, minlength=n * (width + 1))
    # inside some window iff inside the last one that starts at or below it (both ends ascend)
    last_started = hi.numpy().reshape(-1)[row * width + np.maximum(started - 1, 0)]
    inside = np.flatnonzero((started > 0) & (values <= last_started))
    row, flat, started = row[inside], flat[inside], started[inside]
    return (torch.from_numpy(counts).view(n, width + 1), torch.from_numpy(row),
            torch.from_numpy(flat - row * size), torch.from_numpy(started))  # fmt: skip


def _started_numpy(
    row: np.ndarray, per_row: np.ndarray, values: np.ndarray, lo: np.ndarray
) -> np.ndarray:
    """For each value, how many of its row's windows start at or below it (lo [n, W] ascending,
    +inf padded): what a binary search among the row's windows gives, read from a grid.

    Each row's span [first lo, last lo] is cut into 8 W cells by f(x) = clip((x - first) *
    scale, 0, cells - 1), computed alike in float32 for the values and the window starts. f is
    monotone, so a window whose cell is below a value's cell starts below it, one whose cell is
    above starts above it: a value's count is the number of windows in lower cells, unless a
    window shares its cell (about one value in eight), which is searched for."""
    n, width = lo.shape
    cells = 8 * width
    finite = np.isfinite(lo)
    first = lo[:, 0]
    top = np.where(finite, lo, -np.inf).max(1)
    span = top - first
    scale = np.where(span > 0, np.float32(cells - 1) / np.where(span > 0, span, 1), 0)
    scale = scale.astype(np.float32)

    def cell(x: np.ndarray, base: np.ndarray, step: np.ndarray) -> np.ndarray:
        return np.clip((x - base) * step, 0, cells - 1).astype(np.int64)

    lo_cell = np.where(finite, cell(np.where(finite, lo, first[:, None]), first[:, None],
                                    scale[:, None]), cells)  # fmt: skip
    hist = np.bincount((np.arange(n)[:, None] * (cells + 1) + lo_cell).ravel(),
                       minlength=n * (cells + 1))  # fmt: skip
    below = np.cumsum(hist.reshape(n, cells + 1), 1) - hist.reshape(n, cells + 1)
    at = row * (cells + 1) + cell(values, np.repeat(first, per_row), np.repeat(scale, per_row))
    started = below.ravel()[at]
    shared = np.flatnonzero(hist[at] > 0)
    if len(shared):
        lo_code = _encode_numpy(np.repeat(np.arange(n), width), lo.reshape(-1))
        code = _encode_numpy(row[shared], values[shared])
        started[shared] = np.searchsorted(lo_code, code, side="right") - row[shared] * width
    return started


def _locate_torch(
    k32: torch.Tensor, below: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """_locate_numpy in torch, step for step (CUDA); the windows are found by a binary search
    where numpy reads a grid: the same counts."""
    n, size = k32.shape
    width = lo.shape[1]
    flat = torch.nonzero(below.reshape(-1)).squeeze(1)
    row = flat // size
    values = k32.reshape(-1)[flat]
    lo_code = _encode(_row_of(n, width, k32.device), lo.reshape(-1))
    started = torch.searchsorted(lo_code, _encode(row, values), side="right") - row * width
    counts = torch.bincount(row * (width + 1) + started, minlength=n * (width + 1))
    last_started = hi.reshape(-1)[row * width + (started - 1).clamp(min=0)]
    inside = torch.nonzero((started > 0) & (values <= last_started)).squeeze(1)
    row, flat, started = row[inside], flat[inside], started[inside]
    return counts.view(n, width + 1), row, flat - row * size, started


def _rounding_bound(
    q64: torch.Tensor, g64: torch.Tensor, qc: torch.Tensor, gc: torch.Tensor, level: float
) -> torch.Tensor:
    """Per query row, a bound on |k32 - (k64 + ||q||^2)| for every gallery item.

    A float32 dot product of n terms errs by at most gamma_n = n u / (1 - n u) times the sum
    of the terms' magnitudes (u = 2^-24, any order of summation, with or without fused
    multiply-adds); here n = D + 4 and the terms sum to at most (||q - mu|| + ||g - mu||)^2
    plus the level.
    Rounding the centred inputs to float32 adds 2 u ||q - mu|| ||g - mu||, the norms' hi + lo
    split u^2 of a norm, and the float64 keys err by gamma_D (||q|| + ||g||)^2 in float64.
    1.25 times their sum leaves room for the bound's own rounding."""
    n = q64.shape[1] + 4
    u32, u64 = 2.0**-24, 2.0**-53
    qc_norm = qc.to(torch.float64).norm(dim=1)
    gc_norm = float(gc.to(torch.float64).norm(dim=1).max())
    spread = (qc_norm + gc_norm) ** 2 + abs(level)
    g32 = n * u32 / (1 - n * u32) * spread + 2 * u32 * qc_norm * gc_norm + u32 * u32 * spread
    g64 = n * u64 / (1 - n * u64) * (q64.norm(dim=1) + float(g64.norm(dim=1).max())) ** 2
    return 1.25 * (g32 + g64)


def _level(mean_sq: float) -> float:
    """c^2 for a c near sqrt(mean_sq) with 12 significant bits: c and c^2 are then exact in
    float32 (and float64), so no constant of the float32 arithmetic is rounded (a rounded one
    would scale or shift every distance alike)."""
    if not mean_sq > 0:
        return 1.0
    root = math.sqrt(mean_sq)
    step = 2.0 ** (math.floor(math.log2(root)) - 11)
    c = max(round(root / step), 1) * step
    return c * c


def _hi_lo(x: torch.Tensor) -> torch.Tensor:
    """[n, 2] float32 (hi, lo) with hi + lo = x to about float32 precision squared."""
    hi = x.to(torch.float32)
    return torch.stack([hi, (x - hi.to(torch.float64)).to(torch.float32)], 1)


def _float32_toward(x: torch.Tensor, *, down: bool) -> torch.Tensor:
    """x rounded to float32, one step further when rounding went the wrong way (so a window
    never shrinks)."""
    y = x.to(torch.float32)
    wrong = (y.to(torch.float64) > x) if down else (y.to(torch.float64) < x)
    target = torch.full_like(y, float("-inf") if down else float("inf"))
    return torch.where(wrong, torch.nextafter(y, target), y) + 0.0  # + 0.0: no -0.0


def _encode(row: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """int64 codes ordered like (row, value) for float32 values (-0.0 taken as 0.0)."""
    bits = (values + 0.0).contiguous().view(torch.int32).to(torch.int64)
    flipped = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # monotone in the float
    return (row << 32) + (flipped + (1 << 31))


def _encode_numpy(row: np.ndarray, values: np.ndarray) -> np.ndarray:
    """_encode in numpy."""
    bits = (values + np.float32(0.0)).view(np.int32).astype(np.int64)
    flipped = np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return (row.astype(np.int64) << 32) + (flipped + (1 << 31))


def _row_of(n: int, width: int, device: torch.device) -> torch.Tensor:
    return torch.arange(n, device=device).repeat_interleave(width)


def counted_pass(
    split: Split,
    *,
    ks: list[int],
    names: set[str],
    chunk_size: int,
    retrieval: bool,
    lda: PairMoments | None,
    sums: Sums,
) -> None:
    """The exact pass's metrics (see harness.evaluate.metrics.onepass) from float32 keys:
    retrieval metrics over the active queries and/or LDA moments over every query row.

    On a CPU each chunk is cut into one part per core, and each part (its product, then its
    ranks and sums) runs on its own thread with single-threaded BLAS and torch: numpy lets go
    of the interpreter, and no library's idle threads spin against the others'. The parts'
    results are added in order, so the numbers do not depend on the number of cores."""
    exact_lda = lda is not None and len(split.q_ids) * len(split.g_ids) < FLOAT32_LDA_MIN_PAIRS
    if exact_lda:  # few pairs: the float64 pass's LDA, as it always was
        exact_pass(split, ks=[], names=set(), scorer=None, chunk_size=chunk_size,
                   retrieval=False, lda=lda, sums=Sums())  # fmt: skip
    pass_ = _Pass(split, ks, names, retrieval, lda is not None and not exact_lda)
    rows_all = torch.arange(len(split.q_ids), device=split.q_emb.device)
    # with lda asked for, chunks of every row, as the exact pass cuts them: the same sums
    rows_pool = rows_all if lda is not None else split.active
    cpu = split.q_emb.device.type == "cpu"
    workers = min(MAX_THREADS, torch.get_num_threads()) if cpu else 1
    negatives = Negatives(pass_.cent.level) if pass_.float_lda else None
    with _one_thread_each(workers > 1), ThreadPoolExecutor(workers) as pool:
        for start in range(0, len(rows_pool), chunk_size):
            rows = rows_pool[start : start + chunk_size]
            cuts = [len(rows) * i // (PARTS * workers) for i in range(PARTS * workers + 1)]
            parts = [rows[a:b] for a, b in itertools.pairwise(cuts) if b > a]
            chunk: dict[str, list[torch.Tensor]] = {}
            for adds, pairs in pool.map(pass_.score, parts):
                for name, values in adds:
                    chunk.setdefault(name, []).append(values)
                if pairs is not None:
                    negatives.add(lda, *pairs)
            for name, values in chunk.items():  # one sum per chunk, as the exact pass adds
                sums.add(name, torch.cat(values))
    if negatives is not None:
        negatives.finish(lda)


@contextlib.contextmanager
def _one_thread_each(limit: bool) -> Iterator[None]:
    """Single-threaded BLAS and torch inside, when the pass runs its own threads."""
    if not limit:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            yield
    finally:
        torch.set_num_threads(threads)


class _Pass:
    """What every chunk of the pass reads, and the scoring of one chunk's rows."""

    def __init__(
        self, split: Split, ks: list[int], names: set[str], retrieval: bool, float_lda: bool
    ) -> None:
        self.split, self.ks, self.names = split, ks, names
        self.retrieval, self.float_lda = retrieval, float_lda
        self.cent = Centred.of(split.q_emb, split.g_emb)
        self.members = class_members(split.g_ids, split.num_ids)
        self.depth = retrieval_depth(split, ks, names) if retrieval else 0
        self.is_active = torch.zeros(len(split.q_ids), dtype=torch.bool, device=split.q_emb.device)
        self.is_active[split.active] = True
        self.local = threading.local()

    def _buffer(self, n: int, name: str = "keys") -> np.ndarray | None:
        """This thread's [n, G] float32 buffer ``name`` (CPU), reused chunk after chunk."""
        if self.split.q_emb.device.type != "cpu":
            return None
        buffer = getattr(self.local, name, None)
        if buffer is None or buffer.shape[0] != n:
            buffer = np.empty((n, len(self.split.g_ids)), dtype=np.float32)
            setattr(self.local, name, buffer)
        return buffer

    def score(self, rows: torch.Tensor) -> tuple[list, tuple | None]:
        """(the per-query metric values to add, in order; the LDA pair sums or None) of some
        consecutive rows."""
        split, cent = self.split, self.cent
        k32 = cent.keys32(rows, self._buffer(len(rows)))
        partners = self.members[split.q_ids[rows]]
        adds: list[tuple[str, torch.Tensor]] = []
        exact = cent.relevant_keys(rows, partners) if self.retrieval or self.float_lda else None
        ranked = self.is_active[rows]
        if self.retrieval and bool(ranked.any()):
            every = bool(ranked.all())
            r, keys = (rows, k32) if every else (rows[ranked], k32[ranked])
            mine, ex = (partners, exact) if every else (partners[ranked], exact[ranked])
            ranks = counted_ranks(cent, keys, r, mine, ex, split.all_vs_all)
            rank_metrics(ranks, split.r_counts[r], self.ks, self.names, self.depth,
                         lambda name, values: adds.append((name, values)))  # fmt: skip
        if not self.float_lda:
            return adds, None
        exact_sq = exact + cent.q_sq64[rows].unsqueeze(1)
        close = 100 * float(cent.err[rows].max())  # below it, a square root magnifies errors
        exact_pairs = Exact(cent.level, close, cent.pair_squares)
        pairs = float32_pairs(k32, rows, partners, exact_sq, split.all_vs_all, exact_pairs,
                              self._buffer(len(rows), "scratch"))  # fmt: skip
        return adds, pairs
