"""Which losses can be treated as interchangeable, as the leaderboard and the report show it:
the section with its sensitivity to the ROPE, the table of shrunk means, the stacked-bar
figure of the report's front page and the README's sentence, all from one computation over
the blocks (harness.stats.equivalence: the hierarchical model and the signed-rank test).

Within a protocol, the tables' `P(worse · ≈ · better)` columns come from
harness.report.verdicts.within (the correlated t-test of harness.stats.bayes)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from tabulate import tabulate

from harness.report.figures import _figure, _save
from harness.report.ranks import SETTING_STEMS, missing
from harness.stats import (
    ALL,
    DECISIVE,
    ESS_MIN,
    RHAT_MAX,
    ROPES,
    SAMPLES,
    Across,
    Block,
    NotConverged,
    Posterior,
    PosteriorCache,
    Verdict,
    comparisons,
    nuts,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLOURS = {"worse": "#c0504d", "equivalent": "#a6a6a6", "better": "#4f81bd"}


def _over(a: Across) -> str:
    """`all 6 protocols`, or `3 protocols, pretrained on real photos`."""
    n = len(a.blocks)
    return f"all {n} protocols" if a.label == ALL else f"{n} protocols, {a.label}"


def _left_out(a: Across) -> str:
    """` Left out for fewer than 2 shared seeds: X on cars.`, then the methods some protocols
    lack: ` Compared over the protocols each ran on only: ...`, ` Not compared, ...`."""
    over = {m: bs for m, bs in a.unranked.items() if m in a.signed_rank}  # on 2 protocols or more
    rest = (missing(over, "Compared over the protocols each ran on only")
            + missing({m: bs for m, bs in a.unranked.items() if m not in over}, "Not compared"))  # fmt: skip
    named = "; ".join(f"{m} on {', '.join(p)}" for m, p in a.left_out().items())
    return (f" Left out of a comparison for fewer than 2 seeds shared with {a.reference}: "
            f"{named}.{rest}" if named else rest)  # fmt: skip


def _model_sentence() -> str:
    h = nuts  # its settings as they are now (a test may lower the draws)
    return (f"the hierarchical Bayesian model (Corani et al. 2017; NumPyro NUTS, {h.CHAINS} "
            f"chains of {h.DRAWS:,} draws from seed {h.SEED})")  # fmt: skip


def caption(a: Across) -> str:
    """What the stacked-bar figure shows, by which model, at which ROPE, over what."""
    eq = a.equivalent()
    named = ", ".join(eq) if eq else "none"
    done, total = a.converged()
    seeds = f"{a.seeds[0]}" if a.seeds[0] == a.seeds[1] else f"{a.seeds[0]} to {a.seeds[1]}"
    return (f"{a.label.capitalize()}: each method against {a.reference} (the best average "
            f"rank) on the main metric, ROPE ±{a.rope:g} points: P(worse by more than the "
            f"ROPE), P(within it) and P(better) for the next protocol's mean difference, by "
            f"{_model_sentence()} over every seed of {len(a.blocks)} protocols "
            f"({', '.join(a.blocks)}; {seeds} seeds each); {done} of {total} comparisons "
            f"converged (R-hat < {RHAT_MAX:g}, ESS > {ESS_MIN:g}). Practically equivalent to "
            f"{a.reference} with P ≥ {DECISIVE:g}: {named}.{_left_out(a)}")  # fmt: skip


def _count(verdicts: list[str]) -> str:
    return (f"{verdicts.count('equivalent')} practically equivalent, {verdicts.count('worse')} "
            f"worse, {verdicts.count('better')} better")  # fmt: skip


def readme_sentence(a: Across) -> str:
    """The README's sentence on the Bayesian comparison (a test checks that it is there)."""
    ours = [p.verdict() for p in a.probs.values()]
    theirs = [p.verdict() for p in a.signed_rank.values()]
    unconverged = ours.count("not converged")
    rest = f" and {unconverged} did not converge" if unconverged else ""
    return (f"The hierarchical Bayesian model over every seed of the same {len(a.blocks)} "
            f"protocols, with a region of practical equivalence of ±{a.rope:g} MAP@R point, "
            f"finds, of the other {len(ours)} methods against {a.reference}, {_count(ours)} "
            f"(P ≥ {DECISIVE:g}) for the next protocol; {ours.count('undecided')} stay "
            f"undecided{rest}. The signed-rank test over the protocols' means finds "
            f"{_count(theirs)}; the hierarchical model decides {len(a.newly_decided())} that "
            f"it left undecided, and leaves {len(a.newly_undecided())} undecided that it "
            "decided.")  # fmt: skip


