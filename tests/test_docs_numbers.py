"""Numbers the README and the manual quote from the committed results agree with the results
themselves, and the pages that quote one fact quote it alike, so a regenerated result cannot
leave them stale: a test here recomputes each number (from the run records, the studies, or
the same functions that write the leaderboard) and, where a page drifted, names the file and
line and what it should read. Sentences the README quotes whole are made by functions
(harness.report.headline, .tuned_verdict, .equivalence.readme_sentence) and checked here or
where they are computed (test_glance, test_bayes, test_reference_results).

After new results: regenerate the leaderboard, run these tests, and paste what each failure
says the line should read."""

from __future__ import annotations

import bisect
import functools
import json
import re
import statistics
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO / "results" / "reference"
RUNS = REFERENCE / "runs"
PHOTOS = ("cars", "groceries", "birds")
DOCS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))


class Page:
    """A README or manual page with its white space folded (a quote may wrap anywhere), each
    folded offset traced back to its line, so a failure names where the stale quote is."""

    def __init__(self, path: str) -> None:
        self.path = path
        raw = (REPO / path).read_text(encoding="utf-8")
        words = list(re.finditer(r"\S+", raw))
        self.text = " ".join(w.group() for w in words)
        self.starts, self.lines, at = [], [], 0
        for w in words:
            self.starts.append(at)
            self.lines.append(raw.count("\n", 0, w.start()) + 1)
            at += len(w.group()) + 1

    def line(self, offset: int) -> int:
        return self.lines[max(0, bisect.bisect_right(self.starts, offset) - 1)]

    def where(self, anchor: str) -> str:
        at = self.text.find(" ".join(anchor.split()))
        return f"{self.path}:{self.line(at)}" if at >= 0 else f"{self.path} (no {anchor!r})"

    def quotes(self, expected: str, anchor: str) -> None:
        """The page holds `expected` word for word (wrapped as it likes)."""
        expected = " ".join(expected.split())
        assert expected in self.text, (f"{self.where(anchor)}: the results give, word for "
                                       f"word:\n{expected}")  # fmt: skip

    def numbers(self, pattern: str, *expected: object) -> None:
        """`pattern` (a regex over the folded text, one group per quoted number) is on the
        page, and its groups read `expected`."""
        found = re.search(pattern, self.text)
        assert found, f"{self.path}: no quote matching {pattern!r} (it should read {expected})"
        got = found.groups()
        want = tuple(str(e) for e in expected)
        assert got == want, (f"{self.path}:{self.line(found.start())}: quotes "
                             f"{', '.join(got)}; the committed results give {', '.join(want)}")  # fmt: skip


@functools.cache
def committed():
    """The committed runs, loaded once: (runs, groups by protocol with their tuned runs)."""
    from harness.core import load_methods
    from harness.records import load_results
    from harness.report.glance import protocol_groups

    load_methods()
    runs = load_results(REFERENCE)
    return runs, protocol_groups(runs, tuned=True)


def _text(path: str) -> str:
    return " ".join((REPO / path).read_text(encoding="utf-8").split())


def _runs(protocol: str, tuned: bool = False, root: Path = RUNS) -> list[dict]:
    """The protocol's paper-default runs (tuned: its `+tuned` runs)."""
    return [json.loads(p.read_text()) for p in sorted((root / protocol).glob("*/seed*.json"))
            if p.parent.name.endswith("+tuned") == tuned]  # fmt: skip


def _seconds(run: dict) -> float:
    return (datetime.fromisoformat(run["finished_at"])
            - datetime.fromisoformat(run["started_at"])).total_seconds()  # fmt: skip


def _minutes(runs: list[dict]) -> float:
    return sum(_seconds(r) for r in runs) / 60


def _vendors(runs: list[dict]) -> set[str]:
    return {((r.get("environment") or {}).get("fingerprint") or {}).get("cpu_vendor") for r in runs}


def _study(protocol: str) -> dict:
    """The committed study's trials, read from its Optuna storage (as the cost benchmark)."""
    from benchmarks.tuning_cost import study_cost

    return study_cost(REFERENCE / "tuning" / protocol / "studies.db")


def _studied(protocol: str) -> bool:
    """Whether `protocol` has a committed study (its Optuna storage)."""
    return (REFERENCE / "tuning" / protocol / "studies.db").is_file()


