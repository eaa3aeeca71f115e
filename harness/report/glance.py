"""The verdict at a glance: one figure per question, drawn from the result files for both
the markdown leaderboard (results/figures/) and the HTML report's front page (assets/).

- Which method is best over every protocol, and can it be told: the critical-difference
  diagram (harness.report.ranks).
- Which methods are practically equivalent to the best: stacked bars of P(worse), P(≈) and
  P(better) against it (harness.report.equivalence).
- Does the ranking hold from one protocol to the next: the bump chart of ranks.
- On one protocol, which methods the seeds cannot tell from the best: its forest plot, and
  for a protocol with `+tuned` runs, tuned against paper defaults as a dumbbell plot
  (harness.report.forest).

Each figure comes with a caption that says what it shows and by which test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core import load_methods
from harness.records import RunResult, protocol_groups
from harness.report.equivalence import caption as equivalence_caption
from harness.report.equivalence import figure as equivalence_figure
from harness.report.equivalence import stem as equivalence_stem
from harness.report.forest import (
    Forest,
    dumbbell_figure,
    dumbbells,
    forest,
    forest_figure,
    mark_kind,
)
from harness.report.ranks import (
    SETTING_STEMS,
    bump_caption,
    bump_figure,
    caption,
    cd_figure,
    setting_agreement,
)
from harness.stats import (
    Across,
    Block,
    PosteriorCache,
    across,
    by_setting,
    main_blocks,
    protocol_blocks,
    rank_test,
)

CD_DIAGRAM = "cd_diagram"
BUMP_CHART = "ranks_bump"


@dataclass(frozen=True)
class Glance:
    """One figure: its file stem, what it shows (alt text), its caption, the PNG, and the
    leaderboard group (protocol name, version, hash, max_steps) whose table it draws."""

    name: str
    title: str
    caption: str
    png: Path
    protocol_key: tuple[str, int, str, Any] | None = None


def safe_name(name: str) -> str:
    """A file name from a protocol or run folder name (`contrastive+tuned` -> itself minus
    the characters a URL would need to escape; `tuning v2 (1a2b)` -> `tuning_v2__1a2b_`)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def forest_caption(f: Forest) -> str:
    """What a forest plot shows, with its counts."""
    kinds = [mark_kind(r.mark) for r in f.rows]
    tied, below = kinds.count("tied"), kinds.count("below")
    rows = ("each method's tuned runs (a method with nothing to tune: its paper default)"
            if f.tuned else "each method")  # fmt: skip
    text = (f"{f.protocol}: {rows}, mean {f.metric} and its 95 % t-interval over seeds, best "
            f"first. Shaded: the best ({f.rows[0].name}) and the {tied} rows the paired "
            f"t-tests cannot tell from it; unshaded: the {below} rows significantly below it "
            "(Benjamini-Hochberg over the rows, 5 %).")  # fmt: skip
    if f.reference is not None:
        text += (f" Dashed line: {f.reference.name}, which trained no step (the network's "
                 f"{f.reference_label}), at {f.reference.cell()}.")  # fmt: skip
    return text


def _protocol_figures(name: str, group: list[RunResult], folder: Path) -> list[Glance]:
    r = group[0]
    key = (r.protocol.name, r.protocol.version, r.protocol.hash, None)
    f = forest(group, name)
    if not f.rows:
        return []
    out = [Glance(f"forest_{safe_name(name)}", f"forest plot: {f.title}", forest_caption(f),
                  forest_figure(f, folder / f"forest_{safe_name(name)}.png"), key)]  # fmt: skip
    if f.tuned:
        lines = dumbbells(group)
        moved = [d.moved for d in lines]
        text = (f"{name}: each method's paper-default (hollow) and tuned (filled) mean "
                f"{f.metric}, joined by a line: green where tuning moved it significantly up "
                f"({moved.count('up')}), red where down ({moved.count('down')}), grey within "
                f"the seeds' noise ({moved.count('noise')}; paired t-test over the seeds both "
                "ran, 5 %).")  # fmt: skip
        png = dumbbell_figure(lines, name, f.metric, folder / f"dumbbell_{safe_name(name)}.png")
        out.append(Glance(f"dumbbell_{safe_name(name)}",
                          f"dumbbell plot: {name}, tuned against paper defaults", text, png, key))  # fmt: skip
    return out


