"""The hierarchical Bayesian model across protocols (harness.stats.hierarchical, its sampler
harness.stats.nuts) and its kept posteriors (harness.stats.posteriors): the likelihood with sigma_i integrated out
against numerical integration; known answers (planted twins equivalent, a method 5 points
below on every seed worse, baycomp's documented example reproduced, one seed per protocol
falling back to the protocols' means as the signed-rank test sees them); convergence
checked and shown as words; the same draws in two processes; and the bad inputs (a ROPE of
0, a protocol with one shared seed, a kept posterior that does not match its inputs).

The tests that sample are marked slow (each comparison takes seconds, and the first of a
process compiles the sampler, about 20 s); the committed comparisons are read from the
committed posteriors, never sampled here."""

from __future__ import annotations

import csv
import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate, stats

from harness.core import HarnessError, load_methods
from harness.records import load_results
from harness.report.equivalence import caption, section, table
from harness.stats import (
    PRETRAINED,
    across,
    comparisons,
    convergence,
    hierarchical,
    main_blocks,
    nuts,
    posteriors,
    protocol_blocks,
)
from harness.stats.bayes import DECISIVE, signed_rank_probs
from harness.stats.convergence import Diagnostics
from harness.stats.hierarchical import (
    NotConverged,
    Posterior,
    check_rope,
    compare,
    shared_differences,
    winner_shares,
)
from harness.stats.nuts import marginal_log_likelihood
from harness.stats.posteriors import CACHE_FILE, PosteriorCache

REPO = Path(__file__).resolve().parents[3]
REFERENCE = REPO / "results" / "reference"
BAYCOMP = Path(__file__).with_name("baycomp_nbc_j48.csv")


@pytest.fixture(autouse=True)
def fresh_memory(monkeypatch):
    """Each test starts with no posterior kept in this process."""
    monkeypatch.setattr(posteriors, "_MEMORY", {})


# ------------------------------------------------------------------ the likelihood, exactly


@pytest.mark.parametrize("rho", [0.0, 0.1])
def test_sigma_is_integrated_out_exactly(rho):
    """log p(x | delta) of the model, sigma ~ Uniform(0, H) integrated out in closed form,
    against scipy's quadrature of the multivariate normal over sigma."""
    import jax.numpy as jnp

    nuts._jax()
    x = np.array([[0.4, -0.3, 1.1, 0.2, 0.0], [2.0, 1.0, 1.5, 0.0, 0.0]])
    mask = np.array([[True] * 5, [True, True, True, False, False]])
    delta, upper = np.array([0.3, 1.2]), 4.0
    ours = np.asarray(marginal_log_likelihood(jnp.asarray(x), jnp.asarray(mask),
                                              jnp.asarray(delta), upper, rho))  # fmt: skip
    for i in range(2):
        n = int(mask[i].sum())
        cov = (1 - rho) * np.eye(n) + rho

        def density(sigma: float, i: int = i, n: int = n, cov: np.ndarray = cov) -> float:
            normal = stats.multivariate_normal(np.full(n, delta[i]), sigma**2 * cov)
            return normal.pdf(x[i, :n]) / upper

        value, _ = integrate.quad(density, 1e-9, upper, limit=200, epsabs=0, epsrel=1e-10)
        assert ours[i] == pytest.approx(math.log(value), abs=1e-7)


def test_shared_seeds_pair_by_seed_and_protocols_with_one_are_left_out():
    a = {"p": {0: 5.0, 1: 6.0, 2: 7.0}, "q": {0: 1.0, 3: 2.0}, "r": {0: 1.0, 1: 2.0}}
    b = {"p": {0: 4.0, 1: 4.0, 9: 0.0}, "q": {0: 0.0, 1: 0.0}, "r": {0: 0.0, 1: 0.0}}
    kept, left_out = shared_differences(a, b)
    assert kept == {"p": [1.0, 2.0], "r": [1.0, 2.0]} and left_out == ["q"]
    # no protocol with 2 shared seeds: each one's single difference, the means only
    kept, left_out = shared_differences(
        {"p": {0: 3.0}, "q": {1: 1.0}}, {"p": {0: 1.0}, "q": {2: 0.0}}
    )
    assert kept == {"p": [2.0]} and left_out == ["q"]


def test_a_rope_of_zero_or_below_is_one_line_naming_what_to_set():
    for rope in (0, -1.0, math.nan, math.inf):
        with pytest.raises(HarnessError, match=r"set evaluation\.rope in the protocol") as err:
            check_rope(rope)
        assert "\n" not in str(err.value)
    with pytest.raises(HarnessError, match="positive number of points, got 0"):
        compare({"p": {0: 1.0, 1: 2.0}}, {"p": {0: 0.0, 1: 0.0}}, [1.0, 0.0])


