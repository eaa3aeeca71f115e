"""Evaluation against one faiss flat self-search, as pytest-benchmark records (the ratio in
each record's extra_info): `harness evaluate`'s whole command on files, at 20,000 x 128 and at
SOP's size, 60,000 x 512 (bench_evaluation.py prints the same ratios without pytest).

Skipped by the default test command (`--benchmark-skip` in pyproject.toml); run them with
`pytest tests/benchmarks/test_bench_evaluation.py --benchmark-only -n 0` (the 60k case
takes a few minutes on 2 cores). Nothing is asserted about time.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from bench_evaluation import SIZES, _command, embeddings, faiss, faiss_flat  # noqa: E402


@pytest.mark.skipif(faiss is None, reason="needs faiss for the reference search")
@pytest.mark.parametrize("size", list(SIZES))
def test_evaluate_command_against_a_faiss_flat_search(size, benchmark, tmp_path):
    n, dim, classes, per_class = SIZES[size]
    x, y = embeddings(n, dim, classes, per_class=per_class)
    np.save(tmp_path / "e.npy", x)
    np.save(tmp_path / "l.npy", y)
    k = int(np.bincount(y).max())
    reference: list[float] = []

    def faiss_first() -> tuple[tuple, dict]:  # the reference, just before each round of ours
        start = time.perf_counter()
        faiss_flat(x, k)
        reference.append(time.perf_counter() - start)
        return (), {}

    rounds = 3 if size == "20k" else 1
    peak = []
    benchmark.pedantic(lambda: peak.append(_command(tmp_path)[1]), setup=faiss_first,
                       rounds=rounds, iterations=1)  # fmt: skip
    ours = benchmark.stats.stats.median
    benchmark.extra_info.update(
        faiss_seconds=statistics.median(reference),
        ratio_to_faiss=ours / statistics.median(reference),
        peak_gb=max(peak) / 2**20,
    )
