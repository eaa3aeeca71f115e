"""Choosing among a calibration's candidates: each candidate's estimated full sweep (every
registered method x seed, and the feature cache), the best one whose sweep fits the budget,
where each chosen value sits in its grid, and the neighbour search's next candidates.
(harness.tune.calibrate runs the candidates; this module only reads their record.)"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.tune.probe import all_timed, probe_id, run_seconds, scales

# `calibration` below: harness.tune.calibrate.Calibration (not imported: it imports this)
Calibration = Any


def candidate_id(candidate: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in candidate.items())


def cache_id(candidate: dict[str, Any]) -> str:
    """The candidate's trunk settings (candidates that share them share a feature cache)."""
    return ", ".join(f"{k}={v}" for k, v in candidate.items() if k.startswith("features.")) or "-"


def _ordered(values: list[Any]) -> list[Any]:
    return sorted(values) if all(isinstance(v, (int, float)) for v in values) else list(values)


def next_neighbours(record: dict[str, Any], calibration: Calibration,
                    sizes: dict[str, int]) -> list[dict[str, Any]]:  # fmt: skip
    """The neighbour search's next candidates: the best finished candidate's neighbours (each
    setting one step along its sorted values, the others kept) not yet tried; the grid's
    middle candidate when nothing has finished; while every finished candidate is over the
    budget, the neighbours of the one with the shortest sweep (the walk heads for the
    candidates that fit). Empty when every neighbour of the best is tried (run, or recorded
    as over the budget): the search has converged."""
    tried = set(record["runs"]) | set(record.get("skipped", {}))
    chosen = choose(record, calibration, sizes)
    best = chosen["chosen_settings"]
    if best is None:
        if not chosen["candidates"]:
            return [{k: _ordered(v)[(len(v) - 1) // 2] for k, v in calibration.grid.items()}]
        quickest = min(chosen["candidates"], key=lambda r: r["sweep_minutes"])["candidate"]
        best = next(c for c in calibration.candidates() if candidate_id(c) == quickest)
    out = []
    for key, values in calibration.grid.items():
        ordered = _ordered(values)
        at = ordered.index(best[key])
        for step in (at - 1, at + 1):
            if 0 <= step < len(ordered):
                neighbour = {**best, key: ordered[step]}
                if candidate_id(neighbour) not in tried:
                    out.append(neighbour)
    return out


def _budget(candidate: dict[str, Any]) -> tuple[str, float] | None:
    for key in ("budget.epochs", "budget.steps"):
        if key in candidate:
            return key, float(candidate[key])
    return None


def projected_minutes(record: dict[str, Any], calibration: Calibration,
                      candidate: dict[str, Any], sizes: dict[str, int]) -> tuple[float, str] | None:  # fmt: skip
    """A candidate's full sweep projected from a finished candidate on the same trunk and
    budget unit (time per run scales with the budget), before anything of it runs: a
    candidate far over the budget is not run. None when no such candidate has finished."""
    mine = _budget(candidate)
    if mine is None:
        return None
    for other in calibration.candidates():
        cid, theirs = candidate_id(other), _budget(other)
        runs = record["runs"].get(cid, {})
        if (cache_id(other) != cache_id(candidate) or theirs is None or theirs[0] != mine[0]
                or not all(m in runs for m in [calibration.zero_shot, *calibration.methods])):  # fmt: skip
            continue
        scaled = {m: {**r, "seconds": r["seconds"] * mine[1] / theirs[1]} for m, r in runs.items()}
        views = int(candidate.get("features.train_views", 1) or 1)
        return estimate_minutes(scaled, record["caches"].get(cache_id(candidate), 0.0), views,
                                sizes, calibration.zero_shot,
                                probe_of(record, candidate), calibration.methods), cid  # fmt: skip
    return None


def probe_of(record: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    return record.get("probes", {}).get(probe_id(candidate), {})


def estimate_minutes(runs: dict[str, Any], cache_seconds: float, views: int,
                     sizes: dict[str, int], zero_shot: str, probe: dict[str, Any] | None = None,
                     methods: list[str] | tuple[str, ...] = ()) -> float:  # fmt: skip
    """A full sweep's minutes: every registered method x seed, and the cache (scaled to its
    rows). With the candidate's probe (harness.tune.probe), each method at its own cost (its
    training scaled to the protocol's training images, its evaluation to the square of its
    test images: harness.tune.probe.scales);
    a method the probe lacks, and every method without one, at the reference `methods'` mean
    time per run (scaled to the protocol's training images)."""
    scale = scales(sizes)
    mean = (
        float(np.mean([r["seconds"] for m, r in runs.items() if m != zero_shot])) * scale["train"]
    )
    each = run_seconds(runs, probe or {}, list(methods), scale)
    per_seed = (mean * sizes["methods"] if each is None
                else sum(each.values()) + mean * max(0, sizes["methods"] - len(each)))  # fmt: skip
    rows = sizes["train"] * views + sizes["images"]
    cal_rows = sizes["calibration_train"] * views + sizes["calibration_images"]
    cache = cache_seconds * rows / max(1, cal_rows)
    return (per_seed * sizes["seeds"] + cache) / 60


def choose(record: dict[str, Any], calibration: Calibration, sizes: dict[str, int]) -> dict:
    """Each candidate's mean reference MAP@R, gain over zero-shot and estimated sweep time;
    the best that fits the budget is the choice."""
    rows = []
    for cid, runs in record["runs"].items():
        if not all(m in runs for m in [calibration.zero_shot, *calibration.methods]):
            continue
        candidate = next(c for c in calibration.candidates() if candidate_id(c) == cid)
        views = int(candidate.get("features.train_views", 1) or 1)
        frozen = cache_id(candidate)
        mean = float(np.mean([runs[m]["map@r"] for m in calibration.methods]))
        rows.append({"candidate": cid, "mean_map@r": round(mean, 6),
                     "gain_over_zero_shot": round(mean - runs[calibration.zero_shot]["map@r"], 6),
                     "sweep_minutes": round(estimate_minutes(
                         runs, record["caches"].get(frozen, 0.0), views, sizes,
                         calibration.zero_shot, probe_of(record, candidate), calibration.methods), 1),
                     "methods_timed": all_timed(probe_of(record, candidate),
                                               calibration.methods)})  # fmt: skip
    fitting = [r for r in rows if r["sweep_minutes"] <= calibration.sweep_budget_minutes]
    best = max(fitting, key=lambda r: r["mean_map@r"]) if fitting else None
    settings = next((c for c in calibration.candidates()
                     if best and candidate_id(c) == best["candidate"]), None)  # fmt: skip
    return {"candidates": sorted(rows, key=lambda r: -r["mean_map@r"]), "sizes": sizes,
            "chosen": best["candidate"] if best else None, "chosen_settings": settings,
            "learns": bool(best and best["gain_over_zero_shot"] > 0),
            "positions": positions(record, calibration, settings, rows) if settings else {}}  # fmt: skip


def positions(record: dict[str, Any], calibration: Calibration, chosen: dict[str, Any],
              rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:  # fmt: skip
    """For each setting of the choice: whether a candidate that differs in that setting alone
    was tried on each side of the chosen value (`interior`; a neighbour run and found over
    the budget, or not run for it, counts as tried), and, at an edge, the limit that explains
    it: the calibration's own (`limits`), or, for a longer training budget, the sweep budget
    when twice the chosen budget would be over it (time per run scales with the budget)."""
    over = {r["candidate"] for r in rows if r["sweep_minutes"] > calibration.sweep_budget_minutes}
    tried = {r["candidate"] for r in rows} | over | set(record.get("skipped", {}))
    minutes = {r["candidate"]: r["sweep_minutes"] for r in rows}[candidate_id(chosen)]
    out = {}
    for key, values in calibration.grid.items():
        value = chosen[key]
        ordered = _ordered(values)
        at = ordered.index(value)
        sides = {}
        for side, neighbours in (("below", ordered[:at][::-1]), ("above", ordered[at + 1 :])):
            sides[side] = next((v for v in neighbours
                                if candidate_id({**chosen, key: v}) in tried), None)  # fmt: skip
        limit = calibration.limits.get(key)
        if len(values) == 1:
            where = "fixed"
        elif sides["below"] is not None and sides["above"] is not None:
            where, limit = "interior", None
        else:
            where = "edge"
            budget = calibration.sweep_budget_minutes
            if (limit is None and key in ("budget.epochs", "budget.steps")
                    and sides["above"] is None and 2 * minutes > budget):  # fmt: skip
                limit = (f"the sweep budget: twice {value} would take about {2 * minutes:.0f} "
                         f"minutes, over {budget:g}")  # fmt: skip
        out[key] = {"value": value, "position": where, "tried_below": sides["below"],
                    "tried_above": sides["above"], "limit": limit}  # fmt: skip
    return out
