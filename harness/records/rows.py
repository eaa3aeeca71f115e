"""The rows of a results table, read from result records: which runs are one configuration
(a method at one version and one set of hyperparameters, tuned or at the paper's defaults),
the values each seed gave, the protocol groups whose numbers may be ranked together, and the
tuned view (a method's tuned runs where one finished, else its defaults). The statistics take
these typed numbers (row -> seed -> value); the report's tables, figures and verdicts all
read them from here, so that they never disagree on what a row is.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable

from harness.core import METHODS, load_methods
from harness.records.results import RunResult

TUNED = "+tuned"  # the row of a method's tuned runs: `method+tuned`


def row_name(r: RunResult) -> str:
    """A leaderboard row's name: the method, or `method+tuned` for a tuned configuration."""
    return f"{r.method.name}+tuned" if r.tuning else r.method.name


def hyperparameter_id(r: RunResult) -> str:
    """Six hex digits that tell one run's hyperparameters from another's."""
    text = json.dumps(r.method.hyperparameters, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:6]


def row_names(runs: Iterable[RunResult]) -> dict[int, str]:
    """Each run's row (by id(run)): its `row_name`, unless runs of that name differ in method
    version or hyperparameters: then each configuration is a row of its own, `name@v2` (and
    `name@v2:1a2b3c` by the hyperparameters' id within one version), so results of different
    code or settings are never averaged together."""
    runs = list(runs)
    configs: dict[str, set[tuple[int, str]]] = {}
    for r in runs:
        configs.setdefault(row_name(r), set()).add((r.method.version, hyperparameter_id(r)))
    names = {}
    for r in runs:
        name, mixed = row_name(r), configs[row_name(r)]
        if len(mixed) > 1:
            name += f"@v{r.method.version}"
            if sum(v == r.method.version for v, _ in mixed) > 1:
                name += f":{hyperparameter_id(r)}"
        names[id(r)] = name
    return names


def completeness(runs: list[RunResult]) -> tuple[int, int, list[int]]:
    """(finished, asked, missing) seeds of one method's runs: asked is every seed the runs'
    sweeps asked for (the protocol's seeds for files that predate `sweep_seeds`)."""
    asked = {s for r in runs for s in r.asked_seeds()}
    finished = {r.seed for r in runs if r.ok}
    return len(finished & asked) if asked else len(finished), len(asked), sorted(asked - finished)


def not_applicable(runs: list[RunResult]) -> str | None:
    """Why a method cannot run on the protocol (e.g. it needs coarse labels the dataset lacks),
    when every one of its runs says so; None otherwise."""
    if runs and all(r.status == "not_applicable" for r in runs):
        return runs[0].failure or "not applicable"
    return None


def per_seed(runs: Iterable[RunResult], metric: str) -> dict[str, dict[int, float]]:
    """row name (see row_names) -> {seed: value} over the finished runs that report `metric`."""
    runs = list(runs)
    names = row_names(runs)
    out: dict[str, dict[int, float]] = {}
    for r in runs:
        if r.ok and metric in (r.metrics or {}):
            out.setdefault(names[id(r)], {})[r.seed] = float(r.metrics[metric])
    return out


def row_means(runs: list[RunResult]) -> tuple[str, dict[str, float]]:
    """The protocol's main metric and each row's mean over its finished seeds."""
    metric = main_metric(runs)
    values = per_seed(runs, metric)
    return metric, {row: sum(v.values()) / len(v) for row, v in values.items() if v}


def bootstrap_half_width(runs: Iterable[RunResult], metric: str) -> float | None:
    """The mean over seeds of the half-width of each run's bootstrap interval over test
    queries on `metric` (how much the test set alone moves it); None when no run has one."""
    halves = [(hi - lo) / 2 for r in runs if r.ok and r.bootstrap
              for lo, hi in [r.bootstrap.get("intervals", {}).get(metric, (math.nan,) * 2)]
              if not math.isnan(lo)]  # fmt: skip
    return sum(halves) / len(halves) if halves else None


def main_metric(runs: list[RunResult]) -> str:
    """The protocol's main metric: what its model selection uses (map@r unless it says)."""
    content = runs[0].protocol.content or {}
    return (content.get("evaluation") or {}).get("select_by") or "map@r"


def pretrained(runs: list[RunResult]) -> bool:
    """Whether the runs' protocol starts from pretrained weights (backbone.pretrained)."""
    content = (runs[0].protocol.content or {}) if runs else {}
    return ((content.get("backbone") or {}).get("pretrained") or "none") != "none"


