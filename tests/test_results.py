import json
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.leaderboard import render, write_leaderboard
from harness.results import RESULT_SCHEMA, load_results, write_json_atomic


def run(method: str, seed: int, recall: float, status: str = "ok", hash_: str = "h1", **extra):
    record = {
        "schema": RESULT_SCHEMA,
        "status": status,
        "failure": None if status == "ok" else "loss became nan at step 3",
        "protocol": {"name": "p", "version": 1, "hash": hash_},
        "method": {"name": method, "version": 1, "hyperparameters": {}},
        "seed": seed,
        "training": {"max_steps": None},
        "environment": {"git_commit": "abc", "hardware": {"device": "cpu"}},
        "finished_at": "2026-11-22T00:00:00+00:00",
    }
    if status == "ok":
        record["metrics"] = {"recall@1": recall, "map@r": recall / 2}
        record["timings"] = {"images_per_second": 100.0, "seconds_per_epoch": 2.0}
    record.update(extra)
    return record


def test_atomic_write_never_leaves_half_a_file(tmp_path: Path):
    path = tmp_path / "r" / "seed0.json"
    write_json_atomic(path, {"a": 1})

    class Boom:
        pass

    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": Boom()})  # fails half-way through serialising
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in path.parent.iterdir()] == ["seed0.json"]


def test_leaderboard_mean_std_over_seeds_and_failures_shown():
    text = render(
        [run("a", 0, 0.5), run("a", 1, 0.7), run("b", 0, 0.9), run("c", 0, 0, status="failed")]
    )
    lines = {
        line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")
    }
    # mean 60.0, sample std of (50, 70) = 14.1
    assert "60.0 ± 14.1" in lines["a"] and "| 2 " in lines["a"]
    assert "90.0" in lines["b"]
    assert "failed (loss became nan at step 3)" in lines["c"] and "| 0 " in lines["c"]
    order = [k for k in lines if k in ("a", "b", "c")]
    assert order == ["b", "a", "c"]  # best recall@1 first, failures last


def test_protocol_versions_and_short_budgets_get_separate_tables():
    text = render([run("a", 0, 0.5), run("a", 0, 0.9, hash_="h2"),
                   run("a", 1, 0.1, training={"max_steps": 5})])  # fmt: skip
    assert text.count("## p ") == 3
    assert "shortened to 5 steps, not comparable" in text


def test_leaderboard_errors(tmp_path: Path):
    with pytest.raises(HarnessError, match="no run results"):
        write_leaderboard(tmp_path)
    bad = tmp_path / "runs" / "p" / "a" / "seed0.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"schema": 1, "status": ')
    with pytest.raises(HarnessError, match="unreadable result file .*seed0.json"):
        load_results(tmp_path)
