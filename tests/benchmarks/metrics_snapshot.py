"""Save every metric the harness computes on a fixed set of inputs, or compare against a save.

Made to check that a rewrite of ``harness.metrics`` changes no number: run ``save`` on the old
code, ``compare`` on the new one (the largest absolute difference is printed per case and
overall; counts, backends and histogram counts must match exactly).

    PYTHONPATH=. python tests/benchmarks/metrics_snapshot.py save /tmp/metrics_before.json
    PYTHONPATH=. python tests/benchmarks/metrics_snapshot.py compare /tmp/metrics_before.json

The inputs are random and tie-heavy (integer-valued) embeddings, all-vs-all and query/gallery,
with lone queries, duplicates, large offsets, float16/float64 inputs, several chunk sizes,
metric subsets (the top-K only path included), the faiss backend and learned scorers.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from bench_evaluation import embeddings

from harness.evaluate import MetricOptions, compute_report, distance_histogram, lda_score, rerank

TOP_K = ["recall@K", "precision@1", "r_precision", "map@r"]


OPTION_NAMES = ("knn_backend", "num_clusters", "seed", "kmeans_convention", "device", "chunk_size")


def _gauss(n: int, d: int, classes: int, seed: int, dtype=np.float32) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)).astype(dtype), rng.integers(0, classes, size=n)


def _ints(n: int, d: int, high: int, classes: int, seed: int) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, high, size=(n, d)).astype(np.float32), rng.integers(0, classes, n)


def _normalised(n: int, d: int, classes: int, seed: int) -> tuple[Any, Any]:
    return embeddings(n, d, classes, seed)  # the benchmark's clustered, normalised rows


def _neg_sq(q: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return -torch.cdist(q.double(), g.double()).pow(2)


def _cosine(q: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(q, dim=1) @ torch.nn.functional.normalize(g, dim=1).T


def _rounded_dot(q: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return torch.round(q @ g.T)  # heavy ties among the scores


def _cases() -> dict[str, Callable[[], dict[str, Any]]]:
    cases: dict[str, Callable[[], dict[str, Any]]] = {}

    def report(name: str, *args: Any, **kwargs: Any) -> None:
        def run() -> dict[str, Any]:
            how = {k: kwargs.pop(k) for k in list(kwargs) if k in OPTION_NAMES}
            r = compute_report(*args, **kwargs, options=MetricOptions(**how))
            return {
                "metrics": r.metrics,
                "counts": [r.num_queries, r.num_lone_queries, r.num_gallery, r.num_clusters],
                "backend": r.knn_backend,
            }

        cases[name] = run

    x, y = _gauss(300, 16, 20, 0)
    report("gauss300", x, y)
    report("gauss300_topk", x, y, metrics=TOP_K, recall_ks=(1, 5, 20, 299, 1000))
    report("gauss300_chunk7", x, y, chunk_size=7)
    report("gauss300_cos", x, y, scorer=_cosine)
    report("gauss300_negsq", x, y, scorer=_neg_sq, chunk_size=64)
    report("gauss300_rerank", x, y, scorer=rerank(_cosine, 10))
    report("gauss300_roundeddot", x * 3, y, scorer=_rounded_dot, metrics=TOP_K + ["map"])
    report("gauss300_faiss", x, y, metrics=TOP_K, knn_backend="faiss")
    report("gauss300_k7", x, y, num_clusters=7, seed=3)
    report("gauss300_f64", x.astype(np.float64) * 1e3, y)
    report("gauss300_f16", x.astype(np.float16), y)
    report("gauss300_offset", x + 1000.0, y)
    report("gauss300_offset_topk", x + 1000.0, y, metrics=TOP_K)
    report("gauss300_tiny_f64", x.astype(np.float64) * 1e-9 + 7.0, y)
    report("gauss300_map", x, y, metrics=["map"])
    report("gauss300_lda", x, y, metrics=["lda"])
    x, y = _gauss(2500, 32, 60, 1)
    report("gauss2500", x, y)
    report("gauss2500_topk", x, y, metrics=TOP_K)
    report("gauss2500_chunk100", x, y, chunk_size=100)
    report("gauss2500_qg", x[:700], y[:700], x[700:], y[700:])
    report("gauss2500_qg_topk", x[:700], y[:700], x[700:], y[700:], metrics=TOP_K)
    report("gauss2500_qg_negsq", x[:300], y[:300], x[300:], y[300:], scorer=_neg_sq)
    x, y = _normalised(3000, 64, 100, 2)
    report("normalised3000", x, y)
    report("normalised3000_topk", x, y, metrics=TOP_K, recall_ks=(1, 2, 4, 8, 16, 32))
    x, y = _ints(400, 3, 3, 7, 3)
    report("ints400", x, y)
    report("ints400_topk", x, y, metrics=TOP_K, recall_ks=(1, 3, 17))
    report("ints400_chunk7", x, y, chunk_size=7)
    report("ints400_qg", x[:150], y[:150], x[150:], y[150:])
    report("ints400_qg_topk", x[:150], y[:150], x[150:], y[150:], metrics=TOP_K)
    report("ints400_roundeddot", x, y, scorer=_rounded_dot)
    x, y = _ints(1500, 4, 2, 12, 4)  # only 16 distinct points: enormous ties
    report("binary1500", x, y)
    report("binary1500_topk", x, y, metrics=TOP_K, chunk_size=333)
    report("binary1500_qg", x[:500], y[:500], x[500:], y[500:])
    x, y = _ints(600, 8, 5, 30, 5)
    y[:40] = np.arange(1000, 1040)  # 40 lone queries
    report("ints600_lone", x, y)
    report("ints600_lone_topk", x, y, metrics=TOP_K)
    big = np.array([[1e6, 1e6], [1e6 + 6, 1e6], [1e6 + 3, 1e6 + 4], [1e6, 1e6 + 5]])
    report("bigcoords", np.repeat(big, 3, axis=0).astype(np.float32), np.tile([0, 1], 6))
    dup = np.repeat(_gauss(50, 5, 1, 6)[0], 4, axis=0)
    report("duplicates", dup, np.random.default_rng(6).integers(0, 9, 200))

    def lda(name: str, *args: Any) -> None:
        cases[name] = lambda: {"lda": lda_score(*args)}

    x, y = _gauss(500, 8, 9, 7)
    lda("lda_gauss", x, y)
    lda("lda_gauss_qg", x[:200], y[:200], x[200:], y[200:])
    x, y = _ints(300, 2, 4, 5, 8)
    lda("lda_ints", x, y)

    def hist(name: str, x: Any, y: Any, **kwargs: Any) -> None:
        cases[name] = lambda: distance_histogram(torch.as_tensor(x), torch.as_tensor(y), **kwargs)

    x, y = _gauss(2500, 32, 60, 1)
    hist("hist_gauss2500", x, y)
    hist("hist_gauss2500_b20_c100", x, y, bins=20, chunk=100)
    x, y = _normalised(3000, 64, 100, 2)
    hist("hist_normalised3000", x, y)
    x, y = _ints(400, 3, 3, 7, 3)
    hist("hist_ints400", x, y)
    hist("hist_ints400_c7", x, y, chunk=7)
    return cases


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}/{key}"))
        return out
    if isinstance(value, list):
        out = {}
        for i, item in enumerate(value):
            out.update(_flatten(item, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


def _diff(old: Any, new: Any) -> float:
    if isinstance(old, float) or isinstance(new, float):
        if isinstance(old, float) and math.isinf(old) or isinstance(new, float) and math.isinf(new):
            return 0.0 if old == new else math.inf
        return abs(float(old) - float(new))
    return 0.0 if old == new else math.inf


def main(argv: list[str]) -> int:
    mode, path = argv
    outputs = {name: run() for name, run in _cases().items()}
    if mode == "save":
        with open(path, "w") as f:
            json.dump(outputs, f, indent=1)
        print(f"saved {len(outputs)} cases to {path}")
        return 0
    with open(path) as f:
        saved = json.load(f)
    worst = 0.0
    for name, old in saved.items():
        new = json.loads(json.dumps(outputs[name]))  # the same float round trip as the save
        flat_old, flat_new = _flatten(old), _flatten(new)
        if list(flat_old) != list(flat_new):
            print(f"{name}: keys differ: {list(flat_old)} vs {list(flat_new)}")
            worst = math.inf
            continue
        case = max((_diff(flat_old[k], flat_new[k]) for k in flat_old), default=0.0)
        worst = max(worst, case)
        print(f"{name:<28} max |old - new| = {case:.3g}")
    print(f"{len(saved)} cases, largest difference {worst:.3g}")
    return 0 if worst <= 1e-12 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