def _verdict_cell(p: Verdict) -> str:
    v = p.verdict()
    if v in ("undecided", "not converged"):
        return v
    mark = {"equivalent": "≈"}.get(v, v)
    return f"{mark} ({getattr(p, v):.2f})"


def _diagnostics_cell(posterior: Posterior | None) -> str:
    if posterior is None:
        return "no shared seeds"
    d = posterior.diagnostics
    if d.exact:
        return "exact (no spread)"
    return f"{d.rhat:.3f} · {d.ess:,.0f}" + (" (sampled twice)" if d.retried else "")


def table(a: Across) -> str:
    """One row per method: the hierarchical model's probabilities at the ROPE, its verdict at
    each ROPE of the sensitivity table, `fragile` where the verdict flips inside that range,
    the signed-rank test's at the ROPE beside them, the model's R-hat and effective sample
    size, and the ROPE's region of the difference on every protocol (Across.one_sided)."""
    rows, one = [], a.one_sided()
    for m in a.order():
        row = {"method": m, f"P(worse · ≈ · better), ±{a.rope:g}": a.probs[m].cell()}
        for r in sorted(a.sensitivity):
            row[f"verdict ±{r:g}"] = _verdict_cell(a.sensitivity[r][m])
        row["fragile"] = "fragile" if a.fragile(m) else ""
        sr = a.signed_rank[m]
        row[f"signed-rank, ±{a.rope:g}"] = f"{sr.cell()}: {_verdict_cell(sr)}"
        row["R-hat · ESS"] = _diagnostics_cell(a.posteriors.get(m))
        row["every protocol"] = {"equivalent": "≈"}.get(one.get(m, ""), one.get(m, "straddles"))
        rows.append(row)
    return tabulate(pd.DataFrame(rows), headers="keys", tablefmt="github", showindex=False,
                    disable_numparse=True)  # fmt: skip


def shrunk_table(a: Across) -> str:
    """Each method's mean difference from the reference on each protocol after shrinkage
    (points, posterior mean [95 % interval]); `=` where it entered as known (no spread)."""
    rows = []
    for m in a.order():
        posterior = a.posteriors.get(m)
        shrunk = {s.protocol: s for s in posterior.shrunk} if posterior else {}
        row = {"method": m}
        for name in a.blocks:
            s = shrunk.get(name)
            if s is None:
                row[name] = "left out"
            elif s.known:
                row[name] = f"= {s.mean:+.2f}"
            else:
                row[name] = f"{s.mean:+.2f} [{s.low:+.2f}, {s.high:+.2f}]"
        rows.append(row)
    return tabulate(pd.DataFrame(rows), headers="keys", tablefmt="github", showindex=False,
                    disable_numparse=True)  # fmt: skip


def _against_signed_rank(a: Across) -> str:
    decided, undecided = a.newly_decided(), a.newly_undecided()
    text = (f"Against the signed-rank test at ±{a.rope:g}: the hierarchical model decides "
            f"{len(decided)} verdict{'s' if len(decided) != 1 else ''} that the signed-rank "
            f"test left undecided ({', '.join(decided) if decided else 'none'}), and leaves "
            f"{len(undecided)} undecided that it decided")  # fmt: skip
    return text + (f" ({', '.join(undecided)})." if undecided else ".")