# ------------------------------------------------------------------ known answers


@pytest.fixture(scope="module")
def committed() -> dict[str, dict[str, dict[int, float]]]:
    """The committed pretrained protocols: protocol -> method -> seed -> MAP@R (points)."""
    load_methods()
    blocks = [b for b in protocol_blocks(load_results(REFERENCE)) if b.setting == PRETRAINED]
    return {b.name: {m: {s: 100 * v for s, v in seeds.items()} for m, seeds in b.values.items()}
            for b in blocks}  # fmt: skip


def _method(committed: dict, name: str) -> dict[str, dict[int, float]]:
    return {protocol: rows[name] for protocol, rows in committed.items()}


def test_planted_twins_are_equivalent_exactly(committed):
    """A copy of multi_similarity with its seeds: no spread anywhere, nothing to sample, the
    whole mass at 0 (as the within-protocol test puts it)."""
    best = _method(committed, "multi_similarity")
    p = compare(best, {k: dict(v) for k, v in best.items()}, [0.5, 1.0])
    assert p.diagnostics.exact and p.diagnostics.converged
    assert p.at(0.5).equivalent == 1.0 and p.at(1.0).verdict() == "equivalent"
    assert [s.mean for s in p.shrunk] == [0.0] * len(best) and all(s.known for s in p.shrunk)


@pytest.mark.slow
def test_a_near_twin_is_equivalent_and_five_points_below_is_worse(committed):
    """multi_similarity re-measured (its seeds + N(0, 0.1) points) is practically
    equivalent to it at ±1; the same about 5 points lower on every seed of every protocol
    (each protocol's own gap 5 + N(0, 0.5)) is worse. Both sampled, both converged, each
    protocol's shrunk mean near its own. One gap of exactly 5 on every protocol leaves the
    protocols no spread (std0 near 0, a funnel the sampler may not cross: over the six
    committed protocols it did not): then it is worse or not converged, never another number."""
    rng = np.random.default_rng(0)
    best = _method(committed, "multi_similarity")
    twin = {p: {s: v + rng.normal(0, 0.1) for s, v in seeds.items()} for p, seeds in best.items()}
    gaps = dict(zip(twin, 5 + rng.normal(0, 0.5, len(twin)), strict=True))
    below = {p: {s: v - gaps[p] for s, v in seeds.items()} for p, seeds in twin.items()}
    constant = compare({p: {s: v - 5 for s, v in seeds.items()} for p, seeds in twin.items()},
                       best, [1.0]).at(1.0)  # fmt: skip
    assert constant.verdict() in ("worse", "not converged"), constant.cell()
    for method, verdict in ((twin, "equivalent"), (below, "worse")):
        p = compare(method, best, [1.0])
        assert p.diagnostics.converged and not p.diagnostics.exact, p.diagnostics.text()
        assert p.at(1.0).verdict() == verdict, p.at(1.0).cell()
        assert getattr(p.at(1.0), verdict) >= DECISIVE
        for s in p.shrunk:
            own = np.mean([method[s.protocol][k] - best[s.protocol][k] for k in best[s.protocol]])
            assert s.low < own < s.high and abs(s.mean - own) < 0.2


def _baycomp_case() -> tuple[dict, dict]:
    """baycomp's documentation data (tests/harness/baycomp_nbc_j48.csv): data set -> fold ->
    accuracy (%), naive Bayes and J48, with baycomp's treatment of a data set whose
    differences have no spread (HierarchicalTest.sample: replaced by uniform draws within
    the scaled ROPE and their negatives, here from RandomState(0); the documentation's run
    drew its own, unseeded)."""
    nbc: dict[str, dict[int, float]] = {}
    j48: dict[str, dict[int, float]] = {}
    with BAYCOMP.open(encoding="utf-8") as f:
        for row in csv.DictReader(line for line in f if not line.startswith("#")):
            nbc.setdefault(row["dataset"], {})[int(row["fold"])] = float(row["nbc"])
            j48.setdefault(row["dataset"], {})[int(row["fold"])] = float(row["j48"])
    diff = np.array([[j48[d][k] - nbc[d][k] for k in range(10)] for d in nbc])
    scale = np.mean(np.std(diff, axis=1))
    rope, scaled = 1.0 / scale, diff / scale
    random = np.random.RandomState(0)
    for row in scaled:
        if np.var(row) == 0:
            row[:5] = random.uniform(-rope, rope, 5)
            row[5:] = -row[:5]
    a = {d: dict(enumerate(scaled[i] * scale)) for i, d in enumerate(nbc)}
    return a, {d: dict.fromkeys(range(10), 0.0) for d in nbc}


