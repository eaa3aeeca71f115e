"""The figures of the ranking over every protocol: the critical-difference diagram (Demšar,
JMLR 2006: Friedman and Nemenyi, harness.stats.ranks) and a bump chart of ranks with
Kendall's tau between neighbours (harness.stats.agreement), over the blocks of
harness.stats.blocks (one per protocol, in two settings).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core import family_of as _registered_family
from harness.report.figures import _figure, _save
from harness.stats import (
    ALPHA,
    MIN_METHODS,
    PRETRAINED,
    PRETRAINED_DEFAULT,
    SCRATCH,
    Block,
    RankTest,
    block_ranks,
    blocks_to_resolve,
    kendall,
    neighbour_taus,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SETTING_STEMS = {PRETRAINED: "pretrained", SCRATCH: "scratch",
                 PRETRAINED_DEFAULT: "pretrained_default"}  # their figures' file names  # fmt: skip


def setting_agreement(tests: dict[str, RankTest]) -> str:
    """One sentence: how the settings' average ranks agree (Kendall's tau over the methods
    both rank), or why it cannot be said."""
    tests = {s: t for s, t in tests.items() if s != PRETRAINED_DEFAULT}  # one per setting
    if len(tests) < 2:
        return ""
    (a, first), (b, second) = tests.items()
    found = kendall(dict(first.ranks), dict(second.ranks))
    if len(found.shared) < MIN_METHODS:
        return (f"The two settings share {len(found.shared)} ranked methods: too few for a "
                "Kendall's tau between their rankings.")  # fmt: skip
    return (f"How the two settings agree: Kendall's tau between the average ranks {a} and "
            f"{b} is {found.tau:+.2f} (p = {found.p:.2g}, {len(found.shared)} methods).")  # fmt: skip


def _protocols(n: int) -> str:
    return f"{n} protocol" + ("" if n == 1 else "s")


def _named(pairs: list[tuple[str, str]], most: int = 4) -> str:
    """` (a over b, ...)` for a few pairs; nothing for many."""
    if not pairs or len(pairs) > most:
        return ""
    return " (" + ", ".join(f"{a} over {b}" for a, b in pairs) + ")"


def missing(unranked: dict[str, list[str]], verb: str = "Not ranked") -> str:
    """` Not ranked, for want of a run on every protocol: Q (none on p3).`, or nothing."""
    named = ", ".join(f"{m} (none on {', '.join(bs)})" for m, bs in unranked.items())
    return f" {verb}, for want of a run on every protocol: {named}." if named else ""


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
    text += missing(test.unranked)
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


def _tau_text(a: str, b: str, tau: float, p: float, n: int) -> str:
    if tau != tau:  # NaN: too few methods shared
        return f"{a} → {b}: too few methods shared for a tau ({n})"
    return f"{a} → {b}: tau {tau:+.2f} (p = {p:.2g}, {n} methods)"


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
