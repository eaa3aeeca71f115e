"""The CI regression check: exact on the baseline's machine; elsewhere exact for the rows whose
numbers reproduce and statistical for the others; a planted and a real regression fail it in
both modes; the committed baseline covers every method; the report is a summary and the rows
that did not simply pass (--full: every row)."""

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from stand_in import other_kernels_env

from harness.check import BASELINE_DIR, check
from harness.check.baselines import load_baseline, update
from harness.check.compare import ALPHA, MIN_BOUND, WATCH_DROP, compare, t_bound, too_noisy
from harness.check.verdict import report
from harness.cli import main
from harness.core import HarnessError, load_methods, load_protocol
from harness.records import Environment, MethodInfo, ProtocolInfo, RunResult

REPO = Path(__file__).resolve().parents[3]


def run(method: str, seed: int, metrics: dict, version: int = 1, status: str = "ok") -> RunResult:
    return RunResult(status=status, protocol=ProtocolInfo("p", 1, "h"), seed=seed,
                     method=MethodInfo(method, version), metrics=metrics)  # fmt: skip


BASE = {
    "format": 2,
    "protocol_hash": "h",
    "seeds": [0, 1, 2, 3],
    "methods": {"a": {"version": 1, "metrics": {"map@r": [0.50, 0.52, 0.48, 0.50]}}},
}


def runs_a(values: list[float], **kw) -> dict:
    return {"a": [run("a", s, {"map@r": v}, **kw) for s, v in enumerate(values)]}


def statuses(runs: dict, exact: bool, seeds=(0, 1, 2), hash_: str = "h") -> dict:
    return {(r.method, r.metric): r.status for r in compare(BASE, hash_, runs, list(seeds), exact)}


def test_t_bound_matches_the_hand_worked_pooled_t_test():
    # base mean 0.50, variance 0.0008/3; now mean 0.46, variance 0.0002/2; pooled variance
    # (0.0008 + 0.0002) / 5 = 0.0002; standard error sqrt(0.0002 * (1/4 + 1/3)) = 0.0108012;
    # one-sided 99% quantile of Student's t with 5 df (tables): 3.36493.
    base, now = [0.50, 0.52, 0.48, 0.50], [0.45, 0.47, 0.46]
    assert t_bound(base, now, rows=1, alpha=0.01) == pytest.approx(3.36493 * 0.0108012, rel=1e-5)
    # Bonferroni: ten rows test each at 0.001 (t quantile 5.89343), so the bound widens
    assert t_bound(base, now, rows=10, alpha=0.01) == pytest.approx(5.89343 * 0.0108012, rel=1e-5)
    assert t_bound([0.5] * 4, [0.5] * 3, rows=1) == MIN_BOUND  # no spread at all


def test_statistical_mode_flags_a_drop_beyond_the_bound_only():
    # bound for these spreads is about 0.036 (see above): a 0.04 drop regresses, 0.02 does not
    assert statuses(runs_a([0.45, 0.47, 0.46]), exact=False)[("a", "map@r")] == "REGRESSED"
    assert statuses(runs_a([0.47, 0.49, 0.48]), exact=False)[("a", "map@r")] == "ok"
    assert statuses(runs_a([0.55, 0.57, 0.56]), exact=False)[("a", "map@r")] == "improved"


def test_exact_mode_fails_any_difference_either_way():
    assert statuses(runs_a([0.50, 0.52, 0.48]), exact=True)[("a", "map@r")] == "ok"
    # a trained number moving by 1e-10 is a change; metric sums reordered (1e-15) are not
    assert statuses(runs_a([0.50, 0.52, 0.48 + 1e-10]), exact=True)[("a", "map@r")] == "CHANGED"
    assert statuses(runs_a([0.50, 0.52, 0.48 + 4e-15]), exact=True)[("a", "map@r")] == "ok"
    assert statuses(runs_a([0.51, 0.52, 0.48]), exact=True)[("a", "map@r")] == "CHANGED"
    # the check's seeds are looked up by seed, not by position
    assert statuses(runs_a([0.52, 0.48]), exact=True, seeds=(1, 2))[("a", "map@r")] == "ok"


