"""Does re-ranking change which method is best? (`harness rerank`)

For each run with saved test embeddings (`run --save-embeddings`), the retrieval metrics
without re-ranking and with each re-ranking (harness.evaluate.reranking: k-reciprocal, αQE
with DBA, at their papers' parameters), one small JSON record per run: the numbers, the
re-rankings' seconds, the saved embeddings' sha256 and where they came from
(<out>/<protocol>/<method>/reranked-seed<k>.json). Without
re-ranking the metrics are computed again from the embeddings and must equal those the run
recorded, up to float rounding (`matches_run`): the table's plain column is the leaderboard's.

The table is generated from the records (RERANKING.md beside them), never edited by hand:
per protocol, each method's MAP@R and recall@1 as mean ± 95 % t-interval over seeds, each
re-ranking's paired change against the plain ranking (mean over seeds, with the paired
t-test's p), the best method under each ranking, and the cost.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import torch

import harness
from harness.core import HarnessError, compare, t_interval
from harness.evaluate import compute_metrics, file_sha256, load_embeddings
from harness.evaluate.reranking import parse_rerank, reranked_metrics
from harness.records import environment, read_result, write_json_atomic, write_text_atomic

DEFAULT_RERANKS = ("k_reciprocal", "aqe_dba")
METRICS = ("map@r", "recall@1")
PLAIN = "none"
TABLE = "RERANKING.md"


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


def read_records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("*/*/reranked-seed*.json"))]


def _cell(values: list[float]) -> str:
    mean = statistics.fmean(values)
    if len(values) < 2 or len(set(values)) == 1:
        return f"{100 * mean:.2f}"
    _, half = t_interval(values)
    return f"{100 * mean:.2f} ± {100 * half:.2f}"


def _change(plain: list[float], other: list[float]) -> str:
    diff = [100 * (b - a) for a, b in zip(plain, other, strict=True)]
    mean = statistics.fmean(diff)
    if len(diff) < 2 or len(set(diff)) == 1:
        return f"{mean:+.2f}"
    result = compare(dict(enumerate(other)), dict(enumerate(plain)))
    return f"{mean:+.2f} (p {result.p:.2g})"


def protocol_table(records: list[dict[str, Any]]) -> list[str]:
    """One protocol's rows: methods (the zero-shot row first, then by plain MAP@R)."""
    by_method: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(records, key=lambda r: r["seed"]):
        by_method.setdefault(r["method"], []).append(r)
    untrained = sorted({r["method"] for r in records if not r["trained"]})
    zero_shot = untrained[0] if len(untrained) == 1 else None
    rankings = list(records[0]["metrics"])
    others = [k for k in rankings if k != PLAIN]

    def values(method: str, ranking: str, metric: str) -> list[float]:
        return [r["metrics"][ranking][metric] for r in by_method[method]]

    order = sorted(by_method, key=lambda m: (m != zero_shot, -np.mean(values(m, PLAIN, "map@r"))))
    head = ["method", "seeds"] + [f"MAP@R {k.split(':')[0]}" for k in rankings]
    head += [f"Δ MAP@R {k.split(':')[0]}" for k in others]
    head += [f"R@1 {k.split(':')[0]}" for k in rankings]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in order:
        name = f"{m} (zero-shot)" if m == zero_shot else m
        cells = [name, str(len(by_method[m]))]
        cells += [_cell(values(m, k, "map@r")) for k in rankings]
        cells += [_change(values(m, PLAIN, "map@r"), values(m, k, "map@r")) for k in others]
        cells += [_cell(values(m, k, "recall@1")) for k in rankings]
        lines.append("| " + " | ".join(cells) + " |")
    best = {k: max((m for m in by_method if m != zero_shot),
                   key=lambda m, k=k: np.mean(values(m, k, "map@r"))) for k in rankings}  # fmt: skip
    lines += ["", "Best trained method by mean MAP@R: " + "; ".join(
        f"{k.split(':')[0]}: **{m}**" for k, m in best.items()) + "."]  # fmt: skip
    for k in others:  # a new best: is it apart from the old one under the re-ranking?
        if best[k] != best[PLAIN]:
            c = compare(dict(enumerate(values(best[k], k, "map@r"))),
                        dict(enumerate(values(best[PLAIN], k, "map@r"))))  # fmt: skip
            lines.append(f"Under {k.split(':')[0]}, {best[k]} − {best[PLAIN]}: "
                         f"{100 * c.difference:+.2f} ± {100 * c.half_width:.2f} MAP@R "
                         f"(paired t, p {c.p:.2g}).")  # fmt: skip
    cost = [f"{k}: {statistics.fmean(r['rerank_seconds'][k] for r in records):.1f} s"
            for k in others]  # fmt: skip
    lines += ["", f"Cost per run ({records[0]['rows']} test photos, all-vs-all, on the CPU): "
              + "; ".join(cost) + "; each on top of the plain ranking."]  # fmt: skip
    return lines


def write_table(out: Path, protocols: list[str] | None = None) -> Path:
    """RERANKING.md in `out`, from the records there (every protocol, or those named)."""
    records = read_records(out)
    if not records:
        raise HarnessError(f"no re-ranking records under {out}; make them with `rerank`")
    names = protocols or sorted({r["protocol"]["name"] for r in records})
    rankings = [k for k in records[0]["metrics"] if k != PLAIN]
    commits = sorted({r["environment"]["git_commit"][:10] for r in records})
    lines = [
        "# Does re-ranking change which method is best?", "",
        "Generated by `python -m harness rerank` from the records beside this file (one per "
        "run); do not edit. Each run's saved test embeddings ranked all-vs-all by Euclidean "
        "distance (`none`, the leaderboard's numbers: every record checks that they match "
        "its run) and by each re-ranking at its paper's parameters: "
        + ", ".join(f"`{k}`" for k in rankings) + " ([how](../../docs/reranking.md)). "
        "MAP@R and recall@1 in %, mean ± 95 % t-interval over seeds; Δ: the paired change "
        "against `none` over the seeds, with the paired t-test's p. Both re-rankings are "
        "transductive: a query's new distances use the neighbourhoods of the whole test set "
        "(the gallery a search has at hand), never its labels.", "",
        f"{len(records)} runs; made at commit{'s' if len(commits) > 1 else ''} "
        f"{', '.join(commits)}.",
    ]  # fmt: skip
    for name in names:
        mine = [r for r in records if r["protocol"]["name"] == name]
        if not mine:
            raise HarnessError(f"no re-ranking records of protocol {name} under {out}")
        p = mine[0]["protocol"]
        lines += ["", f"## {name} (v{p['version']}, hash {p['hash']})", ""]
        lines += protocol_table(mine)
    path = out / TABLE
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path
