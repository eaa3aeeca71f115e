"""The baseline files (results/reference/baselines/<protocol>.json, committed beside the other
reference results): every method's metrics for several seeds and the fingerprint of the
machine that made them; read with a one-line fix for an old format, written (`--update`)
only from finite numbers made on one machine.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.check.machine import run_fingerprint
from harness.check.pinned import same_machine
from harness.core import HarnessError, Protocol, program_name, source_tree
from harness.records import RunResult, write_json_atomic

# The committed baselines, beside the clone's other reference results; an installed harness
# (no clone) looks in ./results/reference/baselines and otherwise needs --baselines DIR
BASELINE_DIR = (source_tree() or Path()) / "results" / "reference" / "baselines"
BASELINE_FORMAT = 2
BASELINE_SEEDS = 20  # default number of seeds `--update` records


def baseline_path(protocol: str, baseline_dir: Path) -> Path:
    """A protocol's baseline file in `baseline_dir`: <protocol>.json."""
    return Path(baseline_dir) / f"{protocol}.json"


def load_baseline(path: Path) -> dict[str, Any]:
    """The baseline file, refused with a one-line fix if it predates the per-seed format."""
    try:
        baseline = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise HarnessError(f"unreadable baseline file {path}: {exc}; restore it from git") from None
    if baseline.get("format") != BASELINE_FORMAT:
        raise HarnessError(
            f"{path} is a format-{baseline.get('format', 1)} baseline (one seed, fixed "
            f"tolerances); this check needs format {BASELINE_FORMAT}: remake it with "
            f"`{program_name()} check --update --reason TEXT`"
        )
    return baseline


def update(
    path: Path, protocol: Protocol, runs: dict[str, list[RunResult]], seeds: list[int],
    reason: str, partial: bool,
) -> list[str]:  # fmt: skip
    """Write the baseline file from the runs; returns the methods left out (failed runs).
    A partial update (some methods) keeps the others, if they were made on this machine."""
    env = next(iter(runs.values()))[0].environment  # the workers' (threads as they ran)
    if env is None:
        raise HarnessError("the check's runs recorded no environment; report this as a bug")
    env_json = env.to_json()
    fingerprint = run_fingerprint(runs)
    old_methods: dict[str, Any] = {}
    if partial and path.exists():
        old = load_baseline(path)
        same = same_machine(fingerprint, old["fingerprint"], protocol)  # or numerics
        if set(old["methods"]) <= set(runs):  # every method it holds is rewritten: none kept
            old["methods"] = {}
        elif not same or (old["seeds"], old["protocol_hash"]) != (seeds, protocol.hash):
            raise HarnessError(
                f"{path} was made on another machine, seeds or protocol; update every method "
                "(leave out --methods) so the whole file comes from one machine"
            )
        old_methods = old["methods"]
    ok = {m: rs for m, rs in runs.items() if all(r.ok for r in rs)}
    _refuse_non_finite(ok)
    write_json_atomic(path, {
        "format": BASELINE_FORMAT,
        "protocol": protocol.name,
        "protocol_hash": protocol.hash,
        "updated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": env.git_commit,
        "reason": reason,
        "environment": {k: env_json[k] for k in ("python", "packages", "hardware")},
        "fingerprint": fingerprint,
        "seeds": seeds,
        "methods": {**old_methods, **{
            m: {"version": rs[0].method.version,
                "metrics": {k: [r.metrics[k] for r in rs] for k in rs[0].metrics or {}}}
            for m, rs in ok.items()}},
    })  # fmt: skip
    return sorted(set(runs) - set(ok))


def _refuse_non_finite(runs: dict[str, list[RunResult]]) -> None:
    """A baseline of NaN or inf would pass any later value, so such a run is never recorded."""
    bad = sorted(f"{m} {k} (seed {r.seed}: {v})" for m, rs in runs.items() for r in rs
                 for k, v in (r.metrics or {}).items()
                 if not isinstance(v, (int, float)) or not math.isfinite(v))  # fmt: skip
    if bad:
        raise HarnessError(
            f"not finite, so not a baseline: {', '.join(bad)}; fix the method, or leave it out "
            "with --methods"
        )
