"""The committed results live in results/reference, where a user's commands never write: a
fresh clone's `run` (and CI's `check`) leave the tracked tree unchanged, git ignores whatever
they write under results/, the user's leaderboard sets its runs beside the reference's, and
`run --tuned` and `compare` find the committed tuning and runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.check import BASELINE_DIR
from harness.cli import main
from harness.core import HarnessError, load_methods, load_protocol
from harness.records import result_path
from harness.report import write_leaderboard
from harness.sweep import checkpoint_path
from harness.sweep.tuned import load_overlay, overlay_path

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "results" / "reference"
DEFAULT = REFERENCE / "runs" / "default"

needs_git = pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(),
    reason="needs git and a git checkout",
)


def git(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def written_by_user_commands(results: Path) -> list[Path]:
    """Paths `run`, `leaderboard`, `report`, `cost` and `tune` write under the default results
    folder (from the functions that name them where they are public)."""
    return [
        result_path(results, "default", "contrastive", 0),
        result_path(results, "default", "contrastive+tuned", 1),
        checkpoint_path(results, "default", "contrastive", 0),
        overlay_path(results, "tuning", "contrastive"),
        overlay_path(results, "tuning", "contrastive", 30),
        results / "tuning" / "tuning" / "studies.db",
        results / "runs" / "default" / "contrastive" / ".seed0.json.1a2b.tmp",
        results / "runs" / "default" / "contrastive" / "seed0.json.lock",
        results / "archive" / "default" / "contrastive" / "seed0-20260101T000000000000.json",
        results / "archive" / "cost" / "default-20260101T000000000000.json",
        results / "LEADERBOARD.md",
        results / "report" / "index.html",
        results / "report" / "assets" / "default" / "training.png",
        results / "figures" / "training_default.png",
        results / "cost" / "default.json",
        results / "cost" / "devices" / "default.json",
        results / "cost" / "pipeline" / "default.json",
    ]


@needs_git
def test_git_ignores_what_user_commands_write_under_results_but_not_the_reference():
    paths = [str(p) for p in written_by_user_commands(Path("results"))]
    ignored = git("check-ignore", "--no-index", *paths).stdout.split()
    assert sorted(ignored) == sorted(paths)
    committed = git("ls-files", "results").stdout.split()
    assert committed and all(p.startswith("results/reference/") for p in committed), [
        p for p in committed if not p.startswith("results/reference/")
    ]
    assert "results/reference/LEADERBOARD.md" in committed
    assert "results/reference/baselines/regression.json" in committed
    kept = git("check-ignore", "--no-index", "results/reference/LEADERBOARD.md",
               "results/reference/runs/default/contrastive/seed0.json")  # fmt: skip
    assert kept.stdout == ""


def test_the_check_compares_with_the_reference_baselines():
    assert BASELINE_DIR == REFERENCE / "baselines"
    assert (BASELINE_DIR / "regression.json").is_file()


def test_every_relative_link_of_the_committed_leaderboards_resolves():
    boards = [REFERENCE / "LEADERBOARD.md", *sorted(REFERENCE.glob("studies/*/LEADERBOARD.md"))]
    assert len(boards) >= 3
    for board in boards:
        links = re.findall(r"\]\(([^)#]+)\)", board.read_text())
        local = [link for link in links if "://" not in link]
        assert local, board
        for link in local:
            assert (board.parent / link).is_file(), f"{board}: {link}"


@pytest.mark.slow
def test_the_committed_leaderboard_is_what_the_leaderboard_command_makes(tmp_path: Path):
    """Regenerated from the committed runs (moved to results/reference), it is the committed
    file: nothing in it depended on where the results folder lies."""
    load_methods()
    copy = tmp_path / "reference"
    shutil.copytree(REFERENCE, copy, ignore=shutil.ignore_patterns("studies"))
    write_leaderboard(copy)
    assert (copy / "LEADERBOARD.md").read_text() == (REFERENCE / "LEADERBOARD.md").read_text()


def test_the_readme_quotes_the_committed_tuned_table():
    """The README's tuning paragraph quotes the tuned table that the committed results make
    (the table itself is the leaderboard's): the leader, its numbers, the `≈ best` rows and
    the largest moves. After new results: regenerate, then update the paragraph."""
    from harness.records import load_results
    from harness.report.tuned import tuned_table

    load_methods()
    runs = [r for r in load_results(REFERENCE) if r.protocol.name == "tuning"]
    assert any(r.tuning for r in runs)
    rows = {}
    for line in tuned_table(runs).splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    leader = next(m for m, c in rows.items() if c[2] == "best")
    tuned, default = rows[leader][1], rows[leader][4].split(" ±")[0]
    assert f"{leader} leads ({tuned} MAP@R, from {default} at its paper default)" in readme
    near = [m for m, c in rows.items() if c[2].startswith("≈ best")]
    assert f"{', '.join(near[:-1])} and {near[-1]} are `≈ best`" in readme
    moves = sorted(((float(c[3].split()[0]), m) for m, c in rows.items() if c[3] != "-"),
                   reverse=True)[:5]  # fmt: skip
    for move, method in moves:
        assert method in readme and f"+{move:.1f}" in readme, (method, move)


def user_results(tmp_path: Path, methods=("contrastive", "triplet")) -> Path:
    """A results folder with a reference inside it (copies of the committed default runs of
    `methods`, seeds 0-2), and no runs of its own yet."""
    results = tmp_path / "results"
    for method in methods:
        shutil.copytree(DEFAULT / method, results / "reference" / "runs" / "default" / method)
    return results


def add_run(results: Path, method: str, seed: int, change=None) -> dict:
    """The user's run: a copy of the committed one, changed by `change(record)`."""
    record = json.loads((DEFAULT / method / f"seed{seed}.json").read_text())
    if change:
        change(record)
    path = results / "runs" / "default" / method / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return record


def moved(record: dict) -> None:
    """The numbers another processor gives: every metric a little off."""
    record["metrics"] = {k: v * 1.01 for k, v in record["metrics"].items()}


def section(board: str) -> str:
    return board.split("## Against the committed reference", 1)[1].split("\n## ", 1)[0]


def test_the_users_leaderboard_sets_its_runs_beside_the_reference(tmp_path: Path):
    load_methods()
    results = user_results(tmp_path)
    reference_files = {p: p.read_bytes() for p in (results / "reference").rglob("*")
                       if p.is_file()}  # fmt: skip
    record = add_run(results, "contrastive", 0)  # the reference's machine: reproduced
    add_run(results, "triplet", 0, moved)  # another processor
    add_run(results, "triplet", 1, moved)
    path = write_leaderboard(results)
    assert path == results / "LEADERBOARD.md"
    part = section(path.read_text())
    assert "[its leaderboard](reference/LEADERBOARD.md)" in part
    assert "seed-noise-sized differences" in part
    assert f"### default (hash `{record['protocol']['hash']}`)" in part
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in part.splitlines() if line.startswith("| ") and "---" not in line}  # fmt: skip
    assert rows["contrastive"][:2] == ["1", "3"]
    assert rows["contrastive"][-2:] == ["+0.0", "identical (seed 0)"]
    assert rows["triplet"][-1] == "differs (seeds 0, 1)" and rows["triplet"][-2] != "+0.0"
    assert "method" in rows and "lifted_structure" not in rows  # only the methods run here
    # the reference is read, never written
    after = {p: p.read_bytes() for p in (results / "reference").rglob("*") if p.is_file()}
    assert after == reference_files


