"""When two runs are the same run, and when a finished result may be replaced.

The runner skips a run whose result already exists for the same configuration, resumes a
run from a checkpoint only of this very configuration, and archives a result only when the
new run is meant to replace it. A weights file counts by its content (sha256), not its name.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.backbones import weights_record
from harness.core import HarnessError
from harness.records import RunResult

_WEIGHTS_SHA: dict[tuple[str, int, int], dict[str, str]] = {}


def hashed_weights(path: str) -> dict[str, str]:
    """The weights file's record (path and sha256), hashed once per version of the file:
    a sweep asks for it once per run, and a large file takes a while to hash."""
    try:
        stat = Path(path).stat()
    except OSError:
        return weights_record(path)  # its one-line error
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _WEIGHTS_SHA:
        _WEIGHTS_SHA[key] = weights_record(path)
    return dict(_WEIGHTS_SHA[key])


def weights_sha(record: RunResult) -> str | None:
    """The sha256 of the ImageNet weights file a run starts from (None: no file)."""
    return (record.backbone_weights or {}).get("sha256")


def checkpoint_identity(
    record: RunResult, seed: int, max_steps: int | None, decoder: str = "pil"
) -> str:
    """What a checkpoint must match to be resumed: this very run, from this weights file, fed
    by this decoder (torch's pixels differ from PIL's by rounding). The weights and a
    non-default decoder are left out when absent, so older checkpoints still resume."""
    parts = [record.protocol.hash, record.method.to_json(), seed, max_steps]
    sha = weights_sha(record)
    parts += [sha] if sha else []
    parts += [{"decoder": decoder}] if decoder != "pil" else []
    return json.dumps(parts, sort_keys=True)


def refuse_to_replace(
    old: RunResult, max_steps: int | None, protocol_hash: str, path: Path
) -> None:
    """Raise unless a run of this step cap and protocol hash may archive and replace `old`.

    Only a run of the same budget or a larger one under the same protocol hash replaces a
    finished result: a smoke run (--max-steps) or another protocol (an edited file,
    --precision) must not push a full result into the archive by accident. A failed result
    is always retried."""
    if not old.ok or old.training is None:
        return
    cap = old.training.max_steps
    why = []
    if max_steps is not None and (cap is None or max_steps < cap):
        why.append(f"step cap {cap or 'none'} -> {max_steps}")
    if old.protocol.hash != protocol_hash:
        why.append(f"protocol hash {old.protocol.hash} -> {protocol_hash}")
    if why:
        raise HarnessError(
            f"{path} holds a finished run of another configuration ({', '.join(why)}); "
            "give this run its own --results-dir DIR (e.g. for smoke runs), or pass --force to "
            "archive that result and replace it"
        )
