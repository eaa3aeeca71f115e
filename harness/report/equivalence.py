"""Which losses can be treated as interchangeable (harness.report.bayes's tests, at a ROPE).

- Within a protocol (`within`): each row against the best and against the row that trained
  no step, the leaderboard tables' `P(worse · ≈ · better)` columns.
- Across protocols (`across`): each method against the reference (the best average rank) by
  the Bayesian signed-rank test, over every committed protocol and per setting; the
  leaderboard's section with its sensitivity to the ROPE, the stacked-bar figure of the
  report's front page and the README's sentence all come from this one computation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from tabulate import tabulate

from harness.records import RunResult
from harness.report.bayes import (
    DECISIVE,
    DEFAULT_ROPE,
    ROPES,
    SAMPLES,
    SCALE,
    Probs,
    protocol_rope,
    seed_probs,
    signed_rank_probs,
)
from harness.report.figures import _figure, _save
from harness.report.ranks import (
    MIN_METHODS,
    SETTING_STEMS,
    Block,
    average_ranks,
    by_setting,
    shared_blocks,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ALL = "all protocols"
COLOURS = {"worse": "#c0504d", "equivalent": "#a6a6a6", "better": "#4f81bd"}


@dataclass(frozen=True)
class Across:
    """One across-protocol comparison: which protocols (`blocks`, each a mean over up to
    `seeds` seeds), the reference method, the ROPE in points, and each other method's
    probabilities against the reference at that ROPE and at each of ROPES."""

    label: str
    blocks: list[str]
    seeds: tuple[int, int]
    reference: str
    rope: float
    probs: dict[str, Probs]
    sensitivity: dict[float, dict[str, Probs]]

    def equivalent(self) -> list[str]:
        """The methods practically equivalent to the reference with P >= DECISIVE."""
        return sorted(m for m, p in self.probs.items() if p.equivalent >= DECISIVE)

    def order(self) -> list[str]:
        """The methods best first: least likely worse, then most likely equivalent."""
        return sorted(self.probs, key=lambda m: (self.probs[m].worse, -self.probs[m].better, m))

    def fragile(self, method: str) -> bool:
        """Whether the method has a verdict (P >= DECISIVE) at the ROPE and another one, or
        none, at some ROPE of the sensitivity table."""
        verdict = self.probs[method].verdict()
        return verdict != "undecided" and any(
            self.sensitivity[r][method].verdict() != verdict for r in self.sensitivity)  # fmt: skip


def within_column(label: str, rope: float) -> str:
    """The leaderboard's column of probabilities against the `label` row (best, zero-shot)."""
    return f"P(worse · ≈ · better) vs {label}, ±{rope:g}"


def within(values: dict[str, dict[int, float]], best: str | None, runs: list[RunResult]
           ) -> dict[str, dict[str, str]]:  # fmt: skip
    """Within one protocol: column -> row -> cell, each row's probabilities against the
    `best` row and against the zero-shot (pretrained) or untrained (from scratch) row, by the
    correlated t-test over the seeds both ran (`values`: row -> seed -> main metric, the
    complete rows). The reference's own cell names it; a row with one shared seed is
    untested."""
    from harness.report.verdicts import pretrained, untrained_row

    rope = protocol_rope(runs[0].protocol.content if runs else None)
    untrained = untrained_row(runs)
    # the row that trained no step is named by its role under a pretrained backbone, else
    # by its own name (random weights)
    references = [(best, "best"), (untrained, "zero-shot" if pretrained(runs) else untrained)]
    out = {}
    for reference, label in references:
        if reference not in values:
            continue
        ref = {s: SCALE * v for s, v in values[reference].items()}
        cells = {reference: label}
        for name, seeds in values.items():
            if name != reference:
                p = seed_probs({s: SCALE * v for s, v in seeds.items()}, ref, rope)
                cells[name] = p.cell() if p else f"{min(len(seeds), len(ref))} seed: untested"
        out[within_column(label, rope)] = cells
    return out


