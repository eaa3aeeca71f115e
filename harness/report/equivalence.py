"""Which losses can be treated as interchangeable (harness.report.bayes's tests, at a ROPE).

- Within a protocol (`within`, kept in harness.report.bayes, where harness.report.tuned can
  import it without a circle): each row against the best and against the row that trained
  no step, the leaderboard tables' `P(worse · ≈ · better)` columns.
- Across protocols (`across`): each method against the reference (the best average rank) by
  the hierarchical model over every seed of every protocol (harness.report.hierarchical,
  its posteriors kept by harness.report.posteriors), with the Bayesian signed-rank test over
  the protocols' means beside it, over every committed protocol and per setting; the
  leaderboard's section with its sensitivity to the ROPE, the stacked-bar figure of the
  report's front page and the README's sentence all come from this one computation."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from tabulate import tabulate

from harness.report import hierarchical
from harness.report.bayes import (  # noqa: F401 (within, within_column: re-exported)
    DECISIVE,
    DEFAULT_ROPE,
    ROPES,
    SAMPLES,
    SCALE,
    Probs,
    protocol_rope,
    seed_probs,
    signed_rank_probs,
    within,
    within_column,
)
from harness.report.figures import _figure, _save
from harness.report.hierarchical import ESS_MIN, RHAT_MAX, NotConverged, Posterior, check_rope
from harness.report.posteriors import PosteriorCache
from harness.report.ranks import (
    MIN_METHODS,
    SETTING_STEMS,
    Block,
    average_ranks,
    by_setting,
    main_blocks,
    shared_blocks,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

ALL = "all protocols"
COLOURS = {"worse": "#c0504d", "equivalent": "#a6a6a6", "better": "#4f81bd"}
Verdict = Probs | NotConverged  # a hierarchical cell: probabilities, or words


@dataclass(frozen=True)
class Across:
    """One across-protocol comparison: which protocols (`blocks`, each a mean over up to
    `seeds` seeds), the reference method, the ROPE in points, and each other method's
    probabilities against the reference by the hierarchical model at that ROPE (`probs`) and
    at each of ROPES (`sensitivity`), its posterior (`posteriors`: shrunk means, diagnostics,
    protocols left out), and the signed-rank test's probabilities at the ROPE beside them."""

    label: str
    blocks: list[str]
    seeds: tuple[int, int]
    reference: str
    rope: float
    probs: dict[str, Verdict]
    sensitivity: dict[float, dict[str, Verdict]]
    signed_rank: dict[str, Probs] = field(default_factory=dict)
    posteriors: dict[str, Posterior] = field(default_factory=dict)

    def equivalent(self) -> list[str]:
        """The methods practically equivalent to the reference with P >= DECISIVE."""
        return sorted(m for m, p in self.probs.items() if p.verdict() == "equivalent")

    def order(self) -> list[str]:
        """The methods best first: least likely worse, then most likely better; the
        comparisons that did not converge last."""

        def rank(m: str) -> tuple[int, float, float, str]:
            p = self.probs[m]
            if isinstance(p, NotConverged):
                return 1, 0.0, 0.0, m
            return 0, p.worse, -p.better, m

        return sorted(self.probs, key=rank)

    def fragile(self, method: str) -> bool:
        """Whether the method has a verdict (P >= DECISIVE) at the ROPE and another one, or
        none, at some ROPE of the sensitivity table."""
        verdict = self.probs[method].verdict()
        return verdict not in ("undecided", "not converged") and any(
            self.sensitivity[r][method].verdict() != verdict for r in self.sensitivity)  # fmt: skip

    def newly_decided(self) -> list[str]:
        """The methods with a verdict by the hierarchical model that the signed-rank test left
        undecided, at the ROPE."""
        return sorted(m for m, p in self.signed_rank.items() if p.verdict() == "undecided"
                      and self.probs[m].verdict() not in ("undecided", "not converged"))  # fmt: skip

    def newly_undecided(self) -> list[str]:
        """The methods the signed-rank test decided and the hierarchical model does not."""
        return sorted(m for m, p in self.signed_rank.items() if p.verdict() != "undecided"
                      and self.probs[m].verdict() in ("undecided", "not converged"))  # fmt: skip

    def left_out(self) -> dict[str, list[str]]:
        """Method -> the protocols left out of its comparison (fewer than 2 shared seeds)."""
        return {m: p.left_out for m, p in sorted(self.posteriors.items()) if p.left_out}

    def converged(self) -> tuple[int, int]:
        """(comparisons that converged or needed no sampling, comparisons)."""
        return sum(p.diagnostics.converged for p in self.posteriors.values()), len(self.posteriors)


_WARNED: set[str] = set()  # a leaderboard draws each comparison twice (figure, section)


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning(message)


