"""Which method is best over every protocol, and does the ranking hold from one to the next:
the critical-difference diagram (Demšar, "Statistical Comparisons of Classifiers over
Multiple Data Sets", JMLR 2006) and a bump chart of ranks.

Each committed protocol is one block: its full-budget runs, each method's mean main metric
(a protocol with `+tuned` runs enters with its tuned ranking, as the tuned table gives it).
Within a block the methods are ranked (1 = best, ties share the mean rank), and the ranks
are averaged over the blocks. The Friedman test asks whether the average ranks differ more
than chance would make them; the Nemenyi test (scikit-posthocs' posthoc_nemenyi_friedman)
tells which pairs differ: two methods differ at 5 % when their average ranks are more than
the critical difference CD = q_0.05 sqrt(k (k + 1) / (6 N)) apart (k methods, N blocks).

Why Nemenyi and not Holm-corrected Wilcoxon signed-rank tests (Benavoli et al., JMLR 2016,
prefer the latter): with N blocks the smallest two-sided p-value a Wilcoxon signed-rank test
can give is 2 / 2^N, 0.125 for four protocols, so no pair could ever differ, whatever the
numbers; the Nemenyi test can say something with few blocks, and says it conservatively.
Its caveat, that a pair's verdict depends on which other methods are in the comparison, is
why the diagram names every method in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from harness.core import family_of as _registered_family
from harness.records import RunResult
from harness.report.bayes import DEFAULT_ROPE, protocol_rope
from harness.report.figures import _figure, _save
from harness.report.tuned import _mean, tuned_values
from harness.report.verdicts import main_metric, per_seed

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ALPHA = 0.05
MIN_METHODS = 3  # the Friedman test needs three methods; fewer: no diagram
TUNED_BLOCK = " (tuned)"


@dataclass(frozen=True)
class Block:
    """One protocol's ranking: its name (`tuning (tuned)` for a tuned ranking), main metric,
    each row's mean over its finished seeds (and the seeds' values), and when its first run
    started (the order of the bump chart)."""

    name: str
    metric: str
    means: dict[str, float]
    started: str
    setting: str = ""  # SETTINGS: from scratch, or pretrained on real photos
    rope: float = DEFAULT_ROPE  # the protocol's evaluation.rope (harness.report.bayes)
    seeds: int = 0  # the most finished seeds behind one of its means
    # row -> seed -> main metric behind each mean (the hierarchical model's input)
    values: dict[str, dict[int, float]] = field(default_factory=dict)


# the two settings a protocol belongs to, by its backbone's starting weights
SCRATCH, PRETRAINED = "from scratch", "pretrained on real photos"
# once a real-photo protocol has tuned runs, its setting is compared tuned (PRETRAINED) and,
# beside it, every real-photo protocol at the papers' defaults: the Reality Check's question
PRETRAINED_DEFAULT = "pretrained on real photos, at the papers' defaults"
SETTING_STEMS = {PRETRAINED: "pretrained", SCRATCH: "scratch",
                 PRETRAINED_DEFAULT: "pretrained_default"}  # their figures' file names  # fmt: skip


def protocol_blocks(runs: list[RunResult]) -> list[Block]:
    """Every full-budget protocol (runs of several versions: one block per version, named as
    the agreement table names them) with its rows' means, oldest protocol first; a protocol
    with tuned runs enters with its tuned ranking. When a real-photo protocol is tuned, every
    real-photo protocol also enters at the papers' defaults, under PRETRAINED_DEFAULT (which
    `main_blocks` leaves out of the comparison over every protocol)."""
    from harness.report.agreement import protocol_groups
    from harness.report.verdicts import pretrained

    blocks, defaults = [], []
    for name, group in protocol_groups(runs, tuned=True).items():
        metric = main_metric(group)
        setting = PRETRAINED if pretrained(group) else SCRATCH
        untuned = per_seed([r for r in group if not r.tuning], metric)
        if any(r.tuning for r in group):
            _, values, _ = tuned_values(group, metric)
            blocks.append(_block(name + TUNED_BLOCK, metric, values, group, setting))
        else:  # as the agreement table ranks them
            blocks.append(_block(name, metric, untuned, group, setting))
        if setting == PRETRAINED:
            defaults.append(_block(name, metric, untuned, group, PRETRAINED_DEFAULT))
    if any(b.setting == PRETRAINED and b.name.endswith(TUNED_BLOCK) for b in blocks):
        blocks += defaults
    return sorted(blocks, key=lambda b: (b.started, b.name))


def _block(name: str, metric: str, values: dict[str, dict[int, float]], group: list[RunResult],
           setting: str) -> Block:  # fmt: skip
    started = min(r.started_at or r.finished_at or "" for r in group)
    means = {row: _mean(v) for row, v in values.items() if v}
    rope = protocol_rope(group[0].protocol.content)
    seeds = max((len(v) for v in values.values()), default=0)
    kept = {row: dict(v) for row, v in values.items() if v}
    return Block(name, metric, means, started, setting, rope, seeds, kept)


def main_blocks(blocks: list[Block]) -> list[Block]:
    """The blocks of the comparison over every protocol: one per protocol (tuned where it
    is), the real-photo protocols' paper-default twins left out."""
    return [b for b in blocks if b.setting != PRETRAINED_DEFAULT]


