"""The comparison of the check's runs with the baseline, row by row (method, metric): exact
(every check seed reproduces its recorded value up to EXACT_RTOL) or statistical (a one-sided
pooled two-sample t-test of the means, Bonferroni over the rows: see harness.check).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from harness.records import RunResult

EXACT_RTOL = 1e-12  # exact mode: float64 metric arithmetic may reorder; training moves far more
ALPHA = 0.01  # the whole check's false-alarm rate in statistical mode (Bonferroni over rows)
MIN_BOUND = 0.005  # a metric constant over all seeds still gets this much room
WATCH_METRIC, WATCH_DROP = "map@r", 0.05  # a method that cannot see this drop is flagged


@dataclass
class Row:
    """One (method, metric): means over seeds, the allowed drop (0 when judged exactly),
    verdict, and how it was judged: "exact", "statistical", or "" (not comparable)."""

    method: str
    metric: str
    baseline: float | None
    now: float | None
    bound: float | None
    status: str
    how: str = ""

    @property
    def failed(self) -> bool:
        """Whether the row fails the check (anything but ok or improved)."""
        return self.status not in ("ok", "improved")

    @property
    def notable(self) -> bool:
        """Shown in the short report: failed, changed, regressed or improved."""
        return self.status != "ok"


def t_bound(base: list[float], now: list[float], rows: int, alpha: float = ALPHA) -> float:
    """The largest drop of mean(now) below mean(base) that a one-sided pooled two-sample t-test
    at level alpha / rows still accepts as chance."""
    n_base, n_now = len(base), len(now)
    df = n_base + n_now - 2
    pooled = (
        (n_base - 1) * statistics.variance(base) + (n_now - 1) * statistics.variance(now)
    ) / df
    from scipy import stats  # on first use: scipy.stats is slow to import

    critical = stats.t.ppf(1 - alpha / rows, df)
    return max(float(critical) * math.sqrt(pooled * (1 / n_base + 1 / n_now)), MIN_BOUND)


def _structural(baseline: dict[str, Any], method: str, runs: list[RunResult]) -> str | None:
    """Why a method cannot be compared at all (failed run, no baseline, new version)."""
    bad = next((r for r in runs if not r.ok), None)
    if bad is not None:
        return f"run {bad.status} (seed {bad.seed}): {bad.failure}"
    base = baseline["methods"].get(method)
    if base is None:
        return "missing baseline"
    if base["version"] != runs[0].method.version:
        return f"method version {base['version']} -> {runs[0].method.version}: update the baseline"
    return None


def compare(
    baseline: dict[str, Any], protocol_hash: str, runs: dict[str, list[RunResult]],
    seeds: list[int], exact: bool, exact_if_reproduced: bool = False,
) -> list[Row]:  # fmt: skip
    """One row per (method, metric); a row's status says whether it passes. `exact`: every
    row must reproduce its recorded values; else statistical, except, with
    `exact_if_reproduced`, the rows whose values all reproduce: those pass as exact."""
    if baseline.get("protocol_hash") != protocol_hash:
        return [Row("*", "protocol", None, None, None,
                    f"baseline is for protocol hash {baseline.get('protocol_hash')}, now "
                    f"{protocol_hash}: run check --update --reason ...")]  # fmt: skip
    missing = [s for s in seeds if s not in baseline["seeds"]]
    if missing:
        return [Row("*", "seeds", None, None, None,
                    f"seeds {missing} are not in the baseline's {baseline['seeds']}: "
                    "run check --update --reason ...")]  # fmt: skip
    at = [baseline["seeds"].index(s) for s in seeds]
    problems = {m: _structural(baseline, m, rs) for m, rs in runs.items()}
    names = {m: _metric_names(baseline, m, rs) for m, rs in runs.items() if problems[m] is None}
    tested = sum(len(n) for n in names.values())
    rows: list[Row] = []
    for method, method_runs in sorted(runs.items()):
        problem = problems[method]
        if problem is not None:
            rows.append(Row(method, "*", None, None, None, problem))
            continue
        for metric in names[method]:
            base = baseline["methods"][method]["metrics"].get(metric)
            rows.append(_metric_row(method, metric, base, method_runs, at, exact, tested,
                                    exact_if_reproduced))  # fmt: skip
    return rows


def _metric_names(baseline: dict[str, Any], method: str, runs: list[RunResult]) -> list[str]:
    """The metrics of the baseline and of the runs: one the baseline has and a run lost fails."""
    names = dict.fromkeys(baseline["methods"][method]["metrics"])
    for r in runs:
        names.update(dict.fromkeys(r.metrics or {}))
    return list(names)


def _metric_row(
    method: str, metric: str, base: list[float] | None, runs: list[RunResult], at: list[int],
    exact: bool, tested: int, exact_if_reproduced: bool = False,
) -> Row:  # fmt: skip
    """One metric's verdict; a missing or non-finite value on either side never passes."""
    values = [(r.metrics or {}).get(metric) for r in runs]
    if any(v is None for v in values):
        lost = [r.seed for r, v in zip(runs, values, strict=True) if v is None]
        return Row(method, metric, None, None, None, f"missing now (seeds {lost})")
    now = [float(v) for v in values if v is not None]
    if base is None:
        return Row(method, metric, None, statistics.fmean(now), None, "missing baseline")
    if not all(math.isfinite(v) for v in now):
        return Row(method, metric, None, None, None, f"not finite: {now}")
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in base):
        return Row(method, metric, None, None, None, f"baseline not finite: {base}")
    same = all(math.isclose(now[i], base[j], rel_tol=EXACT_RTOL, abs_tol=EXACT_RTOL)
               for i, j in enumerate(at))  # fmt: skip
    if exact or (same and exact_if_reproduced):
        return Row(method, metric, statistics.fmean(base[j] for j in at),
                   statistics.fmean(now), 0.0, "ok" if same else "CHANGED", "exact")  # fmt: skip
    bound = t_bound(base, now, tested)
    if not math.isfinite(bound):
        return Row(method, metric, None, None, None, f"untestable: bound {bound}")
    diff = statistics.fmean(now) - statistics.fmean(base)
    status = "REGRESSED" if diff < -bound else "improved" if diff > bound else "ok"
    return Row(method, metric, statistics.fmean(base), statistics.fmean(now), bound, status,
               "statistical")  # fmt: skip


def too_noisy(rows: list[Row]) -> dict[str, float]:
    """Methods whose MAP@R bound is wider than WATCH_DROP: the check cannot guard them."""
    return {r.method: r.bound for r in rows
            if r.metric == WATCH_METRIC and r.bound is not None and r.bound > WATCH_DROP}  # fmt: skip


def same_metrics(a: dict[str, float], b: dict[str, float]) -> bool:
    """Whether two runs gave the same numbers: every metric both report equal to EXACT_RTOL
    (the exact rule, also of the report's `per seed` beside the committed reference)."""
    keys = set(a) & set(b)
    return bool(keys) and all(
        isinstance(a[k], (int, float)) and isinstance(b[k], (int, float))
        and math.isclose(a[k], b[k], rel_tol=EXACT_RTOL, abs_tol=EXACT_RTOL)
        for k in keys
    )  # fmt: skip
