"""The leaderboard's ranking agreement between protocols: Kendall's tau-b against a hand count
of concordant and discordant pairs, its exact p-value, and what takes part."""

from __future__ import annotations

import pytest

from harness.records import RunResult
from harness.report.agreement import agreement_rows, agreement_section


def result(protocol: str, method: str, value: float, seed: int = 0, **training) -> RunResult:
    return RunResult.from_json({
        "schema": 2, "status": "ok", "protocol": {"name": protocol, "version": 1, "hash": protocol},
        "method": {"name": method, "version": 1, "hyperparameters": {}}, "seed": seed,
        "training": {"max_steps": None, **training}, "metrics": {"map@r": value},
    })  # fmt: skip


def board(protocol: str, values: list[float], **training) -> list[RunResult]:
    return [result(protocol, f"m{i + 1}", v, **training) for i, v in enumerate(values)]


def test_one_swapped_pair_of_six_is_tau_13_15_with_its_exact_p():
    """6 methods, 15 pairs; B swaps m5 and m6: 14 concordant, 1 discordant, tau = 13/15. Under
    the null all 720 orders are equally likely; 6 have at most one inversion, and as many at
    least 14, so the two-sided p is 12/720."""
    (row,) = agreement_rows({"a": board("a", [6, 5, 4, 3, 2, 1]),
                             "b": board("b", [60, 50, 40, 30, 10, 20])})  # fmt: skip
    assert row["protocols"] == "a (map@r) vs b (map@r)" and row["methods both ran"] == "6"
    assert float(row["Kendall's tau"]) == pytest.approx(13 / 15, abs=0.005)
    assert row["p"] == f"{12 / 720:.2g}" == "0.017"  # two significant digits
    assert row["same top 5"] == "4"
    assert row["moved most (rank a → b)"].startswith("m5 5→6, m6 6→5")


def test_a_reversed_order_is_tau_minus_one():
    (row,) = agreement_rows({"a": board("a", [1, 2, 3, 4, 5]), "b": board("b", [5, 4, 3, 2, 1])})
    assert row["Kendall's tau"] == "-1.00"
    assert row["p"] == f"{2 / 120:.2g}"  # 1 of 120 orders at each extreme


def test_only_methods_both_ran_full_runs_and_enough_of_them_take_part():
    a = board("a", [6, 5, 4, 3, 2, 1]) + [result("a", "only_a", 9.0)]
    b = board("b", [6, 5, 4, 3, 2, 1])
    capped = board("c", [1, 2, 3, 4, 5, 6], max_steps=2)  # a smoke run: not a ranking
    section = agreement_section(a + b + capped)
    assert "| a (map@r) vs b (map@r) | 6 " in section and "+1.00" in section
    assert " c (" not in section
    assert agreement_section(board("a", [4, 3, 2, 1]) + board("b", [4, 3, 2, 1])) == ""
