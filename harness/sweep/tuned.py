"""The tuned configurations `harness tune` stores (results/tuning/<protocol>/<method>.yaml),
read here by `run --tuned` and by the leaderboard's tuning section (`read_tuning_file`):
stored state lives beside its readers, not its writer. A results
folder without one falls back to its committed reference's (results/reference/tuning/...),
so a fresh clone's `run --tuned` trains with the committed study's configuration.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml

from harness.core import (
    METHODS,
    HarnessError,
    Protocol,
    plugin_option,
    program_name,
    safe_folder,
)
from harness.records import reference_dir

log = logging.getLogger(__name__)


def tuning_dir(results_dir: str | Path, protocol: str) -> Path:
    """tuning/<protocol>/ under results_dir (the name checked: never a folder outside it)."""
    return Path(results_dir) / "tuning" / safe_folder(protocol, "protocol")


def overlay_path(
    results_dir: str | Path, protocol: str, method: str, max_steps: int | None = None
) -> Path:
    """Where a study's best configuration goes; a capped study (--max-steps) has its own
    file, so a smoke study never replaces the full one."""
    capped = f".max_steps{max_steps}" if max_steps else ""
    return tuning_dir(results_dir, protocol) / f"{safe_folder(method, 'method')}{capped}.yaml"


def load_overlay(
    results_dir: str | Path, protocol: Protocol, method: str, max_steps: int | None = None
) -> dict[str, Any]:
    """The tuned configuration of `method` under `protocol`; a clear error when there is none,
    it was tuned under another version of the protocol or method, or its trials were capped
    (--max-steps) and this run (`max_steps`) is not. A capped run takes the study capped
    alike, else the full study, else the capped study of the most steps. Without any in
    `results_dir`, the same search in its committed reference (results/reference)."""
    path = _find(results_dir, protocol.name, method, max_steps)
    reference = reference_dir(results_dir)
    if not path.is_file() and reference is not None:
        committed = _find(reference, protocol.name, method, max_steps)
        if committed.is_file():
            log.info("no tuned configuration of %s in %s: using the committed reference's %s",
                     method, tuning_dir(results_dir, protocol.name), committed)  # fmt: skip
            path = committed
    if not path.is_file():
        raise HarnessError(f"no tuned configuration for {method} under {protocol.name} ({path}); "
                           f"run `{program_name()} tune --protocol {protocol.argument} --method "
                           f"{method}{plugin_option(method)}` first")  # fmt: skip
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if data.get("protocol_hash") != protocol.hash:
        raise HarnessError(f"{path} was tuned under protocol hash {data.get('protocol_hash')}, "
                           f"not {protocol.hash}; tune again")  # fmt: skip
    if data.get("method_version") != METHODS.get(method).version:
        raise HarnessError(f"{path} was tuned for {method} v{data.get('method_version')}; "
                           f"it is now v{METHODS.get(method).version}: tune again")  # fmt: skip
    capped = (data.get("study") or {}).get("max_steps")
    if capped and not max_steps:
        raise HarnessError(f"{path} comes from trials capped at --max-steps {capped} (a smoke "
                           "study) and this run is not capped: tune again without --max-steps")  # fmt: skip
    data["path"] = str(path)
    return data


def _find(results_dir: str | Path, protocol: str, method: str, max_steps: int | None) -> Path:
    """The overlay file a run of this cap takes from `results_dir` (see load_overlay); the
    full study's path, not necessarily existing, when there is none."""
    path = overlay_path(results_dir, protocol, method)
    if max_steps:
        capped = sorted(tuning_dir(results_dir, protocol).glob(f"{method}.max_steps*.yaml"),
                        key=lambda p: int(p.stem.rsplit("max_steps", 1)[1]))  # fmt: skip
        same = overlay_path(results_dir, protocol, method, max_steps)
        if same.is_file():
            path = same
        elif not path.is_file() and capped:
            path = capped[-1]
    return path


def read_tuning_file(path: Path) -> dict[str, Any]:
    """A tuning file as the leaderboard's tuning section reads it (its study's numbers and the
    hyperparameters), or a one-line error naming the file."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        problem = " ".join(str(exc).split())
    else:
        problem = _tuning_problem(data)
    if problem:
        raise HarnessError(
            f"tuning file {path} is unreadable ({problem}); rerun `{program_name()} tune` "
            "for it, or move it out of the results folder"
        )
    return data


def _tuning_problem(data: Any) -> str | None:
    """What in a tuning file's YAML does not have the shape the tuning section reads."""
    if not isinstance(data, dict):
        return "not a mapping"
    for key in ("study", "hyperparameters"):
        if not isinstance(data.get(key) or {}, dict):
            return f"{key}: not a mapping"
    study = data.get("study") or {}
    for key in ("best_value", "paper_default_value"):
        value = study.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"study.{key}: not a number"
    if not isinstance(study.get("searched") or {}, (dict, list)):
        return "study.searched: not a mapping or list"
    return None
