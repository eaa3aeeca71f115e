"""The Bayesian comparisons with a ROPE (harness.stats.bayes, harness.stats.equivalence; shown by
harness.report.equivalence): the correlated
t-test and the signed-rank test against cases worked by hand and against baycomp's outputs,
the verdicts of identical and shifted methods, the ROPE as a protocol setting, the across-
protocol section's tables and figure (around a stand-in for the hierarchical model, which
tests/harness/stats/test_hierarchical.py tests), and the leaderboard and README quoting one
computation of the committed results."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from harness.core import HarnessError, load_methods, load_protocol
from harness.records import load_results, per_seed, protocol_groups
from harness.report.equivalence import caption, drawing, readme_sentence, section
from harness.report.table import leaderboard_frame
from harness.report.verdicts import against_best, within, within_column
from harness.stats import (
    DECISIVE,
    PRETRAINED,
    ROPES,
    Block,
    across,
    protocol_blocks,
    seed_probs,
    signed_rank_probs,
    signed_rank_samples,
)

REFERENCE = Path(__file__).resolve().parents[3] / "results" / "reference"


def _t2_cdf(t: float) -> float:
    """Student's t CDF with 2 degrees of freedom, in closed form: 1/2 + t / (2 sqrt(2 + t^2))."""
    return 0.5 + t / (2 * math.sqrt(2 + t * t))


def test_the_correlated_t_test_on_three_seeds_worked_by_hand():
    """Differences 1, 2, 3 points, ROPE 1: mean 2, s = 1, posterior t with 2 degrees of
    freedom and scale 1/sqrt(3). P(worse) = F(-3 sqrt 3) = 0.0176, P(better) = 1 - F(-sqrt 3)
    = 0.8873, P(≈) the rest = 0.0951."""
    p = seed_probs({0: 3.0, 1: 4.0, 2: 5.0}, {0: 2.0, 1: 2.0, 2: 2.0}, rope=1.0)
    worse, better = _t2_cdf(-3 * math.sqrt(3)), 1 - _t2_cdf(-math.sqrt(3))
    assert p.n == 3
    assert p.worse == pytest.approx(worse, abs=1e-12) and worse == pytest.approx(0.0176, abs=1e-4)
    assert p.better == pytest.approx(better, abs=1e-12) and better == pytest.approx(
        0.8873, abs=1e-4
    )
    assert p.equivalent == pytest.approx(1 - worse - better, abs=1e-12)


def test_the_correlated_t_test_pairs_by_seed_and_needs_two():
    a, b = {0: 50.0, 1: 60.0, 2: 70.0}, {0: 49.0, 1: 59.0, 2: 69.0, 7: 0.0}
    p = seed_probs(a, b, rope=2.0)  # the same +1 on every shared seed: within ±2, surely
    assert (p.worse, p.equivalent, p.better, p.n) == (0.0, 1.0, 0.0, 3)
    assert seed_probs({0: 1.0}, {0: 2.0, 1: 3.0}, 1.0) is None


def test_the_signed_rank_test_on_one_data_set_worked_by_hand():
    """One data set, y better by 5 with ROPE 1. With the prior's pseudo-observation at 0
    (weight 0.5) the posterior weights are Dirichlet(0.5, 1): w0 ~ Beta(0.5, 1), P(w0 < u) =
    sqrt(u). The pair sums 0 (w0^2, within), 5 and 10 (the rest, above): within is the most
    probable where w0^2 > 1/2, with probability 1 - 2^(-1/4) = 0.1591; better 0.8409."""
    p = signed_rank_probs([0.0], [5.0], rope=1.0)
    assert p.worse == 0.0
    assert p.equivalent == pytest.approx(1 - 2**-0.25, abs=0.006)  # 50,000 samples: se 0.0016
    assert p.better == pytest.approx(2**-0.25, abs=0.006)


# Outputs of baycomp 1.0.3 (the authors' library), computed with it for these inputs:
# SignedRankTest.probs(X, Y, rope, random_state=0), SignedRankTest.sample(X, Y, 1.0,
# nsamples=3, random_state=0) and single.Posterior(d.mean(), d.var(ddof=1) / 5, 4, 0.5).probs()
X = [38.0, 61.0, 13.0, 45.0, 27.0, 52.0]
Y = [38.9, 60.2, 14.6, 46.1, 26.5, 53.4]
BAYCOMP_PROBS = {1.0: (0.0, 0.76982, 0.23018), 0.5: (0.01628, 0.37728, 0.60644)}
BAYCOMP_SAMPLES = [[0.0, 0.49704009376761704, 0.502959906232383],
                   [0.0, 0.8227517281634509, 0.17724827183654912],
                   [0.0, 0.6887706221936282, 0.31122937780637183]]  # fmt: skip