def across(blocks: list[Block], label: str = ALL) -> Across | None:
    """The comparison over the blocks' shared methods (as the critical-difference diagram
    takes them); None with fewer than two blocks or MIN_METHODS shared methods. The ROPE is
    the protocols' own when they all have one, else DEFAULT_ROPE."""
    kept, shared, _ = shared_blocks(blocks)
    if len(kept) < 2 or len(shared) < MIN_METHODS:
        return None
    table = pd.DataFrame([[SCALE * b.means[m] for m in shared] for b in kept],
                         index=[b.name for b in kept], columns=shared)  # fmt: skip
    ranks, means = average_ranks(table), table.mean(axis=0)
    reference = min(shared, key=lambda m: (ranks[m], -means[m], m))
    ropes = {b.rope for b in kept}
    rope = ropes.pop() if len(ropes) == 1 else DEFAULT_ROPE

    def against(r: float) -> dict[str, Probs]:
        x = table[reference].to_numpy()
        return {m: signed_rank_probs(x, table[m].to_numpy(), r) for m in shared if m != reference}

    sensitivity = {r: against(r) for r in sorted({*ROPES, rope})}
    seeds = (min(b.seeds for b in kept), max(b.seeds for b in kept))
    return Across(label, [b.name for b in kept], seeds, reference, rope,
                  sensitivity[rope], sensitivity)  # fmt: skip


def comparisons(blocks: list[Block]) -> list[Across]:
    """Over every protocol, then per setting (pretrained on real photos, from scratch) when
    the protocols hold both."""
    out = [across(blocks)]
    out += [across(group, setting) for setting, group in by_setting(blocks).items()]
    return [a for a in out if a is not None]


def _over(a: Across) -> str:
    """`all 6 protocols`, or `3 protocols, pretrained on real photos`."""
    n = len(a.blocks)
    return f"all {n} protocols" if a.label == ALL else f"{n} protocols, {a.label}"


def _seeds(a: Across) -> str:
    low, high = a.seeds
    return f"{low}" if low == high else f"{low} to {high}"


def caption(a: Across) -> str:
    """What the stacked-bar figure shows, by which model, at which ROPE, over what."""
    eq = a.equivalent()
    named = ", ".join(eq) if eq else "none"
    return (f"{a.label.capitalize()}: each method against {a.reference} (the best average "
            f"rank) on the main metric, ROPE ±{a.rope:g} points: P(worse by more than the "
            f"ROPE), P(within it) and P(better), by the Bayesian signed-rank test (Benavoli "
            f"et al. 2014; {SAMPLES:,} seeded posterior samples) over the means of {len(a.blocks)} "
            f"protocols ({', '.join(a.blocks)}; {_seeds(a)} seeds each). Practically "
            f"equivalent to {a.reference} with P ≥ {DECISIVE:g}: {named}.")  # fmt: skip


def readme_sentence(a: Across) -> str:
    """The README's sentence on the Bayesian comparison (a test checks that it is there)."""
    verdicts = [p.verdict() for p in a.probs.values()]
    k = len(a.probs)
    return (f"A Bayesian signed-rank test over the same {len(a.blocks)} protocols, with a "
            f"region of practical equivalence of ±{a.rope:g} MAP@R point, finds "
            f"{verdicts.count('equivalent')} of the other {k} methods practically equivalent "
            f"to {a.reference} and {verdicts.count('worse')} worse (P ≥ {DECISIVE:g}); "
            f"{verdicts.count('undecided')} stay undecided: {len(a.blocks)} protocols "
            "cannot yet tell them.")  # fmt: skip


def _verdict_cell(p: Probs) -> str:
    v = p.verdict()
    shown = {"equivalent": ("≈", p.equivalent), "worse": ("worse", p.worse),
             "better": ("better", p.better)}  # fmt: skip
    if v == "undecided":
        return "undecided"
    mark, prob = shown[v]
    return f"{mark} ({prob:.2f})"


