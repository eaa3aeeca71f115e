"""The seed papers' claims that a protocol can test: one row per claimed ordering (`A > B`, A
retrieves better), the paper's own recall@1 of both methods and what it was measured on, ours
(the difference A - B over the seeds both ran, with its paired 95 % t-interval, in recall@1
and MAP@R), and a verdict on recall@1: `holds` (A above B, significant), `reversed` (B above
A, significant) or `cannot tell`, by the leaderboard's paired t-test with the p-values
Benjamini-Hochberg-adjusted over the claims.

The claims are data, `protocols/reference/claims.yaml` (harness.core.reference reads them; they
name methods, which the code does not): e.g. lifted structure above contrastive and triplet (Song et al. 2016, with PDDM's Table
1 numbers on CUB-200), PDDM's quadruplet and score variants above lifted structure, HDC's
cascade above each of its heads (the result's metrics_by_part), Karaman et al.'s two
quadruplet selections above random selection. The section shows under a protocol on a
pretrained backbone where both methods of at least one claim have finished runs; a claim with
a method not run says which.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
from tabulate import tabulate

from harness.core import Claim, HarnessError, load_claims, paper_results
from harness.records import RunResult, pretrained, row_names, tuned_view
from harness.report.verdicts import ALPHA
from harness.stats import benjamini_hochberg, compare

METRIC = "recall@1"  # what the papers' tables give, and what the verdict is on
ALSO = "map@r"  # shown beside it
EACH_PART = " / *"


def _values(
    runs: list[RunResult], names: dict[int, str], side: str, metric: str
) -> dict[int, float]:
    """seed -> value of `side` (a row, or `row / part`) over its finished runs."""
    row, _, part = side.partition(" / ")
    out = {}
    for r in runs:
        if r.ok and names[id(r)] == row:
            scores = (r.metrics_by_part or {}).get(part) if part else r.metrics
            if scores and metric in scores:
                out[r.seed] = float(scores[metric])
    return out


def _expanded(
    claims: tuple[Claim, ...], runs: list[RunResult], names: dict[int, str]
) -> list[Claim]:
    """The claims with each `row / *` replaced by one claim per part the row's runs record
    (kept as it is when they record none)."""
    out = []
    for claim in claims:
        row = claim.worse.removesuffix(EACH_PART)
        parts = sorted({part for r in runs if names[id(r)] == row
                        for part in (r.metrics_by_part or {})})  # fmt: skip
        if row == claim.worse or not parts:
            out.append(claim)
        else:
            out += [replace(claim, worse=f"{row} / {part}") for part in parts]
    return out


def _published(claim: Claim) -> str:
    """The paper's recall@1 of both methods (`47.2 vs 26.4`), or its words."""
    if claim.numbers is None:
        return f'"{claim.text}"' if claim.text else "-"
    try:
        _, table = paper_results(*claim.numbers)
        return f"{table[claim.better][METRIC]} vs {table[claim.worse][METRIC]}"
    except (KeyError, HarnessError):
        return f"(not in {claim.numbers[0]} / {claim.numbers[1]})"


def _difference(a: dict[int, float], b: dict[int, float]) -> str:
    """a - b in points: `+3.1 [+0.5, +5.7]` (its 95 % interval), `-` when a side is empty."""
    if not a or not b:
        return "-"
    c = compare(a, b)
    if math.isnan(c.half_width):
        return f"{100 * c.difference:+.1f} (1 seed)"
    lo, hi = c.difference - c.half_width, c.difference + c.half_width
    return f"{100 * c.difference:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def claim_rows(runs: list[RunResult]) -> list[dict[str, str]]:
    """One row per claim (see the module's docstring); empty unless both methods of at least
    one claim have finished runs here. With `+tuned` runs, each claim is judged again on the
    tuned ranking (each method's tuned runs, or its default ones where it has none): `tuned:
    Δ` and `tuned verdict`, which says when a claim holds only untuned, or only tuned."""
    default = [r for r in runs if not r.tuning]  # the papers' claims are at their defaults
    names = row_names(default)
    claims = _expanded(load_claims(), default, names)
    judged = _judged(default, names, claims)
    if judged is None:
        return []
    tuned = _judged(*tuned_view(runs), claims) if any(r.tuning for r in runs) else None
    rows = []
    for i, claim in enumerate(claims):
        row = {
            "claim": f"{claim.better} > {claim.worse}",
            "whose": claim.who,
            f"paper {METRIC} (%)": _published(claim),
            "paper's data": claim.where,
            f"ours: Δ {METRIC}": judged[i][0],
            f"ours: Δ {ALSO}": judged[i][1],
            "verdict": judged[i][2],
        }  # fmt: skip
        if tuned is not None:
            before, after = (j[i][2].startswith("holds") for j in (judged, tuned))
            row[f"tuned: Δ {METRIC}"] = tuned[i][0]
            row["tuned verdict"] = tuned[i][2] + ("; holds only untuned" if before and not after
                                                  else "; holds only tuned" if after and not before
                                                  else "")  # fmt: skip
        rows.append(row)
    return rows


