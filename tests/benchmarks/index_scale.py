"""How the vector index kinds behind `harness index` scale: build time, memory, query time and
recall@10 against the exact (flat) index, on synthetic clustered embeddings.

    python tests/benchmarks/index_scale.py --n 1000000 --dim 512            # docs/search-scale.md
    python tests/benchmarks/index_scale.py --n 100000 --dim 512 --threads 1
    python tests/benchmarks/index_scale.py --n 20000 --dim 128 --kinds flat,hnsw \\
        --hnsw hnsw:M=16 --ef-search 16,32,64

The catalogue: ``n / 100`` cluster centres (about 100 photos of each product), each vector a
centre plus Gaussian noise (``--noise`` times the centres' scale, 1.5 as in
bench_evaluation.py's "like a trained embedding's test split"), its i-th direction scaled so
that its variance goes as i ** -``--spectrum``, randomly rotated, L2-normalised, from a fixed
seed. Trained embeddings are not isotropic: the harness's 512-d ones (birds and cars, 5
methods each) hold 90 % of their variance in 121-192 principal directions and half in 7-35;
spectrum 1.0 gives about 210 and 19 (0, isotropic: about 400 and 120, the hard case for any
approximate index). The queries come from the same centres and are not in the catalogue. Each
kind is built from the same vectors under ids 0..n-1 (harness.deploy.build_index), then:

* build seconds: ``build_index`` (IVF-PQ's training included);
* file MB: the saved index (``VectorIndex.save``), which is what it takes in memory too;
  RSS MB: how much the process's resident memory grew over the build, with the build's peak
  (Linux only: the peak is reset through /proc/self/clear_refs);
* load seconds: ``load_index`` of that file, which `harness search` pays on every run;
* ms per query: one batch of all queries, divided by their number; single ms: the median of
  20 one-query searches (a user's one photo);
* recall@10: the share of each query's exact 10 nearest (flat) that the kind finds, averaged;
  same cluster@10: the share of the 10 it finds that come from the query's own cluster (the
  same product: a miss of recall@10 that stays in the cluster is a near-tie, not a wrong
  photo; flat shows what the exact answer gets); for hnsw and ivfpq again at each
  search-time setting of ``--ef-search`` / ``--nprobe``.

``--vectors FILE.npy`` measures your own embeddings instead (float32 [N, D], e.g. a run's
saved embeddings.npy): a fixed-seed sample of ``--n`` rows is the catalogue, ``--queries`` more
are the queries.

Nothing is asserted; the table is printed as Markdown with the machine and faiss version.
Memory: the vectors take n x dim x 4 bytes (2 GB at 1M x 512), each index about as much again
(IVF-PQ far less), one index at a time.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import faiss  # noqa: E402

from harness.deploy import IndexSpec, VectorIndex, build_index, load_index  # noqa: E402
from harness.deploy.vectors import SEARCH_PARAMETERS  # noqa: E402

K = 10


def catalogue(
    n: int, queries: int, dim: int, noise: float, spectrum: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``n + queries`` clustered, L2-normalised float32 vectors and their clusters, made a block
    at a time so that the float32 result is the only full-size array. With ``spectrum`` > 0 the
    i-th of ``dim`` directions (randomly rotated) carries variance ~ i ** -spectrum."""
    rng = np.random.default_rng(seed)
    clusters = max(1, n // 100)
    centres = rng.normal(size=(clusters, dim)).astype(np.float32)
    out = np.empty((n + queries, dim), np.float32)
    labels = rng.integers(0, clusters, n + queries)
    scale = ((np.arange(dim) + 1.0) ** (-spectrum / 2)).astype(np.float32)
    turn = np.random.default_rng(seed + 1).normal(size=(dim, dim))
    rotation = np.linalg.qr(turn)[0].astype(np.float32) if spectrum else None
    for start in range(0, n + queries, 65_536):
        block = out[start : start + 65_536]
        block[:] = centres[labels[start : start + 65_536]]
        block += noise * rng.standard_normal(block.shape, np.float32)
        if rotation is not None:
            block[:] = (block * scale) @ rotation
        block /= np.linalg.norm(block, axis=1, keepdims=True)
    return out, labels


def own_vectors(args: argparse.Namespace) -> tuple[np.ndarray, None]:
    """A user's embeddings (.npy, [N, D]) in a fixed-seed order, so that the last ``queries``
    rows, the held-out queries, are a sample of the whole."""
    vectors = np.load(args.vectors, mmap_mode="r")
    if vectors.ndim != 2 or len(vectors) <= args.queries:
        raise SystemExit(f"{args.vectors}: need [N, D] with N > --queries, got {vectors.shape}")
    rows = np.random.default_rng(0).permutation(len(vectors))[: args.n + args.queries]
    return np.ascontiguousarray(vectors[rows], dtype=np.float32), None


def rss_mb(field: str = "VmRSS") -> float:
    """The process's resident memory (VmRSS) or its peak since the last reset (VmHWM), in MB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def scorer(truth: np.ndarray, labels: np.ndarray | None, n: int):
    """How good a kind's answers are: recall@10 against flat's ``truth``, and (synthetic
    catalogues) the share of the 10 found that come from the query's own cluster."""

    def score(found: np.ndarray) -> dict:
        hits = [len(np.intersect1d(f[f >= 0], t)) for f, t in zip(found, truth, strict=True)]
        out = {"recall": float(np.mean(hits)) / truth.shape[1], "same": float("nan")}
        if labels is not None:
            mine = labels[n:][:, None]
            out["same"] = float(np.mean((found >= 0) & (labels[np.maximum(found, 0)] == mine)))
        return out

    return score


def query_times(index: VectorIndex, queries: np.ndarray) -> tuple[float, float, np.ndarray]:
    """(ms per query in one batch, median ms of 20 single-query searches, the batch's ids)."""
    start = time.perf_counter()
    _, found = index.search(queries, K)
    batch = (time.perf_counter() - start) * 1e3 / len(queries)
    single = []
    for row in range(min(20, len(queries))):
        start = time.perf_counter()
        index.search(queries[row : row + 1], K)
        single.append((time.perf_counter() - start) * 1e3)
    return batch, statistics.median(single), found


def measure(spec: IndexSpec, x: np.ndarray, queries: np.ndarray, folder: Path) -> dict:
    """Build, save, load and query one index; the loaded copy answers the queries."""
    ids = np.arange(len(x), dtype=np.int64)
    reset_peak()
    before = rss_mb()
    start = time.perf_counter()
    index = build_index(spec, x, ids)
    row = {"kind": spec.kind, "spec": str(spec), "build_s": time.perf_counter() - start}
    row.update(rss_mb=rss_mb() - before, peak_mb=rss_mb("VmHWM") - before)
    path = folder / f"{spec.kind}.faiss"
    index.save(path)
    row["file_mb"] = path.stat().st_size / 2**20
    del index
    start = time.perf_counter()
    index = load_index(path)
    row["load_s"] = time.perf_counter() - start
    path.unlink()
    row["batch_ms"], row["single_ms"], row["found"] = query_times(index, queries)
    row["index"] = index
    return row


def settings(index: VectorIndex, built: IndexSpec, queries: np.ndarray, score,
             values: list[int]) -> list[dict]:  # fmt: skip
    """The same index again at other search-time settings (ef_search, nprobe): no rebuild."""
    name = SEARCH_PARAMETERS.get(built.kind)
    rows = []
    for value in values if name else []:
        if value == getattr(built, name) or (name == "nprobe" and value > built.nlist):
            continue
        index.tune(dataclasses.replace(built, **{name: value}))
        batch, single, found = query_times(index, queries)
        rows.append({"spec": str(index.spec), "batch_ms": batch, "single_ms": single,
                     **score(found)})  # fmt: skip
    return rows


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = " / ".join(f"{v:.1f}" for v in os.getloadavg())
    return (
        f"{cpu}, {os.cpu_count()} cores ({platform.machine()}), load average {load}; "
        f"faiss {faiss.__version__} on {faiss.omp_get_max_threads()} thread(s), "
        f"numpy {np.__version__}, Python {platform.python_version()}"
    )


def table(rows: list[dict]) -> str:
    lines = [
        "| index | build s | file MB | RSS growth MB (peak) | load s | ms/query (batch) "
        "| ms (one query) | recall@10 | same cluster@10 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "build_s" in r:
            lines.append(
                f"| `{r['spec']}` | {r['build_s']:.1f} | {r['file_mb']:,.0f} | "
                f"{r['rss_mb']:,.0f} ({r['peak_mb']:,.0f}) | {r['load_s']:.2f} | "
                f"{r['batch_ms']:.3f} | {r['single_ms']:.2f} | {r['recall']:.3f} | "
                f"{r['same']:.3f} |"
            )
        else:  # a search-time setting of the index above
            lines.append(
                f"| `{r['spec']}` (same index) | | | | | {r['batch_ms']:.3f} | "
                f"{r['single_ms']:.2f} | {r['recall']:.3f} | {r['same']:.3f} |"
            )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> list[dict]:
    start = time.perf_counter()
    if args.vectors:
        data, labels = own_vectors(args)
    else:
        data, labels = catalogue(args.n, args.queries, args.dim, args.noise, args.spectrum)
    n = len(data) - args.queries
    x, queries = data[:n], data[n:]
    print(f"vectors: {n:,} x {x.shape[1]} + {len(queries):,} queries in "
          f"{time.perf_counter() - start:.1f} s", flush=True)  # fmt: skip
    specs = {"flat": IndexSpec(), "hnsw": IndexSpec.parse(args.hnsw),
             "ivfpq": IndexSpec.parse(args.ivfpq)}  # fmt: skip
    more = {"hnsw": args.ef_search, "ivfpq": args.nprobe}
    rows, score = [], None
    with tempfile.TemporaryDirectory(dir=args.tmp) as folder:
        for kind in ["flat", *[k for k in args.kinds.split(",") if k != "flat"]]:
            row = measure(specs[kind], x, queries, Path(folder))
            index, found = row.pop("index"), row.pop("found")
            score = score or scorer(found, labels, n)  # flat comes first: the truth
            row.update(score(found))
            values = [int(v) for v in more.get(kind, "").split(",") if v]
            extra = settings(index, specs[kind], queries, score, values)
            del index
            rows += [row, *extra]
            print("\n".join(table([row, *extra]).splitlines()[2:]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="catalogue size")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--queries", type=int, default=1_000)
    parser.add_argument("--noise", type=float, default=1.5, help="noise scale / centre scale")
    parser.add_argument(
        "--spectrum", type=float, default=1.0, help="direction i's variance ~ i ** -SPECTRUM"
    )
    parser.add_argument(
        "--vectors", help="your own embeddings (.npy [N, D]) instead; --n caps them"
    )
    parser.add_argument("--kinds", default="flat,hnsw,ivfpq")
    parser.add_argument("--hnsw", default="hnsw", help="the HNSW spec (default: its defaults)")
    parser.add_argument("--ivfpq", default="ivfpq", help="the IVF-PQ spec")
    parser.add_argument("--ef-search", default="16,32,128,256", help="more HNSW settings")
    parser.add_argument("--nprobe", default="4,8,32,64", help="more IVF-PQ settings")
    parser.add_argument("--threads", type=int, default=None, help="faiss threads (its default)")
    parser.add_argument("--tmp", default=None, help="where the index files go while measured")
    args = parser.parse_args(argv)
    if args.threads:
        faiss.omp_set_num_threads(args.threads)
    print("command: python " + " ".join(shlex.quote(a) for a in sys.argv), flush=True)
    print("machine: " + machine(), flush=True)
    rows = run(args)
    print("\n" + table(rows))
    print("\nmachine at the end: " + machine())


if __name__ == "__main__":
    main()
