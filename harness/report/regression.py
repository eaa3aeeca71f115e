"""CI's regression check: rerun the small `regression` protocol, compare with the baselines.

The baseline file (results/reference/baselines/<protocol>.json, committed beside the other
reference results) holds every method's metrics for several seeds, and the fingerprint of the
machine that made them (harness/records/fingerprint.py). Runs are pinned to one torch thread
per worker process, so the core count does not matter. The check's own runs go to a temporary
folder (deleted afterwards; kept and named only when the check breaks off), so a check
changes no file of the clone; only `--update` writes, the baseline file.

- **exact** mode, on a machine with the baseline's fingerprint, or with the baseline's pinned
  numerics (any x86-64 processor with AVX2 and FMA; harness.report.pinned): training is deterministic
  there, so every check seed must reproduce its recorded value bit for bit, up to EXACT_RTOL
  (1e-12): the metric code may reorder its float64 sums (issue 12's one-pass metrics agree
  with the previous code to 4.4e-15), while any change in training moves a metric by far
  more (about 1e-4 and up). Any other difference is a change (better or worse) and fails
  until `--update --reason` records it.
- **auto** (the default) on any other machine: a row (method, metric) whose check-seed values
  all equal the recorded ones (up to EXACT_RTOL) passes as exact: the numbers reproduced, so
  nothing regressed (a processor of the same family often rounds alike). Only the rows whose
  numbers differ get the statistical test below; when every number matches the check says
  exact. `--mode statistical` tests every row statistically, `--mode exact` none.
- **statistical** mode, on any other machine: another processor rounds differently and
  training amplifies that into seed-noise-sized differences, so single values cannot be
  compared. For each metric, the mean over the n check seeds is compared with the mean over
  the baseline's N seeds by a one-sided two-sample t-test with pooled variance (Student's t,
  N + n - 2 degrees of freedom), Bonferroni-corrected over all rows so that the whole check
  raises a false alarm with probability at most ALPHA when nothing regressed. The t-test
  treats the two sets of runs as independent draws; the check seeds are among the baseline's,
  and runs of one seed on two machines are positively correlated, which only lowers the
  false-alarm rate further. A metric regresses when its mean falls below the baseline mean by
  more than the bound; the bound is the smallest drop the check can see on this machine. A
  method whose bound on MAP@R exceeds WATCH_DROP is reported as too noisy to guard. The
  Bonferroni count is every comparable row, also those that passed as exact: the bounds are
  those of a wholly statistical check, never narrower.

The report is short by default (machines, mode, a summary, and only the rows that failed,
changed or improved); `full=True` (`check --full`) adds every row and the detectable drops.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import statistics
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tabulate import tabulate

from harness.core import (
    METHODS,
    HarnessError,
    Protocol,
    load_protocol,
    program_name,
    resolve_device,
    source_tree,
)
from harness.data import check_data_root
from harness.records import RunResult, read_result, result_path, write_json_atomic
from harness.report import pinned as pinning
from harness.sweep import plan, sweep_pinned

log = logging.getLogger(__name__)

# The committed baselines, beside the clone's other reference results; an installed harness
# (no clone) looks in ./results/reference/baselines and otherwise needs --baselines DIR
BASELINE_DIR = (source_tree() or Path()) / "results" / "reference" / "baselines"
BASELINE_FORMAT = 2
EXACT_RTOL = 1e-12  # exact mode: float64 metric arithmetic may reorder; training moves far more
ALPHA = 0.01  # the whole check's false-alarm rate in statistical mode (Bonferroni over rows)
MIN_BOUND = 0.005  # a metric constant over all seeds still gets this much room
WATCH_METRIC, WATCH_DROP = "map@r", 0.05  # a method that cannot see this drop is flagged
BASELINE_SEEDS = 20  # default number of seeds `--update` records


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
        return self.status not in ("ok", "improved")

    @property
    def notable(self) -> bool:
        """Shown in the short report: failed, changed, regressed or improved."""
        return self.status != "ok"


def baseline_path(protocol: str, baseline_dir: Path) -> Path:
    return Path(baseline_dir) / f"{protocol}.json"


def load_baseline(path: Path) -> dict[str, Any]:
    """The baseline file, refused with a one-line fix if it predates the per-seed format."""
    try:
        baseline = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise HarnessError(f"unreadable baseline file {path}: {exc}; restore it from git") from None
    if baseline.get("format") != BASELINE_FORMAT:
        raise HarnessError(
            f"{path} is a format-{baseline.get('format', 1)} baseline (one seed, fixed "
            f"tolerances); this check needs format {BASELINE_FORMAT}: remake it with "
            f"`{program_name()} check --update --reason TEXT`"
        )
    return baseline


def run_protocol(
    protocol: Protocol, methods: list[str], seeds: list[int], results_dir: Path, device: str,
    pinned: bool = False,
) -> dict[str, list[RunResult]]:  # fmt: skip
    """Every method for every seed, one torch thread per worker process (`pinned`: under the
    pinned numerics, harness.core.numerics); returns each method's results, ordered as
    `seeds`."""
    specs = plan(protocol, methods, seeds, device=device, results_dir=str(results_dir))
    workers = 1 if resolve_device(device).type == "cuda" else min(os.cpu_count() or 1, len(specs))
    sweep_pinned(specs, workers=workers, threads=1, pinned_numerics=pinned)
    runs = {
        m: [read_result(result_path(results_dir, protocol.name, m, s)) for s in seeds]
        for m in methods
    }
    return runs


def run_fingerprint(runs: dict[str, list[RunResult]]) -> dict[str, Any]:
    """The one fingerprint all runs were made under (they share a process setup)."""
    found = {json.dumps(r.environment.fingerprint, sort_keys=True)
             for rs in runs.values() for r in rs if r.environment is not None}  # fmt: skip
    if len(found) != 1:
        prints = [json.loads(f) for f in found]
        differ = sorted({k for fp in prints for k in fp if fp.get(k) != prints[0].get(k)})
        raise HarnessError(
            f"the check's runs report {len(found)} machine fingerprints, not one (they differ "
            f"in {', '.join(differ)}); report this as a bug"
        )
    return json.loads(found.pop())


def rebuilt_data(runs: dict[str, list[RunResult]]) -> str:
    """Why the runs' data is not the published bytes ('' when it is): a real-photo dataset
    rebuilt with another Pillow compares statistically, as another processor's runs do."""
    for group in runs.values():
        for r in group:
            p = (r.dataset.provenance if r.dataset else None) or {}
            if p and not p.get("exact", True):
                return (f"data rebuilt with Pillow {p.get('pillow')}: {len(p.get('differing', {}))}"
                        " derived files differ from the published bytes")  # fmt: skip
    return ""


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
    return "-" if x is None else f"{x:.3f}"


