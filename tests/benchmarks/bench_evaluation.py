"""Time the evaluation against one faiss flat self-search of the same embeddings.

The ratio (our seconds / faiss seconds) is what to read: the machine may be shared, so the
runs are interleaved (faiss, ours, faiss, ours, ...) in one process, repeated, and the median
of each ratio is reported. Nothing is asserted about wall-clock time.

    PYTHONPATH=. python tests/benchmarks/bench_evaluation.py            # 20,000 x 128, 500 classes
    PYTHONPATH=. python tests/benchmarks/bench_evaluation.py --n 5000 --repeats 5
    PYTHONPATH=. python tests/benchmarks/bench_evaluation.py --old /path/to/old_metrics.py
    PYTHONPATH=. python tests/benchmarks/bench_evaluation.py --n 60000 --dim 512 --device cuda

``--device cuda`` evaluates on the GPU (SOP's size above); the reference stays faiss's CPU
flat search, so the ratio then says how much faster the GPU evaluation is than that search.

``--old`` times a saved copy of an earlier ``harness/metrics.py`` in the same process (the
"before" numbers of a rewrite).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from types import ModuleType

import numpy as np
import torch

try:
    import faiss
except ImportError:  # pragma: no cover - depends on the environment
    faiss = None

from harness.evaluate import MetricOptions, compute_metrics, distance_histogram

TOP_K = ["recall@K", "precision@1", "r_precision", "map@r"]


def embeddings(n: int, dim: int, classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """L2-normalised class centres plus noise, like a trained embedding's test split."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=n)
    centres = rng.normal(size=(classes, dim))
    x = centres[labels] + 1.5 * rng.normal(size=(n, dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32), labels


def faiss_flat(x: np.ndarray, k: int = 9) -> None:
    """One exact float32 self-search (IndexFlatL2): the reference cost."""
    index = faiss.IndexFlatL2(x.shape[1])
    index.add(x)
    index.search(x, k)


def _load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("old_metrics", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_metrics"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _seconds(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--classes", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--old", help="a saved copy of an earlier harness/metrics.py to time too")
    parser.add_argument("--only", help="comma-separated subset of the timed rows")
    parser.add_argument("--device", default="cpu", help="where the evaluation runs (cpu, cuda)")
    args = parser.parse_args(argv)
    if faiss is None:
        print("faiss is not installed: nothing to compare with")
        return 1
    x, y = embeddings(args.n, args.dim, args.classes)
    dev = args.device
    xt, yt = torch.from_numpy(x).to(dev), torch.from_numpy(y).to(dev)
    rows: dict[str, Callable[[], object]] = {
        "all default metrics": lambda: compute_metrics(x, y, options=MetricOptions(device=dev)),
        "top-K metrics (exact)": lambda: compute_metrics(
            x, y, metrics=TOP_K, options=MetricOptions(knn_backend="torch", device=dev)
        ),
        "distance histogram": lambda: distance_histogram(xt, yt),
    }
    if args.old:
        old = _load(args.old)
        rows["old: all default metrics"] = lambda: old.compute_metrics(x, y)
        rows["old: top-K metrics (exact)"] = lambda: old.compute_metrics(
            x, y, metrics=TOP_K, options=MetricOptions(knn_backend="torch")
        )
    if args.only:
        keep = [name.strip() for name in args.only.split(",")]
        rows = {name: work for name, work in rows.items() if name in keep}
    faiss_flat(x)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in rows}
    ratios: dict[str, list[float]] = {name: [] for name in rows}
    reference: list[float] = []
    for _ in range(args.repeats):
        for name, work in rows.items():
            base = _seconds(lambda: faiss_flat(x))
            ours = _seconds(work)
            reference.append(base)
            times[name].append(ours)
            ratios[name].append(ours / base)
    print(
        f"{args.n} x {args.dim}, {args.classes} classes, on {dev}, {torch.get_num_threads()} threads,"
        f" {args.repeats} repeats (medians; each ratio against the faiss search just before it)"
    )
    print(f"  {'faiss flat self-search':<28} {statistics.median(reference):7.2f} s")
    for name in rows:
        print(
            f"  {name:<28} {statistics.median(times[name]):7.2f} s"
            f"  {statistics.median(ratios[name]):6.2f}x faiss"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
