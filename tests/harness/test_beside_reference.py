"""Your loss beside the committed baselines without rerunning them: `leaderboard --reference`
and `compare --reference` read the committed runs of the same protocol hash, mark them
`reference` with their machine, and pair seeds across machines by the one rule that
`compare` and the leaderboard follow (harness.core.pairing)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats

from harness.cli import main
from harness.core import load_methods
from harness.report.beside import Row, committed_reference, paired
from harness.stats import unpaired_probs

CARS = committed_reference() / "runs" / "cars"


def plugin_runs(results: Path, gain: float = 0.05, change=None) -> list[dict]:
    """A plugin loss's 5 cars seeds, made on another machine: the committed contrastive runs
    renamed, `gain` added to every metric."""
    out = []
    for seed in range(5):
        record = json.loads((CARS / "contrastive" / f"seed{seed}.json").read_text())
        record["method"] = {**record["method"], "name": "my_loss",
                            "source": {"plugin": "file", "path": "/tmp/my_loss.py", "sha256": "ab" * 32}}  # fmt: skip
        record["metrics"] = {k: v + gain if isinstance(v, float) else v
                             for k, v in record["metrics"].items()}  # fmt: skip
        record["environment"]["fingerprint"] = {**record["environment"]["fingerprint"],
                                                "id": "another", "cpu_vendor": "GenuineIntel"}  # fmt: skip
        if change:
            change(record)
        path = results / "runs" / "cars" / "my_loss" / f"seed{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))
        out.append(record)
    return out


def rows_of(text: str) -> dict[str, list[str]]:
    part = text.split("## Beside the committed reference", 1)[1].split("\n## ", 1)[0]
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in part.splitlines() if line.startswith("| ") and "---" not in line}  # fmt: skip


def test_a_plugin_loss_sits_beside_the_committed_cars_baselines_with_no_rerun(tmp_path):
    load_methods()
    results = tmp_path / "results"
    plugin_runs(results)
    assert main(["leaderboard", "--results-dir", str(results), "--reference"]) == 0
    rows = rows_of((results / "LEADERBOARD.md").read_text())
    baselines = {n for n, cells in rows.items() if cells[0] == "reference"}
    # 28 methods at their paper defaults, each tuned too, and zero-shot
    assert len(baselines) == 57 and "untrained" in baselines and "margin+tuned" in baselines
    assert rows["my_loss"][0] == "yours" and "GenuineIntel" not in rows["contrastive"][1]
    assert rows["my_loss"][4] == "best"  # five points above contrastive, the cars leader's
    # another machine, the same seeds: the test against a reference row pairs them, as the
    # reference rows among themselves do
    assert (
        rows["contrastive"][4].startswith("below (p = ")
        and "unpaired" not in rows["contrastive"][4]
    )
    assert rows["contrastive"][4].endswith(", paired)")
    worse = float(rows["contrastive"][5].split(" · ")[0])
    assert worse > 0.95  # 5 points below the best, beyond the ROPE of ±1


def test_the_unpaired_posterior_is_welchs_t_and_only_shared_seeds_decide_pairing():
    a, b = {0: 1.0, 1: 2.0, 2: 3.0}, {0: 0.0, 1: 1.0, 2: 2.0}
    probs = unpaired_probs(a, b, 0.5)
    # difference 1, standard error sqrt(1/3 + 1/3), Welch-Satterthwaite: 4 degrees of freedom
    t = stats.t(4, 1.0, math.sqrt(2 / 3))
    assert probs.worse == pytest.approx(t.cdf(-0.5))
    assert probs.better == pytest.approx(1 - t.cdf(0.5))
    assert unpaired_probs({0: 1.0}, b, 0.5) is None  # one value: no spread to weigh
    here = Row("x", "yours", a, frozenset({"m1"}), "")
    assert paired(here, Row("y", "reference", b, frozenset({"m1"}), ""))
    assert paired(here, Row("y", "reference", b, frozenset({"m2"}), ""))  # another machine
    assert not paired(here, Row("y", "reference", {3: 0.0, 4: 1.0}, frozenset({"m1"}), ""))
    assert not paired(here, Row("y", "reference", {0: 0.0, 5: 1.0}, frozenset({"m1"}), ""))


def test_compare_reads_a_method_you_did_not_run_from_the_reference(tmp_path, capsys):
    results = tmp_path / "results"
    plugin_runs(results)
    code = main(["compare", "my_loss", "contrastive", "--protocol", "cars",
                 "--results-dir", str(results), "--reference"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "contrastive: " in out and "(reference, 5 seeds, made on AMD EPYC" in out
    assert "difference +5.00 points" in out and "(paired t test, n = 5)" in out
    assert "made on more than one machine fingerprint" in out  # and says that the seeds pair


def test_a_reference_of_another_protocol_hash_is_one_line_and_nothing_is_written(tmp_path, capsys):
    results = tmp_path / "results"

    def edited(record: dict) -> None:
        record["protocol"]["hash"] = "0123456789abcdef"

    plugin_runs(results, change=edited)
    assert main(["leaderboard", "--results-dir", str(results), "--reference"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "its cars runs have protocol hash" in err[0], err
    assert "yours 0123456789abcdef" in err[0]
    assert not (results / "LEADERBOARD.md").exists()
    assert main(["leaderboard", "--results-dir", str(results),
                 "--reference", str(tmp_path / "nothing")]) == 2  # fmt: skip
    assert "no runs/ folder there" in capsys.readouterr().err


def test_compare_the_leaderboard_and_reference_pair_two_machines_alike(tmp_path, capsys):
    """One rule for runs from two machine fingerprints: `compare` over one results folder,
    `compare --reference` and `leaderboard --reference` give the same paired test of a row
    made on another machine against a committed row (the old `--reference` took Welch's)."""
    load_methods()
    results, alone = tmp_path / "results", tmp_path / "alone"

    def noisy(record: dict) -> None:  # a seed-dependent gain, so the test has a spread
        record["metrics"]["map@r"] += 0.001 * record["seed"]

    records = plugin_runs(results, change=noisy)
    for record in records:  # the same runs, and the committed contrastive, in one folder
        for name, data in (("my_loss", record),
                           ("contrastive", json.loads((CARS / "contrastive" / f"seed{record['seed']}.json").read_text()))):  # fmt: skip
            path = alone / "runs" / "cars" / name / f"seed{record['seed']}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data))
    lines = {}
    for where, extra in ((alone, []), (results, ["--reference"])):
        assert main(["compare", "my_loss", "contrastive", "--protocol", "cars",
                     "--results-dir", str(where), *extra]) == 0  # fmt: skip
        out = capsys.readouterr().out
        lines[str(where)] = next(line for line in out.splitlines() if " − contrastive: " in line)
    first, second = lines.values()
    assert "(paired t test, n = 5)" in first and first == second
    assert main(["leaderboard", "--results-dir", str(results), "--reference"]) == 0
    assert rows_of((results / "LEADERBOARD.md").read_text())["contrastive"][4].endswith(", paired)")


def test_the_pairing_rule_counts_shared_seeds_only():
    from harness.core import shared_seeds
    from harness.stats import compare

    assert shared_seeds({0: 1.0, 1: 2.0, 2: 3.0}, {1: 0.0, 2: 1.0, 5: 0.0}) == [1, 2]
    assert shared_seeds({0: 1.0, 1: 2.0}, {1: 0.0, 2: 1.0}) is None  # one shared seed: unpaired
    assert compare({0: 1.0, 1: 2.0}, {1: 0.0, 2: 1.0}).test == "Welch t"
    assert compare({0: 1.0, 1: 2.5}, {0: 0.0, 1: 1.0}).test == "paired t"
