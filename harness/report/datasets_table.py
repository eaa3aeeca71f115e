"""The datasets table at the top of the leaderboard: one row per real-photo protocol, so that
a reader sees where metric learning pays (a large gain over the pretrained features) and where
those features are already near their ceiling (a gain of a point or less).

Each row: the protocol and its dataset, the dataset's domain (harness.data.photo_sets), the
classes it trains and tests on and its photos (the runs' recorded split), the zero-shot
MAP@R (the pretrained network's own features), and the best MAP@R once each method is tuned
(`tuned_view`: its tuned runs where they finished, else its paper-default runs) with its
gain over zero-shot. The numbers come from the same per-seed values as the tables below."""

from __future__ import annotations

from harness.data.photo_sets import SETS
from harness.records import RunResult, main_metric, pretrained, tuned_values, zero_shot_row

HEADER = ("| protocol | dataset | domain | classes (train / test) | photos | zero-shot MAP@R | "
          "best tuned MAP@R | gain |\n|---|---|---|---|---|---|---|---|")  # fmt: skip


def _mean(values: dict[int, float]) -> float:
    return 100.0 * sum(values.values()) / len(values)


def dataset_row(name: str, runs: list[RunResult]) -> dict[str, object] | None:
    """One protocol's row (None when it has no zero-shot row or no trained method)."""
    zero = zero_shot_row(runs)
    metric = main_metric(runs)
    default, tuned, _notes = tuned_values(runs, metric)
    if zero is None or zero not in default:
        return None
    ranked = {m: _mean(v) for m, v in tuned.items() if m != zero and v}
    if not ranked:
        return None
    best = max(ranked, key=lambda m: ranked[m])
    split = next((r.split for r in runs if r.ok and r.split), None) or {}
    dataset = next((r.dataset.name for r in runs if r.dataset), "")
    any_tuned = any(r.tuning and r.ok for r in runs)
    return {
        "protocol": name,
        "dataset": dataset,
        "domain": SETS[dataset].domain if dataset in SETS else "",
        "train": int(split.get("train_classes", 0)) + int(split.get("validation_classes", 0)),
        "test": int(split.get("test_classes", 0)),
        "photos": int(split.get("train_images", 0)) + int(split.get("validation_images", 0))
        + int(split.get("test_images", 0)),
        "zero_shot": _mean(default[zero]),
        "best": best,
        "best_value": ranked[best],
        "tuned": any_tuned,
    }  # fmt: skip


def datasets_section(groups: dict[str, list[RunResult]]) -> str:
    """The leaderboard's `## The datasets` section ('' without a real-photo protocol)."""
    rows = [row for name, runs in sorted(groups.items()) if runs and pretrained(runs)
            if (row := dataset_row(name, runs)) is not None]  # fmt: skip
    if not rows:
        return ""
    rows.sort(key=lambda r: r["best_value"] - r["zero_shot"])  # type: ignore[operator]
    lines = ["", "## The datasets", "",
             "Each real-photo protocol, from the smallest gain of metric learning over the "
             "pretrained features to the largest: MAP@R in percent, the mean over seeds on the "
             "test classes; best tuned: the best method once each is tuned (its paper default "
             "where its protocol has no tuned runs yet, marked *defaults*).", "", HEADER]  # fmt: skip
    for r in rows:
        how = "" if r["tuned"] else " (*defaults*)"
        gain = r["best_value"] - r["zero_shot"]  # type: ignore[operator]
        lines.append(f"| {r['protocol']} | `{r['dataset']}` | {r['domain']} | {r['train']} / "
                     f"{r['test']} | {r['photos']:,} | {r['zero_shot']:.1f} | "
                     f"{r['best_value']:.1f} ({r['best']}){how} | {gain:+.1f} |")  # fmt: skip
    return "\n".join([*lines, ""])