def _tuned_photos() -> tuple[str, ...]:
    """The real-photo protocols with a committed study and tuned sweep, in the order they
    landed (the order the pages list them in)."""
    landed = ("cars", "groceries", "birds", "plankton", "pollen", "objects", "flowers")
    return tuple(p for p in landed if _studied(p) and _runs(p, tuned=True))


def _study_progress(protocol: str) -> tuple[int, int]:
    """How many of the protocol's studies are finished (one configuration file each) and how
    many there are to run: a method with a search space whose paper-default runs the data
    could serve (a study resumes across sessions; one landed part way is said so)."""
    from benchmarks.tuning_cost import planned_studies

    committed()  # the methods loaded
    tuned = {p.stem for p in (REFERENCE / "tuning" / protocol).glob("*.yaml")}
    return len(tuned), planned_studies(RUNS / protocol)


def _trials(protocol: str) -> int:
    """The budget of the committed study of `protocol`: its tuned configurations' trials."""
    import yaml

    found = {yaml.safe_load(p.read_text())["study"]["trials"]
             for p in (REFERENCE / "tuning" / protocol).glob("*.yaml")}  # fmt: skip
    assert len(found) == 1, (protocol, found)
    return found.pop()


# ------------------------------------------------------------------- times and budgets


def test_the_run_times_and_machines_own_loss_quotes_are_the_committed_runs():
    text = _text("docs/own-loss.md")
    default = _runs("default")
    seconds = [_seconds(r) for r in default]
    assert (f"a median of {statistics.median(seconds):.0f} s a run, {max(seconds):.0f} s at most"
            in text)  # fmt: skip
    assert (
        _vendors(default) == {"GenuineIntel"} and "the Intel Xeon that made the committed" in text
    )
    photos = {p: _runs(p) for p in ("cars", "groceries", "birds")}
    assert all(len(runs) == 145 for runs in photos.values())  # 29 methods x 5 seeds
    median = {p: statistics.median(_seconds(r) for r in runs) for p, runs in photos.items()}
    assert (f"a median of {median['cars']:.0f} s on 2 CPU cores for cars, "
            f"{median['groceries']:.0f} s for groceries and {median['birds']:.0f} s for birds"
            in text)  # fmt: skip
    total = [_minutes(photos[p]) for p in ("cars", "groceries", "birds")]
    assert f"runs sum to {total[0]:.0f}, {total[1]:.0f} and {total[2]:.0f} minutes" in text
    assert set().union(*(_vendors(r) for r in photos.values())) == {"AuthenticAMD"}
    assert "the committed photo runs were made on an AMD EPYC" in text


def test_getting_started_and_the_readme_quote_the_committed_run_times():
    default = _runs("default")
    seconds = [_seconds(r) for r in default]
    page = Page("docs/getting-started.md")
    page.numbers(r"the (\d+) `default` runs sum to (\d+) minutes, a median of (\d+) s a run "
                 r"and (\d+) s at most", len(default), f"{sum(seconds) / 60:.0f}",
                 f"{statistics.median(seconds):.0f}", f"{max(seconds):.0f}")  # fmt: skip
    photos = [_minutes(_runs(p)) for p in PHOTOS]
    page.numbers(r"defaults sum to (\d+), (\d+) and (\d+) minutes for cars, groceries and birds",
                 *(f"{m:.0f}" for m in photos))  # fmt: skip
    page.numbers(r"those of version 2 to (\d+) and (\d+) \(above\)",
                 *(f"{m:.0f}" for m in photos[:2]))  # fmt: skip
    studies = REFERENCE / "studies"
    old = [_minutes(_runs(p, root=studies / f"{p}_v1" / "runs")) for p in ("cars", "groceries")]
    page.numbers(r"version-1 runs \(kept in `results/reference/studies/`\) sum to (\d+) minutes "
                 r"for cars' 145 and (\d+) for groceries' 145", *(f"{m:.0f}" for m in old))  # fmt: skip
    for path in ("README.md", "docs/getting-started.md"):
        Page(path).numbers(r"the committed runs took (\d+) minutes on 2 CPU cores",
                           f"{sum(seconds) / 60:.0f}")  # fmt: skip