def test_auto_mode_elsewhere_passes_reproduced_rows_as_exact_and_tests_the_others():
    base = {**BASE, "methods": {"a": {"version": 1, "metrics": {
        "map@r": [0.50, 0.52, 0.48, 0.50], "recall@1": [0.7, 0.8, 0.6, 0.7]}}}}  # fmt: skip
    runs = {"a": [run("a", s, {"map@r": m, "recall@1": r})
                  for s, (m, r) in enumerate([(0.40, 0.7), (0.42, 0.8), (0.41, 0.6 + 4e-15)])]}  # fmt: skip
    rows = {r.metric: r for r in compare(base, "h", runs, [0, 1, 2], False, True)}
    assert (rows["recall@1"].how, rows["recall@1"].status, rows["recall@1"].bound) == (
        "exact", "ok", 0.0)  # fmt: skip
    assert (rows["map@r"].how, rows["map@r"].status) == ("statistical", "REGRESSED")
    # without exact_if_reproduced (--mode statistical) a reproduced row is tested as well
    plain = {r.metric: r for r in compare(base, "h", runs, [0, 1, 2], False)}
    assert plain["recall@1"].how == "statistical" and plain["recall@1"].bound > 0


def fingerprinted(values: dict[str, list[float]], fp: str) -> dict:
    """Runs of methods a, b, ... (seeds 0, 1, 2: map@r) made on a machine of fingerprint fp."""
    runs = {m: [run(m, s, {"map@r": v}) for s, v in enumerate(vs)] for m, vs in values.items()}
    for rs in runs.values():
        for r in rs:
            r.environment = Environment(fingerprint={"id": fp, "cpu_model": f"cpu {fp}"})
    return runs


TWO = {**BASE, "fingerprint": {"id": "base", "cpu_model": "cpu base"}, "methods": {
    "a": {"version": 1, "metrics": {"map@r": [0.50, 0.52, 0.48, 0.50]}},
    "b": {"version": 1, "metrics": {"map@r": [0.30, 0.32, 0.28, 0.30]}}}}  # fmt: skip
SAME = {"a": [0.50, 0.52, 0.48], "b": [0.30, 0.32, 0.28]}


def check_report(values: dict, fp: str, mode: str = "auto", full: bool = False):
    protocol = SimpleNamespace(hash="h")
    return report(TWO, protocol, fingerprinted(values, fp), [0, 1, 2], mode, Path("b.json"), full)


def test_every_number_reproduced_on_another_fingerprint_is_exact():
    passed, out = check_report(SAME, "other")
    assert passed
    assert "mode: exact (another machine, but every number reproduced bit for bit" in out
    assert "summary: 2/2 rows pass (2 methods): 2 exact, 0 statistical" in out
    assert "check passed (exact): 2/2 rows pass" in out
    # forced statistical mode keeps its meaning: every row by the t-test
    passed, out = check_report(SAME, "other", mode="statistical")
    assert passed and "mode: statistical (forced" in out and "0 exact, 2 statistical" in out


def test_rows_that_differ_elsewhere_are_tested_statistically_and_the_mode_says_mixed():
    passed, out = check_report({"a": [0.50, 0.52, 0.48], "b": [0.301, 0.32, 0.28]}, "other")
    assert passed, out
    assert "mode: mixed (another machine: 1 of 2 rows reproduced bit for bit" in out
    assert "1 exact, 1 statistical" in out and "check passed (mixed)" in out
    passed, out = check_report({"a": [0.50, 0.52, 0.48], "b": [0.10, 0.12, 0.08]}, "other")
    assert not passed and "REGRESSED" in out and "check FAILED (mixed)" in out


def test_on_the_baselines_own_fingerprint_any_difference_fails():
    passed, out = check_report({"a": [0.50, 0.52, 0.48], "b": [0.301, 0.32, 0.28]}, "base")
    assert not passed and "mode: exact (same fingerprint" in out
    assert "CHANGED" in out and "check FAILED (exact)" in out and "--update --reason" in out
    passed, out = check_report({"a": [0.50, 0.52, 0.48], "b": [0.301, 0.32, 0.28]}, "other",
                               mode="exact")  # fmt: skip
    assert not passed and "mode: exact (forced" in out


