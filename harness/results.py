"""Run results: one JSON file per run, written atomically, with full provenance."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

import torch

from harness.errors import HarnessError
from harness.fingerprint import machine_fingerprint, package_versions

RESULT_SCHEMA = 1
REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
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


def result_path(results_dir: Path, protocol: str, method: str, seed: int) -> Path:
    return Path(results_dir) / "runs" / protocol / method / f"seed{seed}.json"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write to a unique temporary file in the same folder, then rename: readers see the old
    file or the new one, never half of one, and two writers never share a temporary file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=False)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_result(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HarnessError(f"unreadable result file {path}: {exc}; delete or restore it") from None
    if not isinstance(data, dict) or data.get("schema") != RESULT_SCHEMA:
        raise HarnessError(
            f"result file {path} is not a schema-{RESULT_SCHEMA} run result; delete or move it"
        )
    return data


def load_results(results_dir: Path) -> list[dict[str, Any]]:
    """Every run result under results_dir/runs, sorted by path."""
    runs = Path(results_dir) / "runs"
    return [read_result(p) for p in sorted(runs.glob("*/*/seed*.json"))]


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def machine_id() -> str:
    """A random id made once per machine (kept in the data cache): results made elsewhere,
    e.g. committed ones, are not mistaken for this machine's own finished runs."""
    from harness.data.base import default_cache_dir

    path = default_cache_dir() / "machine-id"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".machine-id.{os.getpid()}")
        tmp.write_text(uuid.uuid4().hex + "\n")
        os.replace(tmp, path)
    return path.read_text().strip()


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