def test_the_calibration_table_protocols_quotes_is_the_committed_records():
    """Each row of the table in docs/protocols.md (`calibration` (candidates) | chosen |
    validation MAP@R | vs zero-shot | est. sweep) reads its committed record: the candidates
    that ran, the chosen candidate's mean over the reference methods, its gain and its
    estimated sweep."""
    page = Page("docs/protocols.md")
    rows = re.findall(r"\| `(\w+)` \((\d+)(?: candidates)?\) \| [^|]+ \| ([\d.]+) \| ([+−][\d.]+) \| "
                      r"(\d+) min \|", page.text)  # fmt: skip
    assert {r[0] for r in rows} >= {"cars_v2", "groceries_v2", "birds_v3", "plankton", "pollen",
                                    "objects", "flowers"}, rows  # fmt: skip
    for name, ran, mean, gain, minutes in rows:
        record = json.loads((REFERENCE / "calibration" / f"{name}.json").read_text())
        choice = record["choice"]
        chosen = next(c for c in choice["candidates"] if c["candidate"] == choice["chosen"])
        want = (str(len(record["runs"])), f"{100 * chosen['mean_map@r']:.2f}",
                f"{100 * chosen['gain_over_zero_shot']:+.2f}".replace("-", "−"),
                f"{chosen['sweep_minutes']:.0f}")  # fmt: skip
        assert (ran, mean, gain, minutes) == want, (
            f"{page.where(f'`{name}` (')}: `{name}` reads {ran}, {mean}, {gain}, {minutes} min; its "
            f"record gives {', '.join(want)}")  # fmt: skip


def test_the_readme_says_how_long_reproducing_the_headline_takes():
    """The block `Reproduce the headline`: its loop names every real-photo protocol, and per
    dataset the sentence under it gives the default sweep (its runs' time), the study (wall
    time with a trial running, as 2 processes) and the tuned sweep (its runs' time), each in
    hours as the committed records give them (a dataset not tuned yet: what has run, and says
    what has not; a study landed part way: how many of its methods are done), and the budget
    the committed studies used."""
    from harness.records import pretrained

    _, groups = committed()
    photos = [p for p, g in groups.items() if pretrained(g)]
    page = Page("README.md")
    loop = re.search(r"for p in ([\w ]+); do", page.text)
    assert loop and sorted(loop.group(1).split()) == sorted(photos), (loop, photos)
    total, parts = 0.0, []
    for protocol in loop.group(1).split():
        hours = [_minutes(_runs(protocol)) / 60]
        if _studied(protocol):
            hours.append(_study(protocol)["wall_seconds"] / 3600)
        if _runs(protocol, tuned=True):
            hours.append(_minutes(_runs(protocol, tuned=True)) / 60)
        total += sum(hours)
        still = ["", " (its tuned sweep still to run)", " (its study and tuned sweep still to run)"]
        said = still[3 - len(hours)]
        done, of = _study_progress(protocol) if len(hours) == 2 else (0, 0)
        if done < of:  # a study landed part way
            said = f" (its study so far: {done} of {of} methods; its tuned sweep still to run)"
        parts.append(f"{protocol} " + " + ".join(f"{h:.1f}" for h in hours) + said)
    page.quotes(f"{total:.0f} in all: " + ", ".join(parts[:-1]) + f", {parts[-1]}.", "in all:")
    page.numbers(r"then one study of (\d+) Optuna trials per method", _trials("cars"))
    page.numbers(r"--all --trials (\d+) --processes 2", _trials("cars"))


def test_every_tune_command_uses_the_committed_budget():
    """A printed `tune` on a protocol with a committed study gives it that study's trials, so
    that following the manual gives a method the same budget as the committed ones."""
    budgets = {p.name: _trials(p.name) for p in (REFERENCE / "tuning").iterdir() if p.is_dir()}
    assert budgets["tuning"] == 12 and budgets["cars"] == 20
    for path in ["README.md", *DOCS]:
        page = Page(path)
        for found in re.finditer(r"tune --protocol (\w+) (?:(?!python )[^`#])*?--trials (\d+)",
                                 page.text):  # fmt: skip
            protocol, trials = found.groups()
            if protocol in budgets:
                assert int(trials) == budgets[protocol], (
                    f"{path}:{page.line(found.start())}: `tune --protocol {protocol}` with "
                    f"--trials {trials}; the committed study used {budgets[protocol]}")  # fmt: skip


