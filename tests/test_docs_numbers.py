"""Numbers the manual quotes from the committed results agree with the results themselves, and
the pages that quote one fact quote it alike, so a regenerated result cannot leave them stale.
(The README's verdict sentences are checked where they are computed: test_glance, test_bayes,
test_reference_results.)"""

from __future__ import annotations

import json
import statistics
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNS = REPO / "results" / "reference" / "runs"


def _text(path: str) -> str:
    return " ".join((REPO / path).read_text(encoding="utf-8").split())


def _runs(protocol: str) -> list[dict]:
    """The protocol's paper-default runs (its `+tuned` runs are another sweep)."""
    return [json.loads(p.read_text()) for p in sorted((RUNS / protocol).glob("*/seed*.json"))
            if not p.parent.name.endswith("+tuned")]  # fmt: skip


def _seconds(run: dict) -> float:
    return (datetime.fromisoformat(run["finished_at"])
            - datetime.fromisoformat(run["started_at"])).total_seconds()  # fmt: skip


def _vendors(runs: list[dict]) -> set[str]:
    return {((r.get("environment") or {}).get("fingerprint") or {}).get("cpu_vendor") for r in runs}


def test_the_run_times_and_machines_own_loss_quotes_are_the_committed_runs():
    text = _text("docs/own-loss.md")
    default = _runs("default")
    seconds = [_seconds(r) for r in default]
    assert (f"a median of {statistics.median(seconds):.0f} s a run, {max(seconds):.0f} s at most"
            in text)  # fmt: skip
    assert (
        _vendors(default) == {"GenuineIntel"} and "the Intel Xeon that made the committed" in text
    )
    photos = {p: _runs(p) for p in ("cars", "groceries", "birds")}
    assert all(len(runs) == 145 for runs in photos.values())  # 29 methods x 5 seeds
    median = {p: statistics.median(_seconds(r) for r in runs) for p, runs in photos.items()}
    assert (f"a median of {median['cars']:.0f} s on 2 CPU cores for cars, "
            f"{median['groceries']:.0f} s for groceries and {median['birds']:.0f} s for birds"
            in text)  # fmt: skip
    total = [sum(_seconds(r) for r in photos[p]) / 60 for p in ("cars", "groceries", "birds")]
    assert f"runs sum to {total[0]:.0f}, {total[1]:.0f} and {total[2]:.0f} minutes" in text
    assert set().union(*(_vendors(r) for r in photos.values())) == {"AuthenticAMD"}
    assert "the committed photo runs were made on an AMD EPYC" in text


def test_the_test_command_is_the_same_in_the_readme_the_guide_and_ci():
    def command(path: str) -> str:
        return next(line for line in (REPO / path).read_text().splitlines()
                    if line.startswith("python3 -m venv .venv") and "pytest" in line)  # fmt: skip

    assert command("README.md") == command("docs/getting-started.md") == command(".ci/run")
