"""The CI regression check: a planted regression fails it, the committed baselines pass."""

import json
from pathlib import Path

import pytest

from harness.check import DEFAULT_TOLERANCES, check, compare
from harness.cli import main
from harness.errors import HarnessError


def run(method: str, metrics: dict, version: int = 1, status: str = "ok") -> dict:
    return {"status": status, "failure": None, "method": {"name": method, "version": version},
            "metrics": metrics}  # fmt: skip


BASE = {
    "protocol_hash": "h",
    "tolerances": DEFAULT_TOLERANCES,
    "method_tolerances": {"loose": {"map@r": 0.2}},
    "methods": {"a": {"version": 1, "metrics": {"map@r": 0.50}},
                "loose": {"version": 1, "metrics": {"map@r": 0.50}}},
}  # fmt: skip


def statuses(runs: dict, baseline: dict = BASE, hash_: str = "h") -> dict:
    return {(r.method, r.metric): r.status for r in compare(baseline, hash_, runs)}


def test_compare_flags_drops_beyond_tolerance_only():
    tol = DEFAULT_TOLERANCES["map@r"]
    assert statuses({"a": run("a", {"map@r": 0.50 - tol / 2})})[("a", "map@r")] == "ok"
    assert statuses({"a": run("a", {"map@r": 0.50 - tol * 1.5})})[("a", "map@r")] == "REGRESSED"
    assert statuses({"a": run("a", {"map@r": 0.50 + tol * 1.5})})[("a", "map@r")] == "improved"
    assert statuses({"loose": run("loose", {"map@r": 0.35})})[("loose", "map@r")] == "ok"


def test_compare_fails_missing_changed_and_failed():
    assert statuses({"new": run("new", {"map@r": 0.5})})[("new", "*")] == "missing baseline"
    assert "version 1 -> 2" in statuses({"a": run("a", {"map@r": 0.5}, version=2)})[("a", "*")]
    assert "run failed" in statuses({"a": run("a", {}, status="failed")})[("a", "*")]
    assert (
        "protocol hash"
        in statuses({"a": run("a", {"map@r": 0.5})}, hash_="other")[("*", "protocol")]
    )


def test_planted_regression_fails_the_check_and_update_fixes_it(tmp_path: Path, capsys):
    args = [
        "-q",
        "check",
        "--protocol",
        "smoke",
        "--methods",
        "contrastive",
        "--baselines",
        str(tmp_path),
    ]
    with pytest.raises(HarnessError, match="no baseline file"):
        check("smoke", ["contrastive"], tmp_path)
    assert main([*args, "--update", "--reason", "test baselines"]) == 0
    path = tmp_path / "smoke.json"
    baseline = json.loads(path.read_text())
    assert baseline["reason"] == "test baselines" and baseline["commit"]
    assert main(args) == 0  # deterministic: the same numbers again
    baseline["methods"]["contrastive"]["metrics"]["map@r"] += 0.2  # plant a regression
    path.write_text(json.dumps(baseline))
    capsys.readouterr()
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "REGRESSED" in out and "check FAILED" in out


def test_committed_baselines_cover_every_method():
    import methods  # noqa: F401
    from harness.check import BASELINE_DIR
    from harness.method import METHODS
    from harness.protocol import load_protocol

    baseline = json.loads((BASELINE_DIR / "regression.json").read_text())
    assert set(baseline["methods"]) == set(METHODS.names())
    assert baseline["protocol_hash"] == load_protocol("regression").hash