def test_another_protocol_hash_or_a_shortened_run_is_not_set_beside_the_reference(
    tmp_path: Path,
):
    load_methods()
    results = user_results(tmp_path, ("contrastive",))

    def edited(record: dict) -> None:
        record["protocol"]["hash"] = "0123456789abcdef"

    add_run(results, "contrastive", 0, edited)
    part = section(write_leaderboard(results).read_text())
    assert "Not compared: the default runs here have protocol hash `0123456789abcdef`" in part
    assert "| contrastive" not in part

    def capped(record: dict) -> None:
        record["training"]["max_steps"] = 2

    add_run(results, "contrastive", 0, capped)
    assert "Against the committed reference" not in write_leaderboard(results).read_text()


def test_without_a_reference_the_leaderboard_has_no_such_section(tmp_path: Path):
    load_methods()
    results = tmp_path / "results"
    add_run(results, "contrastive", 0)
    assert "Against the committed reference" not in write_leaderboard(results).read_text()


def test_run_names_both_leaderboards(tmp_path: Path, capsys):
    results = tmp_path / "results"
    (results / "reference" / "runs").mkdir(parents=True)
    (results / "reference" / "LEADERBOARD.md").write_text("# Leaderboard\n")
    args = ["-q", "run", "--protocol", "smoke", "--method", "untrained", "--results-dir",
            str(results)]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"leaderboard: {results / 'LEADERBOARD.md'}" in out
    assert f"committed reference: {results / 'reference' / 'LEADERBOARD.md'}" in out
    assert (results / "reference" / "LEADERBOARD.md").read_text() == "# Leaderboard\n"


