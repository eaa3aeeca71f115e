"""Whether a run is due: a finished result of the same configuration made on this machine is
skipped; otherwise the run's lock is taken and a different earlier result archived, never
lost.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path

from harness.core import METHODS, safe_folder
from harness.records import (
    RunResult,
    archive,
    embeddings_dir,
    machine_id,
    model_path,
    read_result,
    result_path,
    run_lock,
)
from harness.sweep.identity import refuse_to_replace, weights_sha
from harness.sweep.record import new_result
from harness.sweep.spec import RunSpec

log = logging.getLogger(__name__)


def _same_run(
    old: RunResult, new: RunResult, any_machine: bool = False, embeddings_of: Path | None = None
) -> bool:
    """A finished result of this very configuration, made on this machine (or, for a sweep on
    a cluster, on any of its machines): skip the run. (A clone on another machine reruns and
    archives what it found: its numbers are its own.) `embeddings_of`: the result's path when
    the run must save its embeddings (`--save-embeddings`): a result without them is rerun."""
    return not _differences(old, new, any_machine, embeddings_of)


def _differences(
    old: RunResult, new: RunResult, any_machine: bool = False, embeddings_of: Path | None = None
) -> list[str]:
    """Why `old` is not a finished result of the run `new` (empty: it is)."""
    if not old.ok:  # a failed or interrupted run may lack what the checks below read
        return [f"a {old.status} run"]
    checks = [
        (not any_machine and old.hardware.machine_id != machine_id(), "made on another machine"),
        (old.protocol.hash != new.protocol.hash, "another protocol hash"),
        (old.method.version != new.method.version, "another method version"),
        (old.method.hyperparameters != new.method.hyperparameters, "other hyperparameters"),
        (old.method.source_identity() != new.method.source_identity(), "another method source"),
        (old.training.max_steps != new.training.max_steps, "another step cap"),
        (weights_sha(old) != weights_sha(new), "another weights file"),
        # the embeddings exist only while the model does: rerun it (same numbers on this machine)
        (embeddings_of is not None and not _saved_embeddings(old, embeddings_of),
         "no saved embeddings, and --save-embeddings asks for them"),
    ]  # fmt: skip
    return [why for differs, why in checks if differs]


def _saved_embeddings(old: RunResult, path: Path) -> bool:
    """Whether the result at `path` recorded saved embeddings and their folder is there."""
    return bool(old.embeddings) and embeddings_dir(path).is_dir()


def _say_no_model(spec: RunSpec, path: Path) -> None:
    """`--save-model` never reruns a finished run for its model (its numbers would not
    change; its cost would): say how to get one."""
    if spec.save_model and not model_path(path).is_file():
        log.warning("%s seed %d finished earlier without a saved model; rerun it with "
                    "--save-model --force to keep its model", spec.method, spec.seed)  # fmt: skip


def checkpoint_path(results_dir: Path, protocol: str, method: str, seed: int) -> Path:
    """checkpoints/<protocol>/<method>/seed<k>.pt under results_dir (names checked as for
    result_path: never a folder outside results_dir)."""
    protocol, method = safe_folder(protocol, "protocol"), safe_folder(method, "method")
    return results_dir / "checkpoints" / protocol / method / f"seed{int(seed)}.pt"


def decide(
    spec: RunSpec, locks: ExitStack, any_machine: bool = False
) -> tuple[str | None, Path, RunResult]:
    """Whether to run a resolved spec now, by the skip-if-finished rule: (None, path, record)
    with the run's lock held in `locks` and a different earlier result archived, or
    ("skipped" | "running_elsewhere", path, record). `any_machine`: a result made on another
    machine counts as finished (a cluster's driver)."""
    path = result_path(Path(spec.results_dir), spec.parsed_protocol.name, spec.run_name,
                       spec.seed)  # fmt: skip
    record = new_result(spec, METHODS.get(spec.method))
    wants = path if spec.save_embeddings else None
    if (
        path.exists()
        and not spec.force
        and _same_run(read_result(path), record, any_machine, wants)
    ):
        _say_no_model(spec, path)
        return "skipped", path, record
    if not locks.enter_context(run_lock(path)):
        log.warning("%s is being run by another process; skipping it here", path)
        return "running_elsewhere", path, record
    if path.exists():
        old = read_result(path)
        if not spec.force and _same_run(old, record, any_machine, wants):
            return "skipped", path, record  # finished by another process meanwhile
        if not spec.force:  # plan checked before the sweep; another process may have written
            refuse_to_replace(old, spec.max_steps, spec.parsed_protocol.hash, path)
        why = "--force" if spec.force else ", ".join(_differences(old, record, any_machine, wants))
        log.info("archived the previous result (%s) to %s", why,
                 archive(path, Path(spec.results_dir)))  # fmt: skip
    return None, path, record
