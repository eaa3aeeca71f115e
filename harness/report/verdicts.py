"""Which method is better, and how sure: per-seed values of a metric from result files, the
comparison of two methods (`harness compare`), and the leaderboard's marks of the methods not
significantly different from the best (tests against the best's seeds, Benjamini-Hochberg)."""

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
    tests = {n: compare(values[best], values[n]) for n in means if n != best}
    adjusted = benjamini_hochberg({n: c.p for n, c in tests.items()})
    marks = {best: "best"}
    for name, p in adjusted.items():
        if math.isnan(p):
            marks[name] = f"{min(len(values[name]), len(values[best]))} seed: untested"
        elif p >= ALPHA:
            marks[name] = f"≈ best (p = {p:.2g})"
        else:
            marks[name] = f"below (p = {p:.2g})"
    return best, marks


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