def draw_glance(runs: list[RunResult], folder: Path, cache: PosteriorCache | None = None
                ) -> list[Glance]:  # fmt: skip
    """Every figure of the glance into `folder`: the critical-difference diagram and the bump
    chart (when two or more protocols share enough methods), then each full-budget protocol's
    forest plot (and dumbbell plot), in the leaderboard's order. The hierarchical posteriors
    of the equivalence figures come from `cache` (harness.stats.posteriors)."""
    load_methods()  # the figures colour methods by family: the registry says which
    folder = Path(folder)
    out = []
    every = protocol_blocks(runs)
    blocks = main_blocks(every)
    test = rank_test(blocks)
    if test is not None:
        out.append(Glance(CD_DIAGRAM, "critical-difference diagram of the average ranks",
                          caption(test), cd_figure(test, folder / f"{CD_DIAGRAM}.png")))  # fmt: skip
    out += _equivalence_figure(across(blocks, cache=cache), folder)
    if len(blocks) >= 2:
        out.append(Glance(BUMP_CHART, "bump chart of each method's rank per protocol",
                          bump_caption(blocks), bump_figure(blocks, folder / f"{BUMP_CHART}.png")))  # fmt: skip
    out += _setting_figures(every, folder, cache)
    groups = protocol_groups(runs, tuned=True)
    for name in sorted(groups):
        out += _protocol_figures(name, groups[name], folder)
    return out


def _setting_figures(blocks: list[Block], folder: Path, cache: PosteriorCache | None = None
                     ) -> list[Glance]:  # fmt: skip
    """Per setting (pretrained on real photos, from scratch), when the protocols hold both:
    its own critical-difference diagram and bump chart; the last caption says how the two
    settings' rankings agree."""
    out, tests = [], {}
    for setting, group in by_setting(blocks).items():
        stem = SETTING_STEMS[setting]
        test = rank_test(group)
        if test is not None:
            tests[setting] = test
            out.append(Glance(f"{CD_DIAGRAM}_{stem}", f"critical-difference diagram, {setting}",
                              f"{setting.capitalize()}: {caption(test)}",
                              cd_figure(test, folder / f"{CD_DIAGRAM}_{stem}.png")))  # fmt: skip
        out += _equivalence_figure(across(group, setting, cache), folder)
        if len(group) >= 2:
            out.append(Glance(f"{BUMP_CHART}_{stem}", f"bump chart of ranks, {setting}",
                              f"{setting.capitalize()}: {bump_caption(group)}",
                              bump_figure(group, folder / f"{BUMP_CHART}_{stem}.png")))  # fmt: skip
    agreement = setting_agreement(tests)
    if agreement and out:
        last = out[-1]
        out[-1] = Glance(last.name, last.title, f"{last.caption} {agreement}", last.png)
    return out


def _equivalence_figure(a: Across | None, folder: Path) -> list[Glance]:
    """The stacked bars of P(worse), P(≈), P(better) against the reference (none without a
    comparison)."""
    if a is None:
        return []
    name = equivalence_stem(a)
    return [Glance(name, f"practical equivalence to {a.reference}, {a.label}",
                   equivalence_caption(a), equivalence_figure(a, folder / f"{name}.png"))]  # fmt: skip


def glance_section(runs: list[RunResult], results_dir: Path, cache: PosteriorCache | None = None
                   ) -> str:  # fmt: skip
    """The leaderboard's `At a glance` section: the figures drawn under results/figures/,
    the two that span protocols shown with their captions, each protocol's linked."""
    figures = draw_glance(runs, Path(results_dir) / "figures", cache)
    if not figures:
        return ""
    lines = ["", "## At a glance", ""]
    for g in figures:
        if g.protocol_key is None:
            lines += [f"![{g.title}](figures/{g.png.name})", "", g.caption, ""]
    links = [f"[{g.title.split(': ', 1)[-1]}](figures/{g.png.name})"
             for g in figures if g.protocol_key is not None]  # fmt: skip
    if links:
        lines += ["Each protocol's main metric per method, mean and 95 % interval (forest "
                  "plots; a tuned protocol also as tuned against paper defaults): "
                  + "; ".join(links) + ".", ""]  # fmt: skip
    return "\n".join(lines)