def section(blocks: list[Block], cache: PosteriorCache | None = None) -> str:
    """The leaderboard's section: each comparison's reference, equivalent set, table and the
    shrunk means."""
    found = comparisons(blocks, cache)
    if not found:
        return ""
    lines = ["", "## Which methods are practically equivalent?", "",
             "Each method against the reference (the best average rank over the protocols) by "
             f"{_model_sentence()} over every seed of every protocol: each protocol's mean "
             "difference is drawn from a Student t shared by the protocols, and the answer is "
             "for the next protocol of the kind. With a region of practical equivalence "
             "(ROPE, `evaluation.rope` of the protocols, in points): P(worse by more than the "
             "ROPE) · P(within it) · P(better by more than it), the posterior predictive "
             f"probabilities of the next protocol's mean difference. A verdict needs P ≥ "
             f"{DECISIVE:g}; `undecided` means the protocols cannot say yet, which is not "
             "`≈`; `not converged`, that the chains disagreed (R-hat ≥ "
             f"{RHAT_MAX:g} or ESS ≤ {ESS_MIN:g}), so no probability is shown. `fragile`: "
             f"the verdict changes between ROPEs {', '.join(f'±{r:g}' for r in ROPES)}. "
             "Beside it, the Bayesian signed-rank test over the protocols' means only "
             f"(Benavoli et al. 2014; {SAMPLES:,} seeded posterior samples, the share in which "
             "each region is the most probable), which the model replaces. Within one "
             "protocol, the tables' `P(worse · ≈ · better)` columns give the same three from "
             "its seeds (docs/verdicts.md).", ""]  # fmt: skip
    for a in found:
        eq, one, still = a.equivalent(), a.one_sided(), a.still_open()
        done, total = a.converged()
        lines += [f"### {_over(a).capitalize()}, ROPE ±{a.rope:g}", "",
                  f"Reference: {a.reference}. Practically equivalent to it (P ≥ "
                  f"{DECISIVE:g}): {', '.join(eq) if eq else 'none'}. "
                  f"{_against_signed_rank(a)} {done} of {total} comparisons converged. Of the "
                  f"{len(one)} methods on one side of ±{a.rope:g} on every protocol (`every "
                  f"protocol`), decided: {len(one) - len(still)}; open: "
                  f"{', '.join(still) or 'none'}.{_left_out(a)}", "", table(a), "",
                  f"Each protocol's mean difference from {a.reference} after shrinkage "
                  "(points: posterior mean [95 % interval]; `=` entered as known, its seeds "
                  "without spread):", "", shrunk_table(a), ""]  # fmt: skip
    return "\n".join(lines)


def drawing(a: Across) -> Figure:
    """One horizontal stacked bar per method: P(worse), P(≈), P(better) against the
    reference, best first from the top; a comparison that did not converge has no bar, and
    says so."""
    names = a.order()
    fig = _figure(figsize=(9, 1.6 + 0.26 * len(names)))
    ax = fig.subplots()
    left = [0.0] * len(names)
    for part in ("worse", "equivalent", "better"):
        widths = [getattr(a.probs[m], part, 0.0) for m in names]
        label = {"equivalent": f"within ±{a.rope:g}"}.get(part, f"{part} by > {a.rope:g}")
        ax.barh(range(len(names)), widths, left=left, color=COLOURS[part], label=label,
                height=0.7)  # fmt: skip
        left = [lo + w for lo, w in zip(left, widths, strict=True)]
    for i, m in enumerate(names):
        if isinstance(a.probs[m], NotConverged):
            ax.text(0.01, i, "not converged", va="center", fontsize=7, color="0.2")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlim(0, 1)
    ax.axvline(DECISIVE, color="0.2", lw=0.8, ls=":")
    ax.set_xlabel(f"probability against {a.reference}, next protocol (dotted: {DECISIVE:g})",
                  fontsize=9)  # fmt: skip
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.06 - 0.6 / max(1, len(names))), ncol=3,
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