def by_setting(blocks: list[Block]) -> dict[str, list[Block]]:
    """The blocks of each setting (pretrained on real photos first, then at the papers'
    defaults when it is tuned), when both settings have some."""
    out = {s: [b for b in blocks if b.setting == s] for s in (PRETRAINED, SCRATCH)}
    if not all(out.values()):
        return {}
    twins = [b for b in blocks if b.setting == PRETRAINED_DEFAULT]
    return {PRETRAINED: out[PRETRAINED], **({PRETRAINED_DEFAULT: twins} if twins else {}),
            SCRATCH: out[SCRATCH]}  # fmt: skip


def setting_agreement(tests: dict[str, RankTest]) -> str:
    """One sentence: how the settings' average ranks agree (Kendall's tau over the methods
    both rank), or why it cannot be said."""
    from scipy.stats import kendalltau

    tests = {s: t for s, t in tests.items() if s != PRETRAINED_DEFAULT}  # one per setting
    if len(tests) < 2:
        return ""
    (a, first), (b, second) = tests.items()
    shared = sorted(set(first.ranks.index) & set(second.ranks.index))
    if len(shared) < MIN_METHODS:
        return (f"The two settings share {len(shared)} ranked methods: too few for a Kendall's "
                "tau between their rankings.")  # fmt: skip
    tau, p = kendalltau([first.ranks[m] for m in shared], [second.ranks[m] for m in shared])
    return (f"How the two settings agree: Kendall's tau between the average ranks {a} and "
            f"{b} is {tau:+.2f} (p = {p:.2g}, {len(shared)} methods).")  # fmt: skip


def shared_blocks(blocks: list[Block]) -> tuple[list[Block], list[str], list[Block]]:
    """(blocks kept, the methods every kept block ran, blocks left out): the methods all
    blocks share; while they are fewer than MIN_METHODS and more than two blocks remain, the
    block with the fewest methods is left out (a small test protocol must not shrink the
    comparison to nothing)."""
    kept, left_out = list(blocks), []
    while True:
        shared = sorted(set.intersection(*(set(b.means) for b in kept))) if kept else []
        if len(shared) >= MIN_METHODS or len(kept) <= 2:
            return kept, shared, left_out
        smallest = min(kept, key=lambda b: (len(b.means), b.name))
        kept.remove(smallest)
        left_out.append(smallest)


def average_ranks(table: pd.DataFrame) -> pd.Series:
    """Each method's (column's) rank averaged over the blocks (rows): rank 1 is the highest
    value of a block, tied values share their mean rank (Demšar's convention)."""
    from scipy.stats import rankdata

    ranks = rankdata(-table.to_numpy(dtype=np.float64), axis=1, method="average")
    return pd.Series(ranks.mean(axis=0), index=table.columns)


def critical_difference(methods: int, blocks: int, alpha: float = ALPHA) -> float:
    """Nemenyi's critical difference of average ranks: q_alpha sqrt(k (k+1) / (6 N)), q_alpha
    the studentized range quantile for k groups and infinite degrees of freedom over sqrt 2
    (Demšar's Table 5a: 2.343 for k = 3, 2.569 for 4, 3.164 for 10)."""
    from scipy.stats import studentized_range

    q = studentized_range.ppf(1 - alpha, methods, math.inf) / math.sqrt(2)
    return float(q * math.sqrt(methods * (methods + 1) / (6 * blocks)))


