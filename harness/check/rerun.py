"""The check's runs: every method of the protocol for every check seed, one torch thread per
worker process (so the core count does not matter), always fresh, in a temporary folder that
is deleted afterwards (kept and named only when the check breaks off); then compared with the
baseline (`check`) or written as the new baseline (`update_baselines`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from harness.check import pinned as pinning
from harness.check.baselines import (
    BASELINE_DIR,
    BASELINE_SEEDS,
    baseline_path,
    load_baseline,
    update,
)
from harness.check.verdict import report
from harness.core import (
    METHODS,
    HarnessError,
    Protocol,
    load_protocol,
    program_name,
    resolve_device,
)
from harness.data import check_data_root
from harness.records import RunResult, read_result, result_path
from harness.sweep import plan, sweep_pinned

log = logging.getLogger(__name__)


def run_protocol(
    protocol: Protocol, methods: list[str], seeds: list[int], results_dir: Path, device: str,
    pinned: bool = False,
) -> dict[str, list[RunResult]]:  # fmt: skip
    """Every method for every seed, one torch thread per worker process (`pinned`: under the
    pinned numerics, harness.core.numerics); returns each method's results, ordered as
    `seeds`."""
    specs = plan(protocol, methods, seeds, device=device, results_dir=str(results_dir))
    workers = 1 if resolve_device(device).type == "cuda" else min(os.cpu_count() or 1, len(specs))
    sweep_pinned(specs, workers=workers, threads=1, pinned_numerics=pinned)
    runs = {
        m: [read_result(result_path(results_dir, protocol.name, m, s)) for s in seeds]
        for m in methods
    }
    return runs


def check(
    protocol_name: str = "regression",
    methods: list[str] | None = None,
    baseline_dir: Path = BASELINE_DIR,
    *,
    device: str = "auto",
    results_dir: Path | None = None,
    mode: str = "auto",
    full: bool = False,
    numerics: str = "auto",
) -> tuple[bool, str]:
    """Rerun the protocol and compare with its baseline file; returns (passed, report). The
    report is short (summary and the rows that did not simply pass) unless `full`. `numerics`:
    auto (pinned where it holds), pinned or native (harness.check.pinned)."""
    names, protocol = _checked(protocol_name, methods)
    path = baseline_path(protocol.name, baseline_dir)
    if not path.exists():
        raise HarnessError(
            f"no baseline file {path}: pass --baselines DIR (a clone's "
            "results/reference/baselines) or create it with "
            f"`{program_name()} check --protocol {protocol.name} --update --reason TEXT`"
        )
    baseline = load_baseline(path)
    seeds = list(protocol.seeds)
    if len(seeds) < 2 and mode != "exact":
        raise HarnessError(
            f"{protocol.path}: the check needs at least 2 seeds for its statistical mode"
        )
    pinned, _ = pinning.pinned_numerics(numerics, device)
    pinning.refuse_other_mode(baseline, path, protocol.name, pinned)
    exact = mode == "exact" or (mode == "auto" and pinning.expect_exact(baseline, pinned, protocol))
    seeds = pinning.check_seeds(seeds, baseline["seeds"], exact)
    with _fresh_runs(results_dir) as runs_dir:
        runs = run_protocol(protocol, names, seeds, runs_dir, device, pinned)
        return report(baseline, protocol, runs, seeds, mode, path, full)


def update_baselines(
    protocol_name: str,
    methods: list[str] | None,
    baseline_dir: Path,
    reason: str,
    *,
    device: str = "auto",
    baseline_seeds: int = BASELINE_SEEDS,
    numerics: str = "auto",
) -> tuple[bool, str]:
    """Remake the baseline file from fresh runs of `baseline_seeds` seeds (0..N-1), saying
    why, in the pinned numerics only; returns (every method recorded, what was written)."""
    if not reason.strip():
        raise HarnessError("--update needs a non-empty --reason saying why the numbers change")
    pinning.refuse_update_unless_pinned(*pinning.pinned_numerics(numerics, device))
    names, protocol = _checked(protocol_name, methods)
    seeds = list(range(baseline_seeds))
    if not set(protocol.seeds) <= set(seeds) or baseline_seeds < 3:
        raise HarnessError(
            f"--baseline-seeds {baseline_seeds} must be at least 3 and cover the protocol's "
            f"check seeds {protocol.seeds}"
        )
    path = baseline_path(protocol.name, baseline_dir)
    with _fresh_runs(None) as runs_dir:
        runs = run_protocol(protocol, names, seeds, runs_dir, device, pinned=True)
        left_out = update(path, protocol, runs, seeds, reason, bool(methods))
    note = f"; failed runs left out: {', '.join(left_out)}" if left_out else ""
    return not left_out, f"baselines for seeds {seeds} written to {path}{note}"


def _checked(protocol_name: str, methods: list[str] | None) -> tuple[list[str], Protocol]:
    """The methods (default: every registered one; a misspelt name is one line, before any
    folder is made) and the parsed protocol, whose data is there (or fetched: --fetch)."""
    names = methods or METHODS.names()
    for name in names:
        METHODS.get(name)
    protocol = load_protocol(protocol_name)
    check_data_root(protocol, None)
    return names, protocol


@contextlib.contextmanager
def _fresh_runs(results_dir: Path | None) -> Iterator[Path]:
    """A folder for the check's runs: always fresh runs (a finished result is never reused:
    the code may have changed); a temporary one is removed afterwards, but kept when anything
    fails, so that no finished run is lost."""
    runs_dir = Path(results_dir or tempfile.mkdtemp(prefix="harness-check-"))
    try:
        yield runs_dir
    except BaseException:
        log.warning("the check's run results are kept in %s", runs_dir)
        raise
    if results_dir is None:
        shutil.rmtree(runs_dir, ignore_errors=True)
