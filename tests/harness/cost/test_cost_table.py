"""The cost table's measurement discipline (issue 39): throughput in interleaved rounds with
the fastest kept, the consistency check that says when the machine disturbed it, the time
exponents fitted above the fixed per-call cost, and batch sizes skipped by an estimate
instead of crashing. Hand-made numbers throughout: no assertion reads a clock."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import harness.methods  # noqa: F401
import numpy as np
import pytest
import torch

import harness.cost.scaling as scaling
import harness.cost.throughput as throughput
from harness.cli import main
from harness.core import METHODS, MethodContext, load_protocol
from harness.cost import (
    consistency,
    cost_context,
    fit_time,
    fits,
    interleaved,
    round_order,
    throughput_rounds,
)
from harness.cost.scaling import extrapolate, measure_scaling, too_large
from harness.report import consistency_line, cost_rows, cost_section
from harness.report.cost_tables import _time_note

REFERENCE = Path(__file__).resolve().parents[3] / "results" / "reference"
SIZES = [32, 64, 128, 256, 512, 1024, 2048, 4096]


def test_every_subject_runs_once_per_round_in_a_rotating_order():
    calls: list[str] = []
    timed = {name: (lambda n=name: calls.append(n) or len(calls)) for name in "abc"}
    results = interleaved(timed, 3)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    for r in range(3):  # each round holds every subject once
        assert sorted(calls[3 * r : 3 * r + 3]) == ["a", "b", "c"]
    assert results == {"a": [1, 6, 8], "b": [2, 4, 9], "c": [3, 5, 7]}
    assert round_order(["a", "b", "c"], 4) == ["b", "c", "a"] and round_order([], 2) == []


def test_a_subject_that_fails_leaves_the_later_rounds_and_the_others_go_on():
    calls: list[str] = []

    def flaky() -> int | None:
        calls.append("f")
        return None if calls.count("f") == 2 else 1

    results = interleaved({"f": flaky, "g": lambda: calls.append("g") or 2}, 4)
    assert calls.count("f") == 2 and calls.count("g") == 4
    assert results == {"f": [1], "g": [2, 2, 2, 2]}


def _record(rate: float, share: float = 0.05) -> dict[str, Any]:
    return {"steps": 2, "batch_size": 16, "images_per_second": rate, "step_ms": 16e3 / rate,
            "mining_loss_ms": 1.0, "mining_loss_share": share, "empty_steps": 0}  # fmt: skip


def test_throughput_keeps_each_methods_fastest_round_and_records_every_round(monkeypatch):
    """Each round builds a fresh model (the same steps from the same initial state) and the
    methods take turns; the record is the fastest round's, with all rounds beside it."""
    rates = {"a": iter([100.0, 300.0, 200.0]), "b": iter([50.0, 40.0, 60.0])}
    order: list[str] = []

    def fake(ctx, model, data, *, steps):
        order.append(model)
        return _record(next(rates[model]))

    monkeypatch.setattr(throughput, "measure_throughput", fake)
    built: list[str] = []
    models = {n: (lambda n=n: built.append(n) or n) for n in ("a", "b")}
    measured, failures = throughput_rounds(None, models, None, steps=2, rounds=3)
    assert order == ["a", "b", "b", "a", "a", "b"] and built == order and failures == {}
    a, b = measured["a"], measured["b"]
    assert a["images_per_second"] == 300.0 and a["fastest_round"] == 1
    assert a["step_ms"] == pytest.approx(16e3 / 300)  # the fastest round's own step time
    assert [r["images_per_second"] for r in a["rounds"]] == [100.0, 300.0, 200.0]
    assert b["images_per_second"] == 60.0 and b["fastest_round"] == 2  # rounds in round order
    assert [r["images_per_second"] for r in b["rounds"]] == [50.0, 40.0, 60.0]


def test_a_method_whose_throughput_fails_is_reported_and_the_others_are_measured(monkeypatch):
    def fake(ctx, model, data, *, steps):
        if model == "broken":
            raise RuntimeError("no such kernel")
        return _record(100.0)

    monkeypatch.setattr(throughput, "measure_throughput", fake)
    models = {n: (lambda n=n: n) for n in ("broken", "fine")}
    measured, failures = throughput_rounds(None, models, None, steps=2, rounds=2)
    assert list(measured) == ["fine"] and len(measured["fine"]["rounds"]) == 2
    assert failures == {"broken": "RuntimeError: no such kernel"}