@pytest.mark.slow
def test_baycomps_documented_hierarchical_example_is_reproduced():
    """baycomp's documentation (docs/functions.rst, two_on_multiple on the 54 x 10 matrices
    of nbc and j48, rope=1; folds of one 10-fold cross-validation, so rho = 1/10) reports
    (0.0795, 0.0365, 0.884): the share of posterior draws in which each region is the most
    probable. The same model here, on NumPyro, agrees within Monte-Carlo error (10,000
    draws here, 40,000 there, each share's standard error under 0.01)."""
    a, b = _baycomp_case()
    differences, _ = shared_differences(a, b)
    samples = nuts.sample(differences, rho=0.1)
    d = convergence.diagnostics(samples)
    assert d.converged, d.text()
    shares = winner_shares(samples, 1.0)
    assert shares == pytest.approx((0.0795, 0.0365, 0.884), abs=0.03)


@pytest.mark.slow
def test_with_one_seed_per_protocol_it_falls_back_to_the_means(committed):
    """Seed 0 alone on each protocol: the model sees the protocols' differences only, as the
    signed-rank test does (`means_only`, every delta_i known), and its most probable region
    is the signed-rank test's for every method the signed-rank test decides."""
    best = _method(committed, "multi_similarity")
    agree = 0
    for name in ("margin", "contrastive", "lmdm_score", "circle", "pddm_score"):
        method = _method(committed, name)
        one = {p: {0: seeds[0]} for p, seeds in method.items()}
        one_best = {p: {0: seeds[0]} for p, seeds in best.items()}
        p = compare(one, one_best, [1.0])
        assert p.means_only and all(s.known for s in p.shrunk) and p.diagnostics.converged
        x = [one_best[q][0] for q in sorted(one_best)]
        y = [one[q][0] for q in sorted(one)]
        sr = signed_rank_probs(x, y, 1.0)
        ours = p.at(1.0)
        if sr.verdict() != "undecided":
            regions = ("worse", "equivalent", "better")
            assert max(regions, key=lambda r: getattr(ours, r)) == sr.verdict(), (name, ours)
            agree += 1
    assert agree >= 2


# ------------------------------------------------------------------ convergence, reproducibility


def test_a_comparison_that_did_not_converge_shows_words_never_a_number():
    d = Diagnostics(1.08, 57.0, 3, 400)
    assert not d.converged and d.text() == "R-hat 1.080, ESS 57, 3 divergent of 400"
    p = Posterior({1.0: None}, {1.0: None}, [], d)
    cell = p.at(1.0)
    assert isinstance(cell, NotConverged) and cell.verdict() == "not converged"
    assert cell.cell() == "not converged (R-hat 1.08, ESS 57)"
    assert not any(ch.isdigit() for ch in cell.cell().split("(")[0])
    assert Diagnostics(1.005, 900.0, 200, 10_000).converged is False  # 2 % divergent
    assert Diagnostics(1.005, 900.0, 20, 10_000).converged


