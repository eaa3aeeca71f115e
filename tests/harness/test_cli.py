"""The command line as a user meets it: outputs, exit codes, one-line errors, resumption."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.evaluate import MetricOptions

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "results" / "reference"  # the committed results (never written by runs)


def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=600,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_run_writes_results_and_leaderboard_then_resumes(tmp_path: Path):
    results = tmp_path / "results"
    args = ["-q", "run", "--protocol", "smoke", "--method", "untrained,contrastive",
            "--results-dir", str(results)]  # fmt: skip
    assert main(args) == 0
    path = results / "runs" / "smoke" / "contrastive" / "seed0.json"
    record = json.loads(path.read_text())
    for key in ("protocol", "method", "seed", "split", "metrics", "timings", "tuples",
                "environment", "status", "training", "dataset"):  # fmt: skip
        assert key in record
    assert record["protocol"]["hash"] and record["protocol"]["version"] == 2
    assert record["method"] == {
        "name": "contrastive", "version": 2, "paper": "lifted_structure_cvpr2016",
        "hyperparameters": {"margin": 1.0},
    }  # fmt: skip
    assert record["environment"]["packages"]["torch"]
    assert record["tuples"]["kind"] == "pairs" and record["tuples"]["per_step"] == 120
    assert set(record["metrics"]) >= {"recall@1", "recall@2", "map@r", "nmi", "f1", "map"}
    # a fresh result has every key of a committed (schema-1) one, plus the sweep's seeds and
    # the bootstrap intervals over test queries (one per retrieval metric, low <= mean <= high),
    # the k-means convention of its nmi and f1, and what the data pipeline cost
    assert record["schema"] == 2 and record["sweep_seeds"] == [0]
    assert record["clustering_convention"] == "harness"
    committed = json.loads((REFERENCE / "runs/default/contrastive/seed0.json").read_text())
    boot = record["bootstrap"]
    assert _keys(record) == _keys(committed) | {"sweep_seeds", "clustering_convention"} | {
        f"bootstrap.{k}" for k in ("unit", "resamples", "seed", "confidence", "intervals")
    } | {"bootstrap"} | {
        f"timings.{k}"
        for k in (
            "data_wait_seconds",
            "data_wait_share",
            "data_startup_seconds",
            "data_workers",
            "decoder",
            "compiled",
        )
    }  # the data pipeline's (issue 13)
    assert boot["resamples"] == 1000 and set(boot["intervals"]) == {
        m for m in record["metrics"] if m not in ("nmi", "f1", "lda")
    }
    for name, (low, high) in boot["intervals"].items():
        assert low <= record["metrics"][name] <= high
    board = (results / "LEADERBOARD.md").read_text()
    assert "| contrastive" in board and "| untrained" in board and "smoke" in board
    mtime = path.stat().st_mtime_ns
    assert main(args) == 0  # finished runs are skipped, not redone
    assert path.stat().st_mtime_ns == mtime
    assert main([*args, "--force"]) == 0  # a forced rerun archives the old result
    archived = list((results / "archive").rglob("seed0-*.json"))
    assert len(archived) == 2


def _keys(record: dict, prefix: str = "") -> set[str]:
    """Dotted key paths, not descending into values whose keys are data (metrics, content)."""
    free = (
        "content",
        "hyperparameters",
        "metrics",
        "distances",
        "packages",
        "fingerprint",
        "intervals",
    )
    out = set()
    for key, value in record.items():
        out.add(prefix + key)
        if isinstance(value, dict) and key not in free:
            out |= _keys(value, f"{prefix}{key}.")
    return out


def test_ls_json_lists_everything():
    proc = cli("ls", "--json")
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    names = {m["name"] for m in listing["methods"]}
    assert {"untrained", "contrastive", "triplet"} <= names
    assert {"default", "smoke", "omniglot"} <= {p["name"] for p in listing["protocols"]}
    assert {"glyphs", "omniglot"} <= set(listing["datasets"])


def test_global_options_before_or_after_the_subcommand(tmp_path: Path):
    """-q silences the per-run lines and -v adds debug lines, before or after the subcommand."""
    base = ["run", "--protocol", "smoke", "--method", "untrained", "--force", "--results-dir"]
    quiet = cli(*base, str(tmp_path / "q"), "-q")
    verbose = cli("-v", *base, str(tmp_path / "v"))
    assert quiet.returncode == 0 and verbose.returncode == 0, quiet.stderr + verbose.stderr
    assert "[1/1]" not in quiet.stderr and "hyperparameters" not in quiet.stderr
    assert "[1/1]" in verbose.stderr and "hyperparameters {'normalize'" in verbose.stderr
    assert_one_line_error(cli("-q", "ls", "-v"), "-q and -v")


def test_leaderboard_command_draws_one_panel_row_per_family(tmp_path: Path):
    """The command must load the methods: without their registry every method is "other"."""
    import harness.methods  # noqa: F401
    from PIL import Image

    from harness.report import training_curve

    paths = []
    for name in ("contrastive", "triplet"):
        path = tmp_path / "runs" / "default" / name / "seed0.json"
        path.parent.mkdir(parents=True)
        path.write_text((REFERENCE / "runs" / "default" / name / "seed0.json").read_text())
        paths.append(path)
    proc = cli("leaderboard", "--results-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    expected = training_curve(paths, tmp_path / "expected.png")
    with (
        Image.open(tmp_path / "figures" / "training_default.png") as got,
        Image.open(expected) as e,
    ):
        assert got.height == e.height  # two rows: pairs and triplets


def test_program_name_follows_the_entry_point(monkeypatch: pytest.MonkeyPatch):
    from harness.core import program_name

    monkeypatch.setattr(sys, "argv", ["/venv/bin/dml-harness", "ls"])
    assert program_name() == "dml-harness"
    monkeypatch.setattr(sys, "argv", [str(REPO / "harness" / "__main__.py"), "ls"])
    assert program_name() == "python -m harness"


def test_evaluate_all_vs_all_and_query_gallery(tmp_path: Path):
    emb = np.array([[0.0], [0.1], [5.0], [5.2]], dtype=np.float32)
    labels = np.array([0, 0, 1, 1])
    np.save(tmp_path / "e.npy", emb)
    np.save(tmp_path / "l.npy", labels)
    proc = cli("evaluate", "--embeddings", str(tmp_path / "e.npy"),
               "--labels", str(tmp_path / "l.npy"), "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads(proc.stdout)
    # all-vs-all excludes each item; nmi and f1 follow faiss's convention unless asked otherwise
    assert metrics.pop("warnings") == proc.stderr.strip().splitlines()
    assert proc.stderr.splitlines()[1].startswith("note: nmi and f1 from faiss k-means (20")
    assert metrics["recall@1"] == 1.0 and metrics["map@r"] == 1.0
    assert all(0.0 <= v <= 1.0 for k, v in metrics.items() if k != "lda")
    assert metrics["lda"] > 1  # a ratio: the two classes are far apart
    np.save(tmp_path / "q.npy", np.array([[4.9], [0.2]], dtype=np.float32))
    np.save(tmp_path / "ql.npy", np.array([0, 0]))
    proc = cli("evaluate", "--embeddings", str(tmp_path / "e.npy"),
               "--labels", str(tmp_path / "l.npy"), "--query-embeddings", str(tmp_path / "q.npy"),
               "--query-labels", str(tmp_path / "ql.npy"), "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # query 0 (label 0) sits next to the label-1 items, query 1 next to the label-0 items
    assert json.loads(proc.stdout)["recall@1"] == 0.5


def test_evaluate_clustering_option_picks_the_k_means_convention(
    tmp_path: Path, capsys, monkeypatch
):
    from harness.cli.evaluate import convention_note
    from harness.evaluate import compute_metrics

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(12), 6)
    emb = rng.normal(size=(12, 8))[labels] + rng.normal(scale=0.6, size=(72, 8))
    np.save(tmp_path / "e.npy", emb.astype(np.float32))
    np.save(tmp_path / "l.npy", labels)
    files = ["evaluate", "--embeddings", str(tmp_path / "e.npy"),
             "--labels", str(tmp_path / "l.npy"), "--json"]  # fmt: skip
    printed = {}
    for convention in ("harness", "faiss"):
        assert main([*files, "--clustering", convention]) == 0
        printed[convention] = json.loads(capsys.readouterr().out)
        assert "excluded from its own gallery" in printed[convention].pop("warnings")[0]
        expected = compute_metrics(
            emb.astype(np.float32), labels, options=MetricOptions(kmeans_convention=convention)
        )
        assert printed[convention] == pytest.approx(expected, abs=1e-12)
    assert printed["harness"]["nmi"] > printed["faiss"]["nmi"]  # here 0.839 against 0.755
    assert main(files) == 0  # the default is faiss's convention (the published tables')
    assert json.loads(capsys.readouterr().out) == {**printed["faiss"], "warnings": [
        "note: all-vs-all: each of the 72 items queries the other 71; it is excluded from its "
        "own gallery", convention_note("faiss", chosen=False)]}  # fmt: skip
    assert "--clustering harness" in convention_note("faiss", chosen=False)
    monkeypatch.setattr("harness.cli.evaluate.KMEANS_FAISS", None)  # faiss not installed
    assert main(files) == 0
    printed_without = json.loads(capsys.readouterr().out)
    assert printed_without["warnings"][1] == (
        "note: nmi and f1 from the harness's k-means (k-means++ start, up to 100 iterations)"
        " (faiss is not installed); --clustering faiss for the published tables' convention"
    )
    assert {**printed_without, "warnings": []} == {**printed["harness"], "warnings": []}
    with pytest.raises(SystemExit) as info:
        main([*files, "--clustering", "fais"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and "'fais'" in err


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["run", "--method", "contrastiv", "--protocol", "smoke"], ["did you mean 'contrastive'"]),
        (["run", "--all", "--protocol", "smok"], ["unknown protocol 'smok'", "did you mean"]),
        (["run", "--all", "--protocol", "smoke", "--data-root", "/nonexistent/dir"],
         ["--data-root /nonexistent/dir is not a directory"]),
        (["run", "--all", "--protocol", "omniglot", "--max-steps", "1"], ["--data-root"]),
        (["leaderboard", "--results-dir", "/nonexistent/results"], ["no run results"]),
        (["run", "--method", ",", "--protocol", "smoke"], ["--method ',' names no method"]),
        (["run", "--all", "--protocol", "smoke", "--address", "auto", "--gpus-per-run", "1"],
         ["--address, --gpus-per-run only apply to --engine ray"]),
        (["evaluate", "--embeddings", "/nonexistent/e.npy", "--labels", "/x.npy"],
         ["does not exist"]),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(args: list[str], fragments: list[str]):
    assert_one_line_error(cli(*args), *fragments)


def test_evaluate_mismatched_counts_is_one_line(tmp_path: Path):
    np.save(tmp_path / "e.npy", np.zeros((4, 2), dtype=np.float32))
    np.save(tmp_path / "l.npy", np.zeros(3, dtype=np.int64))
    proc = cli(
        "evaluate", "--embeddings", str(tmp_path / "e.npy"), "--labels", str(tmp_path / "l.npy")
    )
    assert_one_line_error(proc, "4", "3")


def test_an_unwritable_results_folder_is_one_line(tmp_path: Path):
    """A --results-dir that is a file (or read-only, or on a full disk): the file system's
    error as one line naming the path and the way out, not a traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = cli("run", "--protocol", "smoke", "--method", "contrastive", "--max-steps", "1",
               "--results-dir", str(blocker / "results"))  # fmt: skip
    assert_one_line_error(proc, "cannot use", str(blocker), "--results-dir")