@dataclass(frozen=True)
class RankTest:
    """The critical-difference diagram's numbers: the blocks × methods table of means, the
    average ranks, Friedman's chi-square and p, Nemenyi's CD and pairwise p-values, and the
    blocks left out for lack of shared methods."""

    table: pd.DataFrame
    ranks: pd.Series
    chi_square: float
    p: float
    cd: float
    pairwise: pd.DataFrame
    left_out: list[Block]

    @property
    def blocks(self) -> list[str]:
        return list(self.table.index)

    def resolved(self) -> list[tuple[str, str]]:
        """The pairs of methods the Nemenyi test tells apart at 5 %, better-ranked first."""
        names = list(self.pairwise.index)
        pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]
                 if self.pairwise.loc[a, b] < ALPHA]  # fmt: skip
        return [(a, b) if self.ranks[a] <= self.ranks[b] else (b, a) for a, b in pairs]


def rank_test(blocks: list[Block]) -> RankTest | None:
    """Friedman and Nemenyi over the blocks' shared methods; None with fewer than two blocks
    or MIN_METHODS shared methods (nothing to rank across)."""
    import scikit_posthocs
    from scipy.stats import friedmanchisquare

    kept, shared, left_out = shared_blocks(blocks)
    if len(kept) < 2 or len(shared) < MIN_METHODS:
        return None
    table = pd.DataFrame([[b.means[m] for m in shared] for b in kept],
                         index=[b.name for b in kept], columns=shared)  # fmt: skip
    chi_square, p = friedmanchisquare(*(table[m].to_numpy() for m in shared))
    pairwise = scikit_posthocs.posthoc_nemenyi_friedman(table.to_numpy())
    pairwise.index = pairwise.columns = shared
    return RankTest(table, average_ranks(table), float(chi_square), float(p),
                    critical_difference(len(shared), len(kept)), pairwise, left_out)  # fmt: skip


def blocks_to_resolve(test: RankTest, gap: float) -> int:
    """How many blocks the Nemenyi test needs before average ranks `gap` apart differ at 5 %
    (the CD shrinks as 1 / sqrt N): what more protocols would buy."""
    k = len(test.ranks)
    per_block = critical_difference(k, 1)
    return math.ceil((per_block / gap) ** 2)


def _protocols(n: int) -> str:
    return f"{n} protocol" + ("" if n == 1 else "s")


def _named(pairs: list[tuple[str, str]], most: int = 4) -> str:
    """` (a over b, ...)` for a few pairs; nothing for many."""
    if not pairs or len(pairs) > most:
        return ""
    return " (" + ", ".join(f"{a} over {b}" for a, b in pairs) + ")"


def caption(test: RankTest) -> str:
    """What the critical-difference diagram shows and by which tests, in one paragraph."""
    k, n = len(test.ranks), len(test.blocks)
    ordered = test.ranks.sort_values()
    spread = float(ordered.iloc[-1] - ordered.iloc[0])
    resolved = len(test.resolved())
    text = (f"Average rank of {k} methods over {n} protocols ({', '.join(test.blocks)}; each "
            "ranked by its main metric, 1 = best). Friedman test: chi-square "
            f"{test.chi_square:.1f}, p = {test.p:.2g}. Nemenyi post-hoc at 5 %: methods whose "
            f"average ranks differ by less than CD = {test.cd:.1f} cannot be told apart; a bar "
            f"joins each such group. {resolved} of {k * (k - 1) // 2} pairs "
            f"{'differs' if resolved == 1 else 'differ'}{_named(test.resolved())}. The average ranks span {spread:.1f}; "
            f"the CD shrinks as 1 / sqrt(protocols): ranks 5 apart would need "
            f"{_protocols(blocks_to_resolve(test, 5.0))}, 10 apart "
            f"{_protocols(blocks_to_resolve(test, 10.0))}.")  # fmt: skip
    if test.left_out:
        text += " Left out (too few methods in common): " + ", ".join(
            f"{b.name} ({len(b.means)} methods)" for b in test.left_out) + "."  # fmt: skip
    return text


def family_of(row: str) -> str:
    """A row's method family (`name@v2` and `name+tuned` rows: their method's)."""
    return _registered_family(row.split("@")[0].removesuffix("+tuned"))


