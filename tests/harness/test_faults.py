"""Runs that survive faults: kill -9 mid-sweep, NaN losses, idle miners, concurrent writers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
from harness.methods.contrastive import ContrastiveLoss
from harness.methods.triplet import SemiHardMiner

from harness.cli import main
from harness.sweep import RunSpec, execute

REPO = Path(__file__).resolve().parents[2]


def long_smoke(tmp: Path, budget: str = "budget: {epochs: 6}") -> Path:
    path = tmp / "smoke_long.yaml"
    text = (REPO / "protocols" / "smoke.yaml").read_text()
    path.write_text(text.replace("budget: {steps: 4}", budget))
    return path


def test_kill_9_mid_sweep_then_same_command_loses_nothing(tmp_path: Path):
    protocol = long_smoke(tmp_path)
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "harness", "-q", "run", "--protocol", str(protocol),
           "--method", "untrained,contrastive,triplet", "--results-dir", str(results)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.DEVNULL)
    ckpt = results / "checkpoints" / "smoke" / "contrastive" / "seed0.pt"
    deadline = time.time() + 300
    while not ckpt.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert ckpt.exists(), "the sweep never reached contrastive's first checkpoint"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    runs = results / "runs" / "smoke"
    assert json.loads((runs / "untrained" / "seed0.json").read_text())["status"] == "ok"
    before = (runs / "untrained" / "seed0.json").stat().st_mtime_ns
    assert subprocess.run(cmd, cwd=REPO, env=env, capture_output=True).returncode == 0
    for method in ("untrained", "contrastive", "triplet"):
        record = json.loads((runs / method / "seed0.json").read_text())
        assert record["status"] == "ok"
    assert (runs / "untrained" / "seed0.json").stat().st_mtime_ns == before  # not redone
    resumed = json.loads((runs / "contrastive" / "seed0.json").read_text())
    assert resumed["training"]["resumed_from_step"] > 0
    assert sorted(p.name for p in runs.rglob("*") if p.is_file()) == ["seed0.json"] * 3
    assert not list((results / "checkpoints").rglob("*.pt"))
    assert "| contrastive" in (results / "LEADERBOARD.md").read_text()


def test_nan_loss_marks_the_run_failed_and_the_sweep_goes_on(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(
        ContrastiveLoss,
        "forward",
        lambda self, out, batch, mined: out.embedding.sum() * float("nan"),
    )
    results = tmp_path / "r"
    code = main(["-q", "run", "--protocol", "smoke", "--method", "contrastive,triplet",
                 "--results-dir", str(results)])  # fmt: skip
    assert code == 1  # a failed run makes the sweep's exit status non-zero
    failed = json.loads((results / "runs" / "smoke" / "contrastive" / "seed0.json").read_text())
    assert failed["status"] == "failed" and "loss became nan at step 0" in failed["failure"]
    ok = json.loads((results / "runs" / "smoke" / "triplet" / "seed0.json").read_text())
    assert ok["status"] == "ok"
    board = (results / "LEADERBOARD.md").read_text()
    assert "seed 0: failed (loss became nan" in board
    monkeypatch.undo()
    assert (
        main(
            [
                "-q",
                "run",
                "--protocol",
                "smoke",
                "--method",
                "contrastive",
                "--results-dir",
                str(results),
            ]
        )
        == 0
    )  # fmt: skip  (a failed run is retried)
    assert list((results / "archive").rglob("seed0-*.json"))  # the failure record is kept


def test_a_miner_that_finds_nothing_fails_the_run(tmp_path: Path, monkeypatch):
    def nothing(self, out, batch):
        empty = torch.empty(0, dtype=torch.long)
        from harness.core import Triplets

        return Triplets(0, empty, empty, empty)

    monkeypatch.setattr(SemiHardMiner, "__call__", nothing)
    spec = RunSpec(protocol=str(long_smoke(tmp_path, "budget: {steps: 80}")), method="triplet",
                   seed=0, results_dir=str(tmp_path / "r"))  # fmt: skip
    status, path = execute(spec, progress=False)
    record = json.loads(path.read_text())
    assert status == "failed" and "no tuples for 50 consecutive steps" in record["failure"]


def test_a_run_locked_by_a_live_process_is_left_alone(tmp_path: Path):
    lock = tmp_path / "r" / "runs" / "smoke" / "untrained" / "seed0.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text(f"{os.getpid()} here\n")  # this very process: alive
    spec = RunSpec(protocol="smoke", method="untrained", seed=0, results_dir=str(tmp_path / "r"))
    assert execute(spec, progress=False)[0] == "running_elsewhere"
    lock.write_text(f"999999999 {socket.gethostname()}\n")  # a dead owner here (kill -9): stale
    assert execute(spec, progress=False)[0] == "ok"
    assert not lock.exists()