def test_validate_reports_each_bad_file(tmp_path: Path):
    good = REPO / "protocols" / "smoke.yaml"
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("embedding_dim:", "embeding_dim:"))
    proc = cli("validate", str(good), str(bad))
    assert proc.returncode == 2
    assert "ok" in proc.stdout and "did you mean 'embedding_dim'" in proc.stderr
    assert cli("validate").returncode == 0


def test_a_crashed_ray_task_makes_the_sweep_exit_1(tmp_path: Path, monkeypatch, capsys):
    """A task that raised is counted as `error` by the Ray engine's collector; the command
    must not exit 0 as if every run had finished."""
    import harness.cli.run
    import harness.sweep.ray

    class CrashingRay:  # ray.wait / ray.get as the collector calls them; the task raised
        def wait(self, refs, num_returns, timeout):
            return refs[:1], refs[1:]

        def get(self, ref):
            raise RuntimeError("run crashed: ValueError")

    class NoEpochs:
        def qsize(self):
            return 0

    def sweep_ray(specs, *args, **kwargs):
        counts: dict[str, int] = {}
        pending = {f"task{i}": (spec, None) for i, spec in enumerate(specs)}
        harness.sweep.ray._collect(CrashingRay(), pending, len(specs), counts, False, NoEpochs())
        return counts

    monkeypatch.setattr(harness.cli.run, "sweep_ray", sweep_ray)
    args = ["-q", "run", "--protocol", "smoke", "--method", "contrastive", "--engine", "ray",
            "--results-dir", str(tmp_path), "--max-steps", "2", "--seeds"]  # fmt: skip
    # every task crashed: no results at all, so no leaderboard, and still exit 1 (not 2)
    assert main([*args, "0"]) == 1
    assert "error 1; leaderboard: none" in capsys.readouterr().out
    # beside a finished result (seed 0, run locally), a crashed task still fails the sweep
    assert main([*args[:-1], "--engine", "local", "--seeds", "0"]) == 0
    assert main([*args, "0,1"]) == 1  # (this stand-in for Ray submits finished runs too)
    assert f"runs: error 2; leaderboard: {tmp_path}" in capsys.readouterr().out
