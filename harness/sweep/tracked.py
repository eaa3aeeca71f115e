"""A run's tracker (`run --tracker`): one tracker run per harness run, named by the run's
identity (the checkpoint's), so that a resumed run goes on in the tracker run it started.
The tracker options are not part of the identity: a tracked run and an untracked one are
the same run."""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.core import RunContext
from harness.records import RunResult, Tracker, open_tracker
from harness.sweep.identity import checkpoint_identity
from harness.sweep.spec import RunSpec


def identity_key(record: RunResult, spec: RunSpec) -> str:
    """A short hash of what makes two runs the same run (checkpoint_identity)."""
    identity = checkpoint_identity(record, spec.seed, spec.max_steps, spec.decoder)
    return hashlib.sha256(identity.encode()).hexdigest()[:10]


def tracker_params(spec: RunSpec, ctx: RunContext) -> dict[str, Any]:
    """A run's parameters as a tracker shows them: protocol, method and its
    hyperparameters (hp.<name>), seed, device, precision, step cap."""
    protocol = ctx.protocol
    params: dict[str, Any] = {
        "protocol": protocol.name, "protocol_version": protocol.version,
        "protocol_hash": protocol.hash, "method": spec.method, "run_name": spec.run_name,
        "seed": spec.seed, "device": str(ctx.device), "precision": protocol.precision,
        "max_steps": spec.max_steps,
    }  # fmt: skip
    params.update({f"hp.{k}": v for k, v in (spec.hyperparameters or {}).items()})
    return params


@contextmanager
def tracked(spec: RunSpec, ctx: RunContext, record: RunResult) -> Iterator[Tracker]:
    """The run's tracker (a null one when the run is untracked or on a rank that does not
    write), closed as FINISHED, FAILED (the record says so) or KILLED (interrupted, or a
    crash: the same command resumes it)."""
    tracker = open_tracker(spec.tracking, ctx.dist.is_main)
    name = f"{ctx.protocol.name}/{spec.run_name}/seed{spec.seed}"
    tracker.start(name, identity_key(record, spec), tracker_params(spec, ctx))
    status = "KILLED"
    try:
        yield tracker
        status = {"ok": "FINISHED", "not_applicable": "FINISHED"}.get(record.status, "FAILED")
    finally:
        tracker.close(status)


def log_result(tracker: Tracker, record: RunResult, path: Path) -> None:
    """The finished run's metrics and its result JSON (as written, or as handed to the Ray
    driver) into the tracker."""
    if not tracker.config.active:
        return
    with tempfile.TemporaryDirectory(prefix="dml-tracking-") as folder:
        copy = Path(folder) / path.name
        copy.write_text(json.dumps(record.to_json(), indent=2), encoding="utf-8")
        steps = record.training.steps if record.training else 0
        metrics = {f"test/{k}": v for k, v in (record.metrics or {}).items()}
        tracker.log_final(steps, metrics, [copy])
