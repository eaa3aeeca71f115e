"""Re-ranked metrics of a run's saved test embeddings (`harness rerank`): for each run saved with
`run --save-embeddings`, the retrieval metrics without re-ranking and with each re-ranking
(harness.evaluate.reranking: k-reciprocal, αQE with DBA, at their papers' parameters), one
small JSON record per run: the numbers, the re-rankings' seconds, the saved embeddings'
sha256 and where they came from (<out>/<protocol>/<method>/reranked-seed<k>.json). Without
re-ranking the metrics are computed again from the embeddings and must equal those the run
recorded, up to float rounding (`matches_run`). harness.report.reranked makes the table.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

import harness
from harness.core import HarnessError
from harness.evaluate.metrics import compute_metrics
from harness.evaluate.reranking import parse_rerank, reranked_metrics
from harness.evaluate.saved import file_sha256, load_embeddings
from harness.records import environment, read_result, write_json_atomic

DEFAULT_RERANKS = ("k_reciprocal", "aqe_dba")
METRICS = ("map@r", "recall@1")
PLAIN = "none"  # the ranking without re-ranking


def metrics_match(plain: dict[str, float], recorded: dict[str, Any]) -> bool:
    """Whether the recomputed plain metrics are the run's, up to float rounding.

    Recomputed from the saved float32 embeddings, a sum over the queries can land one unit in
    the last place away from the run's own (seen once in 90 runs); anything larger means the
    embeddings are not the run's."""
    return all(
        isinstance(recorded.get(m), (int, float))
        and math.isclose(plain[m], recorded[m], rel_tol=1e-9, abs_tol=1e-12)
        for m in METRICS
    )


def score_run(result: Path, reranks: list[str]) -> dict[str, Any]:
    """One run's record: its metrics without and with each re-ranking."""
    record = read_result(result)
    folder = result.with_suffix(".embeddings")
    if not record.ok or not folder.is_dir():
        raise HarnessError(f"{result} has no saved embeddings; run it with --save-embeddings")
    saved = load_embeddings(folder)
    if saved.is_query is not None or saved.learned_scorer:
        raise HarnessError(f"{result}: re-ranking tables take all-vs-all Euclidean runs only")
    emb, labels = saved.embeddings, saved.labels
    plain = compute_metrics(emb, labels, recall_ks=[1], metrics=list(METRICS))
    metrics, seconds = {PLAIN: plain}, {}
    for text in reranks:
        spec = parse_rerank(text)
        metrics[spec.text], seconds[spec.text] = reranked_metrics(
            emb, labels, rerank=spec, recall_ks=[1], metrics=list(METRICS)
        )
    matches = metrics_match(plain, record.metrics or {})
    return {
        "protocol": {"name": record.protocol.name, "version": record.protocol.version,
                     "hash": record.protocol.hash},
        "method": record.method.name, "seed": record.seed, "rows": len(labels),
        "trained": bool(record.training.steps), "run_sha256": file_sha256(result),
        "embeddings_sha256": file_sha256(folder / "embeddings.npy"),
        "matches_run": matches, "metrics": metrics,
        "rerank_seconds": {k: round(v, 3) for k, v in seconds.items()},
        "harness_version": harness.__version__, "environment": environment(torch.device("cpu")),
    }  # fmt: skip


def write_records(results_dir: Path, out: Path, protocols: list[str], reranks: list[str],
                  progress: bool = True) -> list[Path]:  # fmt: skip
    """Score every run with saved embeddings of `protocols` under results_dir/runs; one record
    each at out/<protocol>/<method>/reranked-seed<k>.json. A record of the same embeddings and
    re-rankings is kept as it is (the command resumes)."""
    written = []
    runs = sorted(p for name in protocols
                  for p in (results_dir / "runs" / name).glob("*/seed*.json"))  # fmt: skip
    if not runs:
        raise HarnessError(f"no runs of {', '.join(protocols)} under {results_dir / 'runs'}; "
                           "run them with --save-embeddings first")  # fmt: skip
    from tqdm import tqdm

    for result in tqdm(runs, desc="re-ranking", unit="run", disable=not progress):
        target = out / result.parent.parent.name / result.parent.name / f"reranked-{result.name}"
        if _current(target, result, reranks):
            continue
        write_json_atomic(target, score_run(result, reranks))
        written.append(target)
    return written


def _current(target: Path, result: Path, reranks: list[str]) -> bool:
    if not target.is_file():
        return False
    old = json.loads(target.read_text())
    folder = result.with_suffix(".embeddings")
    names = {PLAIN, *(parse_rerank(t).text for t in reranks)}
    return (set(old["metrics"]) == names
            and old["embeddings_sha256"] == file_sha256(folder / "embeddings.npy"))  # fmt: skip