def _judged(runs: list[RunResult], names: dict[int, str], claims: list[Claim]
            ) -> list[tuple[str, str, str]] | None:  # fmt: skip
    """Per claim, on these runs: (A − B in METRIC, in ALSO, the verdict), the p-values
    Benjamini-Hochberg-adjusted over the claims; None when no claim has both methods run."""
    sides = [(c.better, c.worse) for c in claims]
    values = [[_values(runs, names, side, METRIC) for side in pair] for pair in sides]
    tests = {i: compare(a, b) for i, (a, b) in enumerate(values) if a and b}
    if not tests:
        return None
    adjusted = benjamini_hochberg({str(i): c.p for i, c in tests.items()})
    out = []
    for i, pair in enumerate(sides):
        missing = [side for side, v in zip(pair, values[i], strict=True) if not v]
        also = _difference(*[_values(runs, names, side, ALSO) for side in pair])
        out.append((_difference(*values[i]), also,
                    f"cannot tell (not run: {', '.join(missing)})" if missing
                    else _verdict(tests[i].difference, adjusted[str(i)])))  # fmt: skip
    return out


def _verdict(difference: float, p: float) -> str:
    if math.isnan(p):
        return "cannot tell (1 seed)"
    if p >= ALPHA:
        return f"cannot tell (p = {p:.2g})"
    return f"{'holds' if difference > 0 else 'reversed'} (p = {p:.2g})"


def claims_section(runs: list[RunResult]) -> list[str]:
    """The protocol section's table of the seed papers' claims, under a pretrained backbone
    (see the module's docstring); empty elsewhere."""
    rows = claim_rows(runs) if runs and pretrained(runs) else []
    if not rows:
        return []
    table = tabulate(pd.DataFrame(rows), headers="keys", tablefmt="github", showindex=False,
                     disable_numparse=True)  # fmt: skip
    return [
        "### What the seed papers claim, tested here", "",
        f"Each row is an ordering a seed paper claims (`A > B`: A retrieves better), the "
        f"paper's own {METRIC} of both methods (or its words) and what it was measured on, then "
        f"ours: A − B in points over the seeds both ran, with its paired 95 % t-interval, in "
        f"{METRIC} and {ALSO}. The verdict is on {METRIC}, by the paired t-test of `vs best`, "
        "p-values Benjamini-Hochberg-adjusted over the claims: `holds` (A significantly above "
        "B at 5 %), `reversed` (B significantly above A), `cannot tell` (the seeds cannot "
        "order them, or a method has not run here). `method / head1` is one part of a "
        "composite embedding scored alone. Our data, backbone and budget differ from each "
        "paper's: a verdict says whether the ordering carries over, not whether the paper's "
        "numbers reproduce.",
        "", table, "",
    ]  # fmt: skip


def claims_across(groups: dict[str, list[RunResult]]) -> list[dict[str, str]]:
    """One row per claim, one verdict per real-photo protocol (a protocol on a pretrained
    backbone where the claim's methods ran): does each ordering hold on birds, cars and
    groceries alike? Empty with fewer than two such protocols."""
    per = {name: claim_rows(g) for name, g in sorted(groups.items()) if g and pretrained(g)}
    per = {name: rows for name, rows in per.items() if rows}
    if len(per) < 2:
        return []
    first = next(iter(per.values()))
    out = []
    for i, row in enumerate(first):
        line = {"claim": row["claim"], "whose": row["whose"], "paper's data": row["paper's data"]}
        for name, rows in per.items():
            line[f"{name}: Δ {METRIC}"] = rows[i][f"ours: Δ {METRIC}"]
            line[name] = rows[i]["verdict"]
            if "tuned verdict" in rows[i]:
                line[f"{name}, tuned"] = rows[i]["tuned verdict"]
        out.append(line)
    return out


def claims_across_section(groups: dict[str, list[RunResult]]) -> str:
    """The leaderboard's section gathering the claims over every real-photo protocol."""
    rows = claims_across(groups)
    if not rows:
        return ""
    names = [k for k in rows[0] if k not in ("claim", "whose", "paper's data")
             and not k.endswith((f"Δ {METRIC}", ", tuned"))]  # fmt: skip
    table = tabulate(pd.DataFrame(rows), headers="keys", tablefmt="github", showindex=False,
                     disable_numparse=True)  # fmt: skip
    return "\n".join([
        "", "## The seed papers' claims on every real-photo protocol", "",
        f"Each claim's verdict on {METRIC} per protocol ({', '.join(names)}), as each "
        "protocol's own claims table gives it (paired t-tests over the seeds both methods ran, "
        "Benjamini-Hochberg-adjusted within the protocol), with A − B in points and its 95 % "
        "interval. A claim that holds on one dataset and not another is a finding about the "
        "data, not only about the method.", "", table, "",
    ])  # fmt: skip
