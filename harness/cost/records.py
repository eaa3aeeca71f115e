"""The cost file (results/cost/<protocol>.json: reading, writing) and its markdown: the
per-method table, the harness-overhead line and the leaderboard's "Cost" section."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.core import HarnessError, program_name
from harness.cost.consistency import consistency
from harness.records import archive, run_lock, write_json_atomic

COST_SCHEMA = 1

log = logging.getLogger(__name__)


def cost_path(results_dir: Path, protocol: str) -> Path:
    return Path(results_dir) / "cost" / f"{protocol}.json"


def devices_path(results_dir: Path, protocol: str) -> Path:
    """Where `cost --devices` writes its scaling across devices (beside, not among, the
    per-method cost files)."""
    return Path(results_dir) / "cost" / "devices" / f"{protocol}.json"


def figure_path(results_dir: Path, protocol: str) -> Path:
    return Path(results_dir) / "figures" / f"cost_{protocol}.png"


def replace_record(path: Path, record: dict[str, Any], results_dir: Path, why: str = "") -> Path:
    """Write a cost record to `path`; a file already there is moved under
    <results_dir>/archive/ first (the same helper as a replaced run result's), with one log
    line saying where it went and why: a record is never lost silently."""

    if path.is_file():
        moved = archive(path, Path(results_dir))
        log.info("archived the previous %s to %s%s", path, moved, f" ({why})" if why else "")
    write_json_atomic(path, record)
    return path


LOCK_WAIT_SECONDS = 600.0  # merging and writing take well under a second


def save_cost(
    record: dict[str, Any], results_dir: Path, draw: Callable[[dict[str, Any]], Path]
) -> tuple[dict[str, Any], Path, Path]:
    """Merge `record` into its cost file (merge_cost), draw its figure and write it, holding
    the file's lock: two `cost` processes of one protocol take turns, so neither merges a
    file the other is replacing. A lock held past LOCK_WAIT_SECONDS (a hung process) does
    not lose the measurement: it is written beside the file, and the log says where.
    Returns (what was written, its path, the figure's path)."""
    import time

    path = cost_path(results_dir, record["protocol"]["name"])
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while True:
        with run_lock(path) as held:
            if held:
                written = merge_cost(record, results_dir)
                figure = draw(written)
                written["figure"] = str(figure.relative_to(results_dir))
                return written, write_cost(written, results_dir), figure
        if time.monotonic() > deadline:
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            beside = path.with_name(f"{path.stem}.unmerged-{stamp}.json")
            write_json_atomic(beside, record)
            log.warning("%s stayed locked by another process for %.0f s: this measurement is "
                        "in %s (merge it by rerunning, or move it into place)", path,
                        LOCK_WAIT_SECONDS, beside)  # fmt: skip
            return record, beside, draw(record)
        time.sleep(0.2)


def write_cost(record: dict[str, Any], results_dir: Path) -> Path:
    """Write results/cost/<protocol>.json. The file there is replaced in place only when
    `record` holds every method row of it (`merge_cost` made it so) and was measured
    comparably (`incomparable`); otherwise it is archived first."""

    path = cost_path(results_dir, record["protocol"]["name"])
    why = _not_held(path, record)
    if why is None:
        write_json_atomic(path, record)
        return path
    return replace_record(path, record, results_dir, why)


def _not_held(path: Path, record: dict[str, Any]) -> str | None:
    """Why writing `record` over the cost file at `path` would lose some of it; None when
    there is no file or `record` holds all of it, measured comparably."""
    if not path.is_file():
        return None
    try:
        old = read_cost(path)
    except HarnessError as exc:
        return f"unreadable: {exc}"
    new = {e["method"] for e in record["methods"]}
    missing = sorted(e["method"] for e in old["methods"] if e["method"] not in new)
    why = incomparable(old, record)
    if not why and missing:
        why = f"not re-measured: {', '.join(missing)}"
    return why or None


# What must agree between two cost records for their rows to share one table: the protocol
# (by hash), every measurement setting (batch sizes, repeats, throughput steps, ...), and the
# machine, since times from another machine, device, thread count or library build (the
# fingerprint's id) are not comparable.
_HARDWARE = ("machine_id", "device", "gpu", "cpu_count", "torch_threads")


def incomparable(old: dict[str, Any], new: dict[str, Any]) -> str:
    """Why the rows of cost record `old` cannot sit beside `new`'s ('' when they can)."""
    if old["protocol"].get("hash") != new["protocol"].get("hash"):
        return f"protocol hash {old['protocol'].get('hash')} -> {new['protocol'].get('hash')}"
    keys = sorted(set(old["settings"]) | set(new["settings"]))
    changed = [k for k in keys if old["settings"].get(k) != new["settings"].get(k)]
    if changed:
        return f"settings differ: {', '.join(changed)}"
    env_old, env_new = old.get("environment") or {}, new.get("environment") or {}
    hw_old, hw_new = env_old.get("hardware") or {}, env_new.get("hardware") or {}
    changed = [k for k in _HARDWARE if hw_old.get(k) != hw_new.get(k)]
    if (env_old.get("fingerprint") or {}).get("id") != (env_new.get("fingerprint") or {}).get("id"):
        changed.append("fingerprint")
    return f"measured on other hardware: {', '.join(changed)}" if changed else ""


def provenance(record: dict[str, Any]) -> dict[str, Any]:
    """When and from which commit a record was measured (its top level): what each method
    row and the overhead carry as `measured` once records are merged."""
    env = record.get("environment") or {}
    return {"created_at": record.get("created_at"), "git_commit": env.get("git_commit"),
            "git_dirty": env.get("git_dirty")}  # fmt: skip


def _stamped(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with `measured` on every method row and the overhead that lack one."""
    when = provenance(record)
    methods = [e if "measured" in e else {**e, "measured": when} for e in record["methods"]]
    overhead = record.get("overhead")
    if overhead and "measured" not in overhead:
        overhead = {**overhead, "measured": when}
    return {**record, "methods": methods, "overhead": overhead}


def merge_cost(record: dict[str, Any], results_dir: Path) -> dict[str, Any]:
    """What `cost` writes: `record`, with the other methods' rows of the file already at
    results/cost/<protocol>.json kept when that file was measured comparably (see
    `incomparable`): re-measuring some methods then updates their rows and leaves the
    others. Every row (and the overhead) says in `measured` when and from which commit it
    came; the top level (created_at, environment, seconds) describes the latest measurement.
    The overhead is the new one, else the file's; the consistency check covers the merged
    table's rows. Otherwise `record` alone (write_cost then archives the file)."""
    record = _stamped(record)
    path = cost_path(results_dir, record["protocol"]["name"])
    try:
        old = read_cost(path) if path.is_file() else None
    except HarnessError:
        return record
    if old is None or incomparable(old, record):
        return record
    old = _stamped(old)
    fresh = {e["method"]: e for e in record["methods"]}
    kept = [e["method"] for e in old["methods"] if e["method"] not in fresh]
    methods = [fresh.pop(e["method"], e) for e in old["methods"]] + list(fresh.values())
    if kept:
        log.info("merged into %s: %d method(s) measured now, %d kept from earlier (%s)",
                 path, len(record["methods"]), len(kept), ", ".join(kept))  # fmt: skip
    return {**record, "methods": methods, "consistency": consistency(methods),
            "overhead": record.get("overhead") or old.get("overhead")}  # fmt: skip


def read_cost(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HarnessError(f"unreadable cost file {path}: {exc}; delete it or rerun "
                           f"`{program_name()} cost`") from None  # fmt: skip
    if (
        not isinstance(data, dict)
        or data.get("kind") not in ("cost", "cost_devices")
        or data.get("schema") != COST_SCHEMA
    ):
        raise HarnessError(f"{path} is not a schema-{COST_SCHEMA} cost file; delete or move it")
    rows = "methods" if data["kind"] == "cost" else "rows"
    shape = {"protocol": dict, "settings": dict, rows: list}
    wrong = [key for key, kind in shape.items() if not isinstance(data.get(key), kind)]
    wrong += [f"protocol.{key}" for key in ("name", "version", "hash")
              if "protocol" not in wrong and key not in data["protocol"]]  # fmt: skip
    if wrong or not all(isinstance(row, dict) for row in data[rows]):
        raise HarnessError(f"malformed cost file {path} ({', '.join(wrong) or rows}: missing "
                           f"or of the wrong type); delete it or rerun `{program_name()} "
                           "cost`")  # fmt: skip
    return data


def log_line(entry: dict[str, Any]) -> str:
    """One line per measured method for the log: exponents, the largest m measured, and
    img/s once the throughput is measured."""
    done = [c for c in entry["measurements"] if "skipped" not in c]
    last = done[-1] if done else {}
    tp = entry.get("throughput") or {}
    line = (
        f"counts ~ m^{format_number(entry['count_exponent'], 2)}, mining ~ m^"
        f"{format_number(entry['time_exponent'], 2)}, m={last.get('batch_size')}: mining "
        f"{format_number(last.get('mining_ms'), 1)} ms, loss {format_number(last.get('loss_ms'), 1)} ms"
    )
    skipped = [c for c in entry["measurements"] if "skipped" in c]
    if skipped:
        line += f"; {skipped[0]['skipped']}"
    if tp:
        line += f"; {format_number(tp.get('images_per_second'), 0)} img/s"
    return line


def format_number(v: Any, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"
