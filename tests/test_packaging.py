"""The harness installed as a package, not run from the clone: the wheel carries every module
and the shipped protocols, and `dml-harness` lists and runs them from another directory.

The wheel is built from a copy of the sources (a build in the clone would leave build/ and
*.egg-info behind) with this environment's setuptools (requirements-test.txt pins one), and
installed with --no-deps into a fresh virtualenv that sees this environment's packages
through a .pth file: nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("harness", "methods", "protocols", "pyproject.toml", "README.md")

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wheel")]  # one wheel, built once


def _run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=600)  # fmt: skip
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _wheel_name(source: Path) -> str:
    """Where a source file lands in the wheel: protocols/ and methods/ move under harness/."""
    rel = source.relative_to(REPO).as_posix()
    return f"harness/{rel}" if rel.startswith(("protocols/", "methods/")) else rel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", work / "dist", ".", cwd=src)  # fmt: skip
    (built,) = (work / "dist").glob("dml_harness-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel installed; returns its bin/ folder."""
    venv = tmp_path_factory.mktemp("venv")
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=venv)
    python = venv / "bin" / "python"
    purelib = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                   cwd=venv).strip()  # fmt: skip
    here = sysconfig.get_paths()["purelib"]  # this environment's torch, faiss, ...
    Path(purelib, "_harness_test_deps.pth").write_text(here + "\n")
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
         "-q", wheel, cwd=venv)  # fmt: skip
    return venv / "bin"


def _outside_env(tmp: Path) -> dict[str, str]:
    """No PYTHONPATH to the clone, a private data cache: only the installed copy can answer."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["DML_HARNESS_CACHE"] = str(tmp / "cache")
    return env


def test_wheel_carries_every_module_and_protocol(wheel: Path):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(zf.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    sources = [p for d in ("harness", "methods") for p in (REPO / d).rglob("*.py")]
    sources += list((REPO / "protocols").rglob("*.yaml"))
    sources += list((REPO / "harness" / "data" / "manifests").iterdir())
    missing = sorted(_wheel_name(p) for p in sources if _wheel_name(p) not in names)
    assert not missing, f"not in the wheel (add the package to pyproject.toml): {missing}"
    assert "harness/protocols/reference/paper_results.yaml" in names
    assert not any(n.startswith("methods/") for n in names), "a top-level `methods` package"
    assert "dml-harness = harness.cli:main" in entry_points


def test_installed_harness_lists_and_runs_protocols_from_anywhere(installed: Path, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _outside_env(tmp_path)
    where = _run(installed / "python", "-c", "import harness; print(harness.__file__)",
                 cwd=elsewhere, env=env)  # fmt: skip
    assert str(REPO) not in where and "site-packages" in where

    listing = json.loads(_run(installed / "dml-harness", "ls", "--json", cwd=elsewhere, env=env))
    shipped = sorted(p.stem for p in (REPO / "protocols").glob("*.yaml"))
    assert sorted(p["name"] for p in listing["protocols"]) == shipped
    assert {"contrastive", "pddm_quadruplet"} <= {m["name"] for m in listing["methods"]}

    results = tmp_path / "r"
    _run(installed / "dml-harness", "run", "--protocol", "smoke", "--all", "--max-steps", "2",
         "--results-dir", results, "-q", cwd=elsewhere, env=env)  # fmt: skip
    record = json.loads((results / "runs" / "smoke" / "contrastive" / "seed0.json").read_text())
    assert record["status"] == "ok"
    assert "site-packages" in record["protocol"]["path"]  # the packaged copy of smoke.yaml
    assert record["environment"]["git_commit"] == "unknown"  # no clone to ask
    assert record["environment"]["packages"]["dml-harness"]
    assert len(list((results / "runs" / "smoke").glob("*/seed0.json"))) == len(listing["methods"])
    assert (results / "LEADERBOARD.md").is_file()


def test_an_installed_distribution_adds_its_method_through_its_entry_point(
    installed: Path, tmp_path
):
    """docs/own-loss.md's "Ship it as a distribution", as written: its pyproject.toml and
    loss file, installed into the fresh virtualenv (offline: --no-deps --no-index
    --no-build-isolation), then its commands from outside the clone."""
    from tests.walkthrough import commands, files

    page, section = REPO / "docs" / "own-loss.md", "Ship it as a distribution"
    dist = tmp_path / "cosine-margin"
    dist.mkdir()
    for name, text in files(page).items():
        (dist / name).write_text(text)
    assert (dist / "pyproject.toml").is_file() and (dist / "cosine_margin.py").is_file()
    install, *rest = commands(page, section)
    assert install == "pip install ."
    _run(sys.executable, "-m", "pip", "--python", installed / "python", "install", "--no-deps",
         "--no-index", "--no-build-isolation", "-q", ".", cwd=dist)  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _outside_env(tmp_path)
    outputs = []
    for command in rest:
        argv = command.split()
        assert argv[0] == "dml-harness"
        outputs.append(_run(installed / "dml-harness", *argv[1:], cwd=elsewhere, env=env))
    listing = " ".join(outputs[0].split())
    assert "cosine_margin" in listing
    assert "from distribution cosine-margin 0.1.0 (cosine_margin = cosine_margin)" in listing
    record = json.loads((elsewhere / "results/runs/smoke/cosine_margin/seed0.json").read_text())
    assert record["status"] == "ok"
    assert record["method"]["source"] == {
        "distribution": "cosine-margin", "version": "0.1.0",
        "entry_point": "cosine_margin = cosine_margin",
    }  # fmt: skip
    # and tune takes it, as it takes a built-in method (validation classes carved here)
    learning = yaml.safe_load((REPO / "protocols" / "learning.yaml").read_text())
    learning["name"], learning["split"]["validation_fraction"] = "learning_val", 0.25
    (elsewhere / "learning_val.yaml").write_text(yaml.safe_dump(learning))
    _run(installed / "dml-harness", "-q", "tune", "--protocol", "learning_val.yaml", "--method",
         "cosine_margin", "--trials", "2", "--max-steps", "2", cwd=elsewhere, env=env)  # fmt: skip
    assert list((elsewhere / "results/tuning/learning_val").glob("cosine_margin*.yaml"))
