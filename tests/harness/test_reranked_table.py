"""The re-ranking table (`harness rerank`, harness.report.reranked): its cells against values
worked by hand, and the committed table against its committed records."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.evaluate.reranked import METRICS, metrics_match
from harness.report.reranked import TABLE, protocol_table, read_records, write_table

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "results" / "reference" / "reranking"
KR = "k_reciprocal:k1=20,k2=6,lambda=0.3"


def record(method: str, seed: int, plain: float, reranked: float, trained: bool = True) -> dict:
    return {"protocol": {"name": "p", "version": 1, "hash": "h"}, "method": method,
            "seed": seed, "rows": 100, "trained": trained,
            "metrics": {"none": {"map@r": plain, "recall@1": 0.5},
                        KR: {"map@r": reranked, "recall@1": 0.5}},
            "rerank_seconds": {KR: 2.0 + seed}}  # fmt: skip


def test_the_cells_are_means_with_t_intervals_and_paired_changes():
    records = [record("zero", s, 0.30, 0.35, trained=False) for s in range(3)]
    records += [record("a", s, v, v + d) for s, (v, d) in enumerate([(0.40, 0.01), (0.42, 0.02),
                                                                     (0.44, 0.06)])]  # fmt: skip
    records += [record("b", s, v, v + 0.08) for s, v in enumerate([0.41, 0.41, 0.41])]
    lines = protocol_table(records)
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in lines[2:5]}
    assert list(rows) == ["zero (zero-shot)", "a", "b"]  # zero-shot first, then by plain MAP@R
    # a: mean 42.00, sd 2.00 over 3 seeds, t(0.975, 2) = 4.3027: half 4.3027 * 2 / sqrt(3) = 4.97
    assert rows["a"][2] == "42.00 ± 4.97"
    # its changes +1, +2, +6: mean +3, paired t = 3 / (2.6458 / sqrt 3) = 1.964, p = 0.188
    assert rows["a"][4] == "+3.00 (p 0.19)"
    assert rows["b"][2] == "41.00" and rows["b"][4] == "+8.00"  # no spread: no interval, no test
    assert rows["zero (zero-shot)"][2] == "30.00"
    assert "none: **a**; k_reciprocal: **b**" in lines[6]
    # the new best against the old one under k-reciprocal: b - a = 49 - 45 = +4.00 on average
    assert lines[7].startswith("Under k_reciprocal, b − a: +4.00 ± ")
    assert lines[-1].startswith("Cost per run (100 test photos") and "3.0 s" in lines[-1]


@pytest.mark.skipif(not (COMMITTED / TABLE).is_file(), reason="no committed re-ranking table")
def test_the_committed_table_is_made_from_its_records(tmp_path):
    out = tmp_path / "reranking"
    shutil.copytree(COMMITTED, out)
    (out / TABLE).unlink()
    names = []
    for line in (COMMITTED / TABLE).read_text().splitlines():
        if line.startswith("## "):
            names.append(line.split()[1])
    write_table(out, names)
    assert (out / TABLE).read_text() == (COMMITTED / TABLE).read_text()
    records = read_records(COMMITTED)
    assert records and all(r["matches_run"] for r in records)  # `none` is the leaderboard's
    assert {r["protocol"]["name"] for r in records} == {"birds", "cars", "groceries"}


def test_the_plain_metrics_match_the_run_up_to_float_rounding_only():
    recorded = {m: 0.13154647870755745 for m in METRICS}
    one_ulp = {m: 0.1315464787075574 for m in METRICS}  # a sum landing one unit lower
    assert metrics_match(one_ulp, recorded)
    assert not metrics_match({**one_ulp, "map@r": 0.1315465}, recorded)  # other embeddings
    assert not metrics_match(one_ulp, {m: v for m, v in recorded.items() if m != "map@r"})
