"""tests/benchmarks/gpu_checks.sh, the GPU checks that a session with a lent GPU runs in
three calls: every step the docs' GPU page names exists, the script parses, and two of its steps run
on the CPU (DEVICE=cpu) and write their summary and archive. The whole script on the CPU takes
about 9 minutes (docs/gpu.md); these cheap steps keep its plumbing honest in CI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "benchmarks" / "gpu_checks.sh"


def _steps() -> set[str]:
    text = SCRIPT.read_text()
    defined = set(re.findall(r"^step_(\w+)\(\)", text, re.M))
    limits = set(re.findall(r"\[(\w+)\]=\d+", text))
    assert defined == limits, "each step needs a function and a time limit"
    return defined


def test_the_docs_call_only_steps_the_script_has():
    calls = re.findall(r"^bash tests/benchmarks/gpu_checks.sh ([\w ]+?)\s+#",
                       (REPO / "docs" / "gpu.md").read_text(), re.M)  # fmt: skip
    assert len(calls) == 3
    named = [step for call in calls for step in call.split()]
    assert sorted(named) == sorted(_steps())  # every step, once, in the three calls
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@pytest.mark.slow
def test_two_steps_run_on_the_cpu_and_are_archived(tmp_path):
    env = {**os.environ, "DEVICE": "cpu", "OUT": str(tmp_path / "out"),
           "WORK": str(tmp_path / "work"), "PYTHON": sys.executable, "BUDGET": "200"}  # fmt: skip
    done = subprocess.run(["bash", str(SCRIPT), "env", "eval60k", "nosuch"], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("env rc=0") and summary[1].startswith("eval60k rc=0")
    assert summary[2].startswith("unknown step nosuch")
    with tarfile.open(tmp_path / "out" / "gpu_checks.tar.gz") as archive:
        names = archive.getnames()
    assert "logs/env.log" in names and "logs/eval60k.log" in names
    log = (tmp_path / "work" / "logs" / "eval60k.log").read_text()
    assert "3000 x 64" in log and "on cpu" in log and "all default metrics" in log
