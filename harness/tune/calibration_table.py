"""A calibration record as a markdown table (`<results-dir>/calibration/<name>.md`): every
candidate with each reference method's validation MAP@R and seconds, the candidates not run
and why, and where each chosen value sits in its grid."""

from __future__ import annotations

from typing import Any

import numpy as np


def markdown(record: dict[str, Any], calibration: Any) -> str:
    """The record as a table: every candidate, each method's validation MAP@R (%), seconds.
    `calibration`: harness.tune.calibrate.Calibration (not imported: it imports this)."""
    methods = [calibration.zero_shot, *calibration.methods]
    choice = record["choice"]
    summary = {r["candidate"]: r for r in choice["candidates"]}
    head = ["candidate", *methods, "mean (ref.)", "vs zero-shot", "s/run", "est. sweep min"]
    lines = [f"# Calibration `{calibration.name}` of protocol `{calibration.protocol}`", "",
             f"Validation classes: the last {calibration.validation_fraction:.0%} of the sorted "
             f"training classes; seed {calibration.seed}; validation MAP@R in %; the test "
             "classes are never read. Chosen: "
             f"**{choice['chosen'] or 'none within the budget'}** (best mean of the reference "
             f"methods among candidates whose estimated sweep fits "
             f"{calibration.sweep_budget_minutes:g} minutes).", "",
             *([f"Search: neighbours. {len(choice['candidates'])} of the grid's "
                f"{len(calibration.candidates())} combinations ran (below): those of earlier "
                "grids the record kept, then a walk from the best finished candidate to its "
                "untried neighbours (one setting one step along its values) until every "
                "neighbour of the best had been tried.", ""]
               if calibration.search == "neighbours" else []),
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    for row in choice["candidates"]:
        runs = record["runs"][row["candidate"]]
        seconds = np.mean([runs[m]["seconds"] for m in calibration.methods])
        cells = [row["candidate"], *[f"{100 * runs[m]['map@r']:.2f}" for m in methods],
                 f"{100 * row['mean_map@r']:.2f}", f"{100 * row['gain_over_zero_shot']:+.2f}",
                 f"{seconds:.1f}", f"{summary[row['candidate']]['sweep_minutes']:.0f}"
                 + ("" if row.get("methods_timed") else "*")]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    for cid, why in record.get("skipped", {}).items():
        cells = [cid, *["not run"] * len(methods), "", "", "",
                 f"{why['projected_sweep_minutes']:.0f} (projected from {why['from']})"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    caches = "; ".join(f"{k}: {v:.0f} s" for k, v in record["caches"].items())
    if any(not r.get("methods_timed") for r in choice["candidates"]):
        lines += ["", "\\* every method counted at the reference methods' mean time per run: "
                  "no probe timed each method at this candidate's settings, since it is over "
                  "the budget at that count already (or its record was made before probes: "
                  "`calibrate` again adds them without rerunning a candidate)."]  # fmt: skip
    lines += ["", f"Feature caches of the calibration's images: {caches}.", ""]
    lines += _probe_table(record, calibration)
    if choice.get("positions"):
        lines += ["Where each chosen value sits in its grid (`interior`: a tried neighbour on "
                  "both sides; `edge`: the limit that stops the grid there, if any):", "",
                  "| setting | chosen | position | tried below | tried above | limit |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for key, p in choice["positions"].items():
            cells = [
                key,
                p["value"],
                p["position"],
                p["tried_below"],
                p["tried_above"],
                p["limit"] or ("" if p["position"] != "edge" else "none named: widen it"),
            ]
            lines.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _probe_table(record: dict[str, Any], calibration: Any) -> list[str]:
    """Each registered method's cost at the chosen settings, as the probe timed it, and its
    estimated seconds per run of the full sweep (what the chosen row's estimate sums)."""
    from harness.tune.choice import candidate_id
    from harness.tune.probe import PROBE_STEPS, probe_id, run_seconds, scales

    choice = record["choice"]
    chosen = choice.get("chosen_settings")
    probe = record.get("probes", {}).get(probe_id(chosen)) if chosen else None
    if not probe:
        return []
    sizes = choice["sizes"]
    each = run_seconds(record["runs"][candidate_id(chosen)], probe, calibration.methods,
                       scales(sizes))  # fmt: skip
    if each is None:
        return []
    lines = [f"Each registered method at the chosen settings ({probe_id(chosen)}), timed over "
             f"{PROBE_STEPS} training steps on the cached features and one evaluation of the "
             "validation classes; its seconds per run of the sweep are the reference methods' "
             "training time x its step time over theirs, plus its evaluation, scaled to the "
             "protocol's images (training: linearly; evaluation: by the square of the test "
             "images over the validation images):", "",
             "| method | ms a step | evaluation s | est. s a run |", "|---|---|---|---|"]  # fmt: skip
    for name in sorted(probe, key=lambda n: -each[n]):
        p = probe[name]
        why = p.get("not_applicable") or (f"failed: {p['failure']}" if "failure" in p else None)
        cells = ([name, why, "", "0" if "not_applicable" in p else f"{each[name]:.0f}"] if why
                 else [name, f"{1000 * p['step_seconds']:.1f}", f"{p['eval_seconds']:.2f}",
                       f"{each[name]:.0f}"])  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]
