"""The user's leaderboard beside the committed reference: for each protocol both have, each
method's result next to the reference's, so that a fresh clone's `run --all` shows its own
numbers and the committed ones together without ever rewriting the committed files.

The reference is the results folder inside the results folder (results/reference, see
harness.records.reference_dir): the user's runs go to results/runs, the committed ones stay
in results/reference/runs. Numbers are set side by side only under one protocol hash (the
same data, model, budget and evaluation); runs shortened by --max-steps are never compared.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from harness.check import same_metrics
from harness.core import UNBOUNDED_METRICS
from harness.records import (
    RunResult,
    describe,
    full_budget,
    load_results,
    main_metric,
    reference_dir,
    row_names,
)
from harness.stats import t_interval

INTRO = (
    "The committed reference results ([its leaderboard]({link}/LEADERBOARD.md), made by the "
    "project and never written by your runs) beside the runs above, for the protocols both "
    "have: each method's mean over seeds of the main metric, here and there, and the mean "
    "difference over the seeds both ran (over all seeds when they share none). Only runs of "
    "one protocol hash are set side by side; runs shortened by `--max-steps` are not compared. "
    "`per seed` says whether the seeds both ran gave the same numbers (every metric, to 1e-12). "
    "On the processor type that made the reference they reproduce bit for bit; another "
    "processor type rounds floats differently and training amplifies that into seed-noise-sized "
    "differences (compare `here − reference` with the ± intervals), which is expected, not an "
    "error."
)


def reference_section(results_dir: Path, runs: Iterable[RunResult] | None = None) -> str:
    """Markdown: the runs of `results_dir` (or `runs`) beside its committed reference, for
    the protocols both have; empty when there is no reference or no protocol in common."""
    ref_dir = reference_dir(results_dir)
    if ref_dir is None or not (ref_dir / "runs").is_dir():
        return ""
    mine = full_budget(runs if runs is not None else load_results(results_dir))
    theirs = full_budget(load_results(ref_dir))
    common = sorted({r.protocol.name for r in mine} & {r.protocol.name for r in theirs})
    if not common:
        return ""
    link = ref_dir.relative_to(results_dir).as_posix()
    lines = ["", "## Against the committed reference", "", INTRO.format(link=link)]
    for name in common:
        here = [r for r in mine if r.protocol.name == name]
        there = [r for r in theirs if r.protocol.name == name]
        lines += _protocol_part(name, here, there)
    return "\n".join(lines) + "\n"


def _protocol_part(name: str, here: list[RunResult], there: list[RunResult]) -> list[str]:
    """One protocol: a table per hash both have, a line for each hash only one side has."""
    lines = []
    mine, theirs = {r.protocol.hash for r in here}, {r.protocol.hash for r in there}
    for hash_ in sorted(mine & theirs):
        a = [r for r in here if r.protocol.hash == hash_]
        b = [r for r in there if r.protocol.hash == hash_]
        lines += ["", f"### {name} (hash `{hash_}`)", "", *_machines(a, b), "", _table(a, b)]
    only_mine, only_theirs = sorted(mine - theirs), sorted(theirs - mine)
    if only_mine:
        lines += ["", f"Not compared: the {name} runs here have protocol hash "
                  f"{', '.join(f'`{h}`' for h in only_mine)}, the reference's "
                  f"{', '.join(f'`{h}`' for h in sorted(theirs))}: another protocol (an edited "
                  "file, another version, --precision), whose numbers are not comparable."]  # fmt: skip
    elif only_theirs and not mine & theirs:
        lines += ["", f"Not compared: no {name} run here has the reference's protocol hash."]
    return lines


def _machines(here: list[RunResult], there: list[RunResult]) -> list[str]:
    """Where each side was made, and whether that is the same processor type."""

    def prints(runs: list[RunResult]) -> dict[str, str]:
        return {fp.get("id", "?"): describe(fp) for r in runs
                if r.environment is not None and (fp := r.environment.fingerprint)}  # fmt: skip

    mine, theirs = prints(here), prints(there)
    same = bool(mine) and set(mine) == set(theirs)
    verdict = (
        "the same machine fingerprint: the numbers should match bit for bit"
        if same
        else "another machine fingerprint: the numbers may differ by seed-noise amounts (a "
        "processor of the same type often still reproduces them bit for bit: see `per seed`)"
    )
    return [
        f"Here: {'; '.join(mine.values()) or 'unknown machine'}. Reference: "
        f"{'; '.join(theirs.values()) or 'unknown machine'}. {verdict[0].upper()}{verdict[1:]}."
    ]


def _table(here: list[RunResult], there: list[RunResult]) -> str:
    """One row per method configuration run here (named over both sides, so that another
    method version or other hyperparameters never share a row): finished seeds, the main
    metric on each side, the difference of the means, and whether the shared seeds
    reproduced."""
    main = main_metric(there or here)
    scale, unit = (1.0, "") if main in UNBOUNDED_METRICS else (100.0, " (%)")
    names = row_names([*here, *there])
    rows = []
    for row in sorted({names[id(r)] for r in here}):  # the methods run here, not all of theirs
        a = [r for r in here if names[id(r)] == row and r.ok]
        b = [r for r in there if names[id(r)] == row and r.ok]
        va = {r.seed: float(r.metrics[main]) for r in a if main in (r.metrics or {})}
        vb = {r.seed: float(r.metrics[main]) for r in b if main in (r.metrics or {})}
        shared = sorted(set(va) & set(vb))
        if shared:  # paired: seed k here against seed k there, so seed noise cancels
            diff = f"{_mean([va[k] - vb[k] for k in shared]) * scale:+.1f}"
        else:
            diff = f"{(_mean(list(va.values())) - _mean(list(vb.values()))) * scale:+.1f}"
        diff = diff if va and vb else "-"
        rows.append({
            "method": row,
            "seeds here": len(a),
            "seeds reference": len(b),
            f"{main} here{unit}": _cell(list(va.values()), scale),
            f"{main} reference{unit}": _cell(list(vb.values()), scale),
            "here − reference": diff,
            "per seed": _same_seeds(a, b),
        })  # fmt: skip
    return tabulate(pd.DataFrame(rows), headers="keys", tablefmt="github", showindex=False,
                    disable_numparse=True)  # fmt: skip


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _cell(values: list[float], scale: float) -> str:
    """`mean ± h` (95 % t-interval over seeds), the value alone for one seed, `-` for none."""
    if not values:
        return "-"
    mean, half = t_interval(values)
    digits = 1 if scale == 100.0 else 2
    if math.isnan(half):
        return f"{mean * scale:.{digits}f}"
    return f"{mean * scale:.{digits}f} ± {half * scale:.{digits}f}"


def _same_seeds(here: list[RunResult], there: list[RunResult]) -> str:
    """`identical (seeds 0, 1, 2)` when every metric of every seed both ran is the same number
    (harness.check's exact rule), `differs (...)` otherwise, `no seed in common` when they
    share none."""
    by_seed = {r.seed: r for r in there}
    shared = sorted(r.seed for r in here if r.seed in by_seed)
    if not shared:
        return "no seed in common"
    mine = {r.seed: r for r in here}
    same = all(same_metrics(mine[s].metrics or {}, by_seed[s].metrics or {}) for s in shared)
    seeds = f"seed{'s' * (len(shared) > 1)} {', '.join(map(str, shared))}"
    return f"{'identical' if same else 'differs'} ({seeds})"