D = [1.4, -0.3, 0.8, 0.2, 1.1]
BAYCOMP_T = (0.010359018709574801, 0.32593691058770846, 0.6637040707027168)


def test_the_signed_rank_test_reproduces_baycomp_draw_for_draw():
    np.testing.assert_allclose(signed_rank_samples(X, Y, 1.0, nsamples=3), BAYCOMP_SAMPLES,
                               atol=1e-12)  # fmt: skip
    for rope, expected in BAYCOMP_PROBS.items():
        p = signed_rank_probs(X, Y, rope)
        assert (p.worse, p.equivalent, p.better) == pytest.approx(expected, abs=1e-12)


def test_the_correlated_t_test_reproduces_baycomp():
    p = seed_probs(dict(enumerate(D)), dict.fromkeys(range(5), 0.0), 0.5)
    assert (p.worse, p.equivalent, p.better) == pytest.approx(BAYCOMP_T, abs=1e-12)


def test_a_sum_exactly_at_twice_the_rope_counts_half_on_each_side():
    """baycomp's Heaviside convention: a pair sum equal to 2 * ROPE is half within, half
    above. One data set at exactly 2: sums 0 (within), 2 (half), 4 (above)."""
    samples = signed_rank_samples([0.0], [2.0], 1.0, nsamples=4)
    w0 = np.random.RandomState(0).dirichlet([0.5, 1.0], 4)[:, 0]
    w1 = 1 - w0
    np.testing.assert_allclose(samples[:, 2], w0 * w1 + w1**2, atol=1e-12)
    np.testing.assert_allclose(samples[:, 1], w0**2 + w0 * w1, atol=1e-12)


def test_identical_methods_are_equivalent_and_a_five_point_shift_is_better():
    seeds = {0: 41.0, 1: 43.5, 2: 42.2, 3: 40.9, 4: 42.8}
    same = seed_probs(seeds, dict(seeds), 1.0)
    assert same.equivalent == 1.0 and same.verdict() == "equivalent"
    shifted = seed_probs({s: v + 5 for s, v in seeds.items()}, seeds, 1.0)
    assert shifted.better > 0.999 and shifted.verdict() == "better"
    means = [38.0, 61.0, 13.0, 45.0, 27.0, 52.0]
    assert signed_rank_probs(means, means, 1.0).equivalent > DECISIVE
    assert signed_rank_probs(means, [m + 5 for m in means], 1.0).better > 0.97
    assert signed_rank_probs([m + 5 for m in means], means, 1.0).worse > 0.97


def test_a_wider_rope_turns_a_small_gap_into_equivalence():
    means = [38.0, 61.0, 13.0, 45.0, 27.0, 52.0]
    y = [m - 0.8 for m in means]
    assert signed_rank_probs(means, y, 0.5).verdict() == "worse"
    assert signed_rank_probs(means, y, 1.0).verdict() == "equivalent"


def _blocks(ropes: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0)) -> list[Block]:
    """A leads B by 0.8 points on four protocols, C trails by 10, on each of 3 seeds. By the
    signed-rank test B is equivalent at ROPE 1 and C worse; by the stand-in for the
    hierarchical model (tests/canned_posteriors.py: normal, sd 0.1) B is equivalent at ROPE
    1 and 2 but worse at 0.5 (fragile), and C worse at every ROPE."""
    base, noise = (0.40, 0.55, 0.20, 0.33), (0.0, 0.004, -0.003)
    out = []
    for i, (v, r) in enumerate(zip(base, ropes, strict=True)):
        values = {m: {s: v + e - shift for s, e in enumerate(noise)}
                  for m, shift in (("A", 0.0), ("B", 0.008), ("C", 0.10))}  # fmt: skip
        means = {m: float(np.mean(list(seeds.values()))) for m, seeds in values.items()}
        out.append(Block(f"p{i}", "map@r", means, str(i), rope=r, seeds=3, values=values))
    return out


@pytest.fixture
def canned(monkeypatch):
    """The hierarchical model replaced by its stand-in, and this process's kept posteriors
    emptied before and after (the stand-in's must not be taken for the model's)."""
    from canned_posteriors import canned_compare

    from harness.stats import hierarchical, posteriors

    monkeypatch.setattr(hierarchical, "compare", canned_compare)
    monkeypatch.setattr(posteriors, "_MEMORY", {})


