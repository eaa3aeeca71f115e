"""Your runs beside the committed reference runs, without rerunning them: `leaderboard
--reference DIR` and `compare A B --reference DIR`.

A new method (a plugin loss, say) needs its own 5 seeds only: the 28 built-in methods' runs
of the same protocol hash are committed under results/reference, made under the very hash
your runs carry. This module reads them as rows of one table, each marked `reference` with
the machine that made it.

Seeds pair as everywhere else, by the one rule of harness.core.pairing: seed k of your row
and seed k of a reference row share the initial weights and the batch order whatever
machines made them, so a test between the two is paired over the seeds both ran (the
machine is shown beside each row, never used to unpair); rows sharing fewer than two seeds
are compared unpaired (Welch's t-test, and the Welch posterior of the difference of the
means). Reference runs of another protocol hash are never set beside yours: the refusal
says which hashes each side has.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from harness.core import UNBOUNDED_METRICS, HarnessError, shared_seeds
from harness.records import (
    RunResult,
    describe,
    full_budget,
    load_results,
    main_metric,
    per_seed,
    row_names,
)
from harness.report.verdicts import ALPHA
from harness.stats import (
    Probs,
    benjamini_hochberg,
    compare,
    protocol_rope,
    seed_probs,
    t_interval,
    unpaired_probs,
)

MINE, THEIRS = "yours", "reference"


def committed_reference() -> Path:
    """The clone's committed reference results (results/reference beside harness/)."""
    return Path(__file__).resolve().parent.parent.parent / "results" / "reference"


@dataclass(frozen=True)
class Row:
    """One method configuration's seeds (seed -> value) from one side, and its machines."""

    name: str
    source: str
    values: dict[int, float]
    machines: frozenset[str]
    described: str


def reference_runs(reference: Path, mine: Iterable[RunResult]) -> list[RunResult]:
    """The runs of `reference` under the protocol hashes of `mine` (full budgets only). One
    line when the folder holds no results, or holds a protocol of yours under other hashes
    only (another version or an edited file: numbers that are not comparable)."""
    mine = full_budget(mine)
    theirs = _load(reference)
    kept = []
    for name in sorted({r.protocol.name for r in mine}):
        hashes = {r.protocol.hash for r in mine if r.protocol.name == name}
        kept += matching(theirs, reference, name, hashes)
    return kept


def _load(reference: Path) -> list[RunResult]:
    if not (Path(reference) / "runs").is_dir():
        raise HarnessError(f"--reference {reference}: no runs/ folder there: pass a results "
                           "folder that holds committed runs (default: results/reference)")  # fmt: skip
    return full_budget(load_results(Path(reference)))


def matching(theirs: list[RunResult] | Path, reference: Path, name: str,
             hashes: set[str]) -> list[RunResult]:  # fmt: skip
    """The reference runs of protocol `name` under one of `hashes`; a one-line refusal when
    it has runs of `name` under other hashes only."""
    theirs = _load(theirs) if isinstance(theirs, Path) else theirs
    there = [r for r in theirs if r.protocol.name == name]
    same = [r for r in there if r.protocol.hash in hashes]
    if there and not same:
        raise HarnessError(
            f"--reference {reference}: its {name} runs have protocol hash "
            f"{', '.join(sorted({r.protocol.hash for r in there}))}, yours "
            f"{', '.join(sorted(hashes))}: another protocol version or an edited file, whose "
            f"numbers are not comparable; run the shipped {name} protocol unchanged"
        )
    return same


def rows(mine: list[RunResult], theirs: list[RunResult], metric: str) -> dict[str, Row]:
    """Every configuration of either side as a row; a reference row whose name you also ran
    is `NAME (reference)`."""
    out = {}
    for source, runs in ((MINE, mine), (THEIRS, theirs)):
        names = row_names(runs)
        for name, values in per_seed(runs, metric).items():
            made = [r for r in runs if names[id(r)] == name]
            prints = {fp.get("id", "?"): describe(fp) for r in made
                      if r.environment is not None and (fp := r.environment.fingerprint)}  # fmt: skip
            key = f"{name} ({THEIRS})" if source == THEIRS and name in out else name
            out[key] = Row(key, source, values, frozenset(prints),
                           "; ".join(sorted(set(prints.values()))) or "unknown machine")  # fmt: skip
    return out


