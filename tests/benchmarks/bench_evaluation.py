"""`harness evaluate` on files, against one faiss flat self-search of the same embeddings.

The ratio (our seconds / faiss's seconds) is what to read: it holds from one machine to the next,
where seconds do not. For each size the embeddings are written to .npy files, then, in turns
(faiss, ours, faiss, ours, ...), the reference and ours are timed, and the median of the ratios
is printed with the command's peak memory:

* the reference: one exact float32 self-search, faiss IndexFlatL2 with k = the largest R + 1
  (every neighbour a retrieval metric reads), in this process, the index built inside the clock;
* ours: the whole command a user runs, `python -m harness evaluate --embeddings e.npy --labels
  l.npy --json` with its default options (every default metric; nmi and f1 by faiss's k-means
  convention, 20 iterations), in a fresh process: the interpreter's start, the imports and the
  loading count. Its peak resident memory comes from the operating system.

    python tests/benchmarks/bench_evaluation.py                 # 20,000 x 128 and 60,000 x 512
    python tests/benchmarks/bench_evaluation.py --size 20k --repeats 5
    python tests/benchmarks/bench_evaluation.py --n 5000 --dim 64 --classes 100
    python tests/benchmarks/bench_evaluation.py --size 60k --device cuda --in-process

Sizes: ``20k`` is 20,000 x 128 in 500 classes; ``60k`` is SOP's size, 60,000 x 512 in 9,242
classes of 2 to 11 images each. The embeddings are class centres plus Gaussian noise,
L2-normalised, like a trained embedding's test split (``--noise`` sets how well the classes
separate; the output gives the recall@1 that results). ``--in-process`` times
``compute_metrics`` in this process instead of the command (``--device cuda``: on the GPU; the
reference stays faiss on the CPU). Nothing is asserted: the targets (within 5x, at most 3 GB
at 60k) are read from the output, and docs/metrics.md gives the figures measured.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

try:
    import faiss
except ImportError:  # pragma: no cover - depends on the environment
    faiss = None

REPO = Path(__file__).resolve().parents[2]
SIZES = {"20k": (20_000, 128, 500, None), "60k": (60_000, 512, 9_242, (2, 11))}


def embeddings(
    n: int,
    dim: int,
    classes: int,
    seed: int = 0,
    *,
    per_class: tuple[int, int] | None = None,
    noise: float = 1.5,
) -> tuple[np.ndarray, np.ndarray]:
    """L2-normalised class centres plus noise, like a trained embedding's test split; labels
    uniform over the classes, or each class ``per_class`` = (least, most) images."""
    rng = np.random.default_rng(seed)
    if per_class is None:
        labels = rng.integers(0, classes, size=n)
    else:
        sizes = rng.integers(per_class[0], per_class[1] + 1, size=classes)
        labels = np.repeat(np.arange(classes), sizes)[:n]
        labels = rng.permutation(np.pad(labels, (0, n - len(labels)), mode="wrap"))
    centres = rng.normal(size=(classes, dim))
    x = centres[labels] + noise * rng.normal(size=(n, dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32), labels


def faiss_flat(x: np.ndarray, k: int) -> None:
    """One exact float32 self-search (IndexFlatL2): the reference cost."""
    index = faiss.IndexFlatL2(x.shape[1])
    index.add(x)
    index.search(x, k)


def _command(folder: Path) -> tuple[float, int]:
    """(seconds, peak resident kilobytes) of `python -m harness evaluate` on the files."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "evaluate", "--embeddings", str(folder / "e.npy"),
         "--labels", str(folder / "l.npy"), "--json"],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"harness evaluate failed:\n{proc.stderr}")
    # ru_maxrss of the children is the largest so far: a smaller run later reads as the earlier
    return seconds, max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)


def _in_process(x: np.ndarray, y: np.ndarray, device: str) -> float:
    import torch

    from harness.evaluate import MetricOptions, compute_metrics

    start = time.perf_counter()
    compute_metrics(x, y, options=MetricOptions(device=device, kmeans_convention="faiss"))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(x: np.ndarray, y: np.ndarray, args: argparse.Namespace) -> dict[str, float]:
    """Interleaved timings of faiss and ours; the medians, the median ratio and peak memory."""
    k = int(np.bincount(y).max())  # the largest R + 1 (R excludes the query itself)
    faiss_flat(x, k)  # warm-up
    ours, ref, ratios, peak = [], [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "e.npy", x)
        np.save(Path(tmp) / "l.npy", y)
        for _ in range(args.repeats):
            start = time.perf_counter()
            faiss_flat(x, k)
            ref.append(time.perf_counter() - start)
            if args.in_process:
                ours.append(_in_process(x, y, args.device))
            else:
                seconds, kb = _command(Path(tmp))
                ours.append(seconds)
                peak = max(peak, kb)
            ratios.append(ours[-1] / ref[-1])
    return {"faiss": statistics.median(ref), "ours": statistics.median(ours), "k": k,
            "ratio": statistics.median(ratios), "peak_gb": peak / 2**20}  # fmt: skip


def _recall_at_1(x: np.ndarray, y: np.ndarray) -> float:
    index = faiss.IndexFlatL2(x.shape[1])
    index.add(x)
    _, found = index.search(x, 2)
    # the nearest other item (the first neighbour is usually the item itself)
    nearest = np.where(found[:, 0] == np.arange(len(x)), found[:, 1], found[:, 0])
    return float((y[nearest] == y).mean())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=[*SIZES, "all"], default="all")
    parser.add_argument("--n", type=int, help="items (with --dim and --classes: another size)")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--classes", type=int, default=500)
    parser.add_argument("--noise", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--in-process", action="store_true",
                        help="time compute_metrics in this process, not the command")  # fmt: skip
    parser.add_argument("--device", default="cpu", help="with --in-process: cpu or cuda")
    args = parser.parse_args(argv)
    if faiss is None:
        print("faiss is not installed: nothing to compare with")
        return 1
    if args.device != "cpu" and not args.in_process:
        parser.error("--device goes with --in-process (the command runs where its files are)")
    if args.n:
        sizes = {f"{args.n} x {args.dim}": (args.n, args.dim, args.classes, None)}
    else:
        sizes = SIZES if args.size == "all" else {args.size: SIZES[args.size]}
    import torch  # the thread count the command will use too

    what = "compute_metrics" if args.in_process else "harness evaluate (whole command)"
    print(f"{what} on {args.device} against faiss IndexFlatL2 on the CPU,"
          f" {torch.get_num_threads()} threads, {args.repeats} repeats, medians")  # fmt: skip
    for name, (n, dim, classes, per_class) in sizes.items():
        x, y = embeddings(n, dim, classes, per_class=per_class, noise=args.noise)
        got = measure(x, y, args)
        memory = f", peak {got['peak_gb']:.2f} GB" if not args.in_process else ""
        print(f"  {name:>7}: {n} x {dim}, {len(np.unique(y))} classes, recall@1"
              f" {_recall_at_1(x, y):.3f}; faiss (k = {got['k']}) {got['faiss']:.2f} s, ours"
              f" {got['ours']:.2f} s: {got['ratio']:.2f}x{memory}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
