"""Where a number came from: the code version (git commit, or the installed package's
version), the package versions, the hardware, and this machine's id, so that results made
elsewhere are never mistaken for this machine's own finished runs.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import uuid
from pathlib import Path
from typing import Any

import torch

from harness.core import default_cache_dir, source_tree
from harness.records.fingerprint import describe, machine_fingerprint, package_versions
from harness.records.results import RunResult

PACKAGES = (
    "dml-harness",  # only when installed as a package (a clone records its git commit)
    "torch",
    "torchvision",
    "numpy",
    "pytorch-metric-learning",
    "faiss-cpu",
    "faiss-gpu-cu12",
    "matplotlib",
    "pandas",
    "pyyaml",
)


def _git(*args: str) -> str:
    """git's answer about the clone the harness runs from; empty when installed as a package
    (a virtualenv inside some other clone must not record that clone's commit)."""
    root = source_tree()
    if root is None:
        return ""
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def machine_id() -> str:
    """A random id made once per machine: results made elsewhere, e.g. committed ones, are
    not mistaken for this machine's own finished runs. Kept in the user's configuration
    ($XDG_CONFIG_HOME or ~/.config, dml-harness/machine-id), not in the data cache, which a
    user may clear or move without this machine becoming another one."""

    legacy = default_cache_dir() / "machine-id"  # where it was kept before
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    path = config / "dml-harness" / "machine-id"
    if path.exists():
        return path.read_text().strip()
    made = legacy.read_text().strip() if legacy.exists() else uuid.uuid4().hex
    for place in (path, legacy):  # an unwritable home: the cache, as before
        try:
            place.parent.mkdir(parents=True, exist_ok=True)
            tmp = place.with_name(f".machine-id.{os.getpid()}")
            tmp.write_text(made + "\n")
            os.replace(tmp, place)
            return made
        except OSError:
            continue
    return made


def environment(device: torch.device) -> dict[str, Any]:
    """Where a number came from: code version, packages, hardware, and the machine
    fingerprint that says which other machines reproduce it bit for bit."""
    packages = package_versions(PACKAGES)
    dirty = _git("status", "--porcelain", "--", "harness", "methods", "protocols")
    hardware = {
        "device": str(device),
        "machine_id": machine_id(),
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        hardware["gpu"] = torch.cuda.get_device_name(device)
    return {
        "fingerprint": machine_fingerprint(device),
        "git_commit": _git("rev-parse", "HEAD") or "unknown",
        "git_dirty": bool(dirty),
        "python": platform.python_version(),
        "packages": packages,
        "hardware": hardware,
    }


def _json(value: Any) -> str:
    """A value as canonical JSON, one line."""
    return json.dumps(value, sort_keys=True, default=str)


def provenance_fields(r: RunResult, result_file: str) -> dict[str, str]:
    """Where a run's numbers came from, field by field in words (the HTML report's provenance
    table): its result file, status, protocol, method and configuration, the seeds of its
    sweep, training, data, code version, packages, hardware and machine, and when it ran."""
    training = r.training
    capped = f", capped at {training.max_steps} steps" if training.max_steps is not None else ""
    dataset = (
        r.dataset.name + (f" ({r.dataset.source})" if r.dataset.source else "")
        if r.dataset
        else "-"
    )
    fields = {
        "result file": result_file,
        "status": r.status + (f" ({r.failure})" if r.failure else ""),
        "protocol": f"{r.protocol.name} v{r.protocol.version}, hash {r.protocol.hash}",
        "method": f"{r.method.name} v{r.method.version}"
        + (f" ({r.method.paper})" if r.method.paper else ""),
        "hyperparameters": _json(r.method.hyperparameters),
        "tuned by": _json(r.tuning) if r.tuning else "-",
        "method source": _json(r.method.source) if r.method.source else "built in",
        "seeds of the sweep": ", ".join(map(str, r.sweep_seeds or [])) or "-",
        "training": f"{training.steps} steps, {training.epochs} epochs{capped}",
        "dataset": dataset,
        "split": str((r.split or {}).get("hash", "-")),
        "harness version": r.harness_version or "-",
    }
    env = r.environment
    if env is None:
        fields["environment"] = "not recorded"
    else:
        hardware = env.hardware.to_json()
        fields.update({
            "git commit": (env.git_commit or "?")
            + (" (dirty: uncommitted changes)" if env.git_dirty else ""),
            "python": env.python or "-",
            "packages": ", ".join(f"{k} {v}" for k, v in sorted((env.packages or {}).items())),
            "hardware": ", ".join(f"{k}: {v}" for k, v in hardware.items() if v is not None),
            "machine": describe(env.fingerprint),
        })  # fmt: skip
    fields["started"] = r.started_at or "-"
    fields["finished"] = r.finished_at or "-"
    return fields