def _family_colours(names: list[str]) -> dict[str, str]:
    """One colour per method family (pairs, triplets, proxies, ...), so that 29 lines or
    labels read as a few groups."""
    from harness.report.figures import COLOURS

    families = sorted({family_of(n) for n in names})
    return {n: COLOURS[families.index(family_of(n)) % len(COLOURS)] for n in names}


def _family_legend(ax: Axes, colours: dict[str, str], **options: Any) -> None:
    from matplotlib.lines import Line2D

    seen = {family_of(n): c for n, c in sorted(colours.items())}
    handles = [Line2D([], [], color=c, lw=2.5, label=f) for f, c in sorted(seen.items())]
    ax.legend(handles=handles, title="family", fontsize=8, title_fontsize=8, **options)


def cd_figure(test: RankTest, out_png: Path) -> Path:
    """The critical-difference diagram as a PNG (see cd_drawing)."""
    return _save(cd_drawing(test), out_png)


def _stack_in_order(bars: list[Any]) -> None:
    """The library stacks its crossbars in the order of Python sets (which changes with the
    string hash seed): each bar's points sorted, and the bars restacked by (lowest, highest
    rank), so that the same results draw the same bytes in every process."""
    spans = sorted(((sorted(bar.get_xdata()), bar) for bar in bars),
                   key=lambda item: (item[0][0], item[0][-1], list(item[0])))  # fmt: skip
    levels: list[list[tuple[float, float]]] = []
    placed = []
    for xs, bar in spans:
        low, high = xs[0], xs[-1]
        level = next((i for i, taken in enumerate(levels)
                      if not any(low <= b and a <= high for a, b in taken)), len(levels))  # fmt: skip
        if level == len(levels):
            levels.append([])
        levels[level].append((low, high))
        placed.append((bar, xs, -level - 1))
    if len(levels) > len({bar.get_ydata()[0] for bar in bars}):
        placed = [(bar, xs, bar.get_ydata()[0]) for xs, bar in spans]  # keep the library's rows
    for bar, xs, y in placed:
        bar.set_data(xs, [y] * len(xs))


