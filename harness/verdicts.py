"""Which method is better, and how sure: per-seed values of a metric from result files, the
comparison of two methods (`harness compare`), and the leaderboard's marks of the methods not
significantly different from the best (tests against the best's seeds, Benjamini-Hochberg)."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from collections.abc import Iterable
from pathlib import Path

from harness.errors import HarnessError
from harness.metrics.inputs import SINGLE_METRICS, UNBOUNDED_METRICS, is_single_metric
from harness.registry import closest
from harness.results import RunResult, load_results
from harness.stats import CONFIDENCE, Comparison, benjamini_hochberg, compare, t_interval

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


def add_parser(sub: argparse._SubParsersAction) -> None:
    cmp = sub.add_parser("compare", help="is method A better than method B? (difference, CI, p)")
    cmp.add_argument("a", metavar="A", help="method (NAME+tuned for its tuned configuration)")
    cmp.add_argument("b", metavar="B")
    cmp.add_argument("--protocol", default="default", help="protocol name or YAML path")
    cmp.add_argument("--metric", help="default: the protocol's main metric (evaluation.select_by)")
    cmp.add_argument("--results-dir", default="results")
    cmp.add_argument("--max-steps", type=int, help="compare runs capped at this --max-steps "
                     "(default: full runs only)")  # fmt: skip


def cmd_compare(args: argparse.Namespace) -> int:
    from harness.protocol import load_protocol

    protocol = load_protocol(args.protocol)
    metric = args.metric or protocol.evaluation.select_by
    if not is_single_metric(metric):
        raise HarnessError(f"unknown metric {metric!r}{closest(metric, SINGLE_METRICS)}; known: "
                           f"recall@<k> (e.g. recall@1), {', '.join(SINGLE_METRICS)}")  # fmt: skip
    everything = [
        r for r in load_results(Path(args.results_dir)) if r.protocol.hash == protocol.hash
    ]
    runs = [r for r in everything if r.training.max_steps == args.max_steps]
    capped = sorted({r.training.max_steps for r in everything} - {None, args.max_steps})
    values = per_seed(runs, metric)
    for name in (args.a, args.b):
        split = sorted(n for n in values if n.startswith(f"{name}@"))
        if name not in values and split:
            raise HarnessError(
                f"the {protocol.name} runs of {name!r} differ in method version or "
                f"hyperparameters and are never averaged: compare one of {', '.join(split)}"
            )
        if name not in values:
            raise HarnessError(
                f"no finished {protocol.name} run of {name!r} reports {metric} under "
                f"{args.results_dir} (protocol hash {protocol.hash}){closest(name, values)}; "
                f"run `harness run --protocol {protocol.name} --method {name.split('+')[0].split('@')[0]}` first"
                + (
                    f" (runs capped by --max-steps {', '.join(map(str, capped))} exist: pass "
                    "compare the same --max-steps)"
                    if capped
                    else ""
                )
            )
    a, b = values[args.a], values[args.b]
    scale = 1.0 if metric in UNBOUNDED_METRICS else 100.0  # a ratio is shown as is
    cap = "" if args.max_steps is None else f", runs capped at {args.max_steps} steps"
    print(f"{metric} on {protocol.name} (protocol v{protocol.version}, hash {protocol.hash}{cap})")
    for name, v in ((args.a, a), (args.b, b)):
        mean, half = t_interval(list(v.values()))
        spread = "" if math.isnan(half) else f" ± {half * scale:.2f}"
        print(f"  {name}: {mean * scale:.2f}{spread} ({len(v)} seed{'s' * (len(v) != 1)}: "
              f"{', '.join(map(str, sorted(v)))})")  # fmt: skip
    print(f"  {args.a} − {args.b}: {describe(compare(a, b), scale)}")
    return 0
