"""Sweeps: lists of independent, serialisable run specifications, each producing one result.

`spec` plans them (the protocol parsed once, hyperparameters resolved, `preflight`'s checks
before any run), `policy` decides whether a run is due (skip a finished one, lock, archive a
different one), `execute` trains, evaluates and writes one run (`record` builds its result),
`engines` runs a sweep here (one after another, or in pinned worker processes) and `ray` as
Ray tasks; `tuned` reads the configurations `harness tune` stored; `applicable` says which
methods cannot run on a protocol's data at all; `identity` names a run's weights file and
checkpoint.
"""

from harness.sweep.applicable import not_applicable_on, why_not_applicable
from harness.sweep.engines import ENGINES, sweep_pinned
from harness.sweep.identity import checkpoint_identity, hashed_weights, refuse_to_replace
from harness.sweep.policy import checkpoint_path, decide
from harness.sweep.preflight import check_backbone, check_methods, check_protocol
from harness.sweep.ray import TASK_RETRIES, import_ray, run_task, start_ray, sweep_ray
from harness.sweep.record import new_result, record_outcome
from harness.sweep.runner import execute, execute_run, sweep
from harness.sweep.spec import TUNED_SUFFIX, RunSpec, plan, resolve, resolve_all, run_context
from harness.sweep.tuned import load_overlay, overlay_path, read_tuning_file, tuning_dir

__all__ = [
    "ENGINES",
    "TASK_RETRIES",
    "TUNED_SUFFIX",
    "RunSpec",
    "check_backbone",
    "check_methods",
    "check_protocol",
    "checkpoint_identity",
    "checkpoint_path",
    "decide",
    "execute",
    "execute_run",
    "run_context",
    "hashed_weights",
    "import_ray",
    "load_overlay",
    "new_result",
    "not_applicable_on",
    "overlay_path",
    "plan",
    "record_outcome",
    "refuse_to_replace",
    "resolve",
    "resolve_all",
    "run_task",
    "start_ray",
    "sweep",
    "sweep_pinned",
    "sweep_ray",
    "read_tuning_file",
    "tuning_dir",
    "why_not_applicable",
]
