"""tests/benchmarks/gpu_checks.sh, the GPU checks in one command of at most 8 minutes
(docs/gpu.md): its default steps come in order of value and their limits fit the budget; the
docs show the one command and name every step; a run writes a summary line per step and the
archive after every step, also when its budget is spent or it is interrupted. On a CPU
(DEVICE=cpu) its steps run at a tiny scale, which keeps the script's plumbing honest in CI."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "benchmarks" / "gpu_checks.sh"
GPU_DOC = REPO / "docs" / "gpu.md"
# Most valuable first: versions, correctness on CUDA, the measurements, then the birds sweep.
ORDER = ["env", "tests", "smoke", "cost", "pipeline", "long", "birds_gpu"]
BUDGET = 480  # seconds: 8 minutes of a quarter-hour rental, machine start included


def _steps() -> set[str]:
    text = SCRIPT.read_text()
    defined = set(re.findall(r"^step_(\w+)\(\)", text, re.M))
    limits = set(re.findall(r"\[(\w+)\]=\d+", text))
    assert defined == limits, "each step needs a function and a time limit"
    return defined


def _plan() -> tuple[str, list[tuple[str, int]]]:
    listed = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True,
                            check=True, env={**os.environ, "BUDGET": ""}).stdout  # fmt: skip
    return listed, [(m[1], int(m[2])) for m in re.finditer(r"^(\w+) (\d+)$", listed, re.M)]


def _run(tmp_path: Path, *steps: str, budget: int, resume: Path | None = None,
         new_session: bool = False) -> subprocess.Popen:  # fmt: skip
    env = {**os.environ, "DEVICE": "cpu", "OUT": str(tmp_path / "out"),
           "WORK": str(tmp_path / "work"), "PYTHON": sys.executable, "BUDGET": str(budget),
           "RESUME": str(resume or "")}  # fmt: skip
    return subprocess.Popen(["bash", str(SCRIPT), *steps], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=new_session)  # fmt: skip


def _summary(tmp_path: Path) -> list[str]:
    lines = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert lines[0].startswith("# ") and "DEVICE=cpu" in lines[0]  # the command's own line
    return lines[1:]


def _archived(tmp_path: Path) -> list[str]:
    with tarfile.open(tmp_path / "out" / "gpu_checks.tar.gz") as archive:
        return archive.getnames()


def test_the_default_run_goes_by_value_and_fits_eight_minutes():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    listed, plan = _plan()
    assert [name for name, _ in plan] == ORDER
    assert f"budget {BUDGET}s" in listed  # the default budget
    assert sum(limit for _, limit in plan) <= BUDGET
    assert all(limit >= 15 for _, limit in plan)  # each step has time to start at all
    assert set(ORDER) < _steps()  # the others run by name only
    assert "birds_gpu also takes what the steps before it leave" in listed


def test_the_docs_give_the_one_command_and_every_step():
    doc = GPU_DOC.read_text()
    commands = re.findall(r"^(?:\w+=\S+ )*bash tests/benchmarks/gpu_checks.sh(.*)$", doc, re.M)
    assert [c.strip() for c in commands] == [""]  # one command, every default step
    rows = re.findall(r"^\| `(\w+)`(?:, `(\w+)`)? \| ([\w ,]+) \|", doc, re.M)
    documented = {name for row in rows for name in row[:2] if name}
    assert documented == _steps()
    _, plan = _plan()
    limits = {row[0]: row[2] for row in rows}
    assert [limits[name].split()[0] for name in ORDER] == [str(limit) for _, limit in plan]
    pages = ["docs/gpu.md", "docs/scale-out.md", "tests/benchmarks/gpu_checks.sh",
             "tests/benchmarks/gpu_wheels.sh"]  # fmt: skip
    for page in pages:  # they speak of the project and a user's GPU, nothing else
        text = (REPO / page).read_text()
        for word in ("lent", "session", "carry", "device tool", "`device` tool"):
            assert not re.search(rf"\b{word}\b", text, re.I), f"{page}: {word!r}"


def test_a_spent_budget_skips_each_default_step_in_order_and_archives(tmp_path):
    earlier = tmp_path / "earlier"  # RESUME: an earlier archive's birds_gpu results
    (earlier / "results_birds" / "runs").mkdir(parents=True)
    (earlier / "results_birds" / "runs" / "seed0.json").write_text("{}")
    subprocess.run(["tar", "-czf", str(tmp_path / "earlier.tar.gz"), "-C", str(earlier),
                    "results_birds"], check=True)  # fmt: skip
    done = _run(tmp_path, budget=5, resume=tmp_path / "earlier.tar.gz")
    out, _ = done.communicate(timeout=60)
    assert done.returncode == 0, out
    assert [line.split()[0] for line in _summary(tmp_path)] == ORDER
    assert all(" skipped: " in line for line in _summary(tmp_path))
    assert "results_birds/runs/seed0.json" in _archived(tmp_path)
    assert "summary.txt" in _archived(tmp_path)


@pytest.mark.slow
def test_steps_by_name_run_on_the_cpu_and_are_archived(tmp_path):
    done = _run(tmp_path, "env", "smoke", "nosuch", budget=200)
    out, _ = done.communicate(timeout=300)
    assert done.returncode == 0, out
    summary = _summary(tmp_path)
    assert summary[0].startswith("env rc=0") and summary[1].startswith("smoke rc=0"), summary
    assert summary[2].startswith("unknown step nosuch")
    assert len(summary) == 3  # one line a step
    names = _archived(tmp_path)
    assert {"logs/env.log", "logs/smoke.log", "summary.txt"} <= set(names)
    runs = [n for n in names if re.match(r"results/runs/smoke/\w+/seed0\.json$", n)]
    assert len(runs) == 3  # contrastive, cosface, untrained on the CPU; --all on a GPU
    assert "harness imports" in (tmp_path / "work" / "logs" / "env.log").read_text()


@pytest.mark.slow
def test_an_interrupted_run_still_leaves_its_summary_and_archive(tmp_path):
    proc = _run(tmp_path, "env", "smoke", "cost", budget=200, new_session=True)
    archive, smoke_log = tmp_path / "out" / "gpu_checks.tar.gz", tmp_path / "work/logs/smoke.log"
    deadline = time.monotonic() + 120
    while not (archive.exists() and smoke_log.exists()) and time.monotonic() < deadline:
        time.sleep(0.2)  # the archive is written after env, before smoke ends
    assert archive.exists() and "logs/env.log" in _archived(tmp_path)
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    summary = _summary(tmp_path)
    assert summary[0].startswith("env rc=0") and summary[1].startswith("smoke interrupted"), out
    assert len(summary) == 2  # cost never started
    assert "logs/smoke.log" in _archived(tmp_path)
    leftover = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", "the interrupted step's processes are gone"
