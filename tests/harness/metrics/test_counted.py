"""The counted ranks (harness/evaluate/metrics/counted.py) against the full float64 pass they
replace: the same ranks, so the same metrics bit for bit, on ties, duplicates, offsets, untrained
embeddings and both modes; its pieces (the grid count, the rounding bound, the torch twin of the numpy
steps) against plain references; the float32 LDA sums within 1e-9 of the exact ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import harness.evaluate.metrics.report as report
from harness.evaluate.metrics import MetricOptions, compute_metrics
from harness.evaluate.metrics import counted as C
from harness.evaluate.metrics.onepass import exact_pass

FULL = ["recall@K", "precision@1", "r_precision", "map@r", "map"]


def full_pass(*args, monkeypatch, **kwargs) -> dict[str, float]:
    """The metrics from the exact pass's full sort of every row (the reference)."""
    with monkeypatch.context() as m:
        m.setattr(report, "counted_pass", lambda split, **kw: exact_pass(split, scorer=None, **kw))
        return compute_metrics(*args, **kwargs)


def cases() -> dict[str, tuple]:
    rng = np.random.default_rng(7)
    labels = rng.integers(0, 30, 600)
    trained = rng.normal(size=(30, 16))[labels] + 0.7 * rng.normal(size=(600, 16))
    ints = rng.integers(0, 3, size=(400, 3)).astype(np.float64)  # exact ties everywhere
    copies = np.repeat(rng.normal(size=(150, 6)), 3, axis=0)  # each vector three times
    return {
        "trained": (trained, labels),
        "offset": (trained + 1e4, labels),  # far from the origin: centring matters
        "integer ties": (ints, rng.integers(0, 6, 400)),
        "duplicates across classes": (copies, rng.integers(0, 20, 450)),
        "untrained": (rng.normal(size=(500, 8)), rng.integers(0, 10, 500)),
        "query/gallery": (trained[:200], labels[:200], trained[200:], labels[200:]),
        "float32": (trained.astype(np.float32), labels),
    }


@pytest.mark.parametrize("name", list(cases()))
def test_counted_ranks_give_the_full_sorts_metrics_bit_for_bit(name, monkeypatch):
    args = cases()[name]
    for chunk in (1024, 37):
        options = MetricOptions(knn_backend="torch", chunk_size=chunk)
        got = compute_metrics(*args, metrics=FULL, recall_ks=(1, 4, 16), options=options)
        want = full_pass(*args, metrics=FULL, recall_ks=(1, 4, 16), options=options,
                         monkeypatch=monkeypatch)  # fmt: skip
        assert got == want


def test_rows_located_in_small_groups_rank_alike(monkeypatch):
    # an untrained embedding: most of each row lies below its last relevant item; groups of
    # at most 50 items (most rows alone) give the ranks one group gives
    x, y = cases()["untrained"]
    want = full_pass(x, y, metrics=FULL, monkeypatch=monkeypatch)
    for items in (1 << 30, 50):
        monkeypatch.setattr(C, "GROUP_ITEMS", items)
        assert compute_metrics(x, y, metrics=FULL) == want


def test_two_threads_give_what_one_gives(monkeypatch):
    x, y = cases()["trained"]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = compute_metrics(x, y, metrics=FULL, options=MetricOptions(chunk_size=100))
        torch.set_num_threads(2)
        two = compute_metrics(x, y, metrics=FULL, options=MetricOptions(chunk_size=100))
    finally:
        torch.set_num_threads(threads)
    assert one == two


def test_the_grid_counts_like_a_binary_search():
    rng = np.random.default_rng(1)
    n, width = 50, 7
    lo = np.sort(rng.integers(0, 40, (n, width)).astype(np.float32) / 8, axis=1)
    lo[::5, 4:] = np.inf  # padded windows
    lo[3] = 2.0  # one row whose windows all start at one value
    per_row = rng.integers(0, 30, n)
    row = np.repeat(np.arange(n), per_row)
    values = (rng.integers(-8, 48, len(row)) / 8).astype(np.float32)  # on the windows, often
    got = C._started_numpy(row, per_row, values, lo)
    want = np.array(
        [np.searchsorted(lo[r], v, side="right") for r, v in zip(row, values, strict=True)]
    )
    assert (got == want).all()


