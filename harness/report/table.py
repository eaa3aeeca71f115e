"""One protocol's table of the leaderboard: a row per method with its seeds and each metric's
mean and 95 % t-interval over seeds, ranked by the protocol's main metric (incomplete rows
last), with the `vs best` marks (paired t-tests, Benjamini-Hochberg), the `P(worse · ≈ ·
better)` columns and, under a pretrained backbone, the marks against the zero-shot row; and
the small tables beside it (the parts of composite embeddings, the methods' diagnostics).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
from tabulate import tabulate

from harness.core import UNBOUNDED_METRICS
from harness.records import (
    RunResult,
    bootstrap_half_width,
    completeness,
    main_metric,
    not_applicable,
    per_seed,
    row_names,
    zero_shot_row,
)
from harness.report.verdicts import against, against_best, within, zero_shot_label
from harness.stats import t_interval

METRIC_ORDER = ("recall@", "precision@1", "r_precision", "map@r", "map", "nmi", "f1", "lda")


def _metric_key(name: str) -> tuple[int, int]:
    for rank, prefix in enumerate(METRIC_ORDER):
        if name == prefix or (prefix.endswith("@") and name.startswith(prefix)):
            return rank, int(name.split("@")[1]) if prefix == "recall@" else 0
    return len(METRIC_ORDER), 0


def _mean_std(values: pd.Series, scale: float, digits: int) -> str:
    """`mean ± h`, h the half-width of the 95 % t-interval over seeds; one seed: the value."""
    values = values.dropna()
    if values.empty:
        return "-"
    mean, half = t_interval(values.tolist())
    if math.isnan(half):
        return f"{mean * scale:.{digits}f}"
    return f"{mean * scale:.{digits}f} ± {half * scale:.{digits}f}"


def _row(r: RunResult, name: str, metrics: dict[str, float]) -> dict[str, Any]:
    return {"method": name, "seed": r.seed, "status": r.status, **metrics, "failure": r.failure}


def _seeds_cell(runs: list[RunResult]) -> tuple[int | str, list[int]]:
    """`3` for a complete row; `2/3 (incomplete)` when seeds asked for have not finished
    (returned with the missing seeds; none for a complete row)."""
    finished, asked, missing = completeness(runs)
    if not missing:
        return sum(r.ok for r in runs), []
    return f"{finished}/{asked} (incomplete)", missing


def leaderboard_table(
    runs: list[RunResult], ranked: bool = True, parts: bool = False,
    names: dict[int, str] | None = None,
) -> str:  # fmt: skip
    """leaderboard_frame as a GitHub markdown table."""
    table = leaderboard_frame(runs, ranked, parts, names)
    return tabulate(
        table, headers="keys", tablefmt="github", showindex=False, disable_numparse=True
    )


def leaderboard_frame(
    runs: list[RunResult], ranked: bool = True, parts: bool = False,
    names: dict[int, str] | None = None,
) -> pd.DataFrame:  # fmt: skip
    """One row per method (mean +- std over its seeds), best first unless not `ranked`; a row
    with unfinished seeds is marked and ranked below every complete row. With `parts`, one
    row per method and part of a composite embedding, named `method / part`. `names`: each
    run's row name (row_names; default: over `runs`). Cells are the leaderboard's strings
    (the markdown table and the HTML report show this frame)."""
    rows, by_name = [], {}
    names = names or row_names(runs)
    for r in runs:
        row = names[id(r)]
        named = ([(f"{row} / {part}", m) for part, m in (r.metrics_by_part or {}).items()]
                 if parts else [(row, r.metrics or {})])  # fmt: skip
        for name, metrics in named:
            rows.append(_row(r, name, metrics))
            by_name.setdefault(name, []).append(r)
    df = pd.DataFrame(rows)
    metrics = sorted(
        (c for c in df.columns if _metric_key(c)[0] < len(METRIC_ORDER)), key=_metric_key
    )
    main = main_metric(runs)
    if main in metrics:  # the main metric first: the table ranks by it
        metrics = [main] + [m for m in metrics if m != main]
    out = [_line(method, group, metrics, by_name[method])
           for method, group in df.groupby("method", sort=False)]  # fmt: skip
    if not parts and main in metrics:
        values, best = _mark_against_best(out, runs, main)
        _mark_equivalence(out, runs, values, best)
        _mark_against_zero_shot(out, runs, main)
    for line in out:  # a method that cannot run on the protocol is no incomplete row
        if line.pop("_na"):
            line.update({k: "n/a" for k, v in line.items() if v == "incomplete: untested"})
    if ranked:  # complete rows first, each part best first (stable: ties keep their order)
        out.sort(key=lambda line: (not line["_complete"], -_finite(line["_sort"])))
    table = pd.DataFrame(out).drop(columns=["_sort", "_complete"])
    if parts:  # the bootstrap was made for the whole embedding, not for each part
        table = table.drop(columns=[c for c in table.columns if c.startswith("test-set")])
    first = ["method", "seeds", *_verdict_columns(list(table.columns))]
    if metrics:
        main_col = next(c for c in table.columns if c.startswith(metrics[0]))
        first += [main_col, *[c for c in table.columns if c.startswith("test-set")]]
    table = table[first + [c for c in table.columns if c not in first]]
    if not (table["notes"] != "").any():
        table = table.drop(columns="notes")
    if _same_column(table, "precision@1 (%)", "recall@1 (%)"):  # all-vs-all: always equal
        table = table.drop(columns="precision@1 (%)")
    return table


def _verdict_columns(columns: list[str]) -> list[str]:
    """The `vs` columns, each followed by its `P(worse · ≈ · better)` column against the same
    row, then any `P(` column with no `vs` twin (against the untrained row)."""
    probs = [c for c in columns if c.startswith("P(")]
    out = []
    for c in (c for c in columns if c.startswith("vs ")):
        label = c.removeprefix("vs ").split(" (")[0]
        out += [c, *[p for p in probs if f" vs {label}," in p]]
    return out + [p for p in probs if p not in out]


def _same_column(table: pd.DataFrame, column: str, twin: str) -> bool:
    """Whether `column` repeats `twin` cell for cell (then the table shows `twin` alone)."""
    return column in table and twin in table and bool((table[column] == table[twin]).all())


def _finite(value: float) -> float:
    return value if value == value else -math.inf  # NaN ranks last


def _line(
    method: str, group: pd.DataFrame, metrics: list[str], runs: list[RunResult]
) -> dict[str, Any]:
    """One method's row: seeds, mean +- std of each metric, speed, and notes."""
    ok = group[group["status"] == "ok"]
    seeds, missing = _seeds_cell(runs)
    line: dict[str, Any] = {"method": method, "seeds": seeds}
    for name in metrics:
        if name in UNBOUNDED_METRICS:  # a ratio, not a fraction: as is, two decimals
            line[name] = _mean_std(ok[name], 1, 2) if name in ok else "-"
        else:
            line[f"{name} (%)"] = _mean_std(ok[name], 100, 1) if name in ok else "-"
    bad = group[group["status"] != "ok"]
    notes = [f"seed {s}: {st} ({f})"
             for s, st, f in bad[["seed", "status", "failure"]].itertuples(index=False)]  # fmt: skip
    if missing:
        notes.append(f"not finished: seed{'s' if len(missing) > 1 else ''} "
                     f"{', '.join(map(str, missing))}")  # fmt: skip
    line["notes"] = "; ".join(notes)
    if why := not_applicable(runs):  # no seed can run: one note, `n/a` for "incomplete"
        line.update(seeds="n/a", notes=f"not applicable: {why}")
    line["_na"] = bool(why)
    sort_metric = metrics[0] if metrics else None
    line["_sort"] = ok[sort_metric].mean() if sort_metric and not ok.empty else -1.0
    if sort_metric:
        half = bootstrap_half_width(runs, sort_metric)
        line[f"test-set ± ({sort_metric})"] = "-" if half is None else f"± {100 * half:.1f}"
    line["_complete"] = not missing
    return line