def test_the_tuning_cost_verdicts_quotes_is_the_committed_studies_and_sweeps():
    page = Page("docs/verdicts.md")
    tuned_photos = _tuned_photos()
    trial = [sum(sum(m["seconds"]) for m in _study(p)["methods"].values()) / 60
             for p in tuned_photos]  # fmt: skip
    wall = [_study(p)["wall_seconds"] / 60 for p in tuned_photos]
    tuned = [_minutes(_runs(p, tuned=True)) for p in tuned_photos]
    n = r", ".join([r"(\d+)"] * (len(tuned_photos) - 1)) + r" and (\d+)"
    named = r", ".join(rf"(\d+) on `{p}`" for p in tuned_photos[1:-1])
    page.numbers(rf"cost (\d+) trial-minutes on `{tuned_photos[0]}`, {named} "
                 rf"and (\d+) on `{tuned_photos[-1]}`", *(f"{m:.0f}" for m in trial))  # fmt: skip
    page.numbers(rf"`tune --processes 2`: {n} minutes\)", *(f"{m:.0f}" for m in wall))
    page.numbers(rf"its tuned sweep \(28 × 5 seeds\) {n} run-minutes",
                 *(f"{m:.0f}" for m in tuned))  # fmt: skip


# -------------------------------------------------------------- the verdicts quoted


def test_the_readme_opens_with_the_committed_headline():
    """The three sentences come from harness.report.headline, word for word, first."""
    from harness.report.headline import headline

    _, groups = committed()
    text = headline(groups)
    assert len(re.findall(r"\.(?= |$)", text)) == 3  # three sentences
    page = Page("README.md")
    page.quotes(text, "On 3 real-photo datasets")
    first = page.text.split(" ## ")[0]
    assert first.index(" ".join(text.split())) < 100  # right under the title


def test_the_readme_quotes_the_tuned_verdict_without_the_flip_counts():
    """The flips belong to the leaderboard (its verdict and each tuned section), not the
    README, which quotes the rest of the same paragraph."""
    from harness.report.tuned_verdict import tuned_verdict

    _, groups = committed()
    readme = Page("README.md")
    readme.quotes(tuned_verdict(groups, flips=False), "Tuned, each method with the same")
    assert "flipped the ordering" not in readme.text
    board = Page("results/reference/LEADERBOARD.md")
    board.quotes(tuned_verdict(groups), "Tuned, each method with the same")
    assert "Tuning flipped the ordering of" in board.text


def test_the_readme_quotes_the_settings_agreement():
    from harness.report.ranks import setting_agreement
    from harness.stats import by_setting, protocol_blocks, rank_test

    runs, _ = committed()
    tests = {s: rank_test(g) for s, g in by_setting(protocol_blocks(runs)).items()}
    tau, p, n = re.search(r"is ([+-][\d.]+) \(p = ([\de.+-]+), (\d+) methods\)",
                          setting_agreement(tests)).groups()  # fmt: skip
    Page("README.md").numbers(r"agree only in part \(Kendall's tau ([+-][\d.]+), p = ([\de.+-]+), "
                              r"over the (\d+) methods both rank\)", tau, p, n)  # fmt: skip