def _metric_order(name: str) -> tuple[int, str]:
    order = ["recall@1", "recall@4", "precision@1", "r_precision", "map@r", "map", "nmi", "f1"]
    return (order.index(name) if name in order else len(order), name)


def update(
    path: Path, protocol: Protocol, runs: dict[str, list[RunResult]], seeds: list[int],
    reason: str, partial: bool,
) -> list[str]:  # fmt: skip
    """Write the baseline file from the runs; returns the methods left out (failed runs).
    A partial update (some methods) keeps the others, if they were made on this machine."""
    env = next(iter(runs.values()))[0].environment  # the workers' (threads as they ran)
    if env is None:
        raise HarnessError("the check's runs recorded no environment; report this as a bug")
    env_json = env.to_json()
    fingerprint = run_fingerprint(runs)
    old_methods: dict[str, Any] = {}
    if partial and path.exists():
        old = load_baseline(path)
        same = pinning.same_machine(fingerprint, old["fingerprint"], protocol)  # or numerics
        if set(old["methods"]) <= set(runs):  # every method it holds is rewritten: none kept
            old["methods"] = {}
        elif not same or (old["seeds"], old["protocol_hash"]) != (seeds, protocol.hash):
            raise HarnessError(
                f"{path} was made on another machine, seeds or protocol; update every method "
                "(leave out --methods) so the whole file comes from one machine"
            )
        old_methods = old["methods"]
    ok = {m: rs for m, rs in runs.items() if all(r.ok for r in rs)}
    _refuse_non_finite(ok)
    write_json_atomic(path, {
        "format": BASELINE_FORMAT,
        "protocol": protocol.name,
        "protocol_hash": protocol.hash,
        "updated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": env.git_commit,
        "reason": reason,
        "environment": {k: env_json[k] for k in ("python", "packages", "hardware")},
        "fingerprint": fingerprint,
        "seeds": seeds,
        "methods": {**old_methods, **{
            m: {"version": rs[0].method.version,
                "metrics": {k: [r.metrics[k] for r in rs] for k in rs[0].metrics or {}}}
            for m, rs in ok.items()}},
    })  # fmt: skip
    return sorted(set(runs) - set(ok))


def _refuse_non_finite(runs: dict[str, list[RunResult]]) -> None:
    """A baseline of NaN or inf would pass any later value, so such a run is never recorded."""
    bad = sorted(f"{m} {k} (seed {r.seed}: {v})" for m, rs in runs.items() for r in rs
                 for k, v in (r.metrics or {}).items()
                 if not isinstance(v, (int, float)) or not math.isfinite(v))  # fmt: skip
    if bad:
        raise HarnessError(
            f"not finite, so not a baseline: {', '.join(bad)}; fix the method, or leave it out "
            "with --methods"
        )