def _mark_against_best(
    lines: list[dict[str, Any]], runs: list[RunResult], main: str
) -> tuple[dict[str, dict[int, float]], str | None]:
    """Add the `vs best` column: which complete rows the tests cannot tell from the best.
    Returns the complete rows' per-seed values and the best row, which the other marks use."""
    complete = {line["method"] for line in lines if line["_complete"]}
    values = {n: v for n, v in per_seed(runs, main).items() if n in complete}
    best, marks = against_best(values)
    for line in lines:
        line[f"vs best ({main})"] = marks.get(line["method"], "incomplete: untested")
    return values, best


def _mark_equivalence(
    lines: list[dict[str, Any]], runs: list[RunResult],
    values: dict[str, dict[int, float]], best: str | None,
) -> None:  # fmt: skip
    """Add the `P(worse · ≈ · better)` columns (harness.report.verdicts.within) from the
    complete rows' per-seed `values`: against the `best`, and against the zero-shot or
    untrained row, at the protocol's ROPE."""
    for column, cells in within(values, best, runs).items():
        for line in lines:
            line[column] = cells.get(line["method"], "incomplete: untested")


def _mark_against_zero_shot(lines: list[dict[str, Any]], runs: list[RunResult], main: str) -> None:
    """Under a pretrained backbone with a zero-shot row (verdicts.zero_shot_row): the `vs
    zero-shot` column, each complete row tested against it as `vs best` tests against the
    best, and that row named `<row> (zero-shot)`."""
    zero = zero_shot_row(runs)
    if zero is None:
        return
    complete = {line["method"] for line in lines if line["_complete"]}
    values = {n: v for n, v in per_seed(runs, main).items() if n in complete}
    marks = against(values, zero, "zero-shot") if zero in values else {}
    for line in lines:
        untested = "untested: zero-shot incomplete" if line["_complete"] else "incomplete: untested"
        line[f"vs zero-shot ({main})"] = marks.get(line["method"], untested)
        if line["method"] == zero:
            line["method"] = zero_shot_label(zero)