def test_across_protocols_names_the_reference_the_equivalent_and_the_fragile(canned):
    a = across(_blocks())
    assert a.reference == "A" and a.rope == 1.0 and a.blocks == ["p0", "p1", "p2", "p3"]
    assert sorted(a.sensitivity) == sorted(ROPES)
    assert a.probs == a.sensitivity[1.0]
    assert a.probs["B"].verdict() == "equivalent" and a.equivalent() == ["B"]
    assert a.sensitivity[0.5]["B"].verdict() == "worse" and a.fragile("B")
    assert {a.sensitivity[r]["C"].verdict() for r in ROPES} == {"worse"} and not a.fragile("C")
    assert a.order() == ["B", "C"]
    # the signed-rank test beside it, over the protocols' means
    assert a.signed_rank["B"].verdict() == "equivalent" and a.signed_rank["C"].verdict() == "worse"
    assert a.newly_decided() == [] and a.newly_undecided() == []
    assert "ROPE ±1 points" in caption(a) and "4 protocols" in caption(a)
    assert "3 seeds each" in caption(a) and "with P ≥ 0.95: B." in caption(a)
    assert "hierarchical Bayesian model" in caption(a) and "4 of 4" not in caption(a)
    assert "2 of 2 comparisons converged" in caption(a)
    text = section(_blocks())
    assert "| B " in text and "fragile" in text and "Reference: A." in text
    assert "| signed-rank, ±1 " in text and "0.00 · 1.00 · 0.00: ≈ (1.00)" in text
    assert "decides 0 verdicts that the signed-rank test left undecided (none)" in text
    assert "-0.80 [-0.90, -0.70]" in text  # the stand-in's shrunk means, in their table


def test_a_method_missing_from_a_protocol_is_compared_over_those_it_ran_on(canned):
    """Q ran on p0-p2 but cannot run on p3 (a dataset without what it needs), R on p0 alone:
    the rank test's blocks stay complete (the reference is the best of the methods all four
    protocols ran), Q is compared with A over p0-p2, the model's pairs need no complete
    blocks, and R, with one protocol, is not compared; the caption names both and where
    they are missing, rather than dropping them silently."""
    blocks = _blocks()
    for b in blocks[:3]:
        b.values["Q"] = {s: v - 0.2 for s, v in b.values["A"].items()}
        b.means["Q"] = b.means["A"] - 0.2
    blocks[0].values["R"] = {s: v + 0.05 for s, v in blocks[0].values["A"].items()}
    blocks[0].means["R"] = blocks[0].means["A"] + 0.05  # better, yet not the reference
    a = across(blocks)
    assert a.blocks == ["p0", "p1", "p2", "p3"] and a.reference == "A"
    assert sorted(a.probs) == ["B", "C", "Q"]
    assert a.unranked == {"Q": ["p3"], "R": ["p1", "p2", "p3"]}
    assert a.gaps["Q"] == pytest.approx({"p0": -20.0, "p1": -20.0, "p2": -20.0})
    assert [s.protocol for s in a.posteriors["Q"].shrunk] == ["p0", "p1", "p2"]
    assert a.signed_rank["Q"].verdict() == "worse" and a.probs["Q"].verdict() == "worse"
    assert ("Compared over the protocols each ran on only, for want of a run on every "
            "protocol: Q (none on p3). Not compared, for want of a run on every protocol: R "
            "(none on p1, p2, p3).") in caption(a)  # fmt: skip
    whole = caption(across(_blocks()))
    assert "Compared over" not in whole and "Not compared" not in whole


def test_the_methods_on_one_side_of_the_rope_everywhere_are_counted_and_the_open_named(canned):
    """A method whose mean difference from the reference lies in one region of the ROPE on
    every protocol is a comparison the model is expected to decide: B (-0.8 everywhere:
    within ±1) and C (-10: worse) are decided; D (-1.2 and -6 by turns: worse everywhere,
    but so spread that the stand-in gives P(worse) 0.86) stays open; E (-0.5 and -3 by
    turns) straddles ±1, so it is not counted."""
    blocks = _blocks()
    for i, b in enumerate(blocks):
        for name, shift in (("D", (0.012, 0.06)[i % 2]), ("E", (0.005, 0.03)[i % 2])):
            b.values[name] = {s: v - shift for s, v in b.values["A"].items()}
            b.means[name] = b.means["A"] - shift
    a = across(blocks)
    assert a.gaps["D"]["p0"] == pytest.approx(-1.2) and a.gaps["E"]["p1"] == pytest.approx(-3)
    assert a.one_sided() == {"B": "equivalent", "C": "worse", "D": "worse"}
    assert a.probs["D"].worse == pytest.approx(0.86, abs=0.01) and a.still_open() == ["D"]
    text = section(blocks)
    assert "Of the 3 methods on one side of ±1 on every protocol" in text
    assert "decided: 2; open: D." in text
    assert " | straddles " in next(line for line in text.splitlines() if line.startswith("| E "))


def test_the_protocols_rope_is_used_when_they_share_one(canned):
    assert across(_blocks((2.0,) * 4)).rope == 2.0
    assert across(_blocks((2.0, 2.0, 1.0, 1.0))).rope == 1.0  # they differ: the default
    assert across(_blocks()[:1]) is None  # one protocol: nothing to compare across


