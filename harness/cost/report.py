"""The cost file (results/cost/<protocol>.json: reading, writing) and its markdown: the
per-method table, the harness-overhead line and the leaderboard's "Cost" section."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.fingerprint import describe

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
    from harness.results import archive, write_json_atomic

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

    from harness.locks import run_lock
    from harness.results import write_json_atomic

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
    from harness.results import write_json_atomic

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
    The overhead is the new one, else the file's. Otherwise `record` alone (write_cost then
    archives the file)."""
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
    return {**record, "methods": methods, "overhead": record.get("overhead") or old.get("overhead")}


def read_cost(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HarnessError(f"unreadable cost file {path}: {exc}; delete it or rerun "
                           "`python -m harness cost`") from None  # fmt: skip
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
                           "or of the wrong type); delete it or rerun `python -m harness "
                           "cost`")  # fmt: skip
    return data


def _exp_cell(entry: dict[str, Any], key: str, complexity: str) -> str:
    value, name = entry.get(key), (entry.get(complexity) or "").split(" (")[0]
    if value is None:
        return "-" if name in ("", "none") else name
    return f"{value:.2f} {name}"


def cost_rows(record: dict[str, Any]) -> list[dict[str, str]]:
    sizes = record["settings"]["batch_sizes"]
    largest = max(sizes)
    ref = 64 if 64 in sizes else min(sizes)
    rows = []
    for e in record["methods"]:
        row = {"method": e["method"]}
        if e["status"] != "ok":
            row["notes"] = f"{e['status'].replace('_', ' ')} ({e['reason']})"
            rows.append(row)
            continue
        cells = {c["batch_size"]: c for c in e["measurements"]}
        tp = e.get("throughput") or {}

        def ms(m: int, key: str, digits: int = 2, cells: dict = cells, e: dict = e) -> str:
            c = cells.get(m, {})
            if "skipped" in c:
                return "skipped"
            if not e.get("has_miner", True) and key == "mining_ms":
                return "no miner"
            return _num(c.get(key), digits)

        share = tp.get("mining_loss_share")
        row.update({
            "counts ~ m^b": _exp_cell(e, "count_exponent", "count_complexity"),
            "mining time ~ m^b": _exp_cell(e, "time_exponent", "time_complexity"),
            "loss time ~ m^b": _exp_cell(e, "loss_time_exponent", "loss_time_complexity"),
            f"mining ms (m={ref})": ms(ref, "mining_ms"),
            f"mining ms (m={largest})": ms(largest, "mining_ms"),
            f"loss ms (m={largest})": ms(largest, "loss_ms", 1),
            "img/s": _num(tp.get("images_per_second"), 0),
            "mining+loss share": "-" if share is None else f"{share * 100:.0f}%",
            "notes": e.get("reason") or "",
        })  # fmt: skip
        rows.append(row)
    return rows


def cost_table(record: dict[str, Any]) -> str:
    """The per-method summary as a GitHub markdown table."""
    from tabulate import tabulate

    rows = cost_rows(record)
    headers = [k for k in dict.fromkeys(k for row in rows for k in row) if k != "notes"]
    if any(row.get("notes") for row in rows):
        headers.append("notes")
    table = [[row.get(h, "") for h in headers] for row in rows]
    return tabulate(table, headers=headers, tablefmt="github", disable_numparse=True)


def overhead_line(record: dict[str, Any]) -> str:
    o = record.get("overhead")
    if not o:
        return "Harness overhead: not measured."
    verdict = "meets" if o["ratio"] >= o["target"] else "misses"
    text = (
        f"Harness overhead: `harness.train.train` runs at {o['ratio']:.3f} x the throughput of a "
        f"bare PyTorch loop on the same model and batches ({o['harness_images_per_second']:.0f} "
        f"vs {o['bare_images_per_second']:.0f} img/s, {o['method']}, {o['steps']} steps x "
        f"{o['rounds']} alternated rounds, fastest round of each; {verdict} the target "
        f"{o['target']:.2f})."
    )
    if o.get("median_round_ratio") is not None:
        text += f" Median of the per-round ratios: {o['median_round_ratio']:.3f}."
    if o.get("worker_startup_seconds"):
        text += (f" The data workers' start-up, once per run, is not in the harness's rounds: "
                 f"{o['worker_startup_seconds']:.2f} s.")  # fmt: skip
    if o["steps"] < 20:
        text += (
            f" Only {o['steps']} steps (the protocol's budget): once-per-run costs (the first "
            "steps' warm-up, an epoch-end checkpoint) weigh in, so this ratio says little "
            "about a long run."
        )
    if o.get("breakdown"):
        parts = ", ".join(f"{k} {v:.3f}" for k, v in o["breakdown"].items())
        text += f" Bare loop plus one piece, throughput ratio: {parts}."
    when = o.get("measured") or {}
    if when and when.get("created_at") != record.get("created_at"):  # kept by a merge
        text += (f" (Measured {str(when.get('created_at') or '?')[:10]}, commit "
                 f"{str(when.get('git_commit') or '?')[:10]}, before the latest rows.)")  # fmt: skip
    return text


