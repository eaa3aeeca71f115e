"""Where a number came from: the code version (git commit, or the installed package's
version), the package versions, the hardware, and this machine's id, so that results made
elsewhere are never mistaken for this machine's own finished runs.
"""

from __future__ import annotations

import os
import platform
import subprocess
import uuid
from pathlib import Path
from typing import Any

import torch

from harness.core import default_cache_dir, source_tree
from harness.records.fingerprint import machine_fingerprint, package_versions

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