def check(
    protocol_name: str = "regression",
    methods: list[str] | None = None,
    baseline_dir: Path = BASELINE_DIR,
    *,
    device: str = "auto",
    results_dir: Path | None = None,
    mode: str = "auto",
    full: bool = False,
    numerics: str = "auto",
) -> tuple[bool, str]:
    """Rerun the protocol and compare with its baseline file; returns (passed, report). The
    report is short (summary and the rows that did not simply pass) unless `full`. `numerics`:
    auto (pinned where it holds), pinned or native (harness.report.pinned)."""
    names, protocol = _checked(protocol_name, methods)
    path = baseline_path(protocol.name, baseline_dir)
    if not path.exists():
        raise HarnessError(
            f"no baseline file {path}: pass --baselines DIR (a clone's "
            "results/reference/baselines) or create it with "
            f"`{program_name()} check --protocol {protocol.name} --update --reason TEXT`"
        )
    baseline = load_baseline(path)
    seeds = list(protocol.seeds)
    if len(seeds) < 2 and mode != "exact":
        raise HarnessError(
            f"{protocol.path}: the check needs at least 2 seeds for its statistical mode"
        )
    pinned, _ = pinning.pinned_numerics(numerics, device)
    pinning.refuse_other_mode(baseline, path, protocol.name, pinned)
    exact = mode == "exact" or (mode == "auto" and pinning.expect_exact(baseline, pinned, protocol))
    seeds = pinning.check_seeds(seeds, baseline["seeds"], exact)
    with _fresh_runs(results_dir) as runs_dir:
        runs = run_protocol(protocol, names, seeds, runs_dir, device, pinned)
        return report(baseline, protocol, runs, seeds, mode, path, full)


def update_baselines(
    protocol_name: str,
    methods: list[str] | None,
    baseline_dir: Path,
    reason: str,
    *,
    device: str = "auto",
    baseline_seeds: int = BASELINE_SEEDS,
    numerics: str = "auto",
) -> tuple[bool, str]:
    """Remake the baseline file from fresh runs of `baseline_seeds` seeds (0..N-1), saying
    why, in the pinned numerics only; returns (every method recorded, what was written)."""
    if not reason.strip():
        raise HarnessError("--update needs a non-empty --reason saying why the numbers change")
    pinning.refuse_update_unless_pinned(*pinning.pinned_numerics(numerics, device))
    names, protocol = _checked(protocol_name, methods)
    seeds = list(range(baseline_seeds))
    if not set(protocol.seeds) <= set(seeds) or baseline_seeds < 3:
        raise HarnessError(
            f"--baseline-seeds {baseline_seeds} must be at least 3 and cover the protocol's "
            f"check seeds {protocol.seeds}"
        )
    path = baseline_path(protocol.name, baseline_dir)
    with _fresh_runs(None) as runs_dir:
        runs = run_protocol(protocol, names, seeds, runs_dir, device, pinned=True)
        left_out = update(path, protocol, runs, seeds, reason, bool(methods))
    note = f"; failed runs left out: {', '.join(left_out)}" if left_out else ""
    return not left_out, f"baselines for seeds {seeds} written to {path}{note}"


def _checked(protocol_name: str, methods: list[str] | None) -> tuple[list[str], Protocol]:
    """The methods (default: every registered one; a misspelt name is one line, before any
    folder is made) and the parsed protocol, whose data is there (or fetched: --fetch)."""
    names = methods or METHODS.names()
    for name in names:
        METHODS.get(name)
    protocol = load_protocol(protocol_name)
    check_data_root(protocol, None)
    return names, protocol


@contextlib.contextmanager
def _fresh_runs(results_dir: Path | None) -> Iterator[Path]:
    """A folder for the check's runs: always fresh runs (a finished result is never reused:
    the code may have changed); a temporary one is removed afterwards, but kept when anything
    fails, so that no finished run is lost."""
    runs_dir = Path(results_dir or tempfile.mkdtemp(prefix="harness-check-"))
    try:
        yield runs_dir
    except BaseException:
        log.warning("the check's run results are kept in %s", runs_dir)
        raise
    if results_dir is None:
        shutil.rmtree(runs_dir, ignore_errors=True)


def report(
    baseline: dict[str, Any], protocol: Protocol, runs: dict[str, list[RunResult]],
    seeds: list[int], mode: str, path: Path, full: bool = False,
) -> tuple[bool, str]:  # fmt: skip
    """Compare and describe: both machines, the mode, a summary, the rows that failed, changed
    or improved (with `full`: every row and the detectable drops), the verdict."""
    here = run_fingerprint(runs)
    rebuilt = rebuilt_data(runs)
    same = "" if rebuilt else pinning.same_machine(here, baseline["fingerprint"], protocol)
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
        f"this machine: {pinning.machine(here)}" + (f"; {rebuilt}" if rebuilt else ""),
        f"baseline:     {pinning.machine(baseline['fingerprint'])}",
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