def test_the_report_lists_only_rows_that_did_not_simply_pass_unless_full():
    values = {"a": [0.60, 0.62, 0.58], "b": [0.30, 0.32, 0.28]}  # a improved, b reproduced
    passed, out = check_report(values, "other")
    lines = out.splitlines()
    assert passed and lines[0].startswith("this machine: cpu other")
    assert lines[1].startswith("baseline:     cpu base") and lines[2].startswith("mode: mixed")
    assert lines[3] == ("summary: 2/2 rows pass (2 methods): 1 exact, 1 statistical; 0 failed, "
                        "1 improved; 1 method too noisy to guard")  # fmt: skip
    assert lines[4].startswith("too noisy to guard on this machine") and "a (smallest" in lines[4]
    table = [line for line in lines if line.startswith(("a ", "b "))]
    assert len(table) == 1 and table[0].split()[:2] == ["a", "map@r"] and "improved" in table[0]
    assert "smallest detectable drop" not in out and "(--full lists every row)" in lines[-1]
    passed, out = check_report(values, "other", full=True)
    table = [line for line in out.splitlines() if line.startswith(("a ", "b "))]
    assert [line.split()[0] for line in table] == ["a", "b", "a"]  # every row, then the drops
    assert "exact" in table[1] and "smallest detectable drop" in out
    assert out.splitlines()[-1].startswith("check passed (mixed): 2/2 rows pass")


def test_full_goes_with_the_check_not_with_update(capsys):
    assert main(["check", "--update", "--reason", "x", "--full"]) == 2
    assert "--full" in capsys.readouterr().err


def test_compare_fails_missing_changed_failed_and_foreign_seeds():
    new = {"new": [run("new", 0, {"map@r": 0.5}), run("new", 1, {"map@r": 0.5})]}
    assert statuses(new, exact=False, seeds=(0, 1))[("new", "*")] == "missing baseline"
    version = statuses(runs_a([0.5, 0.5, 0.5], version=2), exact=False)[("a", "*")]
    assert "version 1 -> 2" in version
    assert (
        "run failed" in statuses(runs_a([0.5, 0.5, 0.5], status="failed"), exact=False)[("a", "*")]
    )
    nan = statuses(runs_a([0.5, float("nan"), 0.5]), exact=False)[("a", "map@r")]
    assert nan.startswith("not finite")
    assert "protocol hash" in statuses(runs_a([0.5] * 3), exact=False, hash_="x")[("*", "protocol")]
    assert (
        "not in the baseline" in statuses(runs_a([0.5] * 3), False, seeds=(0, 1, 7))[("*", "seeds")]
    )


def test_a_baseline_metric_the_runs_no_longer_report_fails():
    two = {"map@r": [0.5] * 4, "recall@1": [0.7] * 4}
    base = {**BASE, "methods": {"a": {"version": 1, "metrics": two}}}
    for exact in (True, False):
        rows = compare(base, "h", runs_a([0.5, 0.5, 0.5]), [0, 1, 2], exact)
        lost = {r.metric: r for r in rows}["recall@1"]
        assert lost.failed and lost.status.startswith("missing now")
    # one seed lost it: named, and no KeyError
    runs = runs_a([0.5, 0.5, 0.5])
    for r in runs["a"]:
        r.metrics["recall@1"] = 0.7
    del runs["a"][1].metrics["recall@1"]
    rows = {r.metric: r for r in compare(base, "h", runs, [0, 1, 2], exact=False)}
    assert rows["recall@1"].status == "missing now (seeds [1])"
    assert rows["map@r"].status == "ok"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_baseline_never_passes(bad: float):
    base = {**BASE, "methods": {"a": {"version": 1, "metrics": {"map@r": [0.5, bad, 0.5, 0.5]}}}}
    for exact in (True, False):
        (row,) = compare(base, "h", runs_a([0.5, 0.5, 0.5]), [0, 2, 3], exact)
        assert row.failed and row.status.startswith("baseline not finite")


def test_update_refuses_non_finite_values(tmp_path: Path):
    runs = runs_a([0.5, float("nan"), 0.5])
    for r in runs["a"]:
        r.environment = Environment(fingerprint={"id": "x"})
    path = tmp_path / "regression.json"
    with pytest.raises(HarnessError, match=r"not finite.*a map@r \(seed 1: nan\)"):
        update(path, load_protocol("regression"), runs, [0, 1, 2], "why", partial=False)
    assert not path.exists()