def test_the_friedman_nemenyi_and_wilcoxon_numbers_verdicts_quotes():
    from harness.stats import (
        PRETRAINED,
        SCRATCH,
        blocks_to_resolve,
        main_blocks,
        protocol_blocks,
        rank_test,
    )

    runs, _ = committed()
    blocks = protocol_blocks(runs)
    test = rank_test(main_blocks(blocks))
    k, n = len(test.ranks), len(test.blocks)
    pairs = k * (k - 1) // 2
    spread = float(test.ranks.max() - test.ranks.min())
    page = Page("docs/verdicts.md")
    page.numbers(r"On the committed results \((\d+) protocols, the (\d+) methods all of them ran"
                 r"[^)]*\) the Friedman test rejects \(chi-square ([\d.]+), p = ([\de.+-]+)\), yet CD = ([\d.]+) ranks "
                 r"against a spread of average ranks of ([\d.]+): (\d+) of (\d+) pairs differ",
                 n, k, f"{test.chi_square:.1f}", f"{test.p:.2g}", f"{test.cd:.1f}",
                 f"{spread:.1f}", len(test.resolved()), pairs)  # fmt: skip
    page.numbers(r"ranks 10 apart would need (\d+) protocols, 5 apart (\d+)\.",
                 blocks_to_resolve(test, 10.0), blocks_to_resolve(test, 5.0))  # fmt: skip
    setting = {s: rank_test([b for b in blocks if b.setting == s]) for s in (PRETRAINED, SCRATCH)}
    page.numbers(r"\(over the (\d+) real-photo protocols tuned, CD ([\d.]+) ranks and (\d+) of "
                 r"(\d+) pairs apart; over the (\d+) from scratch, CD ([\d.]+) and (\d+) of (\d+)\)",
                 *(x for t in (setting[PRETRAINED], setting[SCRATCH])
                   for x in (len(t.blocks), f"{t.cd:.1f}", len(t.resolved()),
                             len(t.ranks) * (len(t.ranks) - 1) // 2)))  # fmt: skip
    # Wilcoxon's smallest two-sided p with N protocols, against Holm's first threshold
    holm = 0.05 / pairs
    needed = next(m for m in range(1, 64) if 2 / 2**m < holm)
    page.numbers(r"2/2\^N: ([\d.]+) with the (\d+) committed protocols, under 5 % for one pair "
                 r"alone, yet Holm's correction over the (\d+) pairs asks the first of them for "
                 r"([\d.]+), which needs (\d+) protocols; within the real photos' "
                 r"(\d+) protocols it is ([\d.]+)\.",
                 f"{2 / 2**n:.2g}", n, pairs, f"{holm:.2g}", needed,
                 len(setting[PRETRAINED].blocks), f"{2 / 2 ** len(setting[PRETRAINED].blocks):.2g}")  # fmt: skip
    assert 2 / 2**n < 0.05 and needed > n  # the argument as the page makes it


def test_what_the_hierarchical_model_changes_verdicts_quotes():
    """docs/verdicts.md's **What it changes**: how many comparisons each setting's model and
    signed-rank test decide, convergence, the zero-shot network's shrunk means and what
    baycomp's convention adds, all from the kept posteriors (nothing is sampled)."""
    from harness.stats import (
        ALL,
        PRETRAINED,
        PRETRAINED_DEFAULT,
        SCRATCH,
        PosteriorCache,
        comparisons,
        protocol_blocks,
    )

    runs, _ = committed()
    found = {a.label: a for a in comparisons(protocol_blocks(runs), PosteriorCache(REFERENCE))}
    order = [ALL, PRETRAINED, PRETRAINED_DEFAULT, SCRATCH]
    assert list(found) == order

    def decided(probs) -> list[tuple[str, str, float]]:
        return [(m, p.verdict(), getattr(p, p.verdict())) for m, p in probs.items()
                if p.verdict() not in ("undecided", "not converged")]  # fmt: skip

    ours = {label: decided(a.probs) for label, a in found.items()}
    theirs = [len(decided(a.signed_rank)) for a in found.values()]
    named = {label: f"{d[0][0]}, {d[0][1]}, {d[0][2]:.2f}" for label, d in ours.items() if d}
    page = Page("docs/verdicts.md")
    k = len(found[ALL].probs)

    def n(label: str) -> int:
        return len(ours[label])

    def first(label: str) -> str:  # the first decided comparison, if any
        return f" ({named[label]})" if label in named else ""

    def of(label: str) -> str:  # how many it decides, of how many (a setting may have fewer)
        return f"{n(label)} of {len(found[label].probs)}"

    page.quotes(
        f"the model decides {n(ALL)} of the {k} comparisons for the next protocol over all "
        f"{len(found[ALL].blocks)} protocols{first(ALL)}, {of(PRETRAINED)} over the real photos "
        f"tuned{first(PRETRAINED)}, {of(PRETRAINED_DEFAULT)} over the real photos at the papers' "
        f"defaults{first(PRETRAINED_DEFAULT)} and {of(SCRATCH)} from scratch{first(SCRATCH)}, "
        f"where the signed-rank test decides {theirs[0]}, {theirs[1]}, {theirs[2]} and "
        f"{theirs[3]}",
        "the model decides",
    )
    goal = [(len(a.one_sided()) - len(a.still_open()), len(a.one_sided())) for a in found.values()]
    page.numbers(r"it decides (\d+) of (\d+) over all (\d+) protocols, (\d+) of (\d+) over the "
                 r"real photos tuned, (\d+) of (\d+) at the defaults and (\d+) of (\d+) from scratch",
                 *goal[0], len(found[ALL].blocks), *(n for pair in goal[1:] for n in pair))  # fmt: skip
    done = [a.converged() for a in found.values()]
    retried = sum(p.diagnostics.retried for a in found.values() for p in a.posteriors.values())
    page.numbers(r"(\d+) of the (\d+) comparisons converged \((\d+) after a second sampling\)",
                 sum(d for d, _ in done), sum(t for _, t in done), retried)  # fmt: skip
    shrunk = {s.protocol.split(" ")[0]: s for s in found[PRETRAINED].posteriors["untrained"].shrunk}
    cells = [f"{s.mean:.2f} [{s.low:.2f}, {s.high:.2f}]".replace("-", "−")
             for s in (shrunk["cars"], shrunk["groceries"], shrunk["birds"])]  # fmt: skip
    cells += [
        f"{shrunk[p].mean:.2f}".replace("-", "−")
        for p in ("plankton", "pollen", "objects", "flowers")
    ]
    assert found[PRETRAINED].reference == "multi_similarity"
    page.numbers(r"against multi_similarity over the real photos tuned: (\S+ \[\S+ \S+\]) points on "
                 r"cars, (\S+ \[\S+ \S+\]) on groceries, (\S+ \[\S+ \S+\]) on birds, (\S+) on "
                 r"plankton, (\S+) on pollen, (\S+) on objects and (\S+) on flowers\)", *cells)  # fmt: skip
    rope = found[PRETRAINED].rope
    shares = [(m, p.shares[rope]) for m, p in found[PRETRAINED].posteriors.items()]
    more = [(m, s.verdict(), getattr(s, s.verdict())) for m, s in shares
            if s.verdict() not in ("undecided", "not converged")
            and found[PRETRAINED].probs[m].verdict() in ("undecided", "not converged")]  # fmt: skip
    verdict = {"equivalent": "equivalent"}
    page.numbers(r"\(kept in the posteriors file as `shares`\) decides (\d+) more over the real "
                 r"photos tuned: (.+?)\. Fewer", len(more),
                 ", ".join(f"{m} {verdict.get(v, v)} ({p:.2f})" for m, v, p in more))  # fmt: skip


def test_the_two_machines_rule_is_what_the_committed_runs_show():
    """docs/verdicts.md's case for one pairing rule: birds' tuned (AVX2) and default
    (AVX-512) runs of one seed correlate (so Welch's interval would be wider), and cars'
    methods whose study kept the paper default repeat their default runs bit for bit on
    another thread count."""
    from harness.stats import compare

    def by_seed(runs: list[dict]) -> dict[str, dict[int, dict]]:
        out: dict[str, dict[int, dict]] = {}
        for r in runs:
            out.setdefault(r["method"]["name"], {})[r["seed"]] = r
        return out

    birds_t, birds_d = by_seed(_runs("birds", tuned=True)), by_seed(_runs("birds"))

    def isa(runs: dict[str, dict[int, dict]]) -> set[str]:
        return {r["environment"]["fingerprint"]["torch_cpu_isa"]
                for m in runs.values() for r in m.values()}  # fmt: skip

    assert isa(birds_t) == {"AVX2"} and isa(birds_d) == {"AVX512"}
    correlations, wider = [], []
    for name, tuned in birds_t.items():
        seeds = sorted(set(tuned) & set(birds_d[name]))
        a = [tuned[s]["metrics"]["map@r"] for s in seeds]
        b = [birds_d[name][s]["metrics"]["map@r"] for s in seeds]
        welch = compare(dict(enumerate(a)), {-1 - k: v for k, v in enumerate(b)})
        assert welch.test == "Welch t"
        paired = compare(dict(zip(seeds, a, strict=True)), dict(zip(seeds, b, strict=True)))
        wider.append(welch.half_width / paired.half_width)
        correlations.append(statistics.correlation(a, b))
    page = Page("docs/verdicts.md")
    page.numbers(r"correlate at a median ([\d.]+) over the (\d+) methods",
                 f"{statistics.median(correlations):.2f}", len(correlations))  # fmt: skip
    page.numbers(r"interval would be a median (\d+) times wider under Welch's test",
                 f"{statistics.median(wider):.0f}")  # fmt: skip
    cars_t, cars_d = by_seed(_runs("cars", tuned=True)), by_seed(_runs("cars"))
    kept = [m for m, t in cars_t.items()
            if all(r["method"].get("hyperparameters") == cars_d[m][s]["method"].get("hyperparameters")
                   for s, r in t.items())]  # fmt: skip
    assert kept and all(v == cars_d[m][s]["metrics"][k] for m in kept
                        for s, r in cars_t[m].items() for k, v in r["metrics"].items()
                        if k != "lda")  # fmt: skip
    threads = {r["environment"]["fingerprint"]["torch_threads"]
               for g in (cars_t, cars_d) for m in g.values() for r in m.values()}  # fmt: skip
    assert threads == {1, 2}
    page.numbers(r"the (\d+) cars methods whose study kept the paper default gave tuned runs "
                 r"identical to their default runs, bit for bit", len(kept))  # fmt: skip


def test_the_tuning_study_quotes_in_verdicts_are_the_leaderboards():
    """The `tuning` protocol's measured bullets (docs/verdicts.md) against the tuned section
    the leaderboard generates from the runs."""
    board = _text("results/reference/LEADERBOARD.md")
    section = board.split("## tuning (protocol")[1].split("### Every run")[0]
    wins, of, ties, wins_d = re.search(
        r"the best \(\w+\) is significantly better than (\d+) of (\d+) methods and (\d+) cannot be "
        r"told from it; at the papers' defaults, the best \(\w+\) was significantly better than "
        r"(\d+) of", section).groups()  # fmt: skip
    flips, pairs, resolved, reversed_ = re.search(
        r"(\d+) of the (\d+) pairs of methods are ordered the other way round after tuning; (\d+) "
        r"of those reverse an ordering the default table resolved .*?, and (\d+) of these",
        section).groups()  # fmt: skip
    up, down, noise = re.search(r"(\d+) methods significantly up, (\d+) significantly down, "
                                r"(\d+) within", section).groups()  # fmt: skip
    page = Page("docs/verdicts.md")
    page.numbers(r"is significantly better than (\d+) of the other (\d+) rows; at the papers' "
                 r"defaults the best \(\w+\) was significantly better than (\d+)\.",
                 wins, of, wins_d)  # fmt: skip
    page.numbers(r"(\d+) of the (\d+) pairs of methods swap order after tuning; (\d+) of these "
                 r"swaps reverse an ordering the default table resolved, and (\d+) of those",
                 flips, pairs, resolved, reversed_)  # fmt: skip
    page.numbers(r"(\d+) methods moved significantly up, (\d+) significantly down, (\d+) within",
                 up, down, noise)  # fmt: skip
    assert int(ties) + int(wins) == int(of)
    page.numbers(r"The committed `tuning` study .*?: (\d+) trials per method", _trials("tuning"))
    Page("README.md").numbers(r"protocol gives each of the 28 methods with a search space (\d+) "
                              r"Optuna trials", _trials("tuning"))  # fmt: skip


# ------------------------------------------------------------- commands as printed


def test_the_test_command_is_the_same_in_the_readme_the_guide_and_ci():
    def command(path: str) -> str:
        return next(line for line in (REPO / path).read_text().splitlines()
                    if line.startswith("python3 -m venv .venv") and "pytest" in line)  # fmt: skip

    assert command("README.md") == command("docs/getting-started.md") == command(".ci/run")


def test_command_1_installs_the_harness_and_is_the_same_in_the_readme_and_the_guide():
    def command(path: str) -> list[str]:
        lines = (REPO / path).read_text().splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("# 1. "))
        return lines[at : at + 2]

    assert command("README.md") == command("docs/getting-started.md")
    comment, line = command("README.md")
    assert "pip install -r requirements.lock && .venv/bin/pip install --no-deps -e . &&" in line
    assert "glyphs" in comment and "not real photos" in comment  # what it trains
    for path in ["README.md", *DOCS]:  # no placeholder for an address the project lacks
        assert "<repository URL>" not in (REPO / path).read_text(), path


def test_the_commands_said_to_take_plugin_are_the_ones_that_do():
    from harness.cli.program import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    taking = {name for name, p in sub.choices.items()
              if any("--plugin" in a.option_strings for a in p._actions)}  # fmt: skip

    def listed(text: str) -> set[str]:
        return set(re.findall(r"`(\w+)`", text))

    readme = Page("README.md")
    said = re.search(r"\(`--plugin` works on ([^)]+)\)", readme.text)
    assert said and listed(said.group(1)) == taking, (readme.where("`--plugin` works on"), taking)
    own = re.search(r"every command that names methods \(([^)]+)\)", _text("docs/own-loss.md"))
    assert own and listed(own.group(1)) == taking, taking
    head = re.search(r"^## --plugin \(([^)]+)\)$", (REPO / "docs/commands.md").read_text(), re.M)
    assert head and set(head.group(1).split(", ")) == taking, taking