def cd_drawing(test: RankTest) -> Figure:
    """The critical-difference diagram (scikit-posthocs' drawing): each method at its average
    rank, names in full on both sides, a bar over each group the Nemenyi test cannot split,
    and the CD drawn above the axis."""
    import scikit_posthocs

    k = len(test.ranks)
    fig = _figure(figsize=(11, 1.5 + 0.2 * ((k + 1) // 2) + 0.05 * k))
    ax = fig.subplots()
    colours = _family_colours(list(test.ranks.index))
    drawn = scikit_posthocs.critical_difference_diagram(
        test.ranks, test.pairwise, ax=ax, alpha=ALPHA,
        label_fmt_left="{label} ({rank:.1f})", label_fmt_right="({rank:.1f}) {label}",
        label_props={"fontsize": 8.5}, color_palette=colours,
        crossbar_props={"linewidth": 2.2, "color": "0.25"},
    )  # fmt: skip
    _stack_in_order([line for lines in drawn["crossbars"] for line in lines])
    ax.set_xlim(0.5, k + 0.5)
    ax.set_ylim(ax.get_ylim()[0], 2.6)  # room above the rank axis for the CD's segment
    start = float(test.ranks.min())  # Demšar draws the CD from the best rank, above the axis
    ax.plot([start, start + test.cd], [1.6, 1.6], color="0.2", lw=1.6, marker="|", ms=8)
    ax.text(start + test.cd / 2, 1.8, f"CD = {test.cd:.1f}", ha="center", va="bottom",
            fontsize=8.5)  # fmt: skip
    ax.set_xticks(range(1, k + 1))
    ax.tick_params(axis="x", labelsize=8)
    _family_legend(ax, colours, loc="upper center", bbox_to_anchor=(0.5, -0.02),
                   ncol=len(set(map(family_of, colours))), frameon=False)  # fmt: skip
    ax.set_title(f"Average rank over {len(test.blocks)} protocols (1 = best) — Friedman "
                 f"p = {test.p:.2g}, Nemenyi CD = {test.cd:.1f}", fontsize=11, pad=14)  # fmt: skip
    return fig


def neighbour_taus(blocks: list[Block]) -> list[tuple[str, str, float, float, int]]:
    """Kendall's tau-b (and its p-value) between each block and the next, over the methods
    both ran: (first, second, tau, p, methods); tau and p are NaN where the two share fewer
    than MIN_METHODS methods (no tau is worth stating over two)."""
    from scipy.stats import kendalltau

    out = []
    for a, b in zip(blocks, blocks[1:], strict=False):
        shared = sorted(set(a.means) & set(b.means))
        tau, p = float("nan"), float("nan")
        if len(shared) >= MIN_METHODS:
            tau, p = kendalltau([a.means[m] for m in shared], [b.means[m] for m in shared])
        out.append((a.name, b.name, float(tau), float(p), len(shared)))
    return out


def _tau_text(a: str, b: str, tau: float, p: float, n: int) -> str:
    if tau != tau:  # NaN: too few methods shared
        return f"{a} → {b}: too few methods shared for a tau ({n})"
    return f"{a} → {b}: tau {tau:+.2f} (p = {p:.2g}, {n} methods)"


def block_ranks(blocks: list[Block]) -> dict[str, dict[str, float]]:
    """Each block's ranks of its own rows (1 = best, ties share the mean rank)."""
    from scipy.stats import rankdata

    out = {}
    for b in blocks:
        rows = sorted(b.means)
        ranks = rankdata([-b.means[r] for r in rows], method="average")
        out[b.name] = {r: float(x) for r, x in zip(rows, ranks, strict=True)}
    return out


def bump_caption(blocks: list[Block]) -> str:
    """Which protocols the bump chart joins, and Kendall's tau between neighbours."""
    taus = "; ".join(_tau_text(*t) for t in neighbour_taus(blocks))
    return (f"Each method's rank (1 = best, by the protocol's main metric) through "
            f"{len(blocks)} protocols, oldest first; colour by family. Kendall's tau between "
            f"neighbours: {taus}.")  # fmt: skip


def bump_figure(blocks: list[Block], out_png: Path) -> Path:
    """The bump chart as a PNG (see bump_drawing)."""
    return _save(bump_drawing(blocks), out_png)


def _label_rows(ranks: dict[str, float]) -> dict[str, int]:
    """Where each name's label goes: its place in the order (tied ranks get one row each)."""
    order = sorted(ranks, key=lambda n: (ranks[n], n))
    return {n: i + 1 for i, n in enumerate(order)}


def bump_drawing(blocks: list[Block]) -> Figure:
    """One line per method through the protocols' rankings, its name at both ends, and
    Kendall's tau between neighbouring protocols above the chart."""
    ranks = block_ranks(blocks)
    first, last = _label_rows(ranks[blocks[0].name]), _label_rows(ranks[blocks[-1].name])
    names = sorted({m for b in blocks for m in b.means})
    k, n = len(names), len(blocks)
    fig = _figure(figsize=(4.2 + 2.1 * n, 1.4 + 0.27 * k))
    ax = fig.subplots()
    colours = _family_colours(names)
    for name in names:
        points = [(i, ranks[b.name][name]) for i, b in enumerate(blocks) if name in ranks[b.name]]
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, "-o", color=colours[name], lw=1.4, ms=4, alpha=0.85)
        if xs[0] == 0:
            ax.text(-0.08, first[name], f"{name} {ys[0]:g}", ha="right", va="center",
                    fontsize=8, color=colours[name])  # fmt: skip
        if xs[-1] == n - 1:
            ax.text(n - 1 + 0.08, last[name], f"{ys[-1]:g} {name}", ha="left", va="center",
                    fontsize=8, color=colours[name])  # fmt: skip
    for i, (_, _, tau, _, _) in enumerate(neighbour_taus(blocks)):
        ax.text(i + 0.5, 0.1, f"tau {tau:+.2f}" if tau == tau else "too few shared", ha="center", va="bottom", fontsize=8.5,
                color="0.3")  # fmt: skip
    ax.set_xticks(range(n), [b.name for b in blocks], fontsize=9)
    ax.xaxis.set_ticks_position("top")
    ax.set_ylim(k + 0.6, -0.5)
    ax.set_xlim(-1.6, n - 1 + 1.6)
    ax.set_yticks([])
    for side in ("left", "right", "bottom", "top"):
        ax.spines[side].set_visible(False)
    _family_legend(ax, colours, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                   ncol=len(set(map(family_of, names))), frameon=False)  # fmt: skip
    ax.set_title("Rank of each method in each protocol (1 = best)", fontsize=11, pad=10)
    return fig