def table(a: Across) -> str:
    """One row per method: its three probabilities at the ROPE, its verdict at each ROPE of
    the sensitivity table, and `fragile` where the verdict flips inside that range."""
    rows = []
    for m in a.order():
        row = {"method": m, f"P(worse · ≈ · better), ±{a.rope:g}": a.probs[m].cell()}
        for r in sorted(a.sensitivity):
            row[f"verdict ±{r:g}"] = _verdict_cell(a.sensitivity[r][m])
        row["fragile"] = "fragile" if a.fragile(m) else ""
        rows.append(row)
    return tabulate(pd.DataFrame(rows), headers="keys", tablefmt="github", showindex=False,
                    disable_numparse=True)  # fmt: skip


def section(blocks: list[Block]) -> str:
    """The leaderboard's section: each comparison's reference, equivalent set and table."""
    found = comparisons(blocks)
    if not found:
        return ""
    lines = ["", "## Which methods are practically equivalent?", "",
             "Each method against the reference (the best average rank over the protocols) by "
             "the Bayesian signed-rank test over the protocols' means of their main metric "
             "(Benavoli et al., 2014 and 2017), with a region of practical "
             "equivalence (ROPE, `evaluation.rope` of the protocols, in points): P(worse by "
             "more than the ROPE) · P(within it) · P(better by more than it), the share of "
             f"{SAMPLES:,} seeded posterior samples in which each is the most probable. A "
             f"verdict needs P ≥ {DECISIVE:g}; `undecided` means the protocols cannot say "
             "yet, which is not `≈`. `fragile`: the verdict changes between ROPEs "
             f"{', '.join(f'±{r:g}' for r in ROPES)}. Within one protocol, the tables' "
             "`P(worse · ≈ · better)` columns give the same three from its seeds "
             "(docs/verdicts.md).", ""]  # fmt: skip
    for a in found:
        eq = a.equivalent()
        lines += [f"### {_over(a).capitalize()}, ROPE ±{a.rope:g}",
                  "", f"Reference: {a.reference}. Practically equivalent to it (P ≥ "
                  f"{DECISIVE:g}): {', '.join(eq) if eq else 'none'}.", "", table(a), ""]  # fmt: skip
    return "\n".join(lines)


def drawing(a: Across) -> Figure:
    """One horizontal stacked bar per method: P(worse), P(≈), P(better) against the
    reference, best first from the top."""
    names = a.order()
    fig = _figure(figsize=(9, 1.6 + 0.26 * len(names)))
    ax = fig.subplots()
    left = [0.0] * len(names)
    for part in ("worse", "equivalent", "better"):
        widths = [getattr(a.probs[m], part) for m in names]
        label = {"equivalent": f"within ±{a.rope:g}"}.get(part, f"{part} by > {a.rope:g}")
        ax.barh(range(len(names)), widths, left=left, color=COLOURS[part], label=label,
                height=0.7)  # fmt: skip
        left = [lo + w for lo, w in zip(left, widths, strict=True)]
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlim(0, 1)
    ax.axvline(DECISIVE, color="0.2", lw=0.8, ls=":")
    ax.set_xlabel(f"probability against {a.reference} (dotted: {DECISIVE:g})", fontsize=9)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.06 - 0.6 / len(names)), ncol=3,
              frameon=False, fontsize=8)  # fmt: skip
    ax.set_title(f"Practically equivalent to {a.reference}? {_over(a)}, ROPE ±{a.rope:g}",
                 fontsize=11)  # fmt: skip
    return fig


def figure(a: Across, out_png: Path) -> Path:
    """The stacked-bar figure as a PNG (see drawing)."""
    return _save(drawing(a), out_png)


def stem(a: Across) -> str:
    """The figure's file stem: `equivalence`, `equivalence_pretrained`, ..."""
    return "equivalence" if a.label == ALL else f"equivalence_{SETTING_STEMS[a.label]}"