def test_a_method_too_noisy_to_guard_is_named():
    noisy = {**BASE, "methods": {"a": {"version": 1, "metrics": {"map@r": [0.1, 0.5, 0.2, 0.4]}}}}
    rows = compare(noisy, "h", runs_a([0.3, 0.1, 0.5]), [0, 1, 2], exact=False)
    assert set(too_noisy(rows)) == {"a"} and too_noisy(rows)["a"] > WATCH_DROP


def test_an_old_baseline_file_is_refused_with_the_fix(tmp_path: Path):
    path = tmp_path / "regression.json"
    path.write_text(json.dumps({"protocol": "regression", "methods": {}}))
    with pytest.raises(HarnessError, match="format-1 baseline.*--update --reason"):
        load_baseline(path)


# another processor: the rows that differ are tested statistically; a row whose numbers still
# reproduce (a processor of the same family, or a discrete metric such as recall@4 by chance)
# passes as exact: then the mode is mixed, or exact when every number reproduced
OTHER_MACHINE = re.compile(r"mode: (statistical|mixed|exact) \(another machine")


def tiny_protocol(tmp_path: Path, name: str = "checktiny", overrides: str = "") -> str:
    """The smoke protocol's data, trained a little longer, with two check seeds."""
    text = (REPO / "protocols" / "smoke.yaml").read_text()
    text = text.replace("name: smoke", f"name: {name}").replace("steps: 4", "steps: 12")
    text = text.replace("seeds: [0]", "seeds: [0, 1, 2]") + overrides
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return str(path)


STAND_IN_CHECK = """
import sys
from pathlib import Path
from harness.core import load_methods
from harness.check import check
load_methods()
passed, report = check(sys.argv[1], sys.argv[2].split(","), Path(sys.argv[3]),
                       results_dir=Path(sys.argv[4]), numerics=sys.argv[5])
print(report)
sys.exit(0 if passed else 1)
"""


def check_on_stand_in(
    protocol: str, methods: str, baselines: Path, runs: Path, numerics: str = "native"
):  # fmt: skip
    """The check in a subprocess that takes other kernels: another processor (with native
    numerics; the pinned mode overrides the stand-in). Its runs are kept in `runs`, so a
    second check there (against other baselines) trains nothing again."""
    cmd = [sys.executable, "-c", STAND_IN_CHECK, protocol, methods, str(baselines), str(runs),
           numerics]  # fmt: skip
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=other_kernels_env())  # fmt: skip


@pytest.mark.slow
def test_planted_regression_fails_in_both_modes_and_on_a_stand_in_machine(tmp_path: Path, capsys):
    load_methods()  # check() itself is called below, before main() would load them
    protocol = tiny_protocol(tmp_path)
    args = ["-q", "check", "--protocol", protocol, "--methods", "contrastive",
            "--baselines", str(tmp_path)]  # fmt: skip
    with pytest.raises(HarnessError, match="no baseline file"):
        check(protocol, ["contrastive"], tmp_path)
    assert main([*args, "--update", "--reason", "test baselines", "--baseline-seeds", "6"]) == 0
    path = tmp_path / "checktiny.json"
    baseline = json.loads(path.read_text())
    assert baseline["reason"] == "test baselines" and baseline["commit"]
    assert baseline["seeds"] == [0, 1, 2, 3, 4, 5] and baseline["fingerprint"]["torch_threads"] == 1
    assert len(baseline["methods"]["contrastive"]["metrics"]["map@r"]) == 6
    capsys.readouterr()
    assert main(args) == 0  # the same machine: exact, and the same numbers again
    assert "mode: exact" in capsys.readouterr().out
    stand_in = check_on_stand_in(protocol, "contrastive", tmp_path, tmp_path / "stand_in")
    assert stand_in.returncode == 0, stand_in.stdout + stand_in.stderr
    assert OTHER_MACHINE.search(stand_in.stdout), stand_in.stdout

    for metrics in baseline["methods"]["contrastive"]["metrics"].values():  # plant a regression
        metrics[:] = [v + 0.3 for v in metrics]
    path.write_text(json.dumps(baseline))
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "CHANGED" in out and "check FAILED (exact)" in out
    stand_in = check_on_stand_in(protocol, "contrastive", tmp_path, tmp_path / "stand_in")
    assert stand_in.returncode == 1 and "check FAILED (statistical)" in stand_in.stdout
    assert "REGRESSED" in stand_in.stdout
    # forced statistical mode here too (the runs of a kept results folder are reused)
    runs = tmp_path / "runs"
    passed, report = check(
        protocol, ["contrastive"], tmp_path, results_dir=runs, mode="statistical"
    )
    assert not passed and "REGRESSED" in report
    baseline_path_ = tmp_path / "checktiny.json"
    baseline["methods"]["contrastive"]["metrics"] = {
        k: [v - 0.3 for v in vs] for k, vs in baseline["methods"]["contrastive"]["metrics"].items()
    }
    baseline_path_.write_text(json.dumps(baseline))
    passed, report = check(
        protocol, ["contrastive"], tmp_path, results_dir=runs, mode="statistical"
    )
    assert passed and "check passed (statistical)" in report