def zero_shot_lines(group: list[RunResult]) -> list[str]:
    """The sentence above a table with a zero-shot row; none for other tables."""
    zero = zero_shot_row(group)
    if zero is None:
        return []
    return [
        f"`{zero_shot_label(zero)}` is the pretrained backbone's own features: it trained no "
        "step, no metric learning. `vs zero-shot` tests each complete row against it on the "
        "main metric as `vs best` does (paired t-test over seeds, Benjamini-Hochberg over the "
        "rows): `above` or `below` where the difference is significant at 5 %, `≈ zero-shot` "
        "where the seeds cannot tell the two apart.",
        "",
    ]  # fmt: skip


def diagnostics_table(runs: list[RunResult]) -> str:
    """Method-specific numbers a result records (`diagnostics`, e.g. a learned metric's AUC
    on test pairs beside the Euclidean distance's), mean ± t-interval over seeds."""
    values: dict[str, dict[str, list[float]]] = {}
    names = row_names(runs)
    for r in runs:
        for key, value in (getattr(r, "diagnostics", None) or {}).items():
            if r.ok and isinstance(value, (int, float)):
                values.setdefault(names[id(r)], {}).setdefault(key, []).append(float(value))
    if not values:
        return ""
    rows = [{"method": name, **{k: _mean_std(pd.Series(v), 1, 3) for k, v in sorted(d.items())}}
            for name, d in sorted(values.items())]  # fmt: skip
    table = pd.DataFrame(rows).fillna("-")
    return tabulate(table, headers="keys", tablefmt="github", showindex=False,
                    disable_numparse=True)  # fmt: skip


def parts_table(runs: list[RunResult]) -> str:
    """Each part of a composite embedding scored alone, one row per method and part, named
    `method / part`; empty when no run has parts."""
    with_parts = [r for r in runs if r.metrics_by_part]
    names = row_names(runs)  # the same row names as the main table
    return (
        leaderboard_table(with_parts, ranked=False, parts=True, names=names) if with_parts else ""
    )
