"""The cost records as markdown: the mining-cost and throughput table, the harness-overhead
line, the devices table, and the leaderboard's cost section with its figure.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

from harness.cost import (
    consistency,
    devices_path,
    figure_path,
    format_number,
    provenance,
    read_cost,
)
from harness.records import describe
from harness.report.figures import cost_figure


def _exp_cell(entry: dict[str, Any], key: str, complexity: str) -> str:
    value, name = entry.get(key), (entry.get(complexity) or "").split(" (")[0]
    if value is None:
        return "-" if name in ("", "none") else name
    return f"{value:.2f} {name}"


def _time_note(entry: dict[str, Any]) -> str:
    """Why a time column names no class where the counts name one (e.g. "fixed cost
    dominates up to m=256"), and which sizes its fit left out as slower than a larger m, for
    the notes; '' when there is nothing to say."""
    notes = []
    fitted = entry.get("fits") or {}
    for what, key, fit in (("mining", "time_complexity", "mining_time"),
                           ("loss", "loss_time_complexity", "loss_time")):  # fmt: skip
        if what == "mining" and not entry.get("has_miner", True):
            continue
        text = entry.get(key) or ""
        if text.startswith("unclear (") and "fixed cost" in text:
            notes.append(f"{what} time: {text[len('unclear (') : -1].split(':')[0]}")
        left_out = (fitted.get(fit) or {}).get("disturbed_sizes")
        if left_out:
            sizes = ", ".join(f"m={m}" for m in left_out)
            notes.append(f"{what} time at {sizes} above a larger m's: left out of the fit")
        apart = _apart_from_counts(entry, key, fitted.get(fit) or {}) if what == "mining" else ""
        if apart:
            notes.append(apart)
    return "; ".join(notes)


def _apart_from_counts(entry: dict[str, Any], key: str, fit: dict[str, Any]) -> str:
    """Why a fitted mining time names another class than the miner's counts (or none): how
    the time per counted item moves over the fitted sizes, and the exponent between each two
    successive ones (threads taking on more of the work as m grows lower it, matrices that
    outgrow the caches raise it)."""
    count_class = (entry.get("count_complexity") or "").split(" (")[0]
    time_class = (entry.get(key) or "").split(" (")[0]
    sizes = fit.get("sizes") or []
    if count_class in ("", "none", "unclear") or time_class == count_class or len(sizes) < 2:
        return ""
    cells = {c["batch_size"]: c for c in entry.get("measurements") or [] if "skipped" not in c}
    ms_key = "mining_ms"
    rows = [(m, cells[m][ms_key], cells[m]["evaluated"]) for m in sizes
            if m in cells and cells[m].get(ms_key) and cells[m].get("evaluated")]  # fmt: skip
    if len(rows) < 2:
        return ""
    (m0, t0, n0), (m1, t1, n1) = rows[0], rows[-1]
    local = ", ".join(f"{math.log(b[1] / a[1]) / math.log(b[0] / a[0]):.2f}"
                      for a, b in itertools.pairwise(rows))  # fmt: skip
    return (f"mining time per counted item x{(t1 / n1) / (t0 / n0):.2f} from m={m0} to {m1}"
            f" (exponents between successive sizes: {local})")  # fmt: skip


def _largest(cells: dict[int, dict[str, Any]], largest: int, key: str, digits: int) -> str:
    """The time at the table's largest m, or, when that size was skipped, at the largest
    size measured, with its m."""
    if "skipped" not in cells.get(largest, {}):
        return format_number(cells.get(largest, {}).get(key), digits)
    done = [m for m, c in cells.items() if "skipped" not in c]
    if not done:
        return "skipped"
    return f"{format_number(cells[max(done)].get(key), digits)} (m={max(done)})"


def cost_rows(record: dict[str, Any]) -> list[dict[str, str]]:
    """The cost table's rows, one per method: exponents, times at a small and the largest m,
    img/s and step time (the fastest round where rounds were interleaved), the mining +
    loss share, and notes."""
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
        no_miner = not e.get("has_miner", True)
        share = tp.get("mining_loss_share")
        small = cells.get(ref, {})
        row.update({
            "counts ~ m^b": _exp_cell(e, "count_exponent", "count_complexity"),
            "mining time ~ m^b": _exp_cell(e, "time_exponent", "time_complexity"),
            "loss time ~ m^b": _exp_cell(e, "loss_time_exponent", "loss_time_complexity"),
            f"mining ms (m={ref})": "no miner" if no_miner else
                "skipped" if "skipped" in small else format_number(small.get("mining_ms"), 2),
            f"mining ms (m={largest})": "no miner" if no_miner else
                _largest(cells, largest, "mining_ms", 2),
            f"loss ms (m={largest})": _largest(cells, largest, "loss_ms", 1),
            "img/s": format_number(tp.get("images_per_second"), 0),
            "step ms": format_number(tp.get("step_ms"), 1),
            "mining+loss share": "-" if share is None else f"{share * 100:.0f}%",
            "notes": "; ".join(n for n in (e.get("reason"), _time_note(e)) if n),
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


def consistency_line(record: dict[str, Any]) -> str:
    """The consistency check of a cost record's throughputs (harness.cost.consistency) as
    one line: the record's own, or, for a record made before the check existed, the check
    run on its rows now; bold when the measurement was disturbed. Records whose methods were
    timed one after another (before interleaved rounds) say so."""
    check = record.get("consistency") or consistency(record["methods"])
    text = check["summary"]
    if check.get("consistent") is False:
        text = f"**{text}**"
    if not record["settings"].get("throughput_rounds"):
        text += (" (This table's img/s were timed one method after another, before the cost "
                 "command timed them in interleaved rounds.)")  # fmt: skip
    return text


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


def cost_section(
    results_dir: Path, figure_dir: Path | None = None, figure_link: str = "figures"
) -> str:
    """Markdown for the leaderboard: one "Cost" table per results/cost/<protocol>.json, with
    the harness-overhead line and a link to the figure (relative to results_dir, where
    LEADERBOARD.md lives), whose figure is redrawn from the record. Empty string when
    nothing was measured. The HTML report draws the figures into its own `figure_dir` and
    links them as `figure_link/cost_<protocol>.png`."""

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
        drawn = figure_path(results_dir, p["name"])
        cost_figure(record, Path(figure_dir) / drawn.name if figure_dir else drawn)
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
            'class it supports ("unclear" when the fit does not support one; '
            f"{_time_fit(s)}). img/s, step ms and the share of the step in mining + loss: "
            "whole training steps (backbone, mining, loss, optimizer) on the protocol's data "
            f"and P x K batches, the same initial backbone for every method{_rounds(s)}.",
            "",
            cost_table(record),
            "",
            consistency_line(record),
            "",
            overhead_line(record),
            _sessions(
                record,
                f"on {hw.get('device', '?')} ({hw.get('cpu_count', '?')} CPUs, "
                f"{hw.get('torch_threads', '?')} torch threads)",
            )
            + f"; {describe(env.get('fingerprint'))}.",
            "",
            f"![cost of mining against batch size]({figure_link}/cost_{p['name']}.png)",
        ]
        devices = devices_path(results_dir, p["name"])
        if devices.is_file():
            lines += devices_section(read_cost(devices))
    for devices in alone:
        lines += ["", f"## Cost: {devices.stem}", *devices_section(read_cost(devices))]
    return "\n".join(lines) + "\n"


def _time_fit(settings: dict[str, Any]) -> str:
    """How the record's times were fitted, for the section's description."""
    if settings.get("fixed_multiple") is None:  # made before the fixed cost was measured
        return "times are fitted on the largest sizes"
    return (f"times are fitted where they are at least {settings['fixed_multiple']:g}x the "
            "method's fixed per-call cost, its call on the smallest batch, with that cost "
            "taken off")  # fmt: skip


def _rounds(settings: dict[str, Any]) -> str:
    """How the record's throughput was timed, for the section's description."""
    rounds = settings.get("throughput_rounds")
    if not rounds:
        return ""
    return (f"; every method timed once per round in {rounds} interleaved rounds of "
            f"{settings.get('throughput_steps', '?')} steps, its fastest round shown")  # fmt: skip


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
    table = [[r["processes"], format_number(r["images_per_second"], 0),
              format_number(r["images_per_second_per_rank"], 0), format_number(r["step_ms"], 1),
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
