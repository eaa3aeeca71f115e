"""The cost files are never lost silently: `cost` merges a comparable earlier record (same
protocol hash, settings and machine) and archives any other, `cost --devices` and `cost
--pipeline` archive the record they replace; `cost --pipeline` logs its progress."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import harness.methods  # noqa: F401
import pytest

from harness.cli import main
from harness.cli.cost import cmd_cost
from harness.cli.program import build_parser
from harness.cost import read_cost
from harness.report import cost_section


def _cost(results: Path, names: str, *extra: str) -> int:
    """`cost` on the smoke protocol at m = 8 and 16, one repeat, two throughput steps."""
    return cmd_cost(build_parser().parse_args(["cost",
        "--protocol", "smoke", "--methods", names, "--batch-sizes", "8,16", "--repeats", "1",
        "--steps", "2", "--device", "cpu", "--results-dir", str(results), "--json", *extra,
    ]))  # fmt: skip


def _methods(path: Path) -> list[str]:
    return [e["method"] for e in read_cost(path)["methods"]]


def test_a_comparable_record_is_merged_method_by_method(tmp_path: Path, capsys, caplog):
    caplog.set_level(logging.INFO, logger="harness")
    path = tmp_path / "cost" / "smoke.json"
    assert _cost(tmp_path, "contrastive,triplet") == 0
    first = read_cost(path)
    assert _cost(tmp_path, "multi_similarity", "--no-overhead") == 0
    merged = read_cost(path)
    assert _methods(path) == ["contrastive", "triplet", "multi_similarity"]
    assert merged["methods"][:2] == first["methods"]  # kept as measured, with their time
    assert merged["methods"][2]["measured"]["created_at"] == merged["created_at"]
    assert first["methods"][0]["measured"]["created_at"] == first["created_at"]
    assert merged["overhead"] == first["overhead"]  # not measured now: the earlier one stays
    assert "kept from earlier (contrastive, triplet)" in caplog.text
    assert not (tmp_path / "archive").exists()

    capsys.readouterr()
    assert _cost(tmp_path, "triplet", "--no-overhead") == 0  # replaced in place
    printed = json.loads(capsys.readouterr().out)
    assert [e["method"] for e in printed] == ["triplet"]  # --json: the rows measured now
    again = read_cost(path)
    assert _methods(path) == ["contrastive", "triplet", "multi_similarity"]
    assert again["methods"][0] == first["methods"][0]
    assert again["methods"][1]["measured"]["created_at"] == again["created_at"]
    # three runs, three stamps, even when the runs take less than a second (to the microsecond)
    assert len({first["created_at"], merged["created_at"], again["created_at"]}) == 3
    section = cost_section(tmp_path)
    for name in ("contrastive", "triplet", "multi_similarity"):
        assert f"| {name} " in section
    assert "runs of the command" in section and "`measured`" in section


def test_a_record_measured_otherwise_is_archived(tmp_path: Path, caplog):
    caplog.set_level(logging.INFO, logger="harness")
    path = tmp_path / "cost" / "smoke.json"
    assert _cost(tmp_path, "contrastive", "--no-overhead") == 0
    before = path.read_text()
    assert _cost(tmp_path, "triplet", "--no-overhead", "--batch-sizes", "8,16,32") == 0
    assert _methods(path) == ["triplet"]
    archived = list((tmp_path / "archive" / "cost").glob("smoke-*.json"))
    assert len(archived) == 1 and archived[0].read_text() == before
    assert f"archived the previous {path} to {archived[0]}" in caplog.text
    assert "settings differ: batch_sizes" in caplog.text
    assert "## Cost: smoke" in cost_section(tmp_path)  # the archive is not a cost file


def test_what_makes_two_cost_records_incomparable():
    from harness.cost import incomparable

    base = {"protocol": {"hash": "a"}, "settings": {"batch_sizes": [8, 16], "repeats": 1},
            "environment": {"hardware": {"machine_id": "m", "device": "cpu"},
                            "fingerprint": {"id": "f"}}}  # fmt: skip
    assert incomparable(base, copy.deepcopy(base)) == ""
    for where, key, value, says in [
        ("protocol", "hash", "b", "protocol hash"),
        ("settings", "repeats", 3, "settings differ: repeats"),
        ("hardware", "machine_id", "other", "other hardware: machine_id"),
        ("hardware", "device", "cuda", "other hardware: device"),
        ("fingerprint", "id", "g", "other hardware: fingerprint"),
    ]:
        other = copy.deepcopy(base)
        part = other["environment"] if where in ("hardware", "fingerprint") else other
        part[where][key] = value
        assert says in incomparable(base, other)


def test_an_unreadable_cost_file_is_archived_not_overwritten(tmp_path: Path):
    path = tmp_path / "cost" / "smoke.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert _cost(tmp_path, "contrastive", "--no-overhead") == 0
    assert _methods(path) == ["contrastive"]
    [archived] = (tmp_path / "archive" / "cost").glob("smoke-*.json")
    assert archived.read_text() == "{not json"


@pytest.mark.parametrize("kind", ["devices", "pipeline"])
def test_devices_and_pipeline_records_are_archived_before_replacing(
    kind: str, tmp_path: Path, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="harness")
    made = iter(range(1, 10))

    def fake(*args, **kwargs):
        return {"kind": f"cost_{kind}", "n": next(made), "rows": [], "pipeline": []}

    if kind == "devices":
        monkeypatch.setattr("harness.cli.cost.measure_devices", fake)
        argv = ["--devices", "1", "--methods", "contrastive"]
    else:
        monkeypatch.setattr("harness.cli.cost.measure_pipeline", fake)
        argv = ["--pipeline", "--workers", "0"]
    for _ in range(2):
        assert main(["cost", *argv, "--protocol", "smoke", "--results-dir", str(tmp_path),
                     "--json"]) == 0  # fmt: skip
    path = tmp_path / "cost" / kind / "smoke.json"
    assert json.loads(path.read_text())["n"] == 2
    [archived] = (tmp_path / "archive" / "cost" / kind).glob("smoke-*.json")
    assert json.loads(archived.read_text())["n"] == 1
    assert f"archived the previous {path} to {archived}" in caplog.text


def test_cost_pipeline_logs_each_round_of_each_worker_count(tmp_path: Path, caplog):
    caplog.set_level(logging.INFO, logger="harness")
    assert main(["cost", "--pipeline", "--protocol", "smoke", "--workers", "0", "--steps", "2",
                 "--results-dir", str(tmp_path), "--json"]) == 0  # fmt: skip
    rounds = [r.getMessage() for r in caplog.records if "pipeline: round" in r.getMessage()]
    assert len(rounds) == 5 and rounds[0].startswith("pipeline: round 1/5, 0 worker(s): ")
    assert "pipeline: data-wait share: 2 training steps" in caplog.text


def test_a_cost_file_locked_by_another_process_is_waited_for_and_never_lost(
    tmp_path: Path, monkeypatch, caplog
):
    """Merging and writing hold the cost file's lock, so two `cost` processes of one protocol
    take turns. A lock that outlasts the wait (a hung process) leaves the file alone and
    writes the new measurement beside it, saying where."""
    import harness.cost.records as report
    from harness.records import run_lock

    path = tmp_path / "cost" / "smoke.json"
    assert _cost(tmp_path, "contrastive") == 0
    before = path.read_text()
    monkeypatch.setattr(report, "LOCK_WAIT_SECONDS", 0.3)
    with run_lock(path) as held:  # another process's merge in progress
        assert held
        assert _cost(tmp_path, "triplet") == 0
    assert path.read_text() == before
    (beside,) = (tmp_path / "cost").glob("smoke.unmerged-*.json")
    assert [e["method"] for e in json.loads(beside.read_text())["methods"]] == ["triplet"]
    assert "stayed locked by another process" in caplog.text
    assert _cost(tmp_path, "triplet") == 0  # released: merged as usual
    assert _methods(path) == ["contrastive", "triplet"]
