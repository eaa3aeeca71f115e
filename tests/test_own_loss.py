"""docs/own-loss.md, "Benchmark your own loss", run exactly as written: the loss file the page
shows, `ls --plugin`, a run against contrastive on the default protocol (3 seeds each), the
leaderboard rows, `compare`. Its distribution part runs in tests/test_packaging.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.records import machine_id
from tests.walkthrough import REPO, commands, run_page

PAGE = REPO / "docs" / "own-loss.md"
SECTION = "Run it against the baselines"

pytestmark = pytest.mark.slow  # six runs of the default protocol: about a minute


def test_the_walkthrough_runs_as_written(tmp_path: Path):
    assert [c.split()[:4] for c in commands(PAGE, SECTION)] == [
        ["python", "-m", "harness", "ls"], ["python", "-m", "harness", "run"],
        ["grep", "-E", '"^\\|', "(cosine_margin|contrastive)"],
        ["python", "-m", "harness", "compare"],
    ]  # fmt: skip
    ls, run, rows, compare = run_page(PAGE, tmp_path, section=SECTION)
    for step in (ls, run, rows, compare):
        assert step.returncode == 0, f"{step.args}\n{step.stdout[-2000:]}\n{step.stderr[-2000:]}"
    plugin = (tmp_path / "cosine_margin.py").resolve()
    assert f"from plugin file {plugin}" in " ".join(ls.stdout.split())
    assert "runs: ok 6" in run.stdout
    record = json.loads((tmp_path / "results/runs/default/cosine_margin/seed2.json").read_text())
    assert record["method"]["source"]["path"] == str(plugin)
    assert len(rows.stdout.splitlines()) == 2  # one leaderboard row per method, 3 seeds each
    assert all(row.split("|")[2].strip() == "3" for row in rows.stdout.splitlines())
    assert "cosine_margin − contrastive: difference" in compare.stdout
    reference = REPO / "results/reference/runs/default/contrastive/seed0.json"
    if json.loads(reference.read_text())["environment"]["hardware"]["machine_id"] == machine_id():
        # the baselines' processor type: the numbers the page quotes, bit for bit
        page = PAGE.read_text()
        for row in rows.stdout.splitlines():
            assert "|".join(row.split("|")[:5]) in page
        assert compare.stdout.strip().splitlines()[-1].strip() in page
