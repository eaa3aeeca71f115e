"""`harness search`'s exact search (harness.deploy's flat VectorIndex.search) against one raw
faiss `IndexFlatL2.search` over the same 100,000 x 512 gallery, as pytest-benchmark records
(the ratio, ours / faiss, in each record's extra_info): one query, and a batch of 1,000.

Ours adds the checks on the queries, the id map (IndexIDMap2) and the -1/inf padding; the
ratio says what they cost. Skipped by the default test command (`--benchmark-skip` in
pyproject.toml); run them with
`pytest tests/benchmarks/test_bench_search.py --benchmark-only -n 0`. Nothing is asserted
about time; docs/search-scale.md gives the figures measured.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from harness.deploy import IndexSpec, build_index

sys.path.insert(0, str(Path(__file__).parent))
from bench_evaluation import embeddings, faiss  # noqa: E402

GALLERY = (100_000, 512, 10_000)  # items, dimension, classes (10 photos a class on average)
QUERIES = {"one_query": 1, "1000_queries": 1_000}
ROUNDS = {"one_query": 30, "1000_queries": 3}
K = 10


@functools.cache
def gallery() -> tuple[np.ndarray, np.ndarray]:
    """The gallery, and 1,000 queries from the same classes that are not in it (made once,
    and only when a benchmark runs: a module fixture would be made for skipped ones too)."""
    n, dim, classes = GALLERY
    x, _ = embeddings(n + max(QUERIES.values()), dim, classes)
    return np.ascontiguousarray(x[:n]), np.ascontiguousarray(x[n:])


@pytest.mark.skipif(faiss is None, reason="needs faiss for the reference search")
@pytest.mark.parametrize("case", list(QUERIES))
def test_flat_search_against_a_raw_faiss_search(benchmark, case):
    x, queries = gallery()
    queries = np.ascontiguousarray(queries[: QUERIES[case]])
    ours = build_index(IndexSpec(), x, np.arange(len(x), dtype=np.int64))
    raw = faiss.IndexFlatL2(x.shape[1])
    raw.add(x)
    reference: list[float] = []

    def faiss_first() -> tuple[tuple, dict]:  # the reference, just before each round of ours
        start = time.perf_counter()
        raw.search(queries, K)
        reference.append(time.perf_counter() - start)
        return (), {}

    found = benchmark.pedantic(
        lambda: ours.search(queries, K), setup=faiss_first, rounds=ROUNDS[case], iterations=1
    )
    np.testing.assert_array_equal(found[1], raw.search(queries, K)[1])  # the same neighbours
    benchmark.extra_info.update(
        gallery=f"{len(x)} x {x.shape[1]}",
        queries=len(queries),
        faiss_seconds=statistics.median(reference),
        ratio_to_faiss=benchmark.stats.stats.median / statistics.median(reference),
    )
