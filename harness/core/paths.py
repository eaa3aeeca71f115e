"""Where the harness's files are: the ones it ships, the data cache, the clone it runs from.

The shipped protocols and the published reference numbers live in the clone's top-level
`protocols/` folder. A wheel carries the same files as package data in `harness/protocols/`
(pyproject.toml's package-dir maps one onto the other), so an installed harness finds them
through importlib.resources from any working directory, with no clone beside it.
"""

from __future__ import annotations

import hashlib
import os
from importlib import resources
from pathlib import Path

_CLONE = Path(__file__).resolve().parent.parent.parent


def _protocol_dir() -> Path:
    installed = resources.files("harness") / "protocols"  # a wheel's package data
    if installed.is_dir():
        return Path(str(installed))
    return _CLONE / "protocols"


PROTOCOL_DIR = _protocol_dir()
REFERENCE_FILE = PROTOCOL_DIR / "reference" / "paper_results.yaml"


def source_tree() -> Path | None:
    """The clone the harness runs from, or None when it runs as an installed package (then
    there is no git history to record and no committed baselines beside it)."""
    if (_CLONE / "pyproject.toml").is_file() and (_CLONE / "protocols").is_dir():
        return _CLONE
    return None


def default_cache_dir() -> Path:
    """Where generated or converted data is cached: $DML_HARNESS_CACHE or ~/.cache/dml-harness."""
    return Path(os.environ.get("DML_HARNESS_CACHE", Path.home() / ".cache" / "dml-harness"))


def default_data_dir() -> Path:
    """Where `data fetch` puts datasets by default: $DML_HARNESS_DATA, else
    $XDG_DATA_HOME/dml-harness, else ~/.local/share/dml-harness (one folder per dataset)."""
    if os.environ.get("DML_HARNESS_DATA"):
        return Path(os.environ["DML_HARNESS_DATA"]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "dml-harness"


def file_sha256(path: Path | str) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks (weights files, archives)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