def across(blocks: list[Block], label: str = ALL, cache: PosteriorCache | None = None
           ) -> Across | None:  # fmt: skip
    """The comparison over the blocks' shared methods (as the critical-difference diagram
    takes them); None with fewer than two blocks or MIN_METHODS shared methods. The ROPE is
    the protocols' own when they all have one, else DEFAULT_ROPE. Each method's posterior
    comes from `cache` (the results folder's file; by default this process's memory and the
    committed reference's file) or is sampled."""
    kept, shared, _ = shared_blocks(blocks)
    if len(kept) < 2 or len(shared) < MIN_METHODS:
        return None
    table = pd.DataFrame([[SCALE * b.means[m] for m in shared] for b in kept],
                         index=[b.name for b in kept], columns=shared)  # fmt: skip
    ranks, means = average_ranks(table), table.mean(axis=0)
    reference = min(shared, key=lambda m: (ranks[m], -means[m], m))
    ropes = {b.rope for b in kept}
    rope = ropes.pop() if len(ropes) == 1 else DEFAULT_ROPE
    check_rope(rope)
    all_ropes = sorted({*ROPES, rope})
    cache = cache if cache is not None else PosteriorCache(None)

    def seeds_of(method: str) -> dict[str, dict[int, float]]:
        # a block that holds its means only (no seed values) enters with its mean as one
        # seed: the model then sees the protocols' means, as the signed-rank test does
        return {b.name: {s: SCALE * v for s, v in b.values[method].items()}
                if b.values.get(method) else {0: SCALE * b.means[method]} for b in kept}  # fmt: skip

    x = table[reference].to_numpy()
    signed, posteriors = {}, {}
    for m in shared:
        if m == reference:
            continue
        signed[m] = signed_rank_probs(x, table[m].to_numpy(), rope)
        a, b = seeds_of(m), seeds_of(reference)
        posterior = cache.get(f"{label}: {m} vs {reference}", a, b, all_ropes,
                              lambda a=a, b=b: hierarchical.compare(a, b, all_ropes))  # fmt: skip
        if posterior is not None:
            posteriors[m] = posterior
            for protocol in posterior.left_out:
                _warn_once(f"{label}: {m} and {reference} share fewer than 2 seeds on "
                           f"{protocol}: that protocol is left out of their hierarchical "
                           "comparison; run more seeds of the two there")  # fmt: skip
    sensitivity = {r: {m: p.at(r) for m, p in posteriors.items()} for r in all_ropes}
    seeds = (min(b.seeds for b in kept), max(b.seeds for b in kept))
    return Across(label, [b.name for b in kept], seeds, reference, rope, sensitivity[rope],
                  sensitivity, signed, posteriors)  # fmt: skip


def comparisons(blocks: list[Block], cache: PosteriorCache | None = None) -> list[Across]:
    """Over every protocol, then per setting (pretrained on real photos, from scratch) when
    the protocols hold both."""
    out = [across(main_blocks(blocks), ALL, cache)]
    out += [across(group, setting, cache) for setting, group in by_setting(blocks).items()]
    return [a for a in out if a is not None]


def _over(a: Across) -> str:
    """`all 6 protocols`, or `3 protocols, pretrained on real photos`."""
    n = len(a.blocks)
    return f"all {n} protocols" if a.label == ALL else f"{n} protocols, {a.label}"


def _seeds(a: Across) -> str:
    low, high = a.seeds
    return f"{low}" if low == high else f"{low} to {high}"


def _left_out(a: Across) -> str:
    """` Left out for fewer than 2 shared seeds: X on cars.`, or nothing."""
    left = a.left_out()
    if not left:
        return ""
    named = "; ".join(f"{m} on {', '.join(p)}" for m, p in left.items())
    return f" Left out of a comparison for fewer than 2 seeds shared with {a.reference}: {named}."


def _model_sentence() -> str:
    h = hierarchical  # its settings as they are now (a test may lower the draws)
    return (f"the hierarchical Bayesian model (Corani et al. 2017; NumPyro NUTS, {h.CHAINS} "
            f"chains of {h.DRAWS:,} draws from seed {h.SEED})")  # fmt: skip


def caption(a: Across) -> str:
    """What the stacked-bar figure shows, by which model, at which ROPE, over what."""
    eq = a.equivalent()
    named = ", ".join(eq) if eq else "none"
    done, total = a.converged()
    return (f"{a.label.capitalize()}: each method against {a.reference} (the best average "
            f"rank) on the main metric, ROPE ±{a.rope:g} points: P(worse by more than the "
            f"ROPE), P(within it) and P(better) for the next protocol's mean difference, by "
            f"{_model_sentence()} over every seed of {len(a.blocks)} protocols "
            f"({', '.join(a.blocks)}; {_seeds(a)} seeds each); {done} of {total} comparisons "
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
    the signed-rank test's probabilities and verdict at the ROPE beside them, and the
    model's R-hat and effective sample size."""
    rows = []
    for m in a.order():
        row = {"method": m, f"P(worse · ≈ · better), ±{a.rope:g}": a.probs[m].cell()}
        for r in sorted(a.sensitivity):
            row[f"verdict ±{r:g}"] = _verdict_cell(a.sensitivity[r][m])
        row["fragile"] = "fragile" if a.fragile(m) else ""
        sr = a.signed_rank[m]
        row[f"signed-rank, ±{a.rope:g}"] = f"{sr.cell()}: {_verdict_cell(sr)}"
        row["R-hat · ESS"] = _diagnostics_cell(a.posteriors.get(m))
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
        eq = a.equivalent()
        done, total = a.converged()
        lines += [f"### {_over(a).capitalize()}, ROPE ±{a.rope:g}", "",
                  f"Reference: {a.reference}. Practically equivalent to it (P ≥ "
                  f"{DECISIVE:g}): {', '.join(eq) if eq else 'none'}. "
                  f"{_against_signed_rank(a)} {done} of {total} comparisons converged."
                  f"{_left_out(a)}", "", table(a), "",
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
