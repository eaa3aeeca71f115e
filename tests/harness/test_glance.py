"""The verdict at a glance (harness.report.glance, ranks, forest): the critical-difference
diagram's ranks, Friedman test and critical difference against hand-worked examples and
Demšar's own numbers, the forest and dumbbell plots' numbers against the leaderboard's
tables, the bump chart's taus against the agreement table, and every figure legible at the
committed 29 methods (names in full, no two texts overlapping)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.core import load_methods
from harness.records import load_results, protocol_groups
from harness.report.agreement import agreement_rows
from harness.report.equivalence import drawing as equivalence_drawing
from harness.report.forest import dumbbell_drawing, dumbbells, forest, forest_drawing
from harness.report.glance import draw_glance, glance_section
from harness.report.ranks import bump_caption, bump_drawing, caption, cd_drawing
from harness.report.table import leaderboard_frame
from harness.report.tuned import tuned_frame
from harness.stats import (
    PRETRAINED,
    PRETRAINED_DEFAULT,
    SCRATCH,
    Block,
    across,
    average_ranks,
    blocks_to_resolve,
    critical_difference,
    hierarchical,
    main_blocks,
    neighbour_taus,
    protocol_blocks,
    rank_test,
    shared_blocks,
)

REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference"
# the committed real-photo protocols, oldest first (the order the blocks take)
PHOTOS = ("cars", "groceries", "birds", "plankton", "pollen", "objects", "flowers")


def first_screen(readme: str) -> str:
    """The README above its first section: the verdict, the figures and the two commands."""
    return " ".join(readme.split("\n## ")[0].split())


def _blocks(table: dict[str, dict[str, float]]) -> list[Block]:
    return [Block(name, "map@r", means, f"2026-01-0{i + 1}")
            for i, (name, means) in enumerate(table.items())]  # fmt: skip


# ----------------------------------------------------------------------- hand-worked


def test_three_methods_in_the_same_order_on_four_protocols():
    """A beats B beats C on each of 4 protocols. By hand: average ranks 1, 2, 3; Friedman
    chi2 = 12 N / (k (k+1)) [sum R_j^2 - k (k+1)^2 / 4] = 12*4/12 * (14 - 12) = 8, and with
    k - 1 = 2 degrees of freedom p = exp(-8/2); CD = 2.343 sqrt(3*4 / (6*4)) = 1.657
    (Demšar's q_0.05 for k = 3). A and C are 2 ranks apart (> CD): they differ; A-B and B-C,
    1 apart, do not."""
    blocks = _blocks({p: {"A": 0.5, "B": 0.4, "C": 0.3} for p in ("p1", "p2", "p3", "p4")})
    test = rank_test(blocks)
    assert test.ranks.to_dict() == {"A": 1.0, "B": 2.0, "C": 3.0}
    assert test.chi_square == pytest.approx(8.0)
    assert test.p == pytest.approx(math.exp(-4))
    assert test.cd == pytest.approx(2.343 * math.sqrt(0.5), abs=5e-4)
    assert test.resolved() == [("A", "C")]
    assert test.pairwise.loc["A", "C"] < 0.05 < test.pairwise.loc["A", "B"]
    assert "1 of 3 pairs differs (A over C)" in caption(test)


def test_ties_share_their_mean_rank():
    """Block 1: A = B > C gives A and B rank 1.5; block 2: C > B > A gives 3, 2, 1."""
    table = pd.DataFrame([[0.5, 0.5, 0.1], [0.1, 0.2, 0.3]], columns=["A", "B", "C"])
    assert average_ranks(table).to_dict() == {"A": 2.25, "B": 1.75, "C": 2.0}


@pytest.mark.parametrize(
    ("k", "q"),  # Demšar (2006), Table 5a: critical values of the two-tailed Nemenyi test
    [(2, 1.960), (3, 2.343), (4, 2.569), (5, 2.728), (6, 2.850), (7, 2.949), (8, 3.031),
     (9, 3.102), (10, 3.164)],
)  # fmt: skip
def test_the_critical_difference_uses_demsars_q(k, q):
    n = 7
    assert critical_difference(k, n) == pytest.approx(
        q * math.sqrt(k * (k + 1) / (6 * n)), abs=1e-3
    )


def test_demsars_example_critical_difference():
    """Demšar's worked example (section 3.2.4): 4 classifiers on 14 data sets, CD = 1.25."""
    assert round(critical_difference(4, 14), 2) == 1.25


def test_more_protocols_resolve_smaller_gaps():
    """CD(k, N) = CD(k, 1) / sqrt(N): for k = 3, CD(3, 1) = 2.343 sqrt 2 = 3.314, so a gap of
    one rank needs N >= 3.314^2 = 10.98, 11 protocols."""
    blocks = _blocks({p: {"A": 0.5, "B": 0.4, "C": 0.3} for p in ("p1", "p2", "p3")})
    test = rank_test(blocks)
    assert blocks_to_resolve(test, 1.0) == 11
    assert critical_difference(3, 11) < 1.0 < critical_difference(3, 10)


def test_a_protocol_with_too_few_shared_methods_is_left_out_and_named():
    full = {"A": 0.5, "B": 0.4, "C": 0.3, "D": 0.2}
    blocks = _blocks({"p1": full, "p2": dict(full), "p3": dict(full), "tiny": {"A": 0.1, "B": 0.2}})
    kept, shared, left_out = shared_blocks(blocks)
    assert [b.name for b in kept] == ["p1", "p2", "p3"] and shared == ["A", "B", "C", "D"]
    assert [b.name for b in left_out] == ["tiny"]
    assert "Left out (too few methods in common): tiny (2 methods)." in caption(rank_test(blocks))


def test_a_method_missing_from_a_kept_protocol_is_not_ranked_and_named():
    """Q cannot run on p3 (a dataset without what it needs): the ranks are over the 4
    methods every protocol ran, and the caption says which method is missing where."""
    full = {"A": 0.5, "B": 0.4, "C": 0.3, "D": 0.2}
    blocks = _blocks({"p1": full | {"Q": 0.6}, "p2": full | {"Q": 0.1}, "p3": dict(full)})
    test = rank_test(blocks)
    assert list(test.ranks.index) == ["A", "B", "C", "D"] and test.unranked == {"Q": ["p3"]}
    assert "Not ranked, for want of a run on every protocol: Q (none on p3)." in caption(test)
    assert "Not ranked" not in caption(rank_test(_blocks({"p1": full, "p2": full})))


def test_one_protocol_gives_no_diagram():
    assert rank_test(_blocks({"p1": {"A": 0.5, "B": 0.4, "C": 0.3}})) is None


def test_each_setting_gets_its_own_diagram_and_bump_chart_and_one_agreement_line(tmp_path):
    from harness.report.glance import _setting_figures
    from harness.report.ranks import setting_agreement
    from harness.stats import PRETRAINED, SCRATCH

    order = {"A": 0.5, "B": 0.4, "C": 0.3, "D": 0.2}
    reverse = {"A": 0.2, "B": 0.3, "C": 0.4, "D": 0.5}
    blocks = [Block(f"s{i}", "map@r", dict(order), f"2026-01-0{i}", SCRATCH) for i in (1, 2)]
    blocks += [Block(f"p{i}", "map@r", dict(reverse), f"2026-01-0{i + 2}", PRETRAINED)
               for i in (1, 2, 3)]  # fmt: skip
    figures = _setting_figures(blocks, tmp_path)
    assert [g.name for g in figures] == [
        "cd_diagram_pretrained", "equivalence_pretrained", "ranks_bump_pretrained",
        "cd_diagram_scratch", "equivalence_scratch", "ranks_bump_scratch"]  # fmt: skip
    assert all(g.png.is_file() for g in figures)
    assert figures[0].caption.startswith("Pretrained on real photos: Average rank of 4 methods "
                                         "over 3 protocols (p1, p2, p3")  # fmt: skip
    # the scratch ranks are A..D and the pretrained ones D..A: tau -1 over the 4 methods
    assert figures[-1].caption.endswith(
        "Kendall's tau between the average ranks pretrained on real photos and from scratch "
        "is -1.00 (p = 0.083, 4 methods).")  # fmt: skip
    tests = {SCRATCH: rank_test(blocks[:2]), PRETRAINED: rank_test(blocks[2:])}
    assert "-1.00" in setting_agreement(tests)
    # one setting only: nothing beside the overall diagram
    assert _setting_figures(blocks[:2], tmp_path) == []


def test_a_tuned_real_photo_setting_is_also_compared_at_the_papers_defaults():
    """Two real-photo protocols, one with tuned runs, and two from scratch: the tuned ranking
    stands for the tuned one in the comparison over every protocol and in its setting; every
    real-photo protocol also enters at the papers' defaults, as a setting of its own, and the
    one not tuned yet enters there only (and, untuned, in the comparison over every protocol)."""
    from harness.records import RunResult
    from harness.stats import PRETRAINED, PRETRAINED_DEFAULT, SCRATCH, by_setting, main_blocks

    default = {"A": 0.50, "B": 0.40, "C": 0.30, "D": 0.20}
    tuned = {"A": 0.40, "B": 0.45, "C": 0.50, "D": 0.55}  # tuning reverses the order

    def run(protocol, method, seed, value, tuning=False, photos=True):
        record = {
            "schema": 2, "status": "ok", "seed": seed, "started_at": f"2026-01-0{seed + 1}",
            "protocol": {"name": protocol, "version": 1, "hash": protocol, "content": {
                "backbone": {"pretrained": "imagenet" if photos else "none"}}},
            "method": {"name": method, "version": 1, "hyperparameters": {"t": tuning}},
            "training": {"max_steps": None, "steps": 10}, "metrics": {"map@r": value + seed / 1000},
        }  # fmt: skip
        if tuning:
            record["tuning"] = {"trials": 20}
        return RunResult.from_json(record)

    runs = [run(p, m, s, v, photos=p.startswith("p")) for p in ("p1", "p2", "s1", "s2")
            for m, v in default.items() for s in range(3)]  # fmt: skip
    runs += [run("p1", m, s, v, tuning=True) for m, v in tuned.items() for s in range(3)]
    blocks = protocol_blocks(runs)
    settings = {b.name + "|" + b.setting for b in blocks}
    # p2, not tuned yet, stays out of the tuned comparison: it waits at the papers' defaults
    assert settings == {f"p1 (tuned)|{PRETRAINED}", f"s1|{SCRATCH}", f"s2|{SCRATCH}",
                        f"p1|{PRETRAINED_DEFAULT}", f"p2|{PRETRAINED_DEFAULT}"}  # fmt: skip
    twin = next(b for b in blocks if b.setting == PRETRAINED_DEFAULT and b.name == "p1")
    assert twin.means["A"] == pytest.approx(0.501) and twin.means["D"] == pytest.approx(0.201)
    assert {b.name for b in main_blocks(blocks)} == {"p1 (tuned)", "p2", "s1", "s2"}
    groups = by_setting(blocks)
    assert list(groups) == [PRETRAINED, PRETRAINED_DEFAULT, SCRATCH]
    assert [b.name for b in groups[PRETRAINED_DEFAULT]] == ["p1", "p2"]
    assert [b.name for b in groups[PRETRAINED]] == ["p1 (tuned)"]
    # without tuned real-photo runs, no twins: each real-photo protocol enters once, untuned
    untuned = protocol_blocks([r for r in runs if not r.tuning])
    assert all(b.setting != PRETRAINED_DEFAULT for b in untuned)
    assert {b.name for b in untuned if b.setting == PRETRAINED} == {"p1", "p2"}


# ----------------------------------------------------------- against the committed tables


@pytest.fixture(scope="module")
def committed():
    load_methods()
    return protocol_groups(load_results(REFERENCE), tuned=True)


def _split(cell: str) -> str:
    return cell.split(" (p = ")[0]


@pytest.mark.parametrize("protocol", ["default", "omniglot"])
def test_a_forest_plot_draws_the_numbers_of_its_table(committed, protocol):
    """Names, order, `mean ± h` and `vs best` of each row are the main table's; the row that
    trained no step is the reference line, and the table's row of that name."""
    group = committed[protocol]
    f = forest(group, protocol)
    table = leaderboard_frame(group)
    metric = f"{f.metric} (%)"
    marks = next(c for c in table.columns if c.startswith("vs best"))
    shown = [(n.removesuffix(" (zero-shot)"), v, m)
             for n, v, m in table[["method", metric, marks]].itertuples(index=False)]  # fmt: skip
    reference = [row for row in shown if row[0] == f.reference.name]
    assert reference == [(f.reference.name, f.reference.cell(), f.reference.mark)]
    assert [(r.name, r.cell(), r.mark) for r in f.rows] == [s for s in shown if s not in reference]
    assert f.reference_label == "random weights"


@pytest.mark.parametrize("protocol", ["tuning", "birds"])
def test_the_tuned_forest_and_dumbbell_draw_the_tuned_table(committed, protocol):
    group = committed[protocol]
    f = forest(group, protocol)
    table = tuned_frame(group)
    assert f.tuned
    assert f.reference_label == ("zero-shot features" if protocol == "birds" else "random weights")
    rows = [(n, t, m) for n, t, m in
            table[["method", "tuned map@r (%)", "vs best, tuned"]].itertuples(index=False)]  # fmt: skip
    reference = (f.reference.name, f.reference.cell(), f.reference.mark)
    shown = [(n.removesuffix(" (zero-shot)"), t, m) for n, t, m in rows]
    assert reference in shown  # the zero-shot row sits at its rank; random weights last
    assert [(r.name, r.cell(), r.mark) for r in f.rows] == [s for s in shown if s != reference]
    lines = {d.name: d for d in dumbbells(group)}
    for name, default, moved in table[["method", "paper default map@r (%)", "tuning moved it"]
                                      ].itertuples(index=False):  # fmt: skip
        d = lines[name.removesuffix(" (zero-shot)")]
        assert d.default.cell() == default
        interval = re.search(r"\[([-+][\d.]+), ([-+][\d.]+)\]", moved)
        if interval is None:  # not tuned
            assert d.moved == "not tuned"
            continue
        lo, hi = map(float, interval.groups())  # the paired interval excludes 0 iff p < 5 %
        allowed = {"up" if lo > 0 else "down" if hi < 0 else "noise"}
        if 0.0 in (lo, hi):  # a bound shown as ±0.0 was rounded: either side of zero
            allowed |= {"noise", "up" if lo == 0 else "down"}
        assert d.moved in allowed, (name, moved)
    if protocol == "tuning":
        assert sum(d.moved == "up" for d in lines.values()) == 13  # the tuned section's count


def test_protocols_sharing_too_few_methods_get_no_tau_and_no_scipy_warning():
    import warnings

    a = Block("a", "map@r", {"x": 0.1, "y": 0.2, "z": 0.3}, "1")
    b = Block("b", "map@r", {"x": 0.1, "w": 0.2}, "2")  # one method shared
    c = Block("c", "map@r", {"x": 0.3, "y": 0.2, "z": 0.1}, "3")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scipy's SmallSampleWarning would raise here
        (_, _, tau, p, n), _ = neighbour_taus([a, b, c])
        assert math.isnan(tau) and math.isnan(p) and n == 1
        assert neighbour_taus([a, c])[0][2] == pytest.approx(-1.0)  # reversed order
        caption = bump_caption([a, b])
    assert "a → b: too few methods shared for a tau (1)" in caption


def test_the_committed_blocks_and_taus_are_the_agreement_tables(committed):
    runs = [r for g in committed.values() for r in g]
    every = protocol_blocks(runs)
    blocks = main_blocks(every)
    photos = list(PHOTOS)
    tuned_photos = [p + " (tuned)" for p in photos if any(r.tuning for r in committed[p])]
    waiting = [p for p in photos if not any(r.tuning for r in committed[p])]
    assert [b.name for b in blocks] == ["default", "omniglot", "tuning (tuned)", *tuned_photos,
                                        *waiting]  # fmt: skip
    assert [b.setting for b in blocks] == ([SCRATCH] * 3 + [PRETRAINED] * len(tuned_photos)
                                           + [PRETRAINED_DEFAULT] * len(waiting))  # fmt: skip
    # with a tuned real-photo protocol, each real-photo protocol also at the papers' defaults
    twins = [b.name for b in every if b.setting == PRETRAINED_DEFAULT]
    assert twins == (photos if tuned_photos else [])
    plain = {r["protocols"].split(" (")[0] + "|" + r["protocols"].split(" vs ")[1].split(" (")[0]:
             r["Kendall's tau"] for r in agreement_rows(protocol_groups(runs))}  # fmt: skip
    a, b, tau, _, n = neighbour_taus(blocks)[0]
    assert (a, b, n) == ("default", "omniglot", 29)
    assert f"{tau:+.2f}" == plain["default|omniglot"]
    tuned = {r[0]: r[1] for r in tuned_frame(committed["tuning"]).itertuples(index=False)}
    means = blocks[2].means
    assert {n: f"{100 * v:.1f}" for n, v in means.items()} == {
        n: cell.split(" ±")[0] for n, cell in tuned.items()}  # fmt: skip


# ----------------------------------------------------------------------------- legible


def _texts(fig) -> list:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return [(t.get_text(), t.get_window_extent(renderer)) for t in texts]


def _assert_legible(fig, names: list[str]) -> None:
    """Every name appears in full, and no two texts overlap (by more than a pixel)."""
    texts = _texts(fig)
    joined = "\n".join(t for t, _ in texts)
    for name in names:
        assert re.search(rf"(^|\s){re.escape(name)}($|\s)", joined, re.M), name
    boxes = [(t, b.expanded(1, 1).padded(-1)) for t, b in texts]
    overlaps = [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1 :]
                if ba.overlaps(bb)]  # fmt: skip
    assert overlaps == []


