"""NMI, F1 and k-means inertia under the two k-means conventions on the same embeddings.

Synthetic classes: ``--classes`` centres drawn from N(0, I) in ``--dim`` dimensions, each with
``--per-class`` points at Gaussian noise ``--noise`` (several levels: the harness convention's
lead grows while the clusters still overlap, then shrinks when they are hopelessly mixed).
Every number is deterministic for the seeds given.

    PYTHONPATH=. python tests/benchmarks/compare_kmeans_conventions.py   # 2400 x 64, 150 classes
    PYTHONPATH=. python tests/benchmarks/compare_kmeans_conventions.py --noise 1.0 --seeds 0,1
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from harness.evaluate.metrics.clustering import f1_pairwise, kmeans, nmi


def inertia(x: np.ndarray, ids: np.ndarray) -> float:
    """Sum of squared distances to the cluster means (float64)."""
    x = x.astype(np.float64)
    return float(sum(((x[ids == c] - x[ids == c].mean(0)) ** 2).sum() for c in np.unique(ids)))


def embeddings(classes: int, per_class: int, dim: int, noise: float, seed: int):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(classes), per_class)
    centres = rng.normal(size=(classes, dim))
    x = centres[labels] + rng.normal(scale=noise, size=(len(labels), dim))
    return x.astype(np.float32), labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=150)
    parser.add_argument("--per-class", type=int, default=16)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--noise", type=lambda s: [float(v) for v in s.split(",")],
                        default=[0.5, 1.0, 1.5, 2.0])  # fmt: skip
    parser.add_argument("--seeds", type=lambda s: [int(v) for v in s.split(",")], default=[0, 1, 2])
    args = parser.parse_args()
    print("noise seed | NMI harness  faiss  diff | F1 harness  faiss | inertia harness  faiss | s")
    for noise in args.noise:
        diffs = []
        for seed in args.seeds:
            x, labels = embeddings(args.classes, args.per_class, args.dim, noise, seed)
            row, start = {}, time.perf_counter()
            for convention in ("harness", "faiss"):
                ids = kmeans(x, args.classes, seed, convention=convention)
                row[convention] = (nmi(ids, labels), f1_pairwise(ids, labels), inertia(x, ids))
            (nh, fh, ih), (nf, ff, i_f) = row["harness"], row["faiss"]
            diffs.append(nh - nf)
            print(f"{noise:5.2f} {seed:4d} | {nh:.4f} {nf:.4f} {nh - nf:+.4f} | {fh:.4f} {ff:.4f}"
                  f" | {ih:10.1f} {i_f:10.1f} | {time.perf_counter() - start:.2f}")  # fmt: skip
        print(f"noise {noise}: mean NMI difference (harness - faiss) {np.mean(diffs):+.4f}")


if __name__ == "__main__":
    main()