def test_the_torch_steps_are_the_numpy_steps():
    # the CUDA path, run on CPU tensors, locates the same items as the numpy path
    rng = np.random.default_rng(2)
    k32 = torch.from_numpy(rng.integers(0, 50, (30, 200)).astype(np.float32) / 10)
    lo = torch.sort(torch.from_numpy(rng.integers(0, 40, (30, 5)).astype(np.float32) / 10)).values
    hi = lo + 0.15
    lo[0, 3:], hi[0, 3:] = float("inf"), float("inf")
    last = torch.where(torch.isfinite(hi), hi, float("-inf")).max(1).values
    below = k32 <= last.unsqueeze(1)
    numpy_side = C._locate_numpy(k32, below, lo, hi)
    torch_side = C._locate_torch(k32, below, lo, hi)
    for a, b in zip(numpy_side, torch_side, strict=True):
        assert torch.equal(a.to(torch.int64), b.to(torch.int64))


@pytest.mark.parametrize("scale,offset", [(1.0, 0.0), (1e3, 0.0), (1.0, 1e4), (1e-3, 5.0)])
def test_float32_squared_distances_lie_within_the_bound(scale, offset):
    rng = np.random.default_rng(3)
    q = torch.from_numpy(rng.normal(size=(64, 96)) * scale + offset)
    g = torch.from_numpy(rng.normal(size=(300, 96)) * scale + offset)
    cent = C.Centred.of(q, g)
    k32 = cent.keys32(torch.arange(64)).double() + cent.level  # keys are d^2 - level
    true = ((q[:, None, :] - g[None, :, :]) ** 2).sum(-1)
    off = (k32 - true).abs().max(1).values
    assert (off <= cent.err).all()
    assert (cent.err < 1e-3 * true.mean()).all()  # and tight enough to leave few ties


def test_float32_lda_sums_agree_to_1e_9(monkeypatch):
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 40, 3000)
    x = rng.normal(size=(40, 64))[labels] + rng.normal(size=(3000, 64))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x[5] = x[6]  # a duplicate pair
    exact = compute_metrics(x, labels, metrics=["lda"])["lda"]
    q_args = (x[:1000], labels[:1000], x[1000:], labels[1000:])
    exact_qg = compute_metrics(*q_args, metrics=["lda"])["lda"]
    monkeypatch.setattr(C, "FLOAT32_LDA_MIN_PAIRS", 0)  # the float32 sums, on small data
    assert compute_metrics(x, labels, metrics=["lda"])["lda"] == pytest.approx(exact, rel=1e-9)
    got_qg = compute_metrics(*q_args, metrics=["lda"], options=MetricOptions(chunk_size=333))
    assert got_qg["lda"] == pytest.approx(exact_qg, rel=1e-9)


@pytest.mark.parametrize("name", ["trained", "duplicates across classes", "query/gallery"])
def test_the_torch_path_cuda_takes_gives_the_numpy_paths_numbers(name, monkeypatch):
    # CPU tensors sent through the torch steps (the ones CUDA tensors take), the LDA sums
    # through the float32 path (on 10^5 pairs here, where its rounding averages out less than
    # on the 2^24 it is used from): the same ranks, and the same LDA score to 1e-8 (1e-10
    # absolute for a score near 0, where the classes do not separate)
    from harness.evaluate.metrics import negatives

    args = cases()[name]
    monkeypatch.setattr(C, "FLOAT32_LDA_MIN_PAIRS", 0)
    want = compute_metrics(*args, metrics=[*FULL, "lda"], options=MetricOptions(chunk_size=64))
    monkeypatch.setattr(negatives, "NUMPY_ON_CPU", False)
    got = compute_metrics(*args, metrics=[*FULL, "lda"], options=MetricOptions(chunk_size=64))
    assert {k: got[k] for k in got if k != "lda"} == {k: want[k] for k in want if k != "lda"}
    assert got["lda"] == pytest.approx(want["lda"], rel=1e-8, abs=1e-10)