def test_every_figure_is_legible_at_29_methods(committed, tmp_path, monkeypatch):
    """Each figure checked, then saved and its path printed (`pytest -s`) to look at."""
    runs = [r for g in committed.values() for r in g]
    blocks = protocol_blocks(runs)
    names = sorted(blocks[0].means)
    assert len(names) == 29
    test = rank_test(blocks)  # the methods every protocol ran
    photos = rank_test([b for b in blocks if b.setting == PRETRAINED])
    figures = {"cd_diagram": (cd_drawing(test), sorted(test.ranks.index)),
               "cd_diagram_pretrained": (cd_drawing(photos), sorted(photos.ranks.index)),
               "ranks_bump": (bump_drawing(blocks), names)}  # fmt: skip
    # the comparisons the leaderboard draws (main_blocks: one block per protocol): their
    # posteriors come from the committed file, never sampled here (minutes)
    monkeypatch.setattr(hierarchical, "compare", lambda *a, **k: pytest.fail("sampled"))
    for key, group in (
        ("equivalence", main_blocks(blocks)),
        ("equivalence_pretrained", [b for b in blocks if b.setting == PRETRAINED]),
    ):
        a = across(group)
        figures[key] = (equivalence_drawing(a), a.order())
    for protocol in ("birds", "default", "cars"):
        f = forest(committed[protocol], protocol)
        figures[f"forest_{protocol}"] = (forest_drawing(f), [r.name for r in f.rows])
    lines = dumbbells(committed["tuning"])
    figures["dumbbell_tuning"] = (dumbbell_drawing(lines, "tuning", "map@r"), names)
    for name, (fig, shown) in figures.items():
        _assert_legible(fig, shown)
        fig.savefig(tmp_path / f"{name}.png", dpi=110)
        print(f"figure: {tmp_path / name}.png")