def _row(name: str, rate: float | None, share: float, status: str = "ok") -> dict[str, Any]:
    tp = None if rate is None else {"images_per_second": rate, "mining_loss_share": share,
                                    "step_ms": 64e3 / rate}  # fmt: skip
    return {"method": name, "status": status, "throughput": tp}


def test_the_consistency_check_passes_methods_that_agree():
    rows = [_row("a", 1000, 0.05), _row("b", 1150, 0.08), _row("slow_miner", 300, 0.6)]
    check = consistency(rows)
    assert check["methods"] == ["a", "b"]  # slow_miner spends 60 % in mining + loss: not compared
    assert check["consistent"] is True and check["spread"] == pytest.approx(1.15)
    assert "passed" in check["summary"]


def test_the_consistency_check_flags_a_disturbed_table_and_by_how_much():
    rows = [_row("arcface", 297, 0.04), _row("cosface", 1670, 0.05), _row("c", 1000, 0.09),
            _row("failed", None, 0.0, "failed"), _row("pddm", 100, 0.35)]  # fmt: skip
    check = consistency(rows)
    assert check["consistent"] is False and check["methods"] == ["arcface", "cosface", "c"]
    assert (check["slowest"], check["fastest"]) == ("arcface", "cosface")
    assert check["spread"] == pytest.approx(1670 / 297, abs=1e-3)
    assert "DISTURBED" in check["summary"] and "5.62x" in check["summary"]
    record = {"settings": {"throughput_rounds": 5}, "methods": rows, "consistency": check}
    assert consistency_line(record).startswith("**MEASUREMENT DISTURBED (consistency check")
    lonely = consistency([_row("a", 1000, 0.05), _row("b", 900, 0.5)])
    assert lonely["consistent"] is None and "not applicable" in lonely["summary"]


def test_the_committed_record_made_before_the_rounds_still_renders(tmp_path: Path):
    """The old record (no rounds, no fixed cost, no check; six of its methods, kept under
    tests) reads, its step time is shown beside its img/s, and the check run on its rows
    says it was disturbed."""
    shutil.copytree(Path(__file__).parent / "old_record" / "cost", tmp_path / "cost")
    record = json.loads((tmp_path / "cost" / "default.json").read_text())
    assert "consistency" not in record and "throughput_rounds" not in record["settings"]
    rows = {r["method"]: r for r in cost_rows(record)}
    tp = next(e for e in record["methods"] if e["method"] == "contrastive")["throughput"]
    assert rows["contrastive"]["step ms"] == f"{tp['step_ms']:.1f}"
    section = cost_section(tmp_path)
    assert "| step ms " in section and "MEASUREMENT DISTURBED" in section
    assert "timed one method after another" in section
    assert "times are fitted on the largest sizes" in section


def test_time_exponents_are_fitted_above_the_fixed_cost():
    m = np.array(SIZES, dtype=float)
    fixed = 2.0  # ms per call, whatever m
    times = 1e-5 * m**2 + fixed  # the fixed cost dominates up to m = 512 or so
    fit = fit_time(SIZES, times, fixed, 8)
    assert fit.sizes == [1024, 2048, 4096]  # only where the time is at least 5x the fixed cost
    assert fit.exponent == pytest.approx(2.0, abs=1e-9) and fit.complexity == "O(m^2)"
    assert fit.as_dict()["fixed_ms"] == 2.0 and fit.as_dict()["fixed_batch_size"] == 8
    # fitted on the raw times over every size, the same calls are no power law at all
    from harness.cost import fit_power_law

    assert fit_power_law(SIZES, times).complexity.startswith("unclear")
    linear = fit_time(SIZES, 0.01 * m + 0.5, 0.5, 8)
    assert linear.exponent == pytest.approx(1.0, abs=1e-9) and linear.complexity == "O(m)"


def test_a_time_fit_says_why_it_names_no_class():
    m = np.array(SIZES, dtype=float)
    flat = fit_time(SIZES, 1e-6 * m**2 + 2.0, 2.0, 8)  # 5x the fixed cost only at m = 4096
    assert flat.exponent is None and flat.sizes == [4096]
    assert flat.complexity.startswith("unclear (fixed cost dominates up to m=2048")
    assert "m=8 call's 2 ms" in flat.complexity
    assert fit_time(SIZES, [0.0] * len(SIZES), 0.0, 8).complexity == "none"  # no miner