def untrained_row(runs: list[RunResult]) -> str | None:
    """The one row whose finished runs trained no step (a pretrained backbone's zero-shot
    features, or random weights from scratch): the reference a method has to beat. None
    unless exactly one row is such."""
    names = row_names(runs)
    steps: dict[str, set[int | None]] = {}
    for r in runs:
        if r.ok:
            steps.setdefault(names[id(r)], set()).add(r.training.steps)
    rows = [name for name, s in steps.items() if s == {0}]
    return rows[0] if len(rows) == 1 else None


def zero_shot_row(runs: list[RunResult]) -> str | None:
    """Under a pretrained backbone, the row that trained no step (untrained_row): the
    pretrained network's own features with no metric learning, which a method has to beat.
    None for a protocol trained from scratch, or unless exactly one row is such."""
    return untrained_row(runs) if pretrained(runs) else None


def full_budget(runs: Iterable[RunResult]) -> list[RunResult]:
    """The runs of the whole budget (not shortened by --max-steps)."""
    return [r for r in runs if r.training is None or r.training.max_steps is None]


def protocol_groups(runs: list[RunResult], tuned: bool = False) -> dict[str, list[RunResult]]:
    """The full-budget (no --max-steps), paper-default runs (with `tuned`, the `+tuned` runs
    too) of each protocol, by its name;
    a protocol with runs of several versions (hashes) gives one group per version, named
    `name v2 (hash)`, as the leaderboard gives each its own table: their numbers are never
    pooled into one ranking."""
    by_key: dict[tuple[str, int, str], list[RunResult]] = {}
    for r in runs:
        if r.training.max_steps is None and (tuned or not r.tuning):
            key = (r.protocol.name, r.protocol.version, r.protocol.hash)
            by_key.setdefault(key, []).append(r)
    versions: dict[str, int] = {}
    for name, _, _ in by_key:
        versions[name] = versions.get(name, 0) + 1
    return {name if versions[name] == 1 else f"{name} v{version} ({hash_})": group
            for (name, version, hash_), group in by_key.items()}  # fmt: skip


def tuned_view(runs: list[RunResult]) -> tuple[list[RunResult], dict[int, str]]:
    """The tuned ranking's runs and their rows (run id -> row, the default row's name): each
    method's `+tuned` runs where at least one finished, else its default runs. The one rule
    every tuned figure, table and claim applies."""
    names = row_names(runs)
    row = {id(r): names[id(r)].replace(TUNED, "", 1) for r in runs}
    tuned_rows = {row[id(r)] for r in runs if r.tuning and r.ok}
    kept = [
        r for r in runs if (r.tuning and r.ok) or (not r.tuning and row[id(r)] not in tuned_rows)
    ]
    return kept, {id(r): row[id(r)] for r in kept}


def tuned_values(
    runs: list[RunResult], metric: str
) -> tuple[dict[str, dict[int, float]], dict[str, dict[int, float]], dict[str, str]]:
    """(default, tuned, notes): each method's per-seed values at its paper defaults and in
    the tuned ranking (`tuned_view`), keyed by the default row's name, and for each row that
    ranks with its default values, or has no default ones, a note saying why."""
    values = per_seed(runs, metric)
    default = {n: v for n, v in values.items() if TUNED not in n}
    kept, rows = tuned_view(runs)
    ranked: dict[str, dict[int, float]] = {}
    for r in kept:
        if r.ok and metric in (r.metrics or {}):
            ranked.setdefault(rows[id(r)], {})[r.seed] = float(r.metrics[metric])
    method_of = {rows[id(r)]: r.method.name for r in kept}
    tuned_rows = {rows[id(r)] for r in kept if r.tuning}
    tuned, notes = {}, {}
    for name in sorted(ranked):
        tuned[name] = ranked[name]
        if name not in tuned_rows:
            notes[name] = _why_untuned(method_of[name])
        elif name not in default:
            notes[name] = "no paper-default runs"
    return default, tuned, notes


def _why_untuned(method: str) -> str:
    """Why a method has no tuned runs, from its registry entry where it is registered."""
    load_methods()  # `leaderboard` does not load them up front: only a tuned table asks
    spec = METHODS.get(method) if method in METHODS else None
    if spec is not None and not spec.search:
        return "not tuned: no search space"
    return "not tuned yet"