def test_the_bump_chart_gives_tied_ranks_a_label_each():
    blocks = _blocks({"p1": {"A": 0.5, "B": 0.5, "C": 0.1, "D": 0.0},
                      "p2": {"A": 0.1, "B": 0.1, "C": 0.3, "D": 0.3}})  # fmt: skip
    _assert_legible(bump_drawing(blocks), ["A", "B", "C", "D"])


def test_the_leaderboard_section_links_every_figure(committed, tmp_path):
    runs = [r for g in committed.values() for r in g]
    section = glance_section(runs, tmp_path)
    names = re.findall(r"\(figures/([^)]+\.png)\)", section)
    assert sorted(names) == sorted(p.name for p in (tmp_path / "figures").glob("*.png"))
    # a forest plot for each protocol, and a dumbbell (defaults -> tuned) for each tuned one
    tuned = [p for p in PHOTOS if any(r.tuning for r in committed[p])]
    assert set(names) == {"cd_diagram.png", "ranks_bump.png", "forest_default.png",
                          "forest_omniglot.png", "forest_tuning.png", "dumbbell_tuning.png",
                          *(f"forest_{p}.png" for p in PHOTOS),
                          *(f"dumbbell_{p}.png" for p in tuned),
                          "cd_diagram_pretrained.png", "ranks_bump_pretrained.png",
                          "cd_diagram_scratch.png", "ranks_bump_scratch.png", "equivalence.png",
                          "equivalence_pretrained.png", "equivalence_scratch.png",
                          "cd_diagram_pretrained_default.png", "ranks_bump_pretrained_default.png",
                          "equivalence_pretrained_default.png"}  # fmt: skip
    assert section.index("cd_diagram.png") < section.index("equivalence.png")
    assert section.index("equivalence.png") < section.index("ranks_bump.png")
    assert section.index("cd_diagram_pretrained.png") < section.index("cd_diagram_scratch.png")
    assert "How the two settings agree: Kendall's tau between the average ranks" in section
    assert "Nemenyi" in section and "Kendall's tau between neighbours" in section


