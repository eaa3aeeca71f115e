"""Which method is better, and how sure: per-seed values of a metric from result files, the
comparison of two methods (`harness compare`), and the leaderboard's marks of the methods not
significantly different from the best (tests against the best's seeds, Benjamini-Hochberg)
and, under a pretrained backbone, above or below the zero-shot row (the same tests)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable

from harness.core import CONFIDENCE, Comparison, benjamini_hochberg, compare
from harness.records import RunResult

ALPHA = 0.05


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


def per_seed(runs: Iterable[RunResult], metric: str) -> dict[str, dict[int, float]]:
    """row name (see row_names) -> {seed: value} over the finished runs that report `metric`."""
    runs = list(runs)
    names = row_names(runs)
    out: dict[str, dict[int, float]] = {}
    for r in runs:
        if r.ok and metric in (r.metrics or {}):
            out.setdefault(names[id(r)], {})[r.seed] = float(r.metrics[metric])
    return out


def against_best(values: dict[str, dict[int, float]]) -> tuple[str | None, dict[str, str]]:
    """The best row by mean, and per row a mark: `best`, `≈ best (p = …)` when the
    test against the best, Benjamini-Hochberg-adjusted over the rows, does not reject at 5 %,
    `below (p = …)` when it does,
    or `1 seed: untested`."""
    means = {name: sum(v.values()) / len(v) for name, v in values.items() if v}
    if not means:
        return None, {}
    best = max(means, key=lambda n: means[n])
    return best, against({n: values[n] for n in means}, best, "best")


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


def zero_shot_label(row: str) -> str:
    """How the leaderboard names the zero-shot row: `row (zero-shot)`."""
    return f"{row} (zero-shot)"


def against(
    values: dict[str, dict[int, float]], reference: str, label: str
) -> dict[str, str]:  # fmt: skip
    """Per row, a mark against the `reference` row, by the tests of `against_best` (p-values
    Benjamini-Hochberg-adjusted over the rows): `above (p = …)` or `below (p = …)` where
    the test rejects at 5 %, `≈ {label} (p = …)` where it does not, `{label}` for the
    reference itself, `n seed: untested` where a side has one seed."""
    tests = {n: compare(v, values[reference]) for n, v in values.items() if n != reference and v}
    adjusted = benjamini_hochberg({n: c.p for n, c in tests.items()})
    marks = {reference: label}
    for name, p in adjusted.items():
        if math.isnan(p):
            marks[name] = f"{min(len(values[name]), len(values[reference]))} seed: untested"
        elif p >= ALPHA:
            marks[name] = f"≈ {label} (p = {p:.2g})"
        else:
            marks[name] = f"{'above' if tests[name].difference > 0 else 'below'} (p = {p:.2g})"
    return marks


def describe(c: Comparison, scale: float = 100.0) -> str:
    if c.test == "none":
        return (f"difference {c.difference * scale:+.2f}; no test: a method has only one "
                "finished seed (run more seeds: --seeds 0,1,2)")  # fmt: skip
    lo, hi = (c.difference - c.half_width) * scale, (c.difference + c.half_width) * scale
    unit = " points" if scale == 100.0 else ""
    return (f"difference {c.difference * scale:+.2f}{unit}, {CONFIDENCE:.0%} CI "
            f"[{lo:+.2f}, {hi:+.2f}] ({c.test} test, n = {c.n}), p = {c.p:.3g}")  # fmt: skip


def main_metric(runs: list[RunResult]) -> str:
    """The protocol's main metric: what its model selection uses (map@r unless it says)."""
    content = runs[0].protocol.content or {}
    return (content.get("evaluation") or {}).get("select_by") or "map@r"