def test_run_tuned_falls_back_to_the_committed_tuning(tmp_path: Path):
    load_methods()
    protocol = load_protocol("tuning")
    with pytest.raises(HarnessError, match="no tuned configuration for contrastive"):
        load_overlay(tmp_path / "results", protocol, "contrastive")
    committed = REFERENCE / "tuning" / "tuning" / "contrastive.yaml"
    target = tmp_path / "results" / "reference" / "tuning" / "tuning" / "contrastive.yaml"
    target.parent.mkdir(parents=True)
    shutil.copy(committed, target)
    assert load_overlay(tmp_path / "results", protocol, "contrastive")["path"] == str(target)
    own = overlay_path(tmp_path / "results", "tuning", "contrastive")  # the user's own wins
    own.parent.mkdir(parents=True)
    shutil.copy(committed, own)
    assert load_overlay(tmp_path / "results", protocol, "contrastive")["path"] == str(own)


def test_compare_points_at_the_committed_runs(tmp_path: Path, capsys):
    results = user_results(tmp_path)
    args = ["compare", "contrastive", "triplet", "--results-dir", str(results)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"--results-dir {results / 'reference'}" in err and len(err.splitlines()) == 1
    assert (
        main(["compare", "contrastive", "triplet", "--results-dir", str(results / "reference")])
        == 0
    )


@needs_git
@pytest.mark.slow
def test_a_default_run_and_the_check_leave_the_tracked_tree_unchanged(tmp_path: Path):
    """README command 1 on a fresh clone, shortened, then CI's check: `git status` stays
    empty (the runs, leaderboard, figures, checkpoints and archive are ignored; the check's
    runs go to a temporary folder)."""
    clone = tmp_path / "clone"
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard").stdout
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():  # the working tree as it is, uncommitted changes included
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "s"]):  # fmt: skip
        assert git(*args, cwd=clone).returncode == 0
    env = {**os.environ, "PYTHONPATH": str(clone)}

    def harness(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "harness", "-q", *args], cwd=clone, env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    run = ["run", "--protocol", "default", "--method", "contrastive", "--seeds", "0",
           "--max-steps", "2"]  # fmt: skip
    first = harness(*run)
    harness(*run, "--force")  # archives the first result, writes a checkpoint on the way
    check = harness("check", "--methods", "untrained")
    assert "check passed" in check.stdout
    assert git("status", "--porcelain", "--untracked-files=all", cwd=clone).stdout == ""
    assert "committed reference: results/reference/LEADERBOARD.md" in first.stdout
    assert (clone / "results" / "LEADERBOARD.md").is_file()
    assert list((clone / "results" / "archive").rglob("seed0-*.json"))