def test_a_single_protocol_gets_its_forest_only(committed, tmp_path):
    figures = draw_glance(committed["default"], tmp_path)
    assert [g.name for g in figures] == ["forest_default"]
    assert all(np.asarray(__import__("PIL.Image").Image.open(g.png)).size for g in figures)


def test_the_readme_shows_the_committed_glance(committed):
    """The README's first screen shows the real-photo CD diagram and the cars forest plot,
    and its sentence quotes their numbers as the committed results give them; the glyph
    protocols' diagram and tuned forest follow, quoted alike."""
    readme = (REFERENCE.parents[1] / "README.md").read_text(encoding="utf-8")
    first = first_screen(readme)
    whole = " ".join(readme.split())
    for png in ("cd_diagram_pretrained.png", "forest_cars.png", "cd_diagram_scratch.png",
                "forest_tuning.png"):  # fmt: skip
        assert f'src="results/reference/figures/{png}"' in (
            first if "scratch" not in png and "tuning" not in png else whole
        )
        assert (REFERENCE / "figures" / png).is_file()
    runs = [r for g in committed.values() for r in g]
    for setting, text in ((PRETRAINED, first), (SCRATCH, whole)):
        test = rank_test([b for b in protocol_blocks(runs) if b.setting == setting])
        k, n, resolved = len(test.ranks), len(test.blocks), test.resolved()
        assert f"over the {n} {setting.split()[0]}" in text, setting
        assert f"critical difference is {test.cd:.1f} ranks" in text
        assert f"{len(resolved)} of {k * (k - 1) // 2} pairs" in text
        if setting == PRETRAINED:  # the diagram's alt text counts the same protocols
            assert f"average rank of {k} methods over the {n} tuned real-photo" in first
    cars = forest(committed["cars"], "cars")
    tied = sum(r.mark.startswith("≈") for r in cars.rows)
    shaded = f"the {tied} shaded method{'' if tied == 1 else 's'}"
    assert f"{cars.rows[0].name} leads, and {shaded}" in first
    tuned = forest(committed["tuning"], "tuning")
    tied = sum(r.mark.startswith("≈") for r in tuned.rows)
    assert f"{tuned.rows[0].name} leads, and the {tied} shaded methods" in whole