def cost_section(results_dir: Path) -> str:
    """Markdown for the leaderboard: one "Cost" table per results/cost/<protocol>.json, with
    the harness-overhead line and a link to the figure (relative to results_dir, where
    LEADERBOARD.md lives), whose figure is redrawn from the record. Empty string when
    nothing was measured."""
    from harness.figures import cost_figure

    results_dir = Path(results_dir)
    paths = sorted((results_dir / "cost").glob("*.json"))
    alone = [d for d in sorted((results_dir / "cost" / "devices").glob("*.json"))
             if not (results_dir / "cost" / d.name).is_file()]  # fmt: skip
    if not paths and not alone:
        return ""
    lines = []
    for path in paths:
        record = read_cost(path)
        p, s = record["protocol"], record["settings"]
        cost_figure(record, figure_path(results_dir, p["name"]))
        env = record.get("environment", {})
        hw = env.get("hardware", {})
        lines += [
            "",
            f"## Cost: {p['name']} (protocol v{p['version']}, hash `{p['hash']}`)",
            "",
            f"Generated by `python -m harness cost --protocol {p['name']}`. Scaling on random "
            f"inputs, m = P x {s['images_per_class']} for m in "
            f"{', '.join(map(str, s['batch_sizes']))}: the miner's pair scores evaluated "
            "(counts) and the median mining and loss (forward + backward) times, with the "
            "least-squares exponent b of cost ~ a m^b on log-log axes and the complexity "
            'class it supports ("unclear" when the fit does not support one; times are '
            "fitted on the largest sizes). img/s and the share of the step in mining + loss: "
            "whole training steps (backbone, mining, loss, optimizer) on the protocol's data "
            "and P x K batches, the same initial backbone for every method.",
            "",
            cost_table(record),
            "",
            overhead_line(record),
            _sessions(
                record,
                f"on {hw.get('device', '?')} ({hw.get('cpu_count', '?')} CPUs, "
                f"{hw.get('torch_threads', '?')} torch threads)",
            )
            + f"; {describe(env.get('fingerprint'))}.",
            "",
            f"![cost of mining against batch size](figures/cost_{p['name']}.png)",
        ]
        devices = devices_path(results_dir, p["name"])
        if devices.is_file():
            lines += devices_section(read_cost(devices))
    for devices in alone:
        lines += ["", f"## Cost: {devices.stem}", *devices_section(read_cost(devices))]
    return "\n".join(lines) + "\n"


def _sessions(record: dict[str, Any], where: str) -> str:
    """The line saying when and from which commit the rows were measured: one day and
    commit for a record measured at once; for a merged one, each measurement (from the
    rows' `measured`) with its methods."""
    top = provenance(record)
    groups: dict[tuple[str, str], list[str]] = {}
    for e in record["methods"]:
        m = e.get("measured") or top
        groups.setdefault((str(m.get("created_at") or "?"), str(m.get("git_commit") or "?")),
                          []).append(e["method"])  # fmt: skip
    if len(groups) <= 1:
        when, commit = next(
            iter(groups), (str(top["created_at"] or "?"), str(top["git_commit"] or "?"))
        )
        return f"Measured {when[:10]} {where}, commit {commit[:10]}"
    parts = [f"{when[:16].replace('T', ' ')}, commit {commit[:10]}: "
             + (", ".join(names) if len(names) <= 4 else f"{len(names)} methods")
             for (when, commit), names in groups.items()]  # fmt: skip
    return (f"Measured {where} in {len(groups)} runs of the command, each row's time and "
            f"commit in its `measured` ({'; '.join(parts)})")  # fmt: skip


def devices_table(record: dict[str, Any]) -> str:
    """Scaling across devices as a GitHub markdown table, one row per process count."""
    from tabulate import tabulate

    headers = ["processes", "img/s", "img/s per process", "step ms", "speedup", "efficiency"]
    table = [[r["processes"], _num(r["images_per_second"], 0),
              _num(r["images_per_second_per_rank"], 0), _num(r["step_ms"], 1),
              f"{r['speedup']:.2f}x", f"{r['efficiency'] * 100:.0f}%"] for r in record["rows"]]  # fmt: skip
    return tabulate(table, headers=headers, tablefmt="github", disable_numparse=True)


def devices_section(record: dict[str, Any]) -> list[str]:
    """The leaderboard's lines for one `cost --devices` record."""
    p, s = record["protocol"], record["settings"]
    env = record.get("environment", {})
    hw = env.get("hardware", {})
    where = (f"{s['threads_per_rank']} torch thread(s) per process, so N processes use N "
             "times the cores of one" if s["device"] == "cpu" else "one GPU per process")  # fmt: skip
    return [
        "",
        f"### Scaling across devices: {p['name']} (v{p['version']}, hash `{p['hash']}`), "
        f"{record['method']}",
        "",
        f"Generated by `python -m harness cost --devices ... --protocol {p['name']} --methods "
        f"{record['method']}`: the training step under torchrun on N processes (each embeds "
        f"1/N of every batch of {s['batch_size']}; embeddings gathered, gradients averaged), "
        f"{s['steps']} steps after {s['warmup_steps']} of warm-up, on {s['device']} with "
        f"{where}. Efficiency = img/s on N / (N x img/s on 1).",
        "",
        devices_table(record),
        "",
        f"Measured {str(record.get('created_at', '?'))[:10]} on {hw.get('device', '?')} "
        f"({hw.get('cpu_count', '?')} CPUs), commit {str(env.get('git_commit', '?'))[:10]}.",
    ]


def log_line(entry: dict[str, Any]) -> str:
    """One line per measured method for the log: exponents, the largest m, img/s."""
    done = [c for c in entry["measurements"] if "skipped" not in c]
    last = done[-1] if done else {}
    tp = entry.get("throughput") or {}
    return (
        f"counts ~ m^{_num(entry['count_exponent'], 2)}, mining ~ m^"
        f"{_num(entry['time_exponent'], 2)}, m={last.get('batch_size')}: mining "
        f"{_num(last.get('mining_ms'), 1)} ms, loss {_num(last.get('loss_ms'), 1)} ms; "
        f"{_num(tp.get('images_per_second'), 0)} img/s"
    )


def _num(v: Any, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"
