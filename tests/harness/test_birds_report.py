"""The leaderboard's report of a protocol on a pretrained backbone (issue 38): the zero-shot
row and its `vs zero-shot` column, the table of the seed papers' claims, and Kendall's tau with
the protocols trained from scratch, on hand-made results: 3 seeds of the methods the claims
name, each seed's recall@1 chosen so that each verdict is known before the code runs (MAP@R is
half of it). The expected p-values are scipy's paired t-test on the same numbers, adjusted by
Benjamini-Hochberg over the same family as the code's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from scipy.stats import false_discovery_control, ttest_rel

from harness.core import CLAIMS_FILE, REFERENCE_FILE, load_claims
from harness.records import RunResult, protocol_groups
from harness.report import render
from harness.report.agreement import agreement_section
from harness.report.claims import claim_rows
from harness.report.table import leaderboard_frame

REPO = Path(__file__).resolve().parents[2]
PRETRAINED = {"backbone": {"name": "efficientnet_lite0", "pretrained": "imagenet"}}
SCRATCH = {"backbone": {"name": "conv4", "pretrained": "none"}}

# recall@1 per seed (0, 1, 2); MAP@R, the main metric, is half of it
RECALL = {
    "untrained": [0.300, 0.330, 0.310],  # trains 0 steps: the zero-shot row
    "contrastive": [0.500, 0.520, 0.510],
    "lifted_structure": [0.600, 0.625, 0.605],  # - contrastive: +0.100, +0.105, +0.095
    "triplet": [0.700, 0.730, 0.712],  # lifted - triplet: -0.100, -0.105, -0.107
    "pddm_quadruplet": [0.620, 0.600, 0.615],  # - lifted: +0.020, -0.025, +0.010
    "pddm_score": [0.650, 0.676, 0.652],  # - lifted: +0.050, +0.051, +0.047
    "hdc_contrastive": [0.640, 0.660, 0.650],
    "quadruplet_random": [0.550, 0.560, 0.545],
    "quadruplet_method1": [0.600, 0.612, 0.596],  # - random: +0.050, +0.052, +0.051
    "quadruplet_method2": [0.560, 0.555, 0.560],  # - random: +0.010, -0.005, +0.015
    "npairs": [0.310, 0.320, 0.325],  # - untrained: +0.010, -0.010, +0.015
    "arcface": [0.200, 0.210, 0.190],  # below the zero-shot row
}
HEADS = {  # the cascade's heads, each scored alone; the cascade - head:
    "head1": [0.400, 0.430, 0.405],  # +0.240, +0.230, +0.245
    "head2": [0.650, 0.640, 0.660],  # -0.010, +0.020, -0.010
    "head3": [0.500, 0.510, 0.530],  # +0.140, +0.150, +0.120
}
# the claims in the file's order, the cascade's expanded to its three heads
CLAIMED = [
    ("lifted_structure", "contrastive"), ("lifted_structure", "triplet"),
    ("pddm_quadruplet", "lifted_structure"), ("pddm_score", "lifted_structure"),
    ("hdc_contrastive", "hdc_contrastive / head1"), ("hdc_contrastive", "hdc_contrastive / head2"),
    ("hdc_contrastive", "hdc_contrastive / head3"),
    ("quadruplet_method1", "quadruplet_random"), ("quadruplet_method2", "quadruplet_random"),
]  # fmt: skip
WORDS = ["holds", "reversed", "cannot tell", "holds", "holds", "cannot tell", "holds", "holds",
         "cannot tell"]  # fmt: skip


def record(method: str, seed: int, content: dict, protocol: str = "birds") -> dict:
    value = RECALL[method][seed]
    heads = {h: {"recall@1": v[seed], "map@r": v[seed] / 2} for h, v in HEADS.items()}
    return {
        "schema": 2, "status": "ok", "seed": seed, "sweep_seeds": [0, 1, 2],
        "protocol": {"name": protocol, "version": 1, "hash": f"{protocol}-hash",
                     "content": {"name": protocol, **content}},
        "method": {"name": method, "version": 1, "hyperparameters": {}},
        "training": {"max_steps": None, "steps": 0 if method == "untrained" else 120},
        "metrics": {"recall@1": value, "map@r": value / 2},
        **({"metrics_by_part": heads} if method == "hdc_contrastive" else {}),
    }  # fmt: skip


def runs(content: dict = PRETRAINED, protocol: str = "birds", leave_out=()) -> list[RunResult]:
    return [RunResult.from_json(record(m, s, content, protocol))
            for m in RECALL if m not in leave_out for s in range(3)]  # fmt: skip


def side(name: str) -> list[float]:
    method, _, part = name.partition(" / ")
    return HEADS[part] if part else RECALL[method]


def by_method(frame) -> dict[str, dict[str, str]]:
    return {row["method"]: row for row in frame.to_dict("records")}


def test_the_zero_shot_row_is_named_and_each_row_is_tested_against_it():
    rows = by_method(leaderboard_frame(runs()))
    assert "untrained (zero-shot)" in rows and "untrained" not in rows
    assert rows["untrained (zero-shot)"]["vs zero-shot (map@r)"] == "zero-shot"
    others = [m for m in RECALL if m != "untrained"]  # BH over every row against it
    halves = {m: [v / 2 for v in RECALL[m]] for m in RECALL}
    raw = [ttest_rel(halves[m], halves["untrained"]).pvalue for m in others]
    adjusted = dict(zip(others, false_discovery_control(raw, method="bh"), strict=True))
    assert adjusted["contrastive"] < 0.05 and adjusted["arcface"] < 0.05
    assert adjusted["npairs"] > 0.05
    assert (
        rows["contrastive"]["vs zero-shot (map@r)"] == f"above (p = {adjusted['contrastive']:.2g})"
    )
    assert rows["arcface"]["vs zero-shot (map@r)"] == f"below (p = {adjusted['arcface']:.2g})"
    assert rows["npairs"]["vs zero-shot (map@r)"] == f"≈ zero-shot (p = {adjusted['npairs']:.2g})"
    # the columns: method, seeds, vs best and its probabilities, vs zero-shot and its, then
    # the numbers
    assert list(leaderboard_frame(runs()).columns[:6]) == [
        "method", "seeds", "vs best (map@r)", "P(worse · ≈ · better) vs best, ±1",
        "vs zero-shot (map@r)", "P(worse · ≈ · better) vs zero-shot, ±1"]  # fmt: skip


def test_the_markdown_explains_the_zero_shot_row_above_its_table():
    text = render(runs())
    assert "| untrained (zero-shot) " in text and "`vs zero-shot` tests each complete row" in text
    assert text.index("`untrained (zero-shot)` is the pretrained") < text.index("| method ")


def test_a_protocol_trained_from_scratch_has_neither_the_zero_shot_row_nor_the_claims():
    frame = leaderboard_frame(runs(SCRATCH))
    assert "untrained" in set(frame["method"]) and "vs zero-shot (map@r)" not in frame.columns
    text = render(runs(SCRATCH))
    assert "zero-shot" not in text and "seed papers claim" not in text


def test_each_claim_gets_its_word_from_the_paired_test_adjusted_over_the_claims():
    rows = claim_rows(runs())
    assert [row["claim"] for row in rows] == [f"{a} > {b}" for a, b in CLAIMED]
    raw = [ttest_rel(side(a), side(b)).pvalue for a, b in CLAIMED]
    adjusted = false_discovery_control(raw, method="bh")
    for row, word, p in zip(rows, WORDS, adjusted, strict=True):
        assert row["verdict"] == f"{word} (p = {p:.2g})", row["claim"]


def test_each_claim_is_judged_again_on_the_tuned_ranking():
    """Tuned contrastive reaches lifted structure: the claim `lifted_structure > contrastive`
    holds at the defaults and not tuned, and says so; every other claim is judged on the
    default runs of its (untuned) methods, BH-adjusted over the tuned claims."""
    tuned = [0.600, 0.628, 0.603]  # lifted - tuned contrastive: 0.000, -0.003, +0.002
    extra = []
    for seed, value in enumerate(tuned):
        data = record("contrastive", seed, PRETRAINED)
        data["metrics"] = {"recall@1": value, "map@r": value / 2}
        data["method"]["hyperparameters"] = {"margin": 0.3}
        data["tuning"] = {"trials": 20}
        extra.append(RunResult.from_json(data))
    rows = claim_rows(runs() + extra)
    values = {**RECALL, "contrastive": tuned}
    pairs = [[HEADS[p] if p else values[m] for m, _, p in (s.partition(" / ") for s in c)]
             for c in CLAIMED]  # fmt: skip
    adjusted = false_discovery_control([ttest_rel(a, b).pvalue for a, b in pairs], method="bh")
    assert rows[0]["verdict"].startswith("holds")  # at the defaults, as before
    assert rows[0]["tuned verdict"] == f"cannot tell (p = {adjusted[0]:.2g}); holds only untuned"
    # mean -0.033 points, sd 0.252: ± 4.303 x 0.252 / sqrt(3) = 0.63
    assert rows[0]["tuned: Δ recall@1"] == "-0.0 [-0.7, +0.6]"
    for row, word, p in zip(rows[1:], WORDS[1:], adjusted[1:], strict=True):
        assert row["tuned verdict"] == f"{word} (p = {p:.2g})", row["claim"]
    assert "tuned verdict" not in claim_rows(runs())[0]  # no tuned runs: no tuned columns


def test_a_claim_that_holds_only_once_tuned_says_so():
    """Tuned pddm_quadruplet clears lifted structure (+0.100, +0.105, +0.107): `cannot tell`
    at the defaults, `holds` tuned."""
    extra = []
    for seed, value in enumerate([0.700, 0.730, 0.712]):
        data = record("pddm_quadruplet", seed, PRETRAINED)
        data["metrics"] = {"recall@1": value, "map@r": value / 2}
        data["tuning"] = {"trials": 20}
        extra.append(RunResult.from_json(data))
    row = claim_rows(runs() + extra)[2]
    assert row["claim"] == "pddm_quadruplet > lifted_structure"
    assert row["verdict"].startswith("cannot tell")
    assert row["tuned verdict"].startswith("holds (p = ")
    assert row["tuned verdict"].endswith("; holds only tuned")


def test_ours_is_the_paired_difference_with_its_t_interval_in_points():
    row = claim_rows(runs())[0]  # lifted - contrastive: 0.100, 0.105, 0.095
    # mean 10.0 points, sd 0.5, t(0.975, 2) = 4.303: ± 4.303 x 0.5 / sqrt(3) = 1.24
    assert row["ours: Δ recall@1"] == "+10.0 [+8.8, +11.2]"
    assert row["ours: Δ map@r"] == "+5.0 [+4.4, +5.6]"  # MAP@R is half of recall@1 here


def test_the_paper_numbers_are_the_reference_files_with_where_they_were_measured():
    published = yaml.safe_load(REFERENCE_FILE.read_text(encoding="utf-8"))
    pddm = published["pddm_nips2016"]["cub200"]
    karaman = published["quadruplet_selection_icip2019"]["cars196"]
    rows = {row["claim"]: row for row in claim_rows(runs())}
    lifted = rows["lifted_structure > contrastive"]
    assert lifted["paper recall@1 (%)"] == "47.2 vs 26.4"
    assert lifted["paper recall@1 (%)"] == (f"{pddm['lifted_structure']['recall@1']} vs "
                                           f"{pddm['contrastive']['recall@1']}")  # fmt: skip
    assert (
        "bounding-box crops" in lifted["paper's data"]
        and "PDDM's Table 1" in lifted["paper's data"]
    )
    assert lifted["whose"].startswith("Song et al.")
    assert rows["lifted_structure > triplet"]["paper recall@1 (%)"] == "47.2 vs 36.1"
    assert rows["pddm_quadruplet > lifted_structure"]["paper recall@1 (%)"] == "58.3 vs 47.2"
    assert rows["pddm_score > lifted_structure"]["paper recall@1 (%)"] == "55.0 vs 47.2"
    q1 = rows["quadruplet_method1 > quadruplet_random"]
    assert q1["paper recall@1 (%)"] == (f"{karaman['quadruplet_method1']['recall@1']} vs "
                                        f"{karaman['quadruplet_random']['recall@1']}")  # fmt: skip
    assert (
        q1["paper recall@1 (%)"] == "64.85 vs 61.49"
        and "CARS196, whole images" in q1["paper's data"]
    )
    assert rows["quadruplet_method2 > quadruplet_random"]["paper recall@1 (%)"] == "66.06 vs 61.49"
    head = rows["hdc_contrastive > hdc_contrastive / head1"]
    claim = "each single cascade head is worse than the concatenation of the three"
    assert head["paper recall@1 (%)"] == f'"{claim}"' and "qualitative" in head["paper's data"]
    assert claim in published["hdc_iccv2017"]["claims"]  # the paper's own words, as transcribed


def test_a_claim_whose_method_has_not_run_says_which_and_the_others_are_still_tested():
    rows = {row["claim"]: row for row in claim_rows(runs(leave_out=("pddm_score",)))}
    row = rows["pddm_score > lifted_structure"]
    assert row["verdict"] == "cannot tell (not run: pddm_score)" and row["ours: Δ recall@1"] == "-"
    assert row["paper recall@1 (%)"] == "55.0 vs 47.2"
    # the family is the 8 claims tested: lifted > contrastive's p is adjusted over those
    tested = [c for c in CLAIMED if c[0] != "pddm_score"]
    adjusted = false_discovery_control([ttest_rel(side(a), side(b)).pvalue for a, b in tested])
    assert rows["lifted_structure > contrastive"]["verdict"] == f"holds (p = {adjusted[0]:.2g})"


def test_the_claims_section_follows_the_table_and_needs_one_testable_claim():
    text = render(runs())
    assert text.index("| untrained (zero-shot) ") < text.index("### What the seed papers claim")
    assert "| lifted_structure > contrastive " in text
    assert "seed papers claim" not in render(runs(leave_out=tuple(m for m, _ in CLAIMED)))


def test_every_claim_names_methods_that_exist_and_numbers_that_are_on_file():
    import harness.methods  # noqa: F401

    from harness.core import METHODS

    assert CLAIMS_FILE.parent == REFERENCE_FILE.parent  # shipped with the reference numbers
    for claim in load_claims():
        assert claim.better in METHODS.names(), claim
        assert claim.worse.partition(" / ")[0] in METHODS.names(), claim
        assert claim.numbers or claim.text, claim


def test_birds_joins_the_ranking_agreement_without_moving_the_other_pairs():
    scratch = {"default": runs(SCRATCH, "default"), "omniglot": runs(SCRATCH, "omniglot")}
    for r in scratch["omniglot"]:  # omniglot swaps two methods, so not every tau is 1
        if r.method.name in ("triplet", "pddm_score"):
            r.metrics = {"map@r": RECALL["pddm_score" if r.method.name == "triplet"
                                          else "triplet"][r.seed] / 2}  # fmt: skip
    before = cells(agreement_section(scratch["default"] + scratch["omniglot"]))
    after = cells(agreement_section(scratch["default"] + scratch["omniglot"] + runs()))
    assert [row[0] for row in after] == ["birds (map@r) vs default (map@r)",
                                         "birds (map@r) vs omniglot (map@r)",
                                         "default (map@r) vs omniglot (map@r)"]  # fmt: skip
    assert after[2] == before[0] and after[2][2] != "+1.00"  # the same cells as without birds


def cells(section: str) -> list[list[str]]:
    """The agreement table's rows, each a list of its cells (the header and rule left out)."""
    lines = [line for line in section.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_two_versions_of_one_protocol_are_two_rankings_not_one():
    old = runs()
    new = [RunResult.from_json({**record(r.method.name, r.seed, PRETRAINED), "protocol": {
        "name": "birds", "version": 2, "hash": "new", "content": PRETRAINED}}) for r in old]  # fmt: skip
    groups = protocol_groups(old + new)
    assert sorted(groups) == ["birds v1 (birds-hash)", "birds v2 (new)"]
    assert sorted(protocol_groups(old)) == ["birds"]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """The HTML report of a results folder holding the synthetic pretrained protocol."""
    from harness.core import load_methods
    from harness.report import write_report

    load_methods()
    results = tmp_path_factory.mktemp("birds") / "results"
    for r in runs():
        path = results / "runs" / "birds" / r.method.name / f"seed{r.seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record(r.method.name, r.seed, PRETRAINED)))
    return write_report(results)


def test_the_html_report_links_the_zero_shot_row_and_shows_the_claims(report: Path):
    text = report.read_text(encoding="utf-8")
    assert "untrained (zero-shot)</a>" in text and "seed papers claim" in text
    page = next(report.parent.rglob("*untrained*.html")).read_text(encoding="utf-8")
    assert "untrained (zero-shot)" in page  # its page shows its leaderboard row