def test_the_readme_and_leaderboard_give_the_committed_tuned_photo_verdict(committed):
    """The tuned real-photo verdict (harness.report.tuned_verdict) opens the README's
    real-photo section (without the flip counts, which the leaderboard keeps) and is in the
    leaderboard, as the committed runs give it, and it covers every pretrained protocol with
    tuned runs (and no other)."""
    from harness.records import pretrained
    from harness.report.tuned_verdict import tuned_verdict

    runs = [r for g in committed.values() for r in g]
    text = tuned_verdict(protocol_groups(runs, tuned=True))
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()
            if line.startswith("| ")}  # fmt: skip
    for name, group in committed.items():  # a row per real-photo protocol, marked until tuned
        assert (name in rows) == pretrained(group), name
        if name in rows:
            assert ("*defaults*" not in rows[name]) == any(r.tuning for r in group), name
    readme = (REFERENCE.parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Real photos")[1].split("\n", 1)[1].split("\n## ")[0]
    photos = " ".join(section.split())
    readme_copy = tuned_verdict(protocol_groups(runs, tuned=True), flips=False)
    assert photos.startswith(" ".join(readme_copy.split())), (
        "README's real-photo section is stale; it opens with this (re-wrapped):\n" + readme_copy
    )
    leaderboard = (REFERENCE / "LEADERBOARD.md").read_text(encoding="utf-8")
    assert text in leaderboard


DRAW = """
import hashlib, io
from harness.report.ranks import cd_drawing
from harness.stats import Block, rank_test
names = [f"method_{c}" for c in "abcdefgh"]
blocks = [Block(f"p{b}", "map@r", {n: ((i * (b + 3)) % 8) / 10 + i / 100
                                   for i, n in enumerate(names)}, str(b)) for b in range(6)]
buffer = io.BytesIO()
cd_drawing(rank_test(blocks)).savefig(buffer, format="png", dpi=60)
print(hashlib.sha256(buffer.getvalue()).hexdigest())
"""


def test_the_diagram_is_the_same_bytes_whatever_the_hash_seed():
    """scikit-posthocs stacks its crossbars in set order, which moves with Python's string
    hash seed; the harness restacks them, so two processes draw the same PNG."""
    import os
    import subprocess
    import sys

    digests = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", DRAW], env=env, capture_output=True,
                              text=True, check=True, cwd=REFERENCE.parents[1])  # fmt: skip
        digests.add(done.stdout.strip())
    assert len(digests) == 1, digests
