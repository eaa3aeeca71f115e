"""Sweeps on Ray: a local Ray of 2 CPUs gives the same results as the local engine, and a
worker killed mid-run is retried, with every result written once by the driver."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from harness.cli import main

pytestmark = [
    pytest.mark.slow,  # minutes: run by the README's test command, not by a bare pytest
    # one xdist worker runs them all, one after another, on one local Ray cluster of every
    # core; the kill -9 watcher below must see no other test's Ray tasks
    pytest.mark.xdist_group("ray"),
]
ray = pytest.importorskip("ray", reason="the ray extra is not installed (requirements-ray.lock)")

SWEEP = ["--protocol", "learning", "--method", "contrastive,proxy_anchor", "--seeds", "0,1"]
COMPARED = ("metrics", "training", "tuples", "method", "protocol", "seed")


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray for the module, started as the commands start it (start_ray): each
    command below joins it instead of starting and stopping its own, and its worker
    processes stay warm (each start costs seconds)."""
    from harness.sweep import start_ray

    started = start_ray(ray, None)
    assert started and ray.cluster_resources()["CPU"] == (os.cpu_count() or 1)
    yield
    ray.shutdown()


def results(folder: Path) -> dict[str, dict]:
    return {
        str(p.relative_to(folder)): json.loads(p.read_text())
        for p in sorted((folder / "runs").rglob("seed*.json"))
    }


# The Ray tasks' torch threads (--cpus-per-run), and the local sweep's: float rounding depends
# on the count. One thread: two tasks at a time on a local Ray of 2 CPUs, none oversubscribed.
THREADS = 1


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory) -> Path:
    """The local engine with THREADS torch threads, whatever this process was given."""
    folder = tmp_path_factory.mktemp("local")
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        assert main(["-q", "run", *SWEEP, "--results-dir", str(folder)]) == 0
    finally:
        torch.set_num_threads(threads)
    return folder


def test_a_ray_sweep_equals_the_local_sweep_to_the_last_bit(local_sweep, tmp_path, capsys):
    """Tasks of THREADS torch threads each, as the local engine trained."""
    args = ["run", *SWEEP, "--engine", "ray", "--cpus-per-run", str(THREADS), "--results-dir",
            str(tmp_path)]  # fmt: skip
    assert main(["-q", *args]) == 0
    mine, theirs = results(tmp_path), results(local_sweep)
    assert len(mine) == 4 and mine.keys() == theirs.keys()
    for name, record in mine.items():
        for key in COMPARED:
            if key == "training":  # seconds per epoch are the machine's, not the run's
                record[key].pop("epoch_seconds"), theirs[name][key].pop("epoch_seconds")
            assert record[key] == theirs[name][key], (name, key)
    assert (tmp_path / "LEADERBOARD.md").is_file()
    capsys.readouterr()
    assert main(["run", *SWEEP, "--engine", "ray", "--results-dir", str(tmp_path)]) == 0
    assert "skipped 4" in capsys.readouterr().out  # finished runs are not rerun


def _kill_first_task_worker(stop: threading.Event, killed: list[int]) -> None:
    """kill -9 the first Ray worker seen running a run (its process title names the task)."""
    while not stop.is_set() and not killed:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if title.startswith("ray::run_task") and int(pid) != os.getpid():
                time.sleep(0.5)  # let it start (a 3 s wait let fast machines finish the run)
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:  # it finished first: watch for the next task
                    continue
                killed.append(int(pid))
                return
        time.sleep(0.2)


def test_a_killed_worker_is_retried_and_every_result_is_written_once(tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO)
    stop, killed = threading.Event(), []
    watcher = threading.Thread(target=_kill_first_task_worker, args=(stop, killed))
    watcher.start()
    try:
        args = ["run", "--protocol", "learning", "--method", "contrastive", "--seeds", "0,1",
                "--engine", "ray", "--cpus-per-run", "1", "--results-dir", str(tmp_path)]  # fmt: skip
        assert main(args) == 0
    finally:
        stop.set()
        watcher.join()
    assert killed, "no Ray worker was seen running a run"
    assert sorted(results(tmp_path)) == [
        "runs/learning/contrastive/seed0.json",
        "runs/learning/contrastive/seed1.json",
    ]
    assert all(r["status"] == "ok" for r in results(tmp_path).values())
    assert not (tmp_path / "archive").exists()  # each result written once
    assert "ok 2" in capsys.readouterr().out
    # the workers streamed finished epochs back to the driver's log (not necessarily epoch 1:
    # under load, the killed worker's message for it can be lost with the worker, and the
    # retried run resumes after that epoch's checkpoint)
    for seed in (0, 1):
        streamed = [m for m in caplog.messages if m.startswith(f"contrastive seed {seed}: epoch ")]
        assert streamed and all(m.endswith(" done") for m in streamed), caplog.messages


def test_without_ray_the_engine_says_how_to_install_it(monkeypatch, capsys):
    import harness.sweep.ray

    def missing():
        raise harness.core.HarnessError("--engine ray needs Ray: pip install -e '.[ray]'")

    monkeypatch.setattr(harness.sweep.ray, "import_ray", missing)
    assert main(["run", "--protocol", "smoke", "--method", "contrastive", "--engine", "ray"]) == 2
    assert "pip install -e '.[ray]'" in capsys.readouterr().err


def test_tune_on_ray_ends_with_exactly_n_trials_in_one_storage(tmp_path, capsys):
    """Trials as Ray tasks (two at a time on 2 CPUs) against the default SQLite storage: the
    study ends with exactly --trials finished trials, the first the paper's configuration."""
    import optuna
    import yaml

    import harness.tune.study
    from harness.core import PROTOCOL_DIR

    data = yaml.safe_load((PROTOCOL_DIR / "learning.yaml").read_text())
    data["name"], data["split"]["validation_fraction"] = "learning_val", 0.25
    protocol = tmp_path / "learning_val.yaml"
    protocol.write_text(yaml.safe_dump(data))
    args = ["tune", "--protocol", str(protocol), "--method", "contrastive", "--trials", "3",
            "--max-steps", "20", "--engine", "ray", "--results-dir", str(tmp_path)]  # fmt: skip
    assert main(["-q", *args]) == 0
    storage = harness.tune.default_storage(tmp_path, "learning_val")
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    states = [t.state.name for t in study.trials]
    assert len(states) == 3 and set(states) <= {"COMPLETE", "PRUNED"}, states
    assert study.trials[0].params == {"margin": 1.0}  # the paper default first
    assert all("fold_scores" in t.user_attrs for t in study.trials if t.state.name == "COMPLETE")
    overlay = yaml.safe_load(
        (tmp_path / "tuning/learning_val/contrastive.max_steps20.yaml").read_text()
    )  # capped trials: their own file
    assert overlay["study"]["trials"] == 3
    assert main(["-q", *args]) == 0  # already complete: no new trial
    assert len(optuna.load_study(study_name=summary.study_name, storage=storage).trials) == 3
