"""The code base stays ruff-clean (lint and format), so CI catches style drift too."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PATHS = ["harness", "methods", "tests"]


def ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(exe).exists():
        pytest.skip("ruff is not installed (pip install -r requirements-test.txt)")
    return subprocess.run([exe, *args, *PATHS], cwd=REPO, capture_output=True, text=True)


def test_ruff_check():
    proc = ruff("check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format():
    proc = ruff("format", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