def test_the_table_and_figure_show_a_comparison_that_did_not_converge_as_words(monkeypatch):
    """One method's chains disagreed: its probability and verdict cells are words, its
    diagnostics stand beside them, it sorts last and its bar is empty; the others keep
    their numbers and the caption counts the converged."""
    import dataclasses

    from canned_posteriors import canned_compare

    from harness.report.equivalence import drawing, readme_sentence
    from harness.stats import Block

    def compare_(a, b, ropes, **options):
        p = canned_compare(a, b, ropes)
        if a["p0"][0] < 20:  # C (10 points on p0): its chains did not mix
            return dataclasses.replace(
                p, diagnostics=Diagnostics(1.08, 57.0, 3, 10_000, retried=True)
            )
        return p

    monkeypatch.setattr(hierarchical, "compare", compare_)
    blocks = []
    for i, v in enumerate((0.40, 0.55, 0.20)):
        values = {m: {s: v - shift + 0.001 * s for s in range(3)}
                  for m, shift in (("A", 0.0), ("B", 0.004), ("C", 0.30))}  # fmt: skip
        means = {m: float(np.mean(list(x.values()))) for m, x in values.items()}
        blocks.append(Block(f"p{i}", "map@r", means, str(i), seeds=3, values=values))
    a = across(blocks)
    assert a.order() == ["B", "C"] and a.converged() == (1, 2)
    row = next(line for line in table(a).splitlines() if line.startswith("| C "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "not converged (R-hat 1.08, ESS 57)"
    assert cells[2:5] == ["not converged"] * 3 and cells[5] == ""
    assert cells[7] == "1.080 · 57 (sampled twice)"
    assert "1 of 2 comparisons converged" in caption(a)
    assert "and 1 did not converge" in readme_sentence(a)
    fig = drawing(a)
    assert "not converged" in [t.get_text() for t in fig.axes[0].texts]
    widths = [p.get_width() for p in fig.axes[0].patches]  # worse, ≈, better; B then C
    assert widths[1::2] == [0.0, 0.0, 0.0] and sum(widths[0::2]) == pytest.approx(1.0)


@pytest.mark.slow
def test_too_few_draws_do_not_converge_and_the_table_says_so(committed, monkeypatch):
    """20 draws after 20 of warmup (and again after the retry's longer warmup): R-hat and
    ESS say the chains have not mixed, and the cell is words."""
    monkeypatch.setattr(nuts, "WARMUP", 20)
    monkeypatch.setattr(nuts, "DRAWS", 20)
    best = _method(committed, "multi_similarity")
    p = compare(_method(committed, "margin"), best, [1.0])
    assert not p.diagnostics.converged and p.diagnostics.draws == 80 and p.diagnostics.retried
    assert p.diagnostics.rhat >= convergence.RHAT_MAX or p.diagnostics.ess <= convergence.ESS_MIN
    assert isinstance(p.at(1.0), NotConverged)


SCRIPT = """
import json, sys
from harness.stats import nuts
nuts.WARMUP, nuts.DRAWS = 200, 200
s = nuts.sample({"p": [0.4, -0.3, 1.1], "q": [2.0, 1.0, 1.5, 0.7, 1.1], "r": [0.1, 0.2]})
print(json.dumps([s.delta0.tolist(), s.std0.tolist(), s.nu.tolist(), s.delta.tolist()]))
"""


@pytest.mark.slow
def test_the_draws_are_the_same_in_two_processes():
    """The same PRNG key, the same draws, to the last bit, from one process to the next."""
    runs = [subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout for _ in range(2)]  # fmt: skip
    assert runs[0] == runs[1] and len(json.loads(runs[0])[0]) == nuts.CHAINS


# ------------------------------------------------------------------ the kept posteriors


def _fake(value: float) -> Posterior:
    from harness.stats import Probs

    probs = {1.0: Probs(value, 1 - value, 0.0, 2)}
    return Posterior(probs, probs, [], Diagnostics(1.001, 4000.0, 0, 10_000))


A = {"p": {0: 50.0, 1: 51.0}, "q": {0: 40.0, 1: 40.5}}
B = {"p": {0: 49.0, 1: 50.5}, "q": {0: 40.0, 1: 39.0}}


def test_a_kept_posterior_is_reused_and_a_changed_result_recomputes_only_its_own(tmp_path):
    path = tmp_path / CACHE_FILE
    cache = PosteriorCache(path, fallback=None)
    calls = []

    def compute(value: float):
        return lambda: calls.append(value) or _fake(value)

    assert cache.get("x vs ref", A, B, [1.0], compute(0.1)).probs[1.0].worse == 0.1
    assert cache.get("y vs ref", B, A, [1.0], compute(0.2)).probs[1.0].worse == 0.2
    cache.save()
    first = path.read_bytes()
    posteriors._MEMORY.clear()
    again = PosteriorCache(path, fallback=None)
    assert again.get("x vs ref", A, B, [1.0], compute(0.9)).probs[1.0].worse == 0.1
    changed = {"p": {0: 50.0, 1: 51.0}, "q": {0: 40.0, 1: 40.25}}
    assert again.get("y vs ref", changed, A, [1.0], compute(0.3)).probs[1.0].worse == 0.3
    assert calls == [0.1, 0.2, 0.3] and again.sampled == 1
    again.save()
    stored = json.loads(path.read_text())["entries"]
    assert sorted(stored) == ["x vs ref", "y vs ref"]
    assert stored["y vs ref"]["inputs"]["q"]["a"] == {"0": 40.0, "1": 40.25}
    assert stored["x vs ref"] == json.loads(first)["entries"]["x vs ref"]  # untouched


def test_a_kept_posterior_that_does_not_match_its_inputs_is_recomputed_with_a_warning(
    tmp_path, caplog
):
    path = tmp_path / CACHE_FILE
    cache = PosteriorCache(path, fallback=None)
    cache.get("x vs ref", A, B, [1.0], lambda: _fake(0.1))
    cache.save()
    data = json.loads(path.read_text())
    data["entries"]["x vs ref"]["inputs"]["p"]["a"]["0"] = 49.0  # edited: the key no longer fits
    path.write_text(json.dumps(data))
    posteriors._MEMORY.clear()
    with caplog.at_level(logging.WARNING, logger="harness.stats.posteriors"):
        p = PosteriorCache(path, fallback=None).get("x vs ref", A, B, [1.0], lambda: _fake(0.7))
    assert p.probs[1.0].worse == 0.7
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "x vs ref does not match its inputs" in lines[0]
    assert "sampled again" in lines[0] and "\n" not in lines[0]
    # a file that is not JSON: a warning, everything sampled again
    path.write_text("{not json")
    caplog.clear()
    posteriors._MEMORY.clear()
    with caplog.at_level(logging.WARNING, logger="harness.stats.posteriors"):
        p = PosteriorCache(path, fallback=None).get("x vs ref", A, B, [1.0], lambda: _fake(0.4))
    assert p.probs[1.0].worse == 0.4 and "unreadable" in caplog.records[0].getMessage()


def test_the_reference_posteriors_are_used_only_for_the_same_inputs(tmp_path):
    reference = tmp_path / "reference.json"
    cache = PosteriorCache(reference, fallback=None)
    cache.get("x vs ref", A, B, [1.0], lambda: _fake(0.1))
    cache.save()
    posteriors._MEMORY.clear()
    mine = PosteriorCache(tmp_path / "mine" / CACHE_FILE, fallback=reference)
    assert mine.get("another name", A, B, [1.0], lambda: _fake(0.5)).probs[1.0].worse == 0.1
    changed = {"p": {0: 50.0, 1: 51.0}, "q": {0: 40.0, 1: 40.5000001}}
    assert mine.get("x vs ref", changed, B, [1.0], lambda: _fake(0.5)).probs[1.0].worse == 0.5
    assert mine.sampled == 1


def test_a_protocol_with_one_shared_seed_is_left_out_and_named(monkeypatch, caplog):
    """cars has one seed of C: its comparison leaves cars out (a warning naming what to run),
    the caption says so, and the other methods keep all protocols."""
    from canned_posteriors import canned_compare

    from harness.stats import Block, equivalence

    monkeypatch.setattr(hierarchical, "compare", canned_compare)
    monkeypatch.setattr(equivalence, "_WARNED", set())
    blocks = []
    for name, base in (("birds", 0.4), ("cars", 0.2), ("groceries", 0.3)):
        values = {"A": {s: base + 0.001 * s for s in range(3)},
                  "B": {s: base - 0.02 + 0.001 * s for s in range(3)},
                  "C": {s: base - 0.05 for s in range(1 if name == "cars" else 3)}}  # fmt: skip
        means = {m: float(np.mean(list(v.values()))) for m, v in values.items()}
        blocks.append(Block(name, "map@r", means, name, seeds=3, values=values))
    with caplog.at_level(logging.WARNING, logger="harness.stats.equivalence"):
        a = across(blocks)
        across(blocks)  # the leaderboard's second look (the figure, then the section)
    [line] = [r.getMessage() for r in caplog.records]
    assert "C and A share fewer than 2 seeds on cars" in line and "run more seeds" in line
    assert a.left_out() == {"C": ["cars"]}
    assert [s.protocol for s in a.posteriors["C"].shrunk] == ["birds", "groceries"]
    assert "Left out of a comparison for fewer than 2 seeds shared with A: C on cars." in caption(a)
    assert "C on cars" in section(blocks)
    assert "| C " in table(a) and "left out" in section(blocks)


def test_the_committed_comparisons_come_from_the_committed_posteriors(monkeypatch):
    """Every across-protocol comparison of the committed results is in the committed file
    and matches its inputs: the leaderboard samples nothing."""
    load_methods()
    monkeypatch.setattr(hierarchical, "compare", lambda *a, **k: pytest.fail("sampled"))
    cache = PosteriorCache(REFERENCE / CACHE_FILE, fallback=None)
    blocks = protocol_blocks(load_results(REFERENCE))
    found = section(blocks, cache)
    assert f"### All {len(main_blocks(blocks))} protocols" in found and cache.sampled == 0
    # each setting's methods but its reference (all protocols, real photos tuned, at the papers'
    # defaults, scratch: 28 each, fewer where a protocol lacks a method, e.g. objects' n/a ones)
    expected = sum(len(a.probs) for a in comparisons(blocks, cache))
    assert 100 <= len(cache.used) == len(cache.entries) == expected