def test_a_disturbed_call_neither_sets_the_fixed_cost_nor_enters_the_fit():
    """A fixed call slowed down by another process, and a small size slowed the same way:
    the growth with m tells them apart (no call is cheaper than the fixed cost, none slower
    than a larger batch's)."""
    m = np.array(SIZES, dtype=float)
    times = 1e-5 * m**2 + 2.0
    times[1] = 500.0  # m = 64: the machine was busy
    fit = fit_time(SIZES, times, 50.0, 8)  # the fixed call was disturbed too
    assert fit.fixed_ms == pytest.approx(times[0]) and fit.fixed_batch_size == 32
    assert fit.disturbed_sizes == [64] and 64 not in fit.sizes
    assert fit.exponent == pytest.approx(2.0, abs=0.01) and fit.complexity == "O(m^2)"


def test_fits_use_the_measured_fixed_cost_and_read_old_cells_without_it():
    cells = [{"batch_size": s, "mining_ms": 1e-5 * s**2 + 1.0, "loss_ms": 3.0 + 1e-3 * s,
              "evaluated": s * (s - 1) // 2, "tuples": s} for s in SIZES]  # fmt: skip
    new = fits(cells, {"batch_size": 8, "mining_ms": 1.0, "loss_ms": 3.0})
    assert new["mining_time"].complexity == "O(m^2)" and new["evaluated"].sizes == SIZES
    assert new["loss_time"].complexity.startswith("unclear (fixed cost dominates")
    old = fits(cells)  # a record made before the fixed cost: the smallest size stands for it
    assert old["mining_time"].fixed_batch_size == 32 and old["mining_time"].exponent > 1.9


def test_extrapolation_skips_what_would_not_fit_or_take_too_long():
    """pytorch-metric-learning's semi-hard triplet mask is m x m x m bytes: 1 GiB at m = 1024,
    so 64 GiB at 4096; the estimate skips it instead of letting the machine kill the run."""
    gib = 2**30
    cells = [{"batch_size": 512, "call_seconds": 0.3, "peak_bytes": gib // 8},
             {"batch_size": 1024, "call_seconds": 2.4, "peak_bytes": gib}]  # fmt: skip
    assert extrapolate([(512, gib / 8), (1024, gib)], 4096) == pytest.approx(64 * gib)
    assert too_large(cells, 2048, 20 * gib) is None  # 8 GiB of 20 free, 19 s: runs
    why = too_large(cells, 4096, 20 * gib)
    assert why.startswith("skipped: one call at m=4096 would take about 154 s")
    why = too_large(cells, 4096, 20 * gib, max_call_seconds=1000)
    assert "would need about 64.0 GiB, over 50% of the 20.0 GiB free" in why
    assert "extrapolated from m=512, 1024" in why
    assert too_large(cells, 4096, None, max_call_seconds=1000) is None  # unknown memory
    # clamped to [1, 3]: a jump from a size whose memory was mostly reused reads no steeper
    assert extrapolate([(256, 1.0), (512, 1000.0)], 1024) == pytest.approx(8000.0)
    assert extrapolate([(256, 5.0), (512, 5.0)], 1024) == pytest.approx(10.0)
    assert extrapolate([(256, 0.0)], 512) is None


class _Holds:
    """A PeakMemory stand-in: every call held 1 MiB."""

    def __init__(self, device: torch.device) -> None:
        self.bytes = 2**20

    def __enter__(self) -> _Holds:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def test_scaling_skips_the_sizes_that_would_not_fit_instead_of_crashing(monkeypatch):
    monkeypatch.setattr(scaling, "PeakMemory", _Holds)
    monkeypatch.setattr(scaling, "available_bytes", lambda device: 2**20)  # 1 MiB free
    context = MethodContext((16,), 8, 64, 4)
    method = METHODS.get("contrastive").build(context)
    ctx = cost_context(load_protocol("smoke"), torch.device("cpu"))
    cells = measure_scaling(ctx, method, context, [8, 16, 32], repeats=1)
    assert cells[0]["peak_bytes"] == 2**20 and "skipped" not in cells[0]
    assert cells[1]["skipped"].startswith("skipped: one call at m=16 would need about")
    assert cells[2]["skipped"] == cells[1]["skipped"]  # and every larger size


def test_cost_records_its_rounds_its_fixed_costs_and_its_check(tmp_path: Path, capsys):
    argv = ["cost", "--protocol", "smoke", "--methods", "contrastive,triplet",
            "--batch-sizes", "8,16,32", "--repeats", "1", "--steps", "2", "--rounds", "3",
            "--device", "cpu", "--results-dir", str(tmp_path), "--no-overhead"]  # fmt: skip
    assert main(["-q", *argv]) == 0
    printed = capsys.readouterr().out
    assert "| step ms " in printed and "consistency check" in printed.lower()
    record = json.loads((tmp_path / "cost" / "smoke.json").read_text())
    assert record["settings"]["throughput_rounds"] == 3
    assert record["consistency"] == consistency(record["methods"])
    for entry in record["methods"]:
        tp = entry["throughput"]
        assert len(tp["rounds"]) == 3
        assert tp["images_per_second"] == max(r["images_per_second"] for r in tp["rounds"])
        assert entry["fixed_cost"]["batch_size"] == 8  # 2 classes x K = 4
        assert entry["fits"]["mining_time"]["fixed_batch_size"] is not None
    assert set(record["load_average"]) == {"start", "end", "cpus"}


def test_bad_rounds_are_one_line_errors(capsys):
    with pytest.raises(SystemExit) as done:  # argparse's exit, after its one line
        main(["cost", "--protocol", "smoke", "--rounds", "0"])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--rounds: expected a positive integer" in err and len(err.splitlines()) == 1


def test_the_table_says_why_a_time_names_no_class_and_what_it_left_out():
    """A method whose largest m was skipped shows its largest measured m instead."""
    cells = [{"batch_size": m, "mining_ms": 1.0 * m, "loss_ms": 0.5, "evaluated": m * m,
              "tuples": m} for m in (64, 128)]  # fmt: skip
    entry = {
        "method": "t", "status": "ok", "reason": None, "has_miner": True,
        "count_exponent": 2.0, "count_complexity": "O(m^2)",
        "time_exponent": 1.9, "time_complexity": "unclear (not a power law)",
        "loss_time_exponent": None, "loss_time_complexity":
            "unclear (fixed cost dominates up to m=128: 0 size(s) at 5x the m=8 call's 0.5 ms "
            "or more, 3 needed)",
        "fits": {"mining_time": {"disturbed_sizes": [64]}, "loss_time": {}},
        "measurements": [*cells, {"batch_size": 256, "skipped": "skipped: too big"}],
        "throughput": _record(1000.0),
    }  # fmt: skip
    record = {"settings": {"batch_sizes": [64, 128, 256]}, "methods": [entry]}
    row = cost_rows(record)[0]
    assert row["mining ms (m=256)"] == "128.00 (m=128)" and row["loss ms (m=256)"] == "0.5 (m=128)"
    assert row["step ms"] == "16.0" and row["img/s"] == "1000"
    assert row["notes"] == ("mining time at m=64 above a larger m's: left out of the fit; "
                            "loss time: fixed cost dominates up to m=128")  # fmt: skip


def test_a_mining_time_apart_from_its_counts_says_how_the_time_per_item_moves():
    # counts grow as m^2; the time per counted item halves from m=256 to 1024, then holds
    cells = [{"batch_size": m, "evaluated": m * m, "mining_ms": t}
             for m, t in ((256, 1.0), (512, 2.0), (1024, 8.0))]  # fmt: skip
    entry = {"method": "pairs", "status": "ok", "has_miner": True, "measurements": cells,
             "count_complexity": "O(m^2)", "time_complexity": "unclear",
             "fits": {"mining_time": {"sizes": [256, 512, 1024]}}}  # fmt: skip
    assert _time_note(entry) == ("mining time per counted item x0.50 from m=256 to 1024"
                                 " (exponents between successive sizes: 1.00, 2.00)")  # fmt: skip
    entry["time_complexity"] = "O(m^2)"  # the same class as the counts: nothing to say
    assert _time_note(entry) == ""
