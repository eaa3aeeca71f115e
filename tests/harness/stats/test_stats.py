"""Intervals and tests against hand-worked values (harness/stats.py, harness/verdicts.py)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.core import load_protocol
from harness.records.results import RESULT_SCHEMA
from harness.report import against_best, render
from harness.stats import benjamini_hochberg, bootstrap_intervals, compare, t_interval


def test_t_interval_by_hand():
    # (50, 70): mean 60, s = 14.142, se = 10, t_{0.975, 1} = 12.7062
    mean, half = t_interval([0.5, 0.7])
    assert mean == pytest.approx(0.6) and half == pytest.approx(1.270620, rel=1e-5)
    # (1, 2, 3): s = 1, se = 0.57735, t_{0.975, 2} = 4.302653
    assert t_interval([1, 2, 3])[1] == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert math.isnan(t_interval([0.3])[1]) and t_interval([0.3])[0] == 0.3


def test_paired_t_by_hand():
    # differences (0.05, 0.10, 0.05): mean 0.0667, s = 0.028868, se = 0.016667, t = 4.0 on
    # 2 degrees of freedom: two-sided p = 0.05719; half-width 4.302653 * 0.016667 = 0.071711
    a, b = {0: 0.50, 1: 0.60, 2: 0.70}, {0: 0.45, 1: 0.50, 2: 0.65}
    c = compare(a, b)
    assert c.test == "paired t" and c.n == 3
    assert c.difference == pytest.approx(0.066667, rel=1e-4)
    assert c.p == pytest.approx(0.057191, rel=1e-4)
    assert c.half_width == pytest.approx(0.071711, rel=1e-4)


def test_unpaired_and_untestable():
    c = compare({0: 0.5, 1: 0.6}, {5: 0.4, 6: 0.45})  # no shared seed: Welch
    assert c.test == "Welch t" and 0 < c.p < 1
    assert compare({0: 0.5}, {0: 0.4}).test == "none"
    assert math.isnan(compare({0: 0.5}, {0: 0.4}).p)


def test_benjamini_hochberg_by_hand():
    # sorted p_(i) = 0.01, 0.03, 0.04, 0.5 with m = 4: m / i * p_(i) = 0.04, 0.06, 0.0533, 0.5;
    # adjusted = the running minimum from the largest down: 0.04, 0.0533, 0.0533, 0.5
    adj = benjamini_hochberg({"a": 0.01, "b": 0.04, "c": 0.03, "e": 0.5, "d": math.nan})
    assert adj["a"] == pytest.approx(0.04) and adj["c"] == pytest.approx(0.16 / 3)
    assert adj["b"] == pytest.approx(0.16 / 3) and adj["e"] == pytest.approx(0.5)
    assert math.isnan(adj["d"])
    assert benjamini_hochberg({}) == {} and math.isnan(benjamini_hochberg({"x": math.nan})["x"])


def test_bootstrap_over_queries():
    assert bootstrap_intervals({"m": np.full(50, 0.7)})["m"] == pytest.approx([0.7, 0.7])
    rng = np.random.default_rng(1)
    hits = (rng.random(2000) < 0.3).astype(float)
    ((low, high),) = bootstrap_intervals({"r": hits}, seed=3).values()
    # normal approximation: mean ± 1.96 sqrt(p (1 - p) / n) = ± 0.0201
    assert low < hits.mean() < high
    assert (high - low) / 2 == pytest.approx(1.96 * math.sqrt(0.3 * 0.7 / 2000), rel=0.15)
    again = bootstrap_intervals({"r": hits}, seed=3)
    assert again == {"r": [low, high]}  # seeded: the same interval every time
    with pytest.raises(ValueError, match="one value per query"):
        bootstrap_intervals({"a": np.zeros(3), "b": np.zeros(4)})


def _result(method: str, seed: int, value: float, hash_: str = "h1") -> dict:
    return {
        "schema": RESULT_SCHEMA, "status": "ok", "failure": None,
        "protocol": {"name": "p", "version": 1, "hash": hash_, "content": {}},
        "method": {"name": method, "version": 1, "hyperparameters": {}}, "seed": seed,
        "training": {"max_steps": None},
        "environment": {"git_commit": "abc", "hardware": {"device": "cpu"}},
        "metrics": {"recall@1": value, "map@r": value},
        "bootstrap": {"intervals": {"map@r": [value - 0.02, value + 0.02]}},
        "finished_at": "2026-11-23T00:00:00+00:00",
    }  # fmt: skip


def test_leaderboard_marks_what_the_tests_cannot_tell_from_the_best():
    runs = [_result("best", s, v) for s, v in enumerate([0.60, 0.62, 0.61])]
    runs += [_result("close", s, v) for s, v in enumerate([0.61, 0.59, 0.60])]
    runs += [_result("far", s, v) for s, v in enumerate([0.40, 0.41, 0.405])]
    runs += [_result("single", 0, 0.5)]
    _, marks = against_best({"best": {0: 0.6, 1: 0.62, 2: 0.61},
                             "far": {0: 0.4, 1: 0.41, 2: 0.405}})  # fmt: skip
    assert marks["best"] == "best" and marks["far"].startswith("below (p = ")
    text = render(runs)
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "| best " in rows["best"]
    assert "≈ best (p = " in rows["close"]
    assert "below (p = " in rows["far"]
    assert "1 seed: untested" in rows["single"]
    assert "± 2.0" in rows["far"]  # the bootstrap half-width over test queries, in points
    assert "95 % Student t-interval" in text and "Benjamini-Hochberg" in text


def test_compare_prints_difference_interval_and_p(tmp_path: Path, capsys):
    smoke = load_protocol("smoke")
    for name, values in (("a", [0.50, 0.60, 0.70]), ("b", [0.45, 0.50, 0.65])):
        for seed, v in enumerate(values):
            path = tmp_path / "runs" / "smoke" / name / f"seed{seed}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(_result(name, seed, v, smoke.hash)))
    assert main(["compare", "a", "b", "--protocol", "smoke", "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "difference +6.67 points" in out and "p = 0.0572" in out
    assert "[-0.50, +13.84]" in out and "paired t test, n = 3" in out
    assert main(["compare", "a", "nope", "--protocol", "smoke",
                 "--results-dir", str(tmp_path)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no finished smoke run of 'nope'" in err


def test_compare_shows_ratios_as_is_names_unknown_metrics_and_capped_runs(tmp_path, capsys):
    """lda is a ratio (the leaderboard shows 4.25, not 425 points); a misspelt metric is
    named as such; runs capped by --max-steps are compared only when asked for, and the
    error says they exist."""
    smoke = load_protocol("smoke")
    for name, values in (("a", [4.0, 4.5, 4.25]), ("b", [3.0, 3.5, 3.25])):
        for seed, v in enumerate(values):
            record = _result(name, seed, v, smoke.hash)
            record["metrics"]["lda"] = v
            record["training"]["max_steps"] = 2
            path = tmp_path / "runs" / "smoke" / name / f"seed{seed}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record))
    args = ["compare", "a", "b", "--protocol", "smoke", "--results-dir", str(tmp_path)]
    assert main([*args, "--metric", "lda"]) == 2
    assert "runs capped by --max-steps 2 exist" in capsys.readouterr().err
    assert main([*args, "--metric", "lda", "--max-steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "a: 4.25 ± " in out and "difference +1.00, " in out and "points" not in out
    assert main([*args, "--metric", "map_r", "--max-steps", "2"]) == 2
    assert "unknown metric 'map_r' (did you mean 'map@r'?)" in capsys.readouterr().err


def _versioned(method: str, seed: int, value: float, version: int, hyper: dict, hash_="h1"):
    record = _result(method, seed, value, hash_)
    record["method"].update(version=version, hyperparameters=hyper)
    return record


def test_method_versions_and_hyperparameters_are_never_averaged(tmp_path: Path, capsys):
    """Seed 0 of `a` made by version 1, seeds 1 and 2 by version 2 (and `b` at two margins):
    each configuration is a row of its own in the leaderboard and in compare."""
    runs = [_versioned("a", 0, 0.90, 1, {}), _versioned("a", 1, 0.50, 2, {}),
            _versioned("a", 2, 0.60, 2, {})]  # fmt: skip
    runs += [_versioned("b", s, 0.3, 1, {"margin": 0.5}) for s in (0, 1)]
    runs += [_versioned("b", 2, 0.4, 1, {"margin": 1.0})]
    runs += [_versioned("c", s, 0.2, 3, {"margin": 1.0}) for s in (0, 1)]  # one config: as is
    rows = {line.split("|")[1].strip(): line for line in render(runs).splitlines()
            if line.startswith("| ")}  # fmt: skip
    assert "90.0" in rows["a@v1"] and "| 1 " in rows["a@v1"]
    assert "55.0 ± " in rows["a@v2"] and "| 2 " in rows["a@v2"]
    b_rows = sorted(n for n in rows if n.startswith("b@v1:"))
    assert len(b_rows) == 2 and "a" not in rows and "b" not in rows and "c" in rows
    smoke = load_protocol("smoke")
    for record in runs[:3]:
        record["protocol"]["hash"] = smoke.hash
        path = tmp_path / "runs" / "smoke" / "a" / f"seed{record['seed']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))
    args = ["compare", "--protocol", "smoke", "--results-dir", str(tmp_path)]
    assert main([*args, "a", "a@v2"]) == 2
    assert "never averaged: compare one of a@v1, a@v2" in capsys.readouterr().err
    assert main([*args, "a@v2", "a@v1"]) == 0
    out = capsys.readouterr().out
    assert "a@v2: 55.00" in out and "(2 seeds: 1, 2)" in out and "a@v1: 90.00" in out


def test_compare_hints_run_as_printed_with_the_suggestion_and_the_plugins(tmp_path, capsys):
    """A misspelt method's hint names the suggestion, not the misspelling, in a command that
    runs as printed: compare it when it has runs, else run it (with the --plugin files)."""
    from tests.harness.test_plugins import plugin_file

    smoke = load_protocol("smoke")
    for seed, v in enumerate([0.5, 0.6, 0.7]):
        path = tmp_path / "runs" / "smoke" / "contrastive" / f"seed{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_result("contrastive", seed, v, smoke.hash)))
    args = ["--protocol", "smoke", "--results-dir", str(tmp_path)]
    assert main(["compare", "contrastve", "triplet", *args]) == 2
    err = capsys.readouterr().err
    assert (
        "(did you mean 'contrastive'?); compare it: `python -m harness compare contrastive "
        f"triplet --protocol smoke --results-dir {tmp_path}`"
    ) in err
    assert main(["compare", "contrastive", "triplett", *args]) == 2
    err = capsys.readouterr().err
    assert (
        "(did you mean 'triplet'?); run `python -m harness run --protocol smoke --method "
        "triplet` first"
    ) in err
    plugin = plugin_file(tmp_path, "cosine_margin")
    assert main(["compare", "cosine_margin", "contrastive", *args, "--plugin", str(plugin)]) == 2
    err = capsys.readouterr().err
    assert (
        f"run `python -m harness run --protocol smoke --method cosine_margin --plugin {plugin}` "
        "first"
    ) in err
    assert err.count("\n") == 1
