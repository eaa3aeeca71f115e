"""The check's text: both machines, the mode and why, a summary line, the rows that failed,
changed or improved (`check --full`: every row and the smallest drop each metric's test can
see), and the verdict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tabulate import tabulate

from harness.check.compare import ALPHA, WATCH_DROP, WATCH_METRIC, Row, compare, too_noisy
from harness.check.machine import rebuilt_data, run_fingerprint
from harness.check.pinned import machine, same_machine
from harness.core import Protocol, program_name
from harness.records import RunResult


def render(rows: list[Row], exact: bool = False) -> str:
    """The rows as a table; `max drop` says `exact` for a row judged by its exact values
    (every row when `exact`), else the statistical bound."""

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.4f}"

    table = [
        [r.method, r.metric, fmt(r.baseline), fmt(r.now),
         "-" if r.baseline is None or r.now is None else f"{r.now - r.baseline:+.4f}",
         "exact" if (exact or r.how == "exact") and r.bound is not None else fmt(r.bound),
         r.status]
        for r in rows
    ]  # fmt: skip
    headers = ["method", "metric", "baseline", "now", "diff", "max drop", "status"]
    return tabulate(table, headers=headers, disable_numparse=True)


def detectable_table(rows: list[Row]) -> str:
    """Per method, the smallest drop of each metric's mean the check would catch (the rows
    tested statistically)."""
    by_method: dict[str, dict[str, float]] = {}
    for r in rows:
        if r.bound is not None and r.how == "statistical":
            by_method.setdefault(r.method, {})[r.metric] = r.bound
    metrics = sorted({m for b in by_method.values() for m in b}, key=_metric_order)
    noisy = too_noisy(rows)
    table = [[m, *(fmt_bound(b.get(k)) for k in metrics), "TOO NOISY" if m in noisy else ""]
             for m, b in sorted(by_method.items())]  # fmt: skip
    return tabulate(table, headers=["smallest detectable drop", *metrics, ""],
                    disable_numparse=True)  # fmt: skip


def fmt_bound(x: float | None) -> str:
    """A detectable drop, three decimals (`-` for none)."""
    return "-" if x is None else f"{x:.3f}"


def _metric_order(name: str) -> tuple[int, str]:
    order = ["recall@1", "recall@4", "precision@1", "r_precision", "map@r", "map", "nmi", "f1"]
    return (order.index(name) if name in order else len(order), name)


def report(
    baseline: dict[str, Any], protocol: Protocol, runs: dict[str, list[RunResult]],
    seeds: list[int], mode: str, path: Path, full: bool = False,
) -> tuple[bool, str]:  # fmt: skip
    """Compare and describe: both machines, the mode, a summary, the rows that failed, changed
    or improved (with `full`: every row and the detectable drops), the verdict."""
    here = run_fingerprint(runs)
    rebuilt = rebuilt_data(runs)
    same = "" if rebuilt else same_machine(here, baseline["fingerprint"], protocol)
    strict = mode == "exact" or (mode == "auto" and bool(same))
    rows = compare(baseline, protocol.hash, runs, seeds, strict, exact_if_reproduced=mode == "auto")
    bad = [r for r in rows if r.failed]
    exact_rows = sum(r.how == "exact" for r in rows)
    stat_rows = sum(r.how == "statistical" for r in rows)
    if strict or (exact_rows and not stat_rows):
        kind = "exact"
    else:
        kind = "mixed" if exact_rows else "statistical"
    lines = [
        f"this machine: {machine(here)}" + (f"; {rebuilt}" if rebuilt else ""),
        f"baseline:     {machine(baseline['fingerprint'])}",
        _mode_line(kind, strict, same, mode, seeds, len(baseline["seeds"]), exact_rows, stat_rows),
        _summary(rows, exact_rows, stat_rows),
    ]
    noisy = too_noisy(rows)
    if noisy:
        lines.append(f"too noisy to guard on this machine (cannot see a {WATCH_DROP} drop in "
                     f"{WATCH_METRIC}): " + ", ".join(f"{m} (smallest drop {b:.3f})"
                                                      for m, b in sorted(noisy.items())))  # fmt: skip
    shown = rows if full else [r for r in rows if r.notable]
    if shown:
        lines += ["", render(shown)]
    if full and stat_rows:
        lines += ["", detectable_table(rows)]
    lines += [""] if shown else []
    lines.append(
        f"check {'FAILED' if bad else 'passed'} ({kind}): "
        f"{len(rows) - len(bad)}/{len(rows)} rows pass against {path}"
        + ("" if full else " (--full lists every row)")
    )
    if same and any(r.status == "CHANGED" for r in bad):
        lines.append(
            "a changed number on the baseline's own machine is a change in behaviour: if it is "
            f"intended, record it with `{program_name()} check --update --reason TEXT`"
        )
    return not bad, "\n".join(lines)


def _mode_line(
    kind: str, strict: bool, same: str, mode: str, seeds: list[int], n_base: int,
    exact_rows: int, stat_rows: int,
) -> str:  # fmt: skip
    """How the rows were judged, and why: the machine, the forced mode, or the numbers."""
    test = (f"mean of seeds {seeds} vs mean of the baseline's {n_base} seeds, one-sided pooled "
            f"t-test, false-alarm rate <= {ALPHA} for the whole check")  # fmt: skip
    if strict:
        why = same or "forced"
        return f"mode: exact ({why}: seeds {seeds} must reproduce their values bit for bit)"
    if kind == "exact":
        return (f"mode: exact (another machine, but every number reproduced bit for bit: seeds "
                f"{seeds} match their recorded values)")  # fmt: skip
    if kind == "mixed":
        return (f"mode: mixed (another machine: {exact_rows} of {exact_rows + stat_rows} rows "
                f"reproduced bit for bit and passed as exact, the other {stat_rows} tested "
                f"statistically: {test})")  # fmt: skip
    return f"mode: statistical ({'forced' if mode == 'statistical' else 'another machine'}: {test})"


def _summary(rows: list[Row], exact_rows: int, stat_rows: int) -> str:
    """One line: rows passed, how many judged each way, failures and improvements."""
    passed = sum(not r.failed for r in rows)
    methods = len({r.method for r in rows if r.method != "*"})
    improved = sum(r.status == "improved" for r in rows)
    noisy = too_noisy(rows)
    return (
        f"summary: {passed}/{len(rows)} rows pass ({methods} method{'s' * (methods != 1)}): "
        f"{exact_rows} exact, {stat_rows} statistical; {len(rows) - passed} failed, {improved} "
        f"improved; {len(noisy)} method{'s' * (len(noisy) != 1)} too noisy to guard"
    )