def test_the_drawing_is_the_same_bytes_twice(canned):
    import hashlib
    import io

    def png() -> str:
        buffer = io.BytesIO()
        drawing(across(_blocks())).savefig(buffer, format="png", dpi=50)
        return hashlib.sha256(buffer.getvalue()).hexdigest()

    assert png() == png()


def test_the_rope_is_a_protocol_setting_in_the_hash_when_set(tmp_path):
    source = (REFERENCE.parents[1] / "protocols" / "default.yaml").read_text(encoding="utf-8")
    default = load_protocol("default")
    assert default.evaluation.rope == 1.0

    def with_rope(value: str) -> Path:
        path = tmp_path / f"rope_{value}.yaml"
        path.write_text(re.sub(r"(?m)^evaluation:\n", f"evaluation:\n  rope: {value}\n", source,
                               count=1), encoding="utf-8")  # fmt: skip
        return path

    assert load_protocol(str(with_rope("1.0"))).hash == default.hash  # the default: unchanged
    two = load_protocol(str(with_rope("2")))
    assert two.evaluation.rope == 2.0 and two.hash != default.hash
    with pytest.raises(HarnessError, match="rope must be > 0"):
        load_protocol(str(with_rope("0")))


# ------------------------------------------------------------- the committed results


@pytest.fixture(scope="module")
def committed():
    load_methods()
    return load_results(REFERENCE)


def test_the_tables_quote_the_within_protocol_computation(committed):
    groups = protocol_groups(committed, tuned=True)
    for name in ("cars", "default"):
        runs = groups[name]
        table = leaderboard_frame(runs).set_index("method")
        values = {n: v for n, v in per_seed(runs, "map@r").items()
                  if "incomplete" not in str(table.loc[n if n in table.index
                                                       else f"{n} (zero-shot)", "seeds"])}  # fmt: skip
        best, _ = against_best(values)
        cells = within(values, best, runs)
        assert within_column("best", 1.0) in cells and len(cells) == 2
        for column, rows in cells.items():
            for row, cell in rows.items():
                shown = row if row in table.index else f"{row} (zero-shot)"
                assert table.loc[shown, column] == cell
        leaderboard = (REFERENCE / "LEADERBOARD.md").read_text(encoding="utf-8")
        assert within_column("best", 1.0) in leaderboard


def test_the_leaderboard_figure_and_readme_quote_one_computation(committed):
    blocks = protocol_blocks(committed)
    leaderboard = (REFERENCE / "LEADERBOARD.md").read_text(encoding="utf-8")
    assert section(blocks) in leaderboard
    pretrained = across([b for b in blocks if b.setting == PRETRAINED], PRETRAINED)
    assert caption(pretrained) in leaderboard  # the figure's caption, under the figure
    assert (REFERENCE / "figures" / "equivalence_pretrained.png").is_file()
    readme = (REFERENCE.parents[1] / "README.md").read_text(encoding="utf-8")
    assert readme_sentence(pretrained) in " ".join(readme.split())  # its real-photo section
    one, still = pretrained.one_sided(), pretrained.still_open()  # and the goal's count after it
    assert (f"Of the {len(one)} methods on one side of ±{pretrained.rope:g} on every protocol, "
            f"the model decides {len(one) - len(still)} ") in " ".join(readme.split())  # fmt: skip
    # the first screen says what the datasets decide together, in the same counts
    decided = sum(p.verdict() not in ("undecided", "not converged")
                  for p in pretrained.probs.values())  # fmt: skip
    first = " ".join(readme.split("\n## ")[0].split())
    assert (
        f"over the {len(pretrained.blocks)} decides {decided} of the "
        f"{len(pretrained.probs)} comparisons against {pretrained.reference} "
        f"(±{pretrained.rope:g} MAP@R point, P ≥ {DECISIVE:g}), {len(one) - len(still)} of "
        f"the {len(one)} methods on one side of ±{pretrained.rope:g} on every dataset"
    ) in first


def test_compare_prints_the_probabilities_at_the_protocols_rope(committed, capsys):
    """`compare` on committed cars: margin is significantly above contrastive (p = 0.037)
    and practically equivalent to it (the gap is under a point)."""
    from harness.cli import main

    argv = ["compare", "margin", "contrastive", "--protocol", "cars", "--results-dir",
            str(REFERENCE)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    values = per_seed(protocol_groups(committed)["cars"], "map@r")
    a, b = ({s: 100 * v for s, v in values[m].items()} for m in ("margin", "contrastive"))
    p = seed_probs(a, b, 1.0)
    assert p.verdict() == "equivalent"
    assert f"P(margin worse · ≈ · better than contrastive, ROPE ±1): {p.cell()} " in out
    assert "(paired t test, n = 5), p = 0.0371" in out