@pytest.mark.slow
def test_a_method_made_worse_on_purpose_fails_the_statistical_check(tmp_path: Path):
    """Contrastive with margin 0 never pushes negatives apart: against the committed baseline
    (the same protocol otherwise), its metrics regress beyond the statistical bound."""
    from harness.check.rerun import run_protocol

    load_methods()
    text = (
        (REPO / "protocols" / "regression.yaml")
        .read_text()
        .replace("name: regression", "name: regression_worse")
    )
    (tmp_path / "worse.yaml").write_text(text + "methods:\n  contrastive: {margin: 0}\n")
    worse = load_protocol(str(tmp_path / "worse.yaml"))
    baseline = load_baseline(BASELINE_DIR / "regression.json")
    runs = run_protocol(worse, ["contrastive"], worse.seeds, tmp_path / "r", "cpu")
    rows = compare(baseline, baseline["protocol_hash"], runs, worse.seeds, exact=False)
    regressed = {r.metric for r in rows if r.status == "REGRESSED"}
    assert {"map@r", "nmi"} <= regressed, rows


def test_committed_baseline_covers_every_method_with_enough_seeds():
    import harness.methods  # noqa: F401

    from harness.core import METHODS

    baseline = load_baseline(BASELINE_DIR / "regression.json")
    protocol = load_protocol("regression")
    assert set(baseline["methods"]) == set(METHODS.names())
    assert baseline["protocol_hash"] == protocol.hash
    assert set(protocol.seeds) <= set(baseline["seeds"]) and len(protocol.seeds) >= 3
    assert baseline["fingerprint"]["torch_threads"] == 1 and baseline["fingerprint"]["id"]
    for name, entry in baseline["methods"].items():
        assert entry["version"] == METHODS.get(name).version
        assert all(len(v) == len(baseline["seeds"]) for v in entry["metrics"].values()), name
    assert 0 < ALPHA <= 0.05


@pytest.mark.slow
def test_committed_baseline_holds_on_a_stand_in_processor(tmp_path: Path):
    """Two methods of the real check under other kernels: statistical mode, and it passes;
    every baseline value raised by 0.3 fails it."""
    names, runs = "contrastive,triplet", tmp_path / "stand_in"
    out = check_on_stand_in("regression", names, BASELINE_DIR, runs)
    assert out.returncode == 0, out.stdout + out.stderr
    assert OTHER_MACHINE.search(out.stdout), out.stdout
    planted = load_baseline(BASELINE_DIR / "regression.json")
    for entry in planted["methods"].values():
        for values in entry["metrics"].values():
            values[:] = [v + 0.3 for v in values]
    (tmp_path / "regression.json").write_text(json.dumps(planted))
    out = check_on_stand_in("regression", names, tmp_path, runs)  # the same runs, reused
    assert out.returncode == 1 and "REGRESSED" in out.stdout
    # pinned numerics (the default) override the stand-in: every number bit for bit
    out = check_on_stand_in("regression", names, BASELINE_DIR, tmp_path / "pinned", "auto")
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"mode: exact \((same fingerprint|pinned numerics on both)", out.stdout)


def test_a_misspelt_method_is_named_before_any_run_folder_is_made(tmp_path, monkeypatch, capsys):
    import tempfile

    made = []
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: made.append(kw) or str(tmp_path))
    assert main(["check", "--methods", "contrastiv"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'contrastive'" in err and "kept in" not in err and not made