def paired(a: Row, b: Row) -> bool:
    """Whether a's seed k and b's seed k pair: the one rule (harness.core.pairing), which the
    side and the machines do not enter."""
    return shared_seeds(a.values, b.values) is not None


def versus(a: Row, b: Row, rope: float, scale: float) -> tuple[object, Probs | None]:
    """a against b: the frequentist comparison and P(worse · ≈ · better), paired or unpaired
    by the one rule (compare() applies it too)."""
    pa = {s: scale * v for s, v in a.values.items()}
    pb = {s: scale * v for s, v in b.values.items()}
    probs = seed_probs(pa, pb, rope) if paired(a, b) else unpaired_probs(pa, pb, rope)
    return compare(a.values, b.values), probs


def beside_section(mine: list[RunResult], theirs: list[RunResult], reference: Path) -> str:
    """Markdown: per protocol hash of yours, every row of both sides ranked by the main
    metric, with `vs best` (Benjamini-Hochberg over the rows) and P(worse · ≈ · better)."""
    lines = ["", "## Beside the committed reference", "",
             f"Your runs and the reference runs of `{reference}` under the same protocol hash, "
             "in one table; no reference run was made again. Tests pair the seeds both rows "
             "ran, whichever machines made them (seed k fixes the initial weights and the batch "
             "order on any machine; docs/verdicts.md#one-rule-for-runs-from-two-machines), and "
             "are unpaired (Welch) only between rows sharing fewer than two seeds."]  # fmt: skip
    mine = full_budget(mine)
    for hash_ in sorted({r.protocol.hash for r in mine}):
        here = [r for r in mine if r.protocol.hash == hash_]
        there = [r for r in theirs if r.protocol.hash == hash_]
        metric = main_metric(here)
        scale = 1.0 if metric in UNBOUNDED_METRICS else 100.0
        rope = protocol_rope(here[0].protocol.content)
        table = rows(here, there, metric)
        lines += ["", f"### {here[0].protocol.name} (protocol v{here[0].protocol.version}, hash "
                  f"`{hash_}`): {metric}, ROPE ±{rope:g}", "", _table(table, scale, rope, metric)]  # fmt: skip
    return "\n".join(lines) + "\n"


def _table(table: dict[str, Row], scale: float, rope: float, metric: str) -> str:
    means = {n: sum(r.values.values()) / len(r.values) for n, r in table.items() if r.values}
    best = max(means, key=means.__getitem__)
    tests = {n: versus(table[n], table[best], rope, scale) for n in means if n != best}
    adjusted = benjamini_hochberg({n: c.p for n, (c, _) in tests.items()})
    out = []
    for name in sorted(means, key=lambda n: -means[n]):
        row = table[name]
        mean, half = t_interval(list(row.values.values()))
        cell = f"{mean * scale:.2f}" + ("" if math.isnan(half) else f" ± {half * scale:.2f}")
        if name == best:
            mark, probs = "best", ""
        else:
            p, (c, pr) = adjusted[name], tests[name]
            kind = "paired" if paired(row, table[best]) else "unpaired"
            mark = ("untested" if math.isnan(p) else
                    f"{'≈ best' if p >= ALPHA else 'above' if c.difference > 0 else 'below'} "
                    f"(p = {p:.2g}, {kind})")  # fmt: skip
            probs = pr.cell() if pr is not None else "-"
        out.append({"method": name, "source": row.source, "made on": row.described,
                    "seeds": len(row.values), metric: cell, "vs best": mark,
                    f"P(worse · ≈ · better) vs best, ±{rope:g}": probs})  # fmt: skip
    return tabulate(pd.DataFrame(out), headers="keys", tablefmt="github", showindex=False,
                    disable_numparse=True)  # fmt: skip
